"""Redis: one client for every topology (server, Sentinel, Cluster) and the vault of pseudonyms and
surrogates.
"""
