"""Tenant policies: the model, loading and validating files, the X-Tenant strictness order, and
reloading a directory while serving.
"""
