"""What every exchange of one worker shares: policies, stores, pools and metrics.

Read-only once the worker has started, except `policies`, which a reload replaces whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ext_proc.audit.metrics import Metrics
from ext_proc.audit.receipts.store import ReceiptStore
from ext_proc.media.ocr import OcrPool
from ext_proc.policy.model import PolicySet
from ext_proc.storage.vault import Vault

_T = TypeVar("_T")


@dataclass(slots=True)
class Runtime:
    """`receipts` None means no receipt store: every append fails, as if Redis were down. `vault`
    None means no TENANT_SECRET: policies with consistent pseudonyms were refused at load. `ocr`
    None: media masking refuses (422)."""

    policies: PolicySet
    admin_token: str | None = None
    receipts: ReceiptStore | None = None
    receipt_secret: bytes = b""
    trust_tenant_header: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    ocr: OcrPool | None = None
    vault: Vault | None = None
    # Large bodies are read here, one at a time: several at once in one process only fight over
    # the GIL (slower each, and each holding its parsed copies in memory at the same time).
    large_bodies: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="body")
    )

    async def offload(self, call: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.large_bodies, call, *args)

    async def maybe_offload(self, offload: bool, call: Callable[..., _T], *args: Any) -> _T:
        """`call(*args)` in the body thread when `offload` (a large body), else here."""
        if offload:
            return await self.offload(call, *args)
        return call(*args)
