"""What every exchange of one worker shares: policies, stores, pools and metrics.

Read-only once the worker has started, except `policies`, which a reload replaces whole. The two
stores are typed by what the exchange and the admin API call on them (`ReceiptStorage`,
`VaultStorage`): the Redis-backed `ReceiptStore` and `Vault` fit them, and so do in-memory fakes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ext_proc.audit.metrics import Metrics
from ext_proc.audit.receipts.record import Receipt, ReceiptFields
from ext_proc.audit.receipts.verify import VerifyResult
from ext_proc.errors import CordonError
from ext_proc.media.pool import OcrPool
from ext_proc.policy.model import PolicySet
from ext_proc.storage.vault import SurrogateWanted, VaultRead

_T = TypeVar("_T")


class ReceiptStorage(Protocol):
    """The receipt chains: appended to before an answer is released, read by the admin API.
    A failure is a `ReceiptError`."""

    async def append(self, receipt_fields: ReceiptFields) -> Receipt: ...

    def settle_later(
        self,
        correction: ReceiptFields,
        uncertain: tuple[str, str],
        done: Callable[[str], None] | None = None,
    ) -> None: ...

    async def tenants(self) -> list[str]: ...

    async def verify(self, tenant: str, *, since_checkpoint: bool = True) -> VerifyResult: ...

    async def find_by_ref_digest(self, tenant: str, digest: str) -> list[Receipt]: ...


class VaultStorage(Protocol):
    """Consistent pseudonyms (placeholder → value) and the surrogate registry of each tenant.
    A failure is a `VaultError` (or `SurrogateExhausted` from a claim)."""

    def pseudonym_key(self, tenant: str) -> bytes: ...

    async def put(self, tenant: str, entries: Mapping[str, str], ttl_seconds: int) -> None: ...

    async def get(self, tenant: str, placeholders: Iterable[str]) -> VaultRead: ...

    async def claim_surrogates(
        self,
        tenant: str,
        wanted: Iterable[SurrogateWanted],
        ttl_seconds: int,
        avoid: Callable[[str], bool] | None = None,
    ) -> dict[SurrogateWanted, str]: ...


class BodyTooLarge(CordonError):
    """The request body, as it would leave (redacted, surrogates in, images masked), is larger
    than Envoy takes (MAX_BODY_BYTES). Names sizes only."""


@dataclass(slots=True)
class Runtime:
    """`receipts` None means no receipt store: every append fails, as if Redis were down. `vault`
    None means no TENANT_SECRET: policies with consistent pseudonyms were refused at load. `ocr`
    None: media masking refuses (422). `max_body_bytes`: the largest body Envoy forwards (its
    buffer limit, MAX_BODY_BYTES; the gRPC message limit is above it); a rewritten body that
    grew past it is refused here, never handed to Envoy to fail. None: no limit (tests)."""

    policies: PolicySet
    admin_token: str | None = None
    receipts: ReceiptStorage | None = None
    receipt_secret: bytes = b""
    trust_tenant_header: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    ocr: OcrPool | None = None
    vault: VaultStorage | None = None
    max_body_bytes: int | None = None
    ready: bool = True  # what /readyz answers: False while Redis does not answer, or draining
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
