"""The lines measured in this one process, without Envoy (= one core): the pipeline's MB/s from 8 KB
to 8 MB, piece by piece, and SseRestorer over a delta stream, with and without the output gate."""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import ALL_SETS
from ext_proc.detect.subjects.header import parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.dialects import DIALECTS, classify
from ext_proc.exchange.pipeline import find_media, redact_document
from ext_proc.exchange.reply import build_output_gate
from ext_proc.policy.load import load_policy_dir
from ext_proc.restore.restorers import Restorer
from ext_proc.restore.sse import SseRestorer
from ext_proc.transform.egress import check_body
from ext_proc.transform.placeholders import PlaceholderMap
from ext_proc.transform.walk import dump_json, parse_json
from tests.bench.bodies import CHAT, KB, MB, Fresh, chat_body, subject_header
from tests.bench.subjects import FILLER
from tests.bench.table import Plan, Row, Target, ms
from tests.support.e2e import PERSON, SAMPLES
from tests.support.harness import write_policies


def pipeline_timer() -> Callable[[bytes], list[float]]:
    """A function timing one subject request's body through the pipeline's pieces (parse,
    redact_document, dump, check_body: ext_proc.exchange.pipeline): seconds per piece, in order."""
    with tempfile.TemporaryDirectory() as tmp:
        write_policies(Path(tmp))
        policies = load_policy_dir(tmp)
    header = parse_subject_header(subject_header())
    subjects = compile_subjects(header)
    route = classify("openai", CHAT)
    assert route is not None
    policy = policies.default
    catalog = Catalog.for_sets(policy.sets, skip_documentation_ips=policy.skip_documentation_ips)

    def once(raw: bytes) -> list[float]:
        placeholders = PlaceholderMap()
        t0 = time.perf_counter()
        doc = parse_json(raw.decode("utf-8"))
        t1 = time.perf_counter()
        redaction = redact_document(
            doc,
            policy=policy,
            dialect=route.dialect,
            catalog=catalog,
            placeholders=placeholders,
            subjects=subjects,
            media=find_media(doc, route.dialect),
            counts=Counter(),
        )
        t2 = time.perf_counter()
        body = dump_json(redaction.doc)
        t3 = time.perf_counter()
        hit = check_body(body, route.dialect, subjects, nonce=placeholders.nonce)
        t4 = time.perf_counter()
        if hit is not None:
            raise SystemExit(f"bench: the egress check found {hit} in the redacted body")
        return [t1 - t0, t2 - t1, t3 - t2, t4 - t3]

    return once


