"""Support for tests/reliability/test_reliability.py: a mixed load that carries known values, the checks on
every reply and on everything the fake upstream received, and the measurements (worker RSS and
open files, Envoy's gauges, scans of logs, metrics and Redis for any value).

The load is a closed loop of `clients` connections (keep-alive, raw asyncio HTTP/1.1: it needs
the reply headers, whole bodies and a hang guard per request, which tests/bench/client.py does
not keep). Request `n` takes shape `SHAPES[n % len(SHAPES)]`: every dialect, streamed or not, with
or without `X-Cordon-Subject`, on two tenants. Its user text carries every catalog sample, and a
subject request's text every declared value of the person too, plus the number `n`, so each
request is new text and each reply can be compared with exactly what was asked.

Nothing here prints or returns a value: checks name kinds and counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import PERSON, SAMPLES, SENTENCE, leaked
from tests.support.fake_upstream import ECHO_PREFIX, FakeUpstream, Received
from tests.support.harness import KEYS, RunningStack

PERSON_TEXT = " ".join(value for values in PERSON.values() for value in values)
REF = "reliability-case-7Q4"
SUBJECT_HEADER = encode_subject_header({"ref": REF, "subjects": [PERSON]})
DECLARED: dict[str, str] = {
    f"declared {field_name} #{i}": value
    for field_name, values in PERSON.items()
    for i, value in enumerate(values)
}
# Everything that must never be seen outside the client and its own reply: catalog samples,
# declared values, the ref, the raw subject header and the tenants' API keys.
SECRETS: dict[str, str] = {
    **SAMPLES,
    **DECLARED,
    "subject ref": REF,
    "subject header": SUBJECT_HEADER,
    **{f"api key of {tenant}": key for tenant, key in KEYS.items()},
}

DIALECTS = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
TERMINAL = {"chat": "[DONE]", "responses": "response.completed", "messages": "message_stop"}


# --- requests --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    dialect: str
    stream: bool
    subject: bool
    tenant: str  # "default" (no key) or a tenant of tests.support.harness.KEYS

    @property
    def label(self) -> str:
        return f"{self.dialect}/{'sse' if self.stream else 'json'}/{'subject' if self.subject else 'plain'}"


SHAPES: tuple[Shape, ...] = tuple(
    Shape(dialect, stream, subject, tenant)
    for tenant in ("default", "chain")
    for subject in (False, True)
    for stream in (False, True)
    for dialect in DIALECTS
)


@dataclass(frozen=True, slots=True)
class Call:
    """One request of the load. Its bytes and text stay out of its repr: a failing assertion
    names the shape and number, never a value."""

    shape: Shape
    n: int
    raw: bytes = field(repr=False)  # the whole HTTP/1.1 request
    said: str = field(repr=False)  # the user text; the echo reply is ECHO_PREFIX + said


def user_text(n: int, subject: bool) -> str:
    text = f"Request {n}. {SENTENCE}"
    return f"{text} About {PERSON_TEXT}." if subject else text


def body_for(dialect: str, said: str, stream: bool) -> dict[str, Any]:
    if dialect == "chat":
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": said}]
        return {"model": "gpt-4o-mini", "messages": messages, "stream": stream}
    if dialect == "responses":
        content = [{"type": "input_text", "text": said}]
        return {"model": "gpt-4o-mini", "input": [{"role": "user", "content": content}], "stream": stream}
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": said}],
        "stream": stream,
    }


def raw_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: localhost", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in {"content-type": "application/json", **headers}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# An agent resends its conversation every turn: every 32nd request carries ~300 KB of earlier
# turns (each with every catalog sample), past the size at which a worker reads a body in a thread.
HISTORY_EVERY = 32
HISTORY_TURNS = 40
HISTORY_TEXT = [
    f"Turn {i}: " + ("Notes on the case, nothing else to add. " * 180) + SENTENCE
    for i in range(HISTORY_TURNS)
]


def history(dialect: str) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for text in HISTORY_TEXT:
        if dialect == "responses":
            turns.append({"role": "user", "content": [{"type": "input_text", "text": text}]})
            turns.append({"role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]})
        else:
            turns += [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
    return turns


def make_call(
    n: int,
    shapes: tuple[Shape, ...] = SHAPES,
    *,
    shape: Shape | None = None,
    extra_headers: Mapping[str, str] | None = None,
) -> Call:
    """Request `n` of the load; `extra_headers` go to the fake upstream (`x-fake-*`) or Envoy."""
    shape = shape or shapes[n % len(shapes)]
    said = user_text(n, shape.subject)
    headers: dict[str, str] = {}
    key = KEYS.get(shape.tenant)
    if shape.dialect == "messages":
        headers["anthropic-version"] = "2023-06-01"
        if key:
            headers["x-api-key"] = key
    elif key:
        headers["authorization"] = f"Bearer {key}"
    if shape.subject:
        headers["x-cordon-subject"] = SUBJECT_HEADER
    if shape.stream:
        # Odd splits of the upstream's byte stream, so placeholders straddle chunks; every
        # eighth stream is slow (a write every 3 ms), so streams are in flight at any moment.
        headers["x-fake-chunk-bytes"] = str((0, 7, 61)[n % 3])
        if n % 8 == 1:
            headers["x-fake-delay-ms"] = "3"
    headers.update(extra_headers or {})
    doc = body_for(shape.dialect, said, shape.stream)
    if n % HISTORY_EVERY == 5:
        key = "input" if shape.dialect == "responses" else "messages"
        doc[key] = doc[key][:-1] + history(shape.dialect) + doc[key][-1:]
    body = json.dumps(doc).encode()
    return Call(shape, n, raw_request(PATHS[shape.dialect], body, headers), said)


# --- reading replies -------------------------------------------------------------------------


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE event in a whole stream."""
    out: list[tuple[str | None, str]] = []
    for block in body.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            out.append((name, "\n".join(data)))
    return out


