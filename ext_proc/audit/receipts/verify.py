"""Verifying a receipt chain: re-hash it record by record, and answer queries only from a whole one.

Where this sits: beside the flow. The admin query (`GET /admin/receipts?ref=R`) verifies a chain
before it answers from it, and the auditors' command line (`receipts verify`) walks every chain.

Verification walks the stream in order and recomputes every hash from the stored bytes. It is
incremental: the last verified (stream id, hash) is kept as a checkpoint **in this process only**.
Anyone who can write Redis could also rewrite a checkpoint kept in Redis, so such a checkpoint would
let them hide an edit behind it; an in-process one cannot be moved from outside. A new process (the
command line) therefore verifies from the start. Records before a checkpoint are not re-read by an
incremental verify except the checkpoint record itself (still there, same hash); pass
`since_checkpoint=False` for a full walk.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Literal, TextIO

from ext_proc.audit.receipts.chain import (
    DEFAULT_KEY_PREFIX,
    READ_BATCH,
    ChainRedis,
    ReceiptError,
    id_key,
    text,
)
from ext_proc.audit.receipts.record import GENESIS, Receipt, is_sha256_hex, record_hash
from ext_proc.errors import CordonError
from ext_proc.storage.redis_client import connect

BadReason = Literal["unparsable", "prev", "hash", "head", "checkpoint", "vanished", "anchor"]

_PREV_FIELD = b'"prev":"'


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """One chain's verification. On failure, `bad_id` is the first bad record's stream id.

    `reason`: `unparsable` (not a valid canonical record of this tenant), `prev` (not chained to
    the record before it: one was deleted, inserted or moved), `hash` (its content changed),
    `checkpoint` (the last record verified earlier is gone or changed), `head` (the head key does
    not match the last record, `bad_id`: a record was cut off the end or the head was moved),
    `vanished` (this process appended to the chain, which has since started again from nothing:
    deleted, or a Redis restarted without its data; `bad_id` "0-0"), `anchor` (a record this
    process appended is gone or changed, `bad_id` its id: an earlier record was deleted or edited
    and the chain re-hashed after it).
    """

    tenant: str
    ok: bool
    hashed: int  # records re-hashed by this call
    last_id: str | None  # the last good record (None: no good record)
    head: str  # its hash (GENESIS when none)
    bad_id: str | None = None
    reason: BadReason | None = None


class ChainBroken(CordonError):
    """A query found the chain broken: the answer is the first bad record's id, never records."""

    def __init__(self, result: VerifyResult) -> None:
        super().__init__(f"receipt chain of {result.tenant!r} broken at {result.bad_id} ({result.reason})")
        self.result = result


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    stream_id: str
    hash: str