def pipeline(plan: Plan) -> list[Row]:
    """Detection + redaction + egress at 8 KB … 8 MB, in this one process (= one core)."""
    once = pipeline_timer()
    once(Fresh(chat_body(8 * KB, per_message=2 * KB, person=True))())  # warm-up: catalog compiled
    r = plan.pipeline_rounds
    sizes = {
        "8 KB": (8 * KB, 10 * r),
        "64 KB": (64 * KB, 10 * r),
        "1 MB": (MB, r),
        "8 MB": (8 * MB, (r + 1) // 2),
    }
    rows, per_mb = [], {}
    for label, (size, rounds) in sizes.items():
        fresh = Fresh(chat_body(size, per_message=2 * KB, person=True))
        raw = fresh()
        timings = [once(fresh()) for _ in range(rounds)]  # every round's strings are new
        totals = [sum(t) for t in timings]
        mib = len(raw) / MB
        per_mb[label] = ms(statistics.median(totals)) / mib
        pieces = [ms(statistics.median(t[i] for t in timings)) / mib for i in range(4)]
        rows.append(
            Row(
                f"detection + redaction + egress, {label} body, 1 core",
                "MB/s",
                [mib / t for t in totals],
                Target(">=", 20, "≥ 20 MB/s"),
                f"{per_mb[label]:.1f} ms/MB = parse {pieces[0]:.1f} + redact {pieces[1]:.1f} "
                f"+ dump {pieces[2]:.1f} + egress {pieces[3]:.1f}",
            )
        )
    ratio = per_mb["8 MB"] / per_mb["64 KB"]
    rows.append(
        Row(
            "linear: ms/MB at 8 MB ÷ ms/MB at 64 KB",
            "×",
            [ratio],
            Target("<=", 1.5, "≤ 1.5"),
            "a quadratic path would show as a ratio near 128",
        )
    )
    # A conversation: the history of earlier turns resent, the last 2 KB turn new.
    fresh = Fresh(chat_body(64 * KB, per_message=2 * KB, person=True, marked="last"))
    raw = fresh()
    once(raw)
    totals = [sum(once(fresh())) for _ in range(10 * r)]
    mib = len(raw) / MB
    rows.append(
        Row(
            "detection + redaction + egress, 64 KB conversation, 1 core",
            "MB/s",
            [mib / t for t in totals],
            Target(">=", 20, "≥ 20 MB/s"),
            f"{ms(statistics.median(totals)) / mib:.1f} ms/MB; earlier turns resent, the last 2 KB new",
        )
    )
    return rows


def chat_sse(text: str, delta_chars: int) -> list[bytes]:
    """A Chat Completions stream of `text`, one event per `delta_chars` (the fake upstream's shape)."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o-mini"}

    def event(delta: dict[str, str], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"

    pieces = [text[i : i + delta_chars] for i in range(0, len(text), delta_chars)]
    return [
        event({"role": "assistant", "content": ""}),
        *(event({"content": piece}) for piece in pieces),
        event({}, "stop"),
        b"data: [DONE]\n\n",
    ]


def sse_restore(plan: Plan) -> list[Row]:
    """ext_proc.restore.sse.SseRestorer over ~1000 small delta events, one event per chunk: restore
    alone, and with the output gate reporting (the default policy) or denying (read every chunk)."""
    pmap = PlaceholderMap()
    values = [(kind, SAMPLES[kind]) for kind in ("EMAIL", "PHONE", "CREDIT_CARD")]
    values.append(("SUBJECT1_NAME", PERSON["names"][0]))
    placeholders = [pmap.placeholder_for(label, value) for label, value in values]
    rng = random.Random(5)
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < 4000:
        words += [rng.choice(FILLER) for _ in range(10)] + [placeholders[len(words) % len(placeholders)]]
    text = " ".join(words)
    expected = text
    for placeholder, (_, value) in zip(placeholders, values, strict=True):
        expected = expected.replace(placeholder, value)
    events = chat_sse(text, 4)
    catalog = Catalog.for_sets(ALL_SETS)
    rows = []
    for gated in (None, "report", "deny"):
        samples = []
        for _ in range(plan.sse_rounds):
            gate = None
            if gated is not None:
                gate = build_output_gate(catalog, Restorer(pmap), deny=gated == "deny")
            restorer = SseRestorer(Restorer(pmap), DIALECTS["chat"], gate)
            start = time.perf_counter()
            out = []
            for event in events:
                out.append(restorer.feed(event))
                if gate is not None and gate.deny and gate.check_windows():
                    raise SystemExit("bench: the output gate found a value in the placeholder stream")
            out.append(restorer.finish())
            if gate is not None:
                gate.finish_windows()
            samples.append((time.perf_counter() - start) / len(events) * 1e6)
            content = "".join(
                (json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
                for line in b"".join(out).split(b"\n")
                if line.startswith(b"data: {")
            )
            if content != expected:
                raise SystemExit("bench: SseRestorer did not restore the stream to the original text")
            if gate is not None and gate.counts():
                raise SystemExit("bench: the output gate counted a placeholder as a finding")
        rows.append(
            Row(
                f"SSE restore, {len(events)} Chat events, 1 per chunk (code only)"
                + (f", output gate {gated}" if gated else ""),
                "µs/chunk",
                samples,
                Target("<=", 50, "≤ 50 µs"),
                f"{len(placeholders)} placeholders, {text.count('<')} occurrences split across 4-char deltas"
                + ("" if gated is None else "; the gate reads every channel (deny: before each chunk goes)"),
            )
        )
    return rows
