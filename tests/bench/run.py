"""`make bench`: what the filter costs, against Envoy alone, side by side in one run (SPEC §13).

Run: `make bench`, or `.venv/bin/python -m tests.bench.run [--quick] [--soak MINUTES] [--workers N]`.
Not a test: nothing here asserts a time; it prints one table, each line with its SPEC §13 target.

The stack is started here (tests.support.harness.running_stack: real Envoy, real Redis, WORKERS ext_proc
workers) with `BENCH_LISTEN_PORT` set, so the same Envoy has a third listener with the same routes
and upstream clusters but no ext_proc filter. Every through-the-stack line sends the same request
bytes to both listeners, alternating (the order flips every repetition), and reports the median
over the repetitions with their spread (min–max); "added" is filtered − unfiltered at the same
percentile, within one repetition. The in-process lines (pipeline MB/s, SSE restore) time the
processor's own functions, without Envoy, in this one process (= one core).

Two floors beside them, on two more listeners of the same Envoy (BENCH_FLOOR4_PORT,
BENCH_FLOOR2_PORT): an ext_proc filter to the cheapest Python processor there is (tests.bench.floor,
one process), which exchanges 4 messages (bodies buffered, our shape on a JSON exchange) or 2 (headers
only) and changes nothing. The c=1 latency, c=16 throughput and time-to-first-token lines run them in
the same rotation and give the filter's added time as a multiple of each floor's; the c=16 lines
also give the CPU time per exchange of the stack's processes (/proc/PID/stat).

Load generator: `HttpConnection` (tests.bench.client), a small asyncio HTTP/1.1 client (raw
asyncio streams, keep-alive connections, request bytes built once; it reads the status line and a
content-length or chunked body, nothing else). Its ceiling is measured in the same run, against Envoy's
`/healthz` (a direct response, no upstream) and straight against the fake upstream, and printed
beside the throughput lines.

The fake upstream (tests.support.fake_upstream) runs in a child process of its own, not in this one: in
this process its threads would share the GIL with the load generator, and its request log is
capped (`max_received`) so megabyte bodies do not pile up in it.

This module keeps the command line and the order of the run; the parts: tests.bench.bodies (what is
sent), tests.bench.client (the load generator), tests.bench.stack_lines and tests.bench.in_process
(the lines), tests.bench.table (rows, targets, printing).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.policy.load import load_policy_dir
from tests.bench import extensions
from tests.bench.bodies import (
    CHAT,
    KB,
    MB,
    TINY_BODY,
    TINY_REPLY,
    Fresh,
    chat_body,
    subject_header,
    values_in,
)
from tests.bench.children import port_child
from tests.bench.client import SEQUENTIAL_ERRORS, build_request
from tests.bench.floor import floor_process
from tests.bench.in_process import pipeline, pipeline_timer, sse_restore
from tests.bench.stack_lines import (
    FLOORS,
    Bench,
    big_bodies,
    latency_8k,
    rss_1mb,
    soak,
    sse_stream,
    throughput_8k,
    time_to_first_token,
)
from tests.bench.table import Plan, Row, Section, print_table, progress
from tests.support.harness import free_port, running_stack, write_policies

# Scripts outside the repository run `from tests.bench.run import *` for these, as they did when
# everything lived in this module.
__all__ = [
    "KB",
    "MB",
    "Catalog",
    "Fresh",
    "Path",
    "chat_body",
    "compile_subjects",
    "load_policy_dir",
    "main",
    "parse_subject_header",
    "pipeline_timer",
    "subject_header",
    "tempfile",
    "write_policies",
]

# --- main -------------------------------------------------------------------------------------


# The fake upstream's child process: it prints its port, then serves until its stdin closes.
UPSTREAM_CHILD = """
import sys
from tests.support.fake_upstream import FakeUpstream
with FakeUpstream(max_received=4) as fake:
    print(fake.port, flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def upstream_process() -> Iterator[int]:
    """The fake upstream in a child process (its own GIL); yields its port."""
    with port_child(["-c", UPSTREAM_CHILD], "the fake upstream") as child:
        yield child.port


def measure(
    b: Bench, plain: Fresh, with_subjects: Fresh, conversation: Fresh, soak_minutes: float | None
) -> list[Section]:
    b.check("8 KB chat + 8 subjects", with_subjects)
    b.check("8 KB chat", plain)
    b.check("8 KB conversation + 8 subjects", conversation)
    tiny = Fresh(build_request(CHAT, TINY_BODY, TINY_REPLY))
    progress("latency at concurrency 1, 8 KB")
    latency = latency_8k(
        b,
        {
            "8 KB + 8 subjects, cold": (with_subjects, True),
            "8 KB + 8 subjects, conversation": (conversation, True),
            "tiny chat, nothing to redact (the fixed cost)": (tiny, False),
        },
    )
    progress("throughput at concurrency 16")
    throughput = throughput_8k(b, plain, with_subjects, conversation, tiny)
    soaked = []
    if soak_minutes:  # before the 1 MB bodies, whose heap growth would blur its start
        progress(f"soak, {soak_minutes:g} minutes")
        soaked = soak(b, soak_minutes, [plain, with_subjects])
    progress("1 MB bodies")
    big = big_bodies(b)
    progress("SSE through the stack")
    streams = [sse_stream(b), time_to_first_token(b)]
    progress("RSS under 1 MB bodies at concurrency 16")
    memory = [rss_1mb(b), *soaked]
    progress("in process: pipeline MB/s, SSE restore")
    return [
        ("latency, concurrency 1, 8 KB (SPEC §13 line 1)", latency),
        ("throughput, concurrency 16 (line 2)", throughput),
        ("1 MB bodies, concurrency 1, full catalog, no subjects (line 3)", big),
        ("pipeline in process, 8 subjects, 2 KB messages (line 3)", pipeline(b.plan)),
        ("streaming (line 4)", [*sse_restore(b.plan), *streams]),
        ("memory (line 6)", memory),
    ]


def measure_extensions(b: Bench, body: bytes, header: str) -> list[Section]:
    """`--extensions`: the cold and tiny lines under the plain policy and under one with 20 custom
    kinds and 1,000 deny terms (tests.bench.extensions), and the catalog alone, in process."""
    extended = extensions.auth_header()
    subjects = {**TINY_REPLY, "x-cordon-subject": header}
    cases: dict[str, tuple[bytes | Fresh, bool]] = {
        "8 KB + 8 subjects, cold, plain policy": (Fresh(build_request(CHAT, body, subjects)), True),
        "8 KB + 8 subjects, cold, 20 kinds + 1,000 deny": (
            Fresh(build_request(CHAT, body, {**subjects, **extended})),
            True,
        ),
        "8 KB, no subjects, cold, plain policy": (Fresh(build_request(CHAT, body, TINY_REPLY)), False),
        "8 KB, no subjects, cold, 20 kinds + 1,000 deny": (
            Fresh(build_request(CHAT, body, {**TINY_REPLY, **extended})),
            False,
        ),
        "tiny chat, plain policy": (Fresh(build_request(CHAT, TINY_BODY, TINY_REPLY)), False),
        "tiny chat, 20 kinds + 1,000 deny": (
            Fresh(build_request(CHAT, TINY_BODY, {**TINY_REPLY, **extended})),
            False,
        ),
    }
    for name, (request, _) in cases.items():
        if "tiny" not in name:  # the tiny body carries no value for the check to look for
            b.check(name, request)
    progress("latency at concurrency 1: plain and extended policy")
    latency = latency_8k(b, cases)
    plain, extended_ms = extensions.catalog_in_process(body, b.plan.pipeline_rounds * 20)
    in_process = [
        Row("catalog alone, 8 KB body, plain policy", "ms", plain),
        Row("catalog alone, 8 KB body, 20 kinds + 1,000 deny", "ms", extended_ms),
    ]
    return [
        ("latency, concurrency 1: plain vs extended policy", latency),
        ("in process, one core: the catalog over the 8 KB body's strings", in_process),
    ]


def find(sections: list[Section], prefix: str) -> list[Row]:
    return [row for _, rows in sections for row in rows if row.name.startswith(prefix)]


def floor_note(shapes: dict[int, int]) -> str:
    """What the floor server saw: streams by the number of messages each carried."""
    counts = ", ".join(f"{streams:,} of {messages}" for messages, streams in sorted(shapes.items()))
    return (
        "floor-4 / floor-2: the same Envoy with an ext_proc filter to a pass-through server (tests/bench/"
        "floor.py, one process) answering every message 'continue': request and reply bodies BUFFERED (4 "
        "messages, our shape on a JSON exchange; a streamed reply switched to STREAMED, as ours) or not sent "
        "(2). '×3 of floor-4 (+2.00 ms)': the filter adds 3 times what a processor of our shape adds at "
        f"least. Its streams by messages: {counts or 'none seen'}."
    )


def notes(sections: list[Section], floor_shapes: dict[int, int]) -> list[str]:
    (ceiling,) = (row.value for row in find(sections, "load generator ceiling"))
    (upstream,) = (row.value for row in find(sections, "fake upstream alone"))
    best = max(row.value for row in find(sections, "req/s c=16, WORKERS"))
    failed = [row for _, rows in sections for row in rows if row.target and not row.target.met(row.value)]
    return [
        f"load generator: this module's asyncio HTTP/1.1 client reached {ceiling:,.0f} req/s against "
        f"Envoy's /healthz, {ceiling / best:.0f}× the best filtered figure: not what limits those lines.",
        f"the unfiltered line is bounded by the fake upstream (one Python process: {upstream:,.0f} req/s "
        "alone); Envoy, the workers, Redis, the fake upstream and this client all share the machine's cores.",
        floor_note(floor_shapes),
        "1 MB lines send `x-fake-reply: ok`: the reply is tiny and only the request path is timed. With the "
        "echo ('reply echoes it') the megabyte comes back with its placeholders, and the line also times "
        "its restore (the fake upstream's encoding of it is on both sides).",
        "time to first token: its target is line 1's p99, what the request path may add; a stream the filter "
        "collapsed would show the whole first→last spread added.",
        "SSE end to end: the upstream writes one event at a time, unpaced; Envoy reads them in batches and "
        "sends the processor one message per batch, so the chunk count varies from run to run and the line "
        "is for information. The 'code only' line (SseRestorer, one event per chunk) carries the target.",
        f"MB = 2^20 bytes; Redis runs without persistence (the test harness's). {len(failed)} line(s) FAIL.",
        *(
            f"non-200 answers left out of a concurrency-1 line: port {port} answered {status}"
            f" (stage {stage}) {count} time(s)"
            for (port, status, stage), count in sorted(SEQUENTIAL_ERRORS.items())
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke run, about a minute")
    parser.add_argument("--soak", type=float, metavar="MINUTES", help="hold the 8 KB load, sampling RSS")
    parser.add_argument("--workers", type=int, default=2, help="ext_proc workers (default 2, as SPEC §13)")
    parser.add_argument(
        "--extensions",
        action="store_true",
        help="only the cold and tiny lines, plain policy vs 20 custom kinds + 1,000 deny terms",
    )
    args = parser.parse_args(argv)
    plan = Plan.for_run(args.quick)
    began = time.monotonic()
    load_average = os.getloadavg()[0]

    header = subject_header()
    body = chat_body(8 * KB, per_message=2 * KB, person=True)
    plain = Fresh(build_request(CHAT, body, TINY_REPLY))
    with_subjects = Fresh(build_request(CHAT, body, {**TINY_REPLY, "x-cordon-subject": header}))
    history = chat_body(8 * KB, per_message=2 * KB, person=True, marked="last")
    conversation = Fresh(build_request(CHAT, history, {**TINY_REPLY, "x-cordon-subject": header}))
    with (
        tempfile.TemporaryDirectory(prefix="cordon-bench-") as tmp,
        upstream_process() as upstream_port,
        floor_process() as floor,
    ):
        url = f"http://127.0.0.1:{upstream_port}"
        bench_port = free_port()
        floor_ports = {label: free_port() for label in FLOORS}
        progress(
            f"starting the stack (WORKERS={args.workers}, filter-less listener on {bench_port}, "
            + ", ".join(f"{label} on {port}" for label, port in floor_ports.items())
            + ")"
        )
        with running_stack(
            Path(tmp),
            workers=args.workers,
            LOG_LEVEL="WARNING",
            BENCH_LISTEN_PORT=str(bench_port),
            BENCH_FLOOR4_PORT=str(floor_ports["floor-4"]),
            BENCH_FLOOR2_PORT=str(floor_ports["floor-2"]),
            BENCH_FLOOR_EXTPROC_PORT=str(floor.port),
            OPENAI_UPSTREAM=url,
            ANTHROPIC_UPSTREAM=url,
            tenants={extensions.TENANT: extensions.policy_text()},
        ) as stack:
            bench = Bench(stack, plan, upstream_port, bench_port, floor, floor_ports)
            if args.extensions:
                sections = measure_extensions(bench, body, header)
            else:
                sections = measure(bench, plain, with_subjects, conversation, args.soak)

    catalog_n, person_n = values_in(body)
    print(
        f"\ncordon bench{' --quick' if args.quick else ''}, {time.strftime('%Y-%m-%d %H:%M')}: "
        f"WORKERS={args.workers}, {os.cpu_count()} cores (load average {load_average:.2f} at start), "
        f"Python {platform.python_version()}"
    )
    print(
        f"8 KB request: {len(body):,} bytes of Chat JSON, {catalog_n} catalog values + {person_n} of the "
        f"declared person's; X-Cordon-Subject: 8 subjects, {len(header):,} bytes"
    )
    print(
        f"{plan.reps} repetitions, listeners alternating; per listener and repetition: c=1 {plan.latency_n} "
        f"requests, c=16 {plan.load_seconds:g} s, 1 MB {plan.big_n} requests\n"
    )
    print_table(sections)
    if args.extensions:
        print(f"\nbench took {time.monotonic() - began:.0f} s")
        return 0
    print("\nnotes:")
    for line in notes(sections, floor.shapes):
        print(f"- {line}")
    print(f"bench took {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