class ChainVerifier:
    """Verifies chains, keeping this process's checkpoint of each.

    `vanished`: the chains this process appended to that have since started again from nothing
    (the writer's set, read as it changes); such a chain fails verification as `vanished`.
    """

    def __init__(self, chains: ChainRedis, vanished: Set[str] = frozenset()) -> None:
        self._chains = chains
        self._vanished = vanished
        self._checkpoints: dict[str, _Checkpoint] = {}

    def verified_tenants(self) -> set[str]:
        """The tenants this process holds a checkpoint of (a chain deleted whole is still asked about)."""
        return set(self._checkpoints)

    async def verify(self, tenant: str, *, since_checkpoint: bool = True) -> VerifyResult:
        """Walk the chain (from this process's checkpoint, or from the start) and recheck it.

        The stream's last entry and the head key are read together by one script, so writers
        appending meanwhile never look like a head mismatch; the walk stops at that entry. A chain
        that retention trimmed starts after its anchor (the last record trimmed): its first record
        is chained to the anchor's hash. A trim that runs during the walk is read again, once.
        """
        self._chains.stream_key(tenant)  # validates the tenant
        if tenant in self._vanished:
            # This process appended to a chain that later started again from nothing.
            return VerifyResult(tenant, False, 0, None, GENESIS, "0-0", "vanished")
        result = await self._walk(tenant, since_checkpoint)
        if not result.ok and result.reason == "prev" and result.last_id is None:
            result = await self._walk(tenant, since_checkpoint)  # trimmed meanwhile?
        if result.ok and result.last_id is not None:
            self._checkpoints[tenant] = _Checkpoint(result.last_id, result.head)
        elif result.ok:
            self._checkpoints.pop(tenant, None)
        return result

    async def _walk(self, tenant: str, since_checkpoint: bool) -> VerifyResult:
        tail_id, head = await self._chains.snapshot(tenant)
        trimmed = await self._chains.trimmed(tenant)
        origin = trimmed.hash if trimmed is not None else GENESIS
        prev, last_id, start = origin, None, "-"
        checkpoint = self._checkpoints.get(tenant) if since_checkpoint else None
        if checkpoint is not None and (trimmed is None or id_key(checkpoint.stream_id) > id_key(trimmed.id)):
            found = await self._chains.read(tenant, checkpoint.stream_id, checkpoint.stream_id, count=1)
            if not found or found[0][1].get(b"h") != checkpoint.hash.encode("ascii"):
                return VerifyResult(tenant, False, 0, None, GENESIS, checkpoint.stream_id, "checkpoint")
            prev, last_id, start = checkpoint.hash, checkpoint.stream_id, f"({checkpoint.stream_id}"

        hashed = 0
        if tail_id is not None and (last_id is None or id_key(last_id) < id_key(tail_id)):
            while True:
                batch = await self._chains.read(tenant, start, tail_id)
                for raw_id, entry in batch:
                    entry_id = text(raw_id)
                    hashed += 1
                    reason, digest = _check_entry(tenant, prev, entry)
                    if reason is not None:
                        return VerifyResult(tenant, False, hashed, last_id, prev, entry_id, reason)
                    prev, last_id = digest, entry_id
                if len(batch) < READ_BATCH:
                    break
                start = f"({last_id}"

        expected_head = prev if last_id is not None or trimmed is not None else None
        if head != expected_head:
            return VerifyResult(tenant, False, hashed, last_id, prev, tail_id or "0-0", "head")
        return VerifyResult(tenant, True, hashed, last_id, prev)

    async def check_anchors(self, tenant: str, anchors: Sequence[tuple[str, str]]) -> VerifyResult | None:
        """None when every (stream id, hash) this process appended is still in the chain as
        written, else the failed result naming the first one missing or changed."""
        trimmed = await self._chains.trimmed(tenant)
        for stream_id, digest in anchors:
            if trimmed is not None and id_key(stream_id) <= id_key(trimmed.id):
                continue  # trimmed by retention, as the anchor of the chain says
            found = await self._chains.read(tenant, stream_id, stream_id, count=1)
            if not found or found[0][1].get(b"h") != digest.encode("ascii"):
                return VerifyResult(tenant, False, 0, None, GENESIS, stream_id, "anchor")
        return None

    async def find_by_ref_digest(self, tenant: str, digest: str) -> list[Receipt]:
        """The verified records whose `refDigest` is `digest`; ChainBroken if the chain is not whole.

        The chain is verified first (incrementally), then read from its first record up to the
        one verification reached. That pass reads every record anyway, so it rechecks each one as
        it goes: its `prev` is the hash of the record before it, and its stored hash is the
        SHA-256 of that `prev` and its bytes (about a microsecond: no JSON is parsed but the
        matches'). A record deleted, moved or rewritten before this worker's checkpoint (a
        refDigest taken out of it, to hide it from this query) is caught too.
        """
        if not is_sha256_hex(digest):
            raise ValueError("a refDigest is 64 lowercase hex characters")
        result = await self.verify(tenant)
        if not result.ok:
            raise ChainBroken(result)
        if result.last_id is None:
            return []
        needle = b'"refDigest":"' + digest.encode("ascii") + b'"'
        matches: list[Receipt] = []
        start = "-"
        trimmed = await self._chains.trimmed(tenant)
        link = (trimmed.hash if trimmed is not None else GENESIS).encode("ascii")
        while True:
            batch = await self._chains.read(tenant, start, result.last_id)
            for raw_id, entry in batch:
                raw = entry.get(b"r", b"")
                at = raw.find(_PREV_FIELD)
                stored_prev = raw[at + len(_PREV_FIELD) : at + len(_PREV_FIELD) + 64] if at >= 0 else b""
                if stored_prev != link:
                    raise ChainBroken(VerifyResult(tenant, False, 0, None, GENESIS, text(raw_id), "prev"))
                stored_hash = entry.get(b"h", b"")
                if record_hash(link.decode("ascii"), raw).encode("ascii") != stored_hash:
                    raise ChainBroken(VerifyResult(tenant, False, 0, None, GENESIS, text(raw_id), "hash"))
                link = stored_hash
                if needle not in raw:
                    continue
                try:
                    receipt = Receipt.from_stored(raw, stored_hash.decode("ascii"))
                except (ValueError, TypeError, UnicodeDecodeError):
                    bad = VerifyResult(tenant, False, 0, None, GENESIS, text(raw_id), "unparsable")
                    raise ChainBroken(bad) from None
                if receipt.ref_digest == digest:
                    matches.append(receipt)
            if len(batch) < READ_BATCH:
                return matches
            start = f"({text(batch[-1][0])}"


