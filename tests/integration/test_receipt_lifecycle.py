"""Receipts over time, on a real Redis: retention that keeps chains verifiable, export and offline
verification, and unknown tenants that are errors, never an empty pass."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from ext_proc.audit.receipts.export import export_cli, verify_file_cli
from ext_proc.audit.receipts.record import GENESIS, ReceiptFields
from ext_proc.audit.receipts.store import ReceiptStore
from ext_proc.audit.receipts.verify import verify_cli
from tests.support.harness import redis_server


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("lifecycle")) as server:
        yield server.url


def fields(tenant: str, n: int) -> ReceiptFields:
    return ReceiptFields(
        tenant=tenant, dialect="chat", mode="reversible", decision="forwarded", counts={"EMAIL": n}
    )


def stream(tenant: str) -> str:
    return f"cordon:{{{tenant}}}:stream"


async def _steady(url: str, tenant: str, seconds: float, keep_ms: int) -> list[tuple[int, int]]:
    """Append at a steady rate for `seconds`, trimming to the last `keep_ms` every 0.2 s, and
    verify after every trim (incrementally, as a worker does). (records kept, stream bytes) per trim."""
    store = ReceiptStore.from_url(url, timeout=5.0)
    samples: list[tuple[int, int]] = []
    try:
        client = Redis.from_url(url)
        deadline = time.monotonic() + seconds
        n = 0
        next_trim = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            await store.append(fields(tenant, n))
            n += 1
            await asyncio.sleep(0.002)
            if time.monotonic() >= next_trim:
                next_trim += 0.2
                now = await store.redis_now_ms(tenant)
                await store.trim(now - keep_ms)
                result = await store.verify(tenant)
                assert result.ok, (result.reason, result.bad_id)
                samples.append((client.xlen(stream(tenant)), client.memory_usage(stream(tenant)) or 0))
        client.close()
    finally:
        await store.aclose()
    return samples


def test_a_steady_load_under_retention_stays_bounded_and_verifiable(redis_url: str) -> None:
    """A day compressed into seconds: records kept 1 s, appended for 6 s. The stream stays about a
    second of records long (bounded, not growing), every incremental verify and a fresh full walk
    pass, and the trimmed anchor counts what went."""
    samples = asyncio.run(_steady(redis_url, "retained", 6.0, keep_ms=1000))
    lengths = [length for length, _ in samples]
    assert len(samples) >= 20
    late = lengths[len(lengths) // 2 :]
    assert max(late) <= 2 * max(lengths[: len(lengths) // 4] or [1]) + 50, "the stream kept growing"
    sizes = [size for _, size in samples[len(samples) // 2 :]]
    assert max(sizes) < 3 * min(sizes) + 64 * 1024
    out = io.StringIO()
    assert verify_cli(redis_url, "retained", out=out) == 0, out.getvalue()
    with Redis.from_url(redis_url) as r:
        anchor = r.hgetall("cordon:{retained}:trimmed")
        total = int(anchor[b"count"]) + r.xlen(stream("retained"))
    assert int(anchor[b"count"]) > 0 and total > len(samples)


def test_anchors_of_trimmed_records_are_not_an_alarm(redis_url: str) -> None:
    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url, timeout=5.0)
        try:
            for i in range(5):
                await store.append(fields("trim-anchors", i))
            now = await store.redis_now_ms("trim-anchors")
            assert (await store.trim(now + 1000))["trim-anchors"] == 5  # everything, the head kept
            result = await store.verify("trim-anchors")
            assert result.ok and result.last_id is None
            await store.append(fields("trim-anchors", 99))  # chained onto the trimmed head
            assert (await store.verify("trim-anchors")).ok
        finally:
            await store.aclose()

    asyncio.run(scenario())


def _export(url: str, *args: Any) -> tuple[int, str]:
    out = io.StringIO()
    code = export_cli(url, *args, out=out)
    return code, out.getvalue()


def test_export_and_verify_file_round_trip(redis_url: str, tmp_path: Path) -> None:
    async def fill() -> None:
        store = ReceiptStore.from_url(redis_url, timeout=5.0)
        try:
            for i in range(7):
                await store.append(fields("exported", i))
            for i in range(3):
                await store.append(fields("exported-too", i))
        finally:
            await store.aclose()

    asyncio.run(fill())
    code, text = _export(redis_url)
    assert code == 0
    path = tmp_path / "all.jsonl"
    path.write_text(text)
    out = io.StringIO()
    assert verify_file_cli(str(path), out=out) == 0
    assert "exported: ok, 7 records\n" in out.getvalue() and "exported-too: ok, 3 records\n" in out.getvalue()
    first = json.loads(text.splitlines()[0])
    assert first["type"] == "chain" and first["start"] == GENESIS and first["trimmed"] is None

    # One tenant, since a time: the file vouches for what follows its first link.
    code, since = _export(redis_url, "exported", "2000-01-01T00:00:00Z")
    assert code == 0 and verify_file_cli(_write(tmp_path / "since.jsonl", since), out=io.StringIO()) == 0

    # An edited record, a dropped one, a truncated file: each named.
    lines = [json.loads(line) for line in text.splitlines()]
    records = [i for i, item in enumerate(lines) if item["type"] == "record" and item["tenant"] == "exported"]
    edited = [dict(item) for item in lines]
    edited[records[2]]["record"] = edited[records[2]]["record"].replace('"EMAIL":2', '"EMAIL":9')
    out = io.StringIO()
    assert verify_file_cli(_write(tmp_path / "edited.jsonl", _dump(edited)), out=out) == 1
    assert out.getvalue() == f"exported: BROKEN at {lines[records[2]]['id']} (hash)\n"
    dropped = [item for i, item in enumerate(lines) if i != records[3]]
    out = io.StringIO()
    assert verify_file_cli(_write(tmp_path / "dropped.jsonl", _dump(dropped)), out=out) == 1
    assert out.getvalue() == f"exported: BROKEN at {lines[records[4]]['id']} (prev)\n"
    assert verify_file_cli(_write(tmp_path / "cut.jsonl", _dump(lines[:-1])), out=io.StringIO()) == 1


def _dump(items: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_unknown_tenants_are_errors_never_an_empty_pass(redis_url: str, tmp_path: Path) -> None:
    out = io.StringIO()
    assert verify_cli(redis_url, "nosuch", out=out) == 2
    assert "no receipt chain" in out.getvalue()
    assert _export(redis_url, "nosuch")[0] == 2
    asyncio.run(_one(redis_url, "known"))
    code, text = _export(redis_url, "known")
    assert code == 0
    path = _write(tmp_path / "known.jsonl", text)
    out = io.StringIO()
    assert verify_file_cli(path, "nosuch", out=out) == 2
    assert verify_file_cli(path, "known", out=io.StringIO()) == 0
    assert verify_file_cli(str(tmp_path / "missing.jsonl"), out=io.StringIO()) == 2


async def _one(url: str, tenant: str) -> None:
    store = ReceiptStore.from_url(url, timeout=5.0)
    try:
        await store.append(fields(tenant, 1))
    finally:
        await store.aclose()