def reply_text(dialect: str, stream: bool, body: bytes) -> str | None:
    """The assistant text of a whole reply in the dialect's shape; None when the shape is wrong
    or a stream did not reach its terminal event."""
    try:
        if not stream:
            doc = json.loads(body)
            if dialect == "chat":
                return str(doc["choices"][0]["message"]["content"])
            if dialect == "responses":
                parts = [
                    part["text"]
                    for item in doc["output"]
                    if item["type"] == "message"
                    for part in item["content"]
                    if part["type"] == "output_text"
                ]
                return "".join(parts)
            return "".join(block["text"] for block in doc["content"] if block["type"] == "text")
        events = sse_events(body)
        if not events:
            return None
        last = events[-1][1] if dialect == "chat" else json.loads(events[-1][1]).get("type")
        if last != TERMINAL[dialect]:
            return None
        pieces: list[str] = []
        for _, data in events:
            if data == "[DONE]":
                continue
            event = json.loads(data)
            if dialect == "chat":
                pieces += [c["delta"].get("content") or "" for c in event["choices"]]
            elif dialect == "responses":
                if event["type"] == "response.output_text.delta":
                    pieces.append(event["delta"])
                elif event["type"] == "response.completed":
                    final = reply_text("responses", False, json.dumps(event["response"]).encode())
                    if final != "".join(pieces):
                        return None  # the deltas and the final object disagree
            elif event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
                pieces.append(event["delta"]["text"])
        return "".join(pieces)
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def error_stage(body: bytes) -> str | None:
    """The `stage` of a refusal in either dialect's error shape (None when it is not one)."""
    try:
        error = json.loads(body)["error"]
        return str(error["stage"]) if isinstance(error, dict) and "stage" in error else None
    except (ValueError, KeyError, TypeError):
        return None


# --- the client ------------------------------------------------------------------------------


@dataclass(slots=True)
class Answer:
    status: int
    headers: dict[str, str] = field(repr=False)
    body: bytes = field(repr=False)  # a restored reply holds the values: never in a repr


