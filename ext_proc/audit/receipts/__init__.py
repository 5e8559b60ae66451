"""Receipts: one hash-chained record per exchange, one chain per tenant, kept in Redis: the
record and its hash, the chain's keys and scripts, the store that appends, settling of lost
answers, and verification (the admin query and `receipts verify`).
"""
