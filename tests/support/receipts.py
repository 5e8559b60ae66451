"""Reading receipts back from the test Redis, and scanning every key of it for values."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from typing import Any

import redis

from ext_proc.audit.receipts.record import canonical_json, record_hash
from ext_proc.audit.receipts.store import ReceiptStore
from ext_proc.audit.receipts.verify import VerifyResult
from tests.support.harness import RECEIPT_SECRET, RunningStack


def client(stack: RunningStack) -> redis.Redis:
    assert stack.redis is not None
    return redis.Redis.from_url(stack.redis.url)


# ACL key patterns of the receipt chains (stream, head, turn token, per-call keys).
RECEIPT_KEY_PATTERNS = [f"~cordon:{{*}}:{part}" for part in ("stream", "head", "turn", "call:*")]


def allow_receipt_keys_only(r: redis.Redis) -> None:
    """The default user may reach the receipt keys and no other: vault and registry writes fail."""
    r.execute_command("ACL", "SETUSER", "default", "resetkeys", *RECEIPT_KEY_PATTERNS)


def stream_key(tenant: str) -> str:
    return f"cordon:{{{tenant}}}:stream"


def records(stack: RunningStack, tenant: str) -> list[tuple[str, dict[str, Any], str]]:
    """Every (stream id, record, hash) of a tenant's chain, in order."""
    with client(stack) as r:
        entries = r.xrange(stream_key(tenant))
    return [(i.decode(), json.loads(e[b"r"]), e[b"h"].decode()) for i, e in entries]


def record_for(stack: RunningStack, tenant: str, receipt: str | None) -> dict[str, Any]:
    """The record whose hash the reply's X-Cordon-Receipt named (asserts there is exactly one)."""
    assert receipt is not None and len(receipt) == 64, "the reply carries no X-Cordon-Receipt"
    found = [record for _, record, digest in records(stack, tenant) if digest == receipt]
    assert len(found) == 1, f"{len(found)} records of {tenant} carry the reply's receipt hash"
    return found[0]


def expected_ref_digest(ref: str) -> str:
    return hmac.new(RECEIPT_SECRET.encode(), ref.encode(), hashlib.sha256).hexdigest()


def verify(stack: RunningStack, tenant: str) -> VerifyResult:
    """A full walk of one chain by a fresh store (no checkpoint), as an auditor would."""
    assert stack.redis is not None

    async def run() -> VerifyResult:
        store = ReceiptStore.from_url(stack.redis.url, timeout=5.0)  # type: ignore[union-attr]
        try:
            return await store.verify(tenant, since_checkpoint=False)
        finally:
            await store.aclose()

    return asyncio.run(run())


def delete_and_rechain(r: redis.Redis, tenant: str, removed: str) -> list[str]:
    """What someone with write access to Redis can do to hide a record: delete it, and re-chain
    every later record onto the one before it (re-hashed, re-added, the head moved), so that every
    link of the chain checks again. Returns the new stream ids of the re-chained records."""
    key = stream_key(tenant)
    entries = r.xrange(key)
    ids = [i.decode() for i, _ in entries]
    at = ids.index(removed)
    prev = entries[at - 1][1][b"h"].decode() if at else "0" * 64
    later = entries[at + 1 :]
    r.xdel(key, *ids[at:])
    added: list[str] = []
    for _, entry in later:
        record = {**json.loads(entry[b"r"]), "prev": prev}
        canonical = canonical_json(record)
        prev = record_hash(prev, canonical)
        added.append(r.xadd(key, {"r": canonical, "h": prev}).decode())
    r.set(f"cordon:{{{tenant}}}:head", prev)
    return added


def everything_in_redis(stack: RunningStack) -> bytes:
    """Every key and every value of every key, whatever its type, as one blob to search."""
    parts: list[bytes] = []
    with client(stack) as r:
        for key in r.scan_iter(count=1000):
            parts.append(key)
            kind = r.type(key).decode()
            if kind == "none":
                continue  # expired since the scan listed it (a receipt call's key lives about a second)
            if kind == "string":
                parts.append(r.get(key) or b"")
            elif kind == "stream":
                for entry_id, fields in r.xrange(key):
                    parts.append(entry_id)
                    for name, value in fields.items():
                        parts += [name, value]
            elif kind == "hash":
                for name, value in r.hgetall(key).items():
                    parts += [name, value]
            elif kind in ("list",):
                parts += r.lrange(key, 0, -1)
            elif kind in ("set",):
                parts += list(r.smembers(key))
            elif kind == "zset":
                parts += [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
            else:
                raise AssertionError(f"unexpected Redis type {kind}")
    return b"\n".join(parts)
