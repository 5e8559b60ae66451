"""The gRPC side: the supervisor and its workers, the wire (the only builder of Envoy's answers)
and the admin API.
"""
