"""The pattern catalog: detectors as data (`detectors.py`), their validators, and the engine that
runs a policy's sets over a text (`engine.Catalog`). Every kind's rules: docs/catalog.md.
"""