def _check_entry(tenant: str, prev: str, entry: Mapping[bytes, bytes]) -> tuple[BadReason | None, str]:
    """(None, hash) for a good record chained to `prev`, else (what is wrong, "")."""
    raw, stored_hash = entry.get(b"r"), entry.get(b"h")
    if raw is None or stored_hash is None or len(entry) != 2:
        return "unparsable", ""
    try:
        receipt = Receipt.from_stored(raw, stored_hash.decode("ascii"))
    except (ValueError, TypeError, UnicodeDecodeError):
        return "unparsable", ""
    if receipt.tenant != tenant:
        return "unparsable", ""
    if receipt.prev != prev:
        return "prev", ""
    if record_hash(prev, raw) != receipt.hash:
        return "hash", ""
    return None, receipt.hash


def verify_cli(
    url: str, tenant: str | None = None, *, out: TextIO | None = None, timeout: float = 5.0
) -> int:
    """`receipts verify [--tenant T]`: full walk of one chain or all; 0 whole, 1 broken, 2 error.

    Prints tenant names, counts and stream ids only.
    """
    out = out or sys.stdout

    async def run() -> int:
        try:
            client = connect(url, timeout=timeout, retries=1)
        except ValueError as exc:  # a malformed REDIS_URL: the message names no password
            print(f"receipts verify: {exc}", file=out)
            return 2
        chains = ChainRedis(client, key_prefix=DEFAULT_KEY_PREFIX, timeout=timeout)
        verifier = ChainVerifier(chains)
        try:
            known = await chains.chain_tenants()
            if tenant is not None and tenant not in known:
                print(f"receipts verify: no receipt chain for tenant {tenant!r}", file=out)
                return 2
            tenants = [tenant] if tenant is not None else sorted(known)
            if not tenants:
                print("no receipt chains", file=out)
            code = 0
            for name in tenants:
                result = await verifier.verify(name, since_checkpoint=False)
                if result.ok:
                    print(f"{name}: ok, {result.hashed} records", file=out)
                else:
                    print(f"{name}: BROKEN at {result.bad_id} ({result.reason})", file=out)
                    code = 1
            return code
        except (ReceiptError, ValueError) as exc:
            print(f"receipts verify: {exc}", file=out)
            return 2
        finally:
            await chains.aclose()

    return asyncio.run(run())
