"""Declared subjects: the `X-Cordon-Subject` header (`header.py`), the renderings of each kind of
value (names, contacts, dates, addresses, literal values) and the compiled matcher. What a
declared identifier matches: docs/subjects.md.
"""
