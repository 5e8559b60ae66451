"""Cordon: an Envoy external processor that keeps personal data and secrets out of LLM API calls."""

__version__ = "0.1.0"
