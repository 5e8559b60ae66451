"""Receipts out of Redis and checked offline: `receipts export` and `receipts verify --file`.

Where this sits: beside the flow, for auditors and a SIEM. `export` writes each chain (or one, or
its records since a time) as JSON lines, exactly as stored: every record's canonical bytes and its
hash, so `verify --file` can recompute every link without Redis. The lines of one chain:

    {"type": "chain", "tenant": T, "start": <prev of its first exported record>,
     "trimmed": {"id", "hash", "count"} | null}
    {"type": "record", "tenant": T, "id": <stream id>, "hash": H, "record": <canonical JSON text>}
    ...
    {"type": "end", "tenant": T, "records": N, "head": <hash of the last record>}

`start` is GENESIS for a whole chain, the anchor's hash for one trimmed by retention, and the
first record's own `prev` for an export `--since` a time (the file then vouches for what follows
that link, not for what came before it).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

from ext_proc.audit.receipts.chain import DEFAULT_KEY_PREFIX, READ_BATCH, ChainRedis, ReceiptError, text
from ext_proc.audit.receipts.record import GENESIS, Receipt, is_sha256_hex, record_hash
from ext_proc.storage.redis_client import connect

_PREV_FIELD = '"prev":"'


def since_ms(value: str) -> int:
    """An RFC 3339 time or a date (UTC when no offset is given) in milliseconds since the epoch."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def _line(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def _stored_prev(record: str) -> str:
    at = record.find(_PREV_FIELD)
    return record[at + len(_PREV_FIELD) : at + len(_PREV_FIELD) + 64] if at >= 0 else ""


async def export_chain(chains: ChainRedis, tenant: str, since: int | None) -> list[str]:
    """The JSON lines of one chain (from `since`, ms, when given), as stored."""
    trimmed = await chains.trimmed(tenant)
    start = f"{since}-0" if since is not None else "-"
    lines: list[str] = []
    first_prev: str | None = None
    head = trimmed.hash if trimmed is not None else GENESIS
    count = 0
    while True:
        batch = await chains.read(tenant, start, "+")
        for raw_id, entry in batch:
            record = entry.get(b"r", b"").decode("utf-8", "replace")
            digest = text(entry.get(b"h", b""))
            if first_prev is None:
                first_prev = _stored_prev(record)
            lines.append(
                _line(
                    {"type": "record", "tenant": tenant, "id": text(raw_id), "hash": digest, "record": record}
                )
            )
            head = digest
            count += 1
        if len(batch) < READ_BATCH:
            break
        start = f"({text(batch[-1][0])}"
    origin = trimmed.hash if trimmed is not None else GENESIS
    anchor = {"id": trimmed.id, "hash": trimmed.hash, "count": trimmed.count} if trimmed is not None else None
    start_hash = (first_prev or head) if since is not None else origin  # nothing since: the head
    header = {"type": "chain", "tenant": tenant, "start": start_hash, "trimmed": anchor}
    return [_line(header), *lines, _line({"type": "end", "tenant": tenant, "records": count, "head": head})]


def export_cli(
    url: str,
    tenant: str | None = None,
    since: str | None = None,
    *,
    out: TextIO | None = None,
    timeout: float = 5.0,
) -> int:
    """`receipts export [--tenant T] [--since TIME]`: JSON lines on `out`; 0 done, 2 error (an
    unknown tenant, a bad time, Redis unreadable). Messages name tenants only."""
    out = out or sys.stdout
    errors = sys.stderr if out is sys.stdout else out
    try:
        start_ms = since_ms(since) if since is not None else None
    except ValueError:
        print("receipts export: --since is not an RFC 3339 time or a date", file=errors)
        return 2

    async def run() -> int:
        try:
            client = connect(url, timeout=timeout, retries=1)
        except ValueError as exc:  # a malformed REDIS_URL: the message names no password
            print(f"receipts export: {exc}", file=errors)
            return 2
        chains = ChainRedis(client, key_prefix=DEFAULT_KEY_PREFIX, timeout=timeout)
        try:
            known = await chains.chain_tenants()
            if tenant is not None and tenant not in known:
                print(f"receipts export: no receipt chain for tenant {tenant!r}", file=errors)
                return 2
            for name in [tenant] if tenant is not None else sorted(known):
                for line in await export_chain(chains, name, start_ms):
                    print(line, file=out)
            return 0
        except (ReceiptError, ValueError) as exc:
            print(f"receipts export: {exc}", file=errors)
            return 2
        finally:
            await chains.aclose()

    return asyncio.run(run())


