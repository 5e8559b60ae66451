"""One HTTP exchange through the filter, phase by phase: admission at the request headers, the
request body (redaction, media, the egress check), the commit before release (vault, surrogates,
receipt), and the reply (restore, the output gate). Each phase returns a result; `exchange.py`
turns results into Envoy's answers.
"""
