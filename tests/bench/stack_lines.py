"""The lines measured through the running stack: latency at concurrency 1, throughput at 16, 1 MB
bodies, SSE and time to first token, each against Envoy alone and the floors; and the workers'
memory (peak RSS, soak) and the stack's CPU time, read from /proc."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench.bodies import CHAT, KB, MB, TINY_REPLY, Fresh, chat_body, next_request, prose
from tests.bench.client import Load, build_request, closed_loop, get, post, send, sequential
from tests.bench.floor import FloorServer
from tests.bench.table import Plan, Row, Target, ms, percentile
from tests.support.e2e import SAMPLES, leaked
from tests.support.harness import RunningStack

# The reference points beside the filter: Envoy without any filter, and the floors (tests.bench.floor).
FLOORS = ("floor-4", "floor-2")


@dataclass
class Bench:
    stack: RunningStack
    plan: Plan
    upstream_port: int
    bench_port: int
    floor: FloorServer
    floor_ports: dict[str, int]  # FLOORS label → listener

    @property
    def filtered(self) -> int:
        return self.stack.settings.listen_port

    def pair(self, rep: int) -> list[tuple[str, int]]:
        """Both listeners, in an order that flips every repetition."""
        both = [("filtered", self.filtered), ("unfiltered", self.bench_port)]
        return both if rep % 2 == 0 else both[::-1]

    def four(self, rep: int) -> list[tuple[str, int]]:
        """The filtered and unfiltered listeners and the floors, in an order that turns every repetition."""
        every = [*self.pair(0), *((label, self.floor_ports[label]) for label in FLOORS)]
        return every[rep % len(every) :] + every[: rep % len(every)]

    def pids(self) -> list[int]:
        """Every process a request through Envoy may cost CPU in, but the fake upstream and this one:
        Envoy, the ext_proc supervisor and its workers, Redis, the floor server."""
        services = [service.process.pid for service in self.stack.stack.services]
        redis = self.stack.redis.process if self.stack.redis is not None else None
        return [*services, *worker_pids(self.stack), *([redis.pid] if redis else []), self.floor.pid]

    def run(self, coro: Any) -> Any:
        return asyncio.run(coro)

    # --- checks before timing anything

    def received(self) -> list[dict[str, Any]]:
        reply = self.run(get(self.upstream_port, "/_fake/received"))
        return list(json.loads(reply.body))

    def check(self, name: str, source: bytes | Fresh) -> None:
        """One request per listener: all 200; the filtered one reached the upstream redacted, the
        unfiltered one and the floors untouched, so the lines below time what they claim to."""
        for label, port in self.four(0):
            self.run(post(self.upstream_port, "/_fake/clear"))
            reply = self.run(send(port, next_request(source), keep=True))
            if reply.status != 200:
                raise SystemExit(
                    f"bench: {name} on the {label} listener answered {reply.status}: {reply.body[:300]!r}"
                )
            (seen,) = self.received()
            leaks = leaked(seen["body"])
            if label == "filtered" and leaks:
                raise SystemExit(f"bench: {name}: the upstream saw {leaks} through the filter")
            if label != "filtered" and not leaks:
                raise SystemExit(f"bench: {name}: the {label} listener changed the body")


def latency_8k(b: Bench, cases: dict[str, tuple[bytes | Fresh, bool]]) -> list[Row]:
    """Concurrency 1, one keep-alive connection per listener; added = filtered − unfiltered, and
    each floor's own added time beside it. `cases`: name → (request, whether SPEC §13's line-1
    target applies)."""
    rows = []
    for case, (request, targeted) in cases.items():
        for _, port in b.four(0):
            b.run(sequential(port, request, 30))  # warm-up: connections, caches, the subject compile
        seen: dict[tuple[str, float], list[float]] = {}  # (listener, quantile) → ms, one per repetition
        for rep in range(b.plan.reps):
            got = {label: b.run(sequential(port, request, b.plan.latency_n)) for label, port in b.four(rep)}
            for q in (0.5, 0.99):
                for label, samples in got.items():
                    seen.setdefault((label, q), []).append(ms(percentile(samples, q)))
        for q, name, limit in ((0.5, "p50", 1.0), (0.99, "p99", 3.0)):
            at = {label: seen[label, q] for label in ("filtered", "unfiltered", *FLOORS)}
            rows.append(
                Row(
                    f"added latency c=1, {case}, {name}",
                    "ms",
                    added(at["filtered"], at["unfiltered"]),
                    Target("<=", limit, f"≤ {limit:g} ms") if targeted else None,
                    against_floors(at),
                    signed=True,
                )
            )
    return rows


def added(listener: list[float], alone: list[float]) -> list[float]:
    """What a listener adds to Envoy alone, per repetition (both measured in the same one)."""
    return [x - u for x, u in zip(listener, alone, strict=True)]


def against_floors(at: dict[str, list[float]]) -> str:
    """The filtered time against Envoy alone (a ratio of the times), then its added time as a
    multiple of each floor's: 'filtered 9.1 / Envoy alone 2.0 ms (×4.6); ×3.1 of floor-4 (+2.30
    ms), ×4.5 of floor-2 (+1.60 ms)'. `at`: listener → ms per repetition."""
    f, u = statistics.median(at["filtered"]), statistics.median(at["unfiltered"])
    mine = statistics.median(added(at["filtered"], at["unfiltered"]))
    parts = []
    for label in FLOORS:
        theirs = statistics.median(added(at[label], at["unfiltered"]))
        times = f"×{mine / theirs:.1f}" if theirs > 0.01 else "× n/a"  # a floor lost in the noise
        parts.append(f"{times} of {label} ({theirs:+.2f} ms)")
    return f"filtered {f:.2f} / Envoy alone {u:.2f} ms (×{f / u:.1f}); " + ", ".join(parts)