class Broken(Exception):
    """The connection failed or closed before the whole reply was read."""


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise Broken("not an HTTP/1.x status line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class Connection:
    """One keep-alive HTTP/1.1 connection to Envoy. Any failure closes it; the next send opens a
    fresh one (a request is never sent twice)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None

    async def send(self, raw: bytes) -> Answer:
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 22)
        reader, writer = self.reader, self.writer
        try:
            writer.write(raw)
            await writer.drain()
            status, headers = parse_head(await reader.readuntil(b"\r\n\r\n"))
            body = bytearray()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":
                            pass
                        break
                    body += await reader.readexactly(size)
                    await reader.readexactly(2)
            elif "content-length" in headers:
                body += await reader.readexactly(int(headers["content-length"]))
            else:
                body += await reader.read()
                headers["connection"] = "close"
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError) as exc:
            self.close()
            raise Broken(type(exc).__name__) from None
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Answer(status, headers, bytes(body))


# --- outcomes of a load ----------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    """What became of one call (its shape and number, not its bytes: a long run keeps many)."""

    shape: Shape
    n: int
    history: bool  # the call carried the long history
    started: float  # time.monotonic()
    ended: float
    # ok | refused (an HTTP error status) | broken (the connection failed mid-reply) | hang (no
    # reply within the guard) | incomplete (200, not the dialect's whole shape) | wrong (200,
    # whole, not the restored echo)
    kind: str
    status: int | None = None
    stage: str | None = None
    receipt: str | None = None


def judge(call: Call, answer: Answer) -> tuple[str, str | None]:
    """(kind, stage) of one answer: a 200 must carry exactly the restored echo, whole."""
    if answer.status != 200:
        return "refused", error_stage(answer.body)
    text = reply_text(call.shape.dialect, call.shape.stream, answer.body)
    if text is None:
        return "incomplete", None
    return ("ok" if text == ECHO_PREFIX + call.said else "wrong"), None


async def one_call(connection: Connection, call: Call, timeout: float) -> Outcome:
    started = time.monotonic()
    history = call.n % HISTORY_EVERY == 5
    try:
        answer = await asyncio.wait_for(connection.send(call.raw), timeout)
    except Broken:
        return Outcome(call.shape, call.n, history, started, time.monotonic(), "broken")
    except TimeoutError:
        connection.close()
        return Outcome(call.shape, call.n, history, started, time.monotonic(), "hang")
    kind, stage = judge(call, answer)
    if kind != "ok":
        connection.close()  # a fresh connection after any error: Envoy may be closing this one
    receipt = answer.headers.get("x-cordon-receipt")
    ended = time.monotonic()
    return Outcome(call.shape, call.n, history, started, ended, kind, answer.status, stage, receipt)


@dataclass
class Load:
    outcomes: list[Outcome]
    seconds: float

    def kinds(self) -> Counter[str]:
        return Counter(o.kind for o in self.outcomes)

    def by(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]


async def closed_loop(
    port: int,
    seconds: float,
    *,
    clients: int = 16,
    shapes: tuple[Shape, ...] = SHAPES,
    first: int = 0,
    timeout: float = 30.0,
    until: asyncio.Event | None = None,
    extra_headers: Mapping[str, str] | None = None,
) -> Load:
    """`clients` connections, each sending the next call as soon as its reply is in, for
    `seconds` (and, when `until` is given, at least until it is set)."""
    outcomes: list[Outcome] = []
    counter = iter(range(first, 1 << 62))
    start = time.monotonic()
    end = start + seconds

    def more() -> bool:
        return time.monotonic() < end or (until is not None and not until.is_set())

    async def client() -> None:
        connection = Connection(port)
        try:
            while more():
                call = make_call(next(counter), shapes, extra_headers=extra_headers)
                outcomes.append(await one_call(connection, call, timeout))
        finally:
            connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return Load(outcomes, time.monotonic() - start)


# --- what the upstream received --------------------------------------------------------------


def declared_in(text: str) -> list[str]:
    """Labels of the declared values present in `text`, raw or JSON-escaped (never the values)."""
    found = []
    for label, value in DECLARED.items():
        escaped = json.dumps(value)[1:-1]
        if value in text or escaped in text or value.casefold() in text.casefold():
            found.append(label)
    return found


@dataclass
class UpstreamAudit:
    """Every request the fake upstream received, checked as it is drained (so a long run keeps
    no bodies): what leaked (kinds only), whether the filter's header went through, and whether
    the body was whole JSON (never half of one)."""

    received: int = 0
    leaks: Counter[str] = field(default_factory=Counter)
    subject_headers: int = 0
    not_whole_json: int = 0
    redacted: int = 0  # bodies that carry this proxy's placeholders

    def check(self, records: Iterable[Received]) -> None:
        for record in records:
            self.received += 1
            text = record.text()
            for kind in leaked(record.body) + declared_in(text):
                self.leaks[kind] += 1
            if "x-cordon-subject" in record.headers:
                self.subject_headers += 1
            try:
                json.loads(record.body)
            except ValueError:
                self.not_whole_json += 1
            if "<EMAIL_" in text:
                self.redacted += 1

    def drain(self, upstream: FakeUpstream) -> None:
        self.check(upstream.take())


class Drainer:
    """Drains the fake upstream into an UpstreamAudit every half second, in a thread."""

    def __init__(self, upstream: FakeUpstream, audit: UpstreamAudit) -> None:
        self.upstream, self.audit = upstream, audit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="upstream-audit", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.audit.drain(self.upstream)

    def __enter__(self) -> UpstreamAudit:
        self._thread.start()
        return self.audit

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.audit.drain(self.upstream)


# --- the processes ---------------------------------------------------------------------------


def ready_file(stack: RunningStack, index: int) -> Path:
    return stack.settings.run_dir / "extproc" / f"worker-{index}.ready"


def worker_pids(stack: RunningStack) -> dict[int, int]:
    """index → pid of every worker that reports ready."""
    pids = {}
    for index in range(stack.settings.workers):
        try:
            pids[index] = int(ready_file(stack, index).read_text())
        except (OSError, ValueError):
            continue
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class RssSampler:
    """Samples every ready worker's VmRSS every `interval` seconds, in a thread."""

    def __init__(self, stack: RunningStack, interval: float = 0.5) -> None:
        self.stack = stack
        self.interval = interval
        self.samples: list[tuple[float, dict[int, int]]] = []  # (monotonic time, pid → KiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def _run(self) -> None:
        while True:
            now = time.monotonic()
            row = {}
            for pid in worker_pids(self.stack).values():
                value = rss_kib(pid)
                if value is not None:
                    row[pid] = value
            self.samples.append((now, row))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def series(self, pid: int, since: float = 0.0) -> list[tuple[float, int]]:
        return [(t, row[pid]) for t, row in self.samples if pid in row and t >= since]


def slope_kib_per_minute(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, KiB) points, in KiB per minute."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return 60.0 * cov / var if var else 0.0


# --- Envoy and the metrics endpoint ------------------------------------------------------------


def scrape(stack: RunningStack) -> str:
    url = f"http://127.0.0.1:{stack.settings.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        data: bytes = reply.read()
    return data.decode()


def series_value(text: str, series: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series + " "))