class _Broken(Exception):
    def __init__(self, tenant: str, at: str, reason: str) -> None:
        self.tenant, self.at, self.reason = tenant, at, reason


def _chains_of(lines: Iterable[str]) -> Iterator[tuple[str, str, list[dict[str, Any]], dict[str, Any]]]:
    """(tenant, start, records, end) per chain of an export file; _Broken when it is malformed."""
    current: tuple[str, str, list[dict[str, Any]]] | None = None
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
            kind, name = item["type"], item["tenant"]
        except (ValueError, KeyError, TypeError):
            raise _Broken("?", f"line {number}", "unparsable") from None
        if kind == "chain":
            if current is not None or not is_sha256_hex(str(item.get("start"))):
                raise _Broken(name, f"line {number}", "unparsable")
            current = (name, item["start"], [])
        elif kind == "record" and current is not None and current[0] == name:
            current[2].append(item)
        elif kind == "end" and current is not None and current[0] == name:
            yield current[0], current[1], current[2], item
            current = None
        else:
            raise _Broken(name, f"line {number}", "unparsable")
    if current is not None:
        raise _Broken(current[0], "end of file", "unparsable")


def _check_chain(tenant: str, start: str, records: list[dict[str, Any]], end: dict[str, Any]) -> int:
    prev = start
    for item in records:
        stream_id = str(item.get("id"))
        record, digest = item.get("record"), item.get("hash")
        if not isinstance(record, str) or not isinstance(digest, str):
            raise _Broken(tenant, stream_id, "unparsable")
        try:
            receipt = Receipt.from_stored(record.encode("utf-8"), digest)
        except (ValueError, TypeError, UnicodeDecodeError):
            raise _Broken(tenant, stream_id, "unparsable") from None
        if receipt.tenant != tenant:
            raise _Broken(tenant, stream_id, "unparsable")
        if receipt.prev != prev:
            raise _Broken(tenant, stream_id, "prev")
        if record_hash(prev, record.encode("utf-8")) != digest:
            raise _Broken(tenant, stream_id, "hash")
        prev = digest
    if end.get("records") != len(records) or end.get("head") != prev:
        raise _Broken(tenant, "end", "head")
    return len(records)


def verify_file_cli(path: str, tenant: str | None = None, *, out: TextIO | None = None) -> int:
    """`receipts verify --file F [--tenant T]`: every chain of an export rechecked offline; 0 whole,
    1 naming the first bad record (or line) and why, 2 when the file cannot be read or the tenant
    is not in it."""
    out = out or sys.stdout
    try:
        with open(path, encoding="utf-8") as source:
            lines = source.read().splitlines()
    except (OSError, UnicodeDecodeError):
        print(f"receipts verify: cannot read {path}", file=out)
        return 2
    seen: list[str] = []
    try:
        for name, start, records, end in _chains_of(lines):
            if tenant is not None and name != tenant:
                continue
            seen.append(name)
            print(f"{name}: ok, {_check_chain(name, start, records, end)} records", file=out)
    except _Broken as broken:
        print(f"{broken.tenant}: BROKEN at {broken.at} ({broken.reason})", file=out)
        return 1
    if not seen:
        what = f"tenant {tenant!r}" if tenant is not None else "any chain"
        print(f"receipts verify: the file holds no receipt chain of {what}", file=out)
        return 2
    return 0
