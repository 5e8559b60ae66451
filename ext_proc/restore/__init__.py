"""The reply: placeholders restored (JSON bodies, SSE streams split anywhere) and the model's
output read by the output gate.
"""