def throughput_8k(
    b: Bench, plain: Fresh, with_subjects: Fresh, conversation: Fresh, tiny: Fresh
) -> list[Row]:
    """Concurrency 16 for a fixed time per line; the client's own ceiling measured beside (shorter).
    Each through-Envoy line's CPU per exchange: the stack's processes (Bench.pids), before and after;
    each filtered line's cores used by the workers (their CPU time over the line's wall time)."""
    c, workers = 16, b.stack.settings.workers
    healthz = build_request("/healthz", b"", method="GET")
    target = Target(">=", 1500, "≥ 1,500 req/s")
    tiny_target = Target(">=", 1300, "≥ 1,300 req/s")
    tiny_line = f"req/s c={c}, WORKERS={workers}, tiny chat"
    tiny_alone = f"req/s c={c}, tiny chat, unfiltered listener"
    tiny_floors = {label: f"req/s c={c}, tiny chat, {label} listener" for label in FLOORS}
    alone = f"req/s c={c}, 8 KB chat, unfiltered listener"
    floors = {label: f"req/s c={c}, 8 KB chat, {label} listener" for label in FLOORS}
    cases: dict[str, tuple[int, bytes | Fresh, float, Target | None]] = {
        f"req/s c={c}, WORKERS={workers}, 8 KB chat, no subjects": (b.filtered, plain, 1.0, target),
        f"req/s c={c}, WORKERS={workers}, 8 KB chat + 8 subjects": (b.filtered, with_subjects, 1.0, target),
        f"req/s c={c}, WORKERS={workers}, 8 KB + 8 subjects, conversation": (
            b.filtered,
            conversation,
            1.0,
            target,
        ),
        tiny_line: (b.filtered, tiny, 1.0, tiny_target),
        tiny_alone: (b.bench_port, tiny, 1.0, None),
        **{name: (b.floor_ports[label], tiny, 1.0, None) for label, name in tiny_floors.items()},
        alone: (b.bench_port, plain, 1.0, None),
        **{name: (b.floor_ports[label], plain, 1.0, None) for label, name in floors.items()},
        "load generator ceiling: Envoy /healthz, no upstream": (b.bench_port, healthz, 0.4, None),
        "fake upstream alone (no Envoy), 8 KB chat": (b.upstream_port, plain, 0.4, None),
    }  # name: (port, request, share of the plan's seconds, target)
    for port, request, _, _ in cases.values():
        b.run(closed_loop(port, [request], c, 0.5))  # warm-up
    loads: dict[str, list[Load]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}  # ms per exchange
    cores: dict[str, list[float]] = {name: [] for name in cases}  # the workers' CPU s per second
    pids = b.pids()
    workers_pids = worker_pids(b.stack)
    names = list(cases)
    for rep in range(b.plan.reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            port, request, share, _ = cases[name]
            before, before_workers = cpu_seconds(pids), cpu_seconds(workers_pids)
            load = b.run(closed_loop(port, [request], c, b.plan.load_seconds * share))
            cpu[name].append(ms(cpu_seconds(pids) - before) / max(load.done, 1))
            cores[name].append((cpu_seconds(workers_pids) - before_workers) / load.seconds)
            loads[name].append(load)
    rate = {name: statistics.median(load.rate for load in loads[name]) for name in cases}
    rows = []
    for name, (port, _, _, line_target) in cases.items():
        p50 = statistics.median(ms(percentile(load.latencies, 0.5)) for load in loads[name])
        failed = sum(load.failed for load in loads[name])
        detail = f"p50 {p50:.1f} ms" + (f"; {failed} failed" if failed else "")
        if port == b.filtered:
            # Against Envoy alone and the floors with the same request.
            same_alone, same_floors = (tiny_alone, tiny_floors) if name == tiny_line else (alone, floors)
            shares = [f"{rate[name] / rate[same_alone]:.0%} of Envoy alone's req/s"]
            shares += [f"{rate[name] / rate[same_floors[label]]:.0%} of {label}'s" for label in FLOORS]
            detail += "; " + ", ".join(shares) + f"; workers used {statistics.median(cores[name]):.2f} cores"
        rows.append(Row(name, "req/s", [load.rate for load in loads[name]], line_target, detail))
    mine, floor4 = cpu[names[0]], cpu[floors["floor-4"]]
    others = ", ".join(f"{label} {statistics.median(cpu[name]):.2f}" for label, name in floors.items())
    rows += [
        Row(
            f"CPU/exchange c={c}, 8 KB chat, no subjects: filtered",
            "ms",
            mine,
            None,
            f"×{statistics.median(mine) / statistics.median(floor4):.1f} of floor-4's; {others}, "
            f"Envoy alone {statistics.median(cpu[alone]):.2f} ms",
        ),
        Row(
            f"CPU/exchange c={c}, 8 KB chat: floor-4",
            "ms",
            floor4,
            None,
            "all processes but the fake upstream and the client: Envoy, ext_proc supervisor and "
            "workers, Redis, the floor server",
        ),
    ]
    return rows


def big_bodies(b: Bench) -> list[Row]:
    """1 MB request bodies at concurrency 1, the reply kept tiny; one line with the echo on."""
    many = chat_body(MB, per_message=KB)
    one = chat_body(MB, per_message=MB)
    cases = {
        "added latency, 1 MB over many messages": (Fresh(build_request(CHAT, many, TINY_REPLY)), 50.0),
        "added latency, 1 MB in one field": (Fresh(build_request(CHAT, one, TINY_REPLY)), 50.0),
        "added latency, 1 MB in one field, reply echoes it": (Fresh(build_request(CHAT, one)), None),
    }
    rows = []
    for name, (request, limit) in cases.items():
        for _, port in b.four(0):
            b.run(sequential(port, request, 2))  # warm-up: the workers' heaps grow here
        at: dict[str, list[float]] = {}
        for rep in range(b.plan.reps):
            for label, port in b.four(rep):
                at.setdefault(label, []).append(
                    ms(statistics.median(b.run(sequential(port, request, b.plan.big_n))))
                )
        target = Target("<=", limit, f"≤ {limit:g} ms") if limit is not None else None
        rows.append(
            Row(name, "ms", added(at["filtered"], at["unfiltered"]), target, against_floors(at), signed=True)
        )
    return rows


def sse_stream(b: Bench) -> Row:
    """A ~1000-event Chat stream end to end; the upstream echoes placeholders, so restore works."""
    text = prose(4000, seed=99, person=False)
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": text}]}
    request = build_request(CHAT, json.dumps(body).encode(), {"x-fake-delta-chars": "4"})
    for _, port in b.pair(0):
        b.run(_timed_stream(port, request))
    added: list[float] = []
    chunks: dict[str, list[int]] = {"filtered": [], "unfiltered": []}
    events = 0  # as the upstream sent them (counted on the unfiltered listener)
    for rep in range(b.plan.reps):
        took = {}
        for label, port in b.pair(rep):
            runs = [b.run(_timed_stream(port, request)) for _ in range(3)]
            took[label] = statistics.median(r.seconds for r in runs)
            chunks[label] += [r.chunks for r in runs]
            if label == "unfiltered":
                events = runs[0].events
            elif SAMPLES["EMAIL"] not in runs[0].content or "<EMAIL_" in runs[0].content:
                raise SystemExit("bench: the filtered SSE reply was not restored")
        added.append((took["filtered"] - took["unfiltered"]) * 1e6 / events)
    return Row(
        f"SSE {events} events end to end: added per event",
        "µs",
        added,
        None,
        f"Envoy passed them on in ~{statistics.median(chunks['filtered']):.0f} chunks filtered, "
        f"~{statistics.median(chunks['unfiltered']):.0f} unfiltered",
        signed=True,
    )


def time_to_first_token(b: Bench) -> Row:
    """A short streamed reply, tokens 10 ms apart, with a placeholder in it: the restore path is on."""
    question = f"Please write to {SAMPLES['EMAIL']} about order 1042 and confirm the refund today."
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": question}]}
    spaced = {"x-fake-delta-chars": "8", "x-fake-delay-ms": "10"}
    request = build_request(CHAT, json.dumps(body).encode(), spaced)
    first: dict[str, list[float]] = {}
    spread: dict[str, list[float]] = {}
    for rep in range(b.plan.reps):
        for label, port in b.four(rep):
            runs = [b.run(_timed_stream(port, request)) for _ in range(b.plan.ttft_n)]
            first.setdefault(label, []).append(ms(statistics.median(r.first for r in runs)))
            spread.setdefault(label, []).append(ms(statistics.median(r.last - r.first for r in runs)))
    spreads = " / ".join(
        f"{statistics.median(spread[label]):.0f}" for label in ("filtered", "unfiltered", "floor-4")
    )
    return Row(
        "time to first token, added (tokens 10 ms apart)",
        "ms",
        added(first["filtered"], first["unfiltered"]),
        Target("<=", 3.0, "≤ 3 ms (line 1)"),
        f"{against_floors(first)}; first→last token {spreads} ms (filtered / Envoy alone / floor-4)",
        signed=True,
    )


@dataclass(slots=True)
class Streamed:
    seconds: float  # the whole reply
    first: float  # to the first data line with content
    last: float  # to the last one
    events: int
    chunks: int
    content: str


async def _timed_stream(port: int, request: bytes) -> Streamed:
    start = time.perf_counter()
    pending = bytearray()
    first = last = 0.0
    parts: list[str] = []
    chunks = events = 0

    def on_body(data: bytes) -> None:
        nonlocal first, last, chunks, events
        now = time.perf_counter() - start
        chunks += 1
        pending.extend(data)
        *lines, rest = bytes(pending).split(b"\n")
        pending[:] = rest
        for line in lines:
            if not line.startswith(b"data: {"):
                continue
            events += 1
            choices = json.loads(line[6:]).get("choices") or [{}]
            content = (choices[0].get("delta") or {}).get("content")
            if content:
                parts.append(content)
                first = first or now
                last = now

    reply = await send(port, request, on_body=on_body)
    if reply.status != 200:
        raise SystemExit(f"bench: a streamed request on port {port} answered {reply.status}")
    return Streamed(time.perf_counter() - start, first, last, events, chunks, "".join(parts))


# --- memory and CPU ---------------------------------------------------------------------------


def worker_pids(stack: RunningStack) -> list[int]:
    """The ext_proc workers, from the pid each writes into RUN_DIR/extproc/worker-N.ready."""
    return [int(p.read_text()) for p in sorted((stack.settings.run_dir / "extproc").glob("worker-*.ready"))]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes `pids` have used so far (all their threads), in s."""
    ticks = 0
    for pid in pids:
        # After the command name (which may hold spaces), utime and stime are the 12th and 13th fields.
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # a worker restarted: its time is lost, the line's figure a little low
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def status_mib(pids: list[int], name: str) -> float:
    """Sum over `pids` of one /proc/PID/status field (VmRSS, VmHWM), in MiB."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                total += int(line.split()[1])  # kB
    return total / 1024


async def _sampled(stack: RunningStack, load: Any, every: float) -> tuple[Load, list[tuple[float, float]]]:
    """Run `load` while sampling the workers' summed VmRSS every `every` seconds."""
    pids = worker_pids(stack)
    samples: list[tuple[float, float]] = []
    start = time.perf_counter()
    task = asyncio.ensure_future(load)
    while not task.done():
        samples.append((time.perf_counter() - start, status_mib(pids, "VmRSS")))
        await asyncio.wait({task}, timeout=every)
    return task.result(), samples


def rss_1mb(b: Bench) -> Row:
    pids = worker_pids(b.stack)
    idle = status_mib(pids, "VmRSS")
    requests: list[bytes | Fresh] = [
        Fresh(build_request(CHAT, chat_body(MB, per_message=KB), TINY_REPLY)),
        Fresh(build_request(CHAT, chat_body(MB, per_message=MB), TINY_REPLY)),
    ]
    load, samples = b.run(_sampled(b.stack, closed_loop(b.filtered, requests, 16, b.plan.rss_seconds), 0.2))
    peak = status_mib(pids, "VmHWM")
    # The same load through floor-4: what a Python ext_proc that reads nothing holds (one process).
    b.run(closed_loop(b.floor_ports["floor-4"], requests, 16, b.plan.rss_seconds))
    floor = status_mib([b.floor.pid], "VmHWM")
    return Row(
        f"peak RSS of {len(pids)} workers, 1 MB bodies at c=16, {b.plan.rss_seconds:g} s",
        "MiB",
        [peak],
        Target("<=", 200, "≤ 200 MiB"),
        f"sum of VmHWM; sampled VmRSS max {max(s for _, s in samples):.0f}, idle before {idle:.0f} MiB; "
        f"{load.done} requests ({load.rate:.1f}/s)"
        + (f", {load.failed} failed" if load.failed else "")
        + f"; per worker ×{peak / len(pids) / floor:.1f} of the floor server's {floor:.0f} MiB, same load",
    )


def soak(b: Bench, minutes: float, requests: list[bytes | Fresh]) -> list[Row]:
    load, samples = b.run(_sampled(b.stack, closed_loop(b.filtered, requests, 16, minutes * 60), 10.0))
    values = [mib for _, mib in samples]
    settled = [(t, mib) for t, mib in samples if t >= 60] or samples
    slope = 0.0
    if len(settled) >= 2:
        slope = statistics.linear_regression([t / 60 for t, _ in settled], [m for _, m in settled]).slope
    detail = f"first {values[0]:.0f}, last {values[-1]:.0f}, max {max(values):.0f} MiB; {load.done} requests"
    if load.failed:
        detail += f", {load.failed} failed"
    return [
        Row(
            f"soak {minutes:g} min, 8 KB at c=16: RSS max",
            "MiB",
            [max(values)],
            Target("<=", 200, "≤ 200 MiB"),
            detail,
        ),
        Row(
            "soak: RSS slope after the first minute",
            "MiB/min",
            [slope],
            Target("<=", 1.0, "≤ 1 MiB/min"),
            f"{len(samples)} samples, 10 s apart",
            signed=True,
        ),
    ]
