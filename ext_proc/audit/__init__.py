"""What the filter tells operators and auditors: hash-chained receipts in Redis and metrics."""