def exchange_log(stack: RunningStack) -> list[dict[str, Any]]:
    out = []
    path = stack.settings.run_dir / "logs" / "ext_proc.log"
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "exchange":
                out.append(record)
    return out


def wait_for(predicate: Any, timeout: float = 15.0, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


# --- looking for values anywhere ---------------------------------------------------------------


def _rendering_pattern(value: str) -> re.Pattern[str]:
    """The value read separator-blind and case-blind, as a whole token: its letters and digits in
    order with up to three non-alphanumeric characters between any two, and no letter or digit
    right before or after (so it cannot match inside a longer hash or number by chance)."""
    core = [c for c in fold(value) if c.isalnum()]
    body = r"[^0-9a-z]{0,3}".join(re.escape(c) for c in core)
    return re.compile(rf"(?<![0-9a-z]){body}(?![0-9a-z])")


PATTERNS: dict[str, re.Pattern[str]] = {label: _rendering_pattern(v) for label, v in SECRETS.items()}


def values_in(data: bytes | str) -> list[str]:
    """Labels of the secrets found in `data` in any rendering: raw, JSON-escaped, or written with
    other separators and case (never the values)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    folded = fold(text)
    found = []
    for label, value in SECRETS.items():
        if value in text or json.dumps(value)[1:-1] in text or PATTERNS[label].search(folded):
            found.append(label)
    return found


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())
