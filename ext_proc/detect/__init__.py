"""Detection: what in a text is personal data or a secret. The pattern catalog (`catalog/`), the
declared subjects (`subjects/`), the text folding they share, findings and the detection memo.
Detectors return kinds and spans, never text.
"""
