"""Rewriting a body: the fail-closed JSON walk, findings → placeholders (or strip markers, or
surrogates), the placeholder grammar, and the egress check that reads the final body again.
"""
