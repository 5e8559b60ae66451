"""Receipts: one hash-chained record per exchange, one chain per tenant, kept in Redis.

The public names callers need, re-exported from the modules that define them.
"""

from ext_proc.audit.receipts.chain import ReceiptError
from ext_proc.audit.receipts.record import Decision, Egress, Receipt, ReceiptFields, ref_digest, valid_tenant
from ext_proc.audit.receipts.store import ReceiptStore
from ext_proc.audit.receipts.verify import ChainBroken, VerifyResult, verify_cli

__all__ = [
    "ChainBroken",
    "Decision",
    "Egress",
    "Receipt",
    "ReceiptError",
    "ReceiptFields",
    "ReceiptStore",
    "VerifyResult",
    "ref_digest",
    "valid_tenant",
    "verify_cli",
]
