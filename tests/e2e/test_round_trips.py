"""How many gRPC messages Envoy and the processor exchange for one HTTP exchange, read from Envoy's
own ext_proc counters (`http.plain.ext_proc.*` on its admin interface) before and after it.

Each message is a round trip Envoy waits on (about 0.45 ms on the 2-core machines this runs on),
so the counts are pinned exactly: a change that adds one to a common exchange fails here, and one
that saves one updates EXPECTED and docs/benchmarks.md ("Round trips per exchange"). Tests run one
at a time, so nothing else passes through this module's Envoy between the two reads; its health
checks of the processor are cluster traffic and move none of these counters (measured), and a
stray exchange would show as a second stream started.

A streamed reply costs one message per piece of body Envoy reads from the upstream, and how a
fast upstream's writes fall into Envoy's reads is up to TCP (a short stream that has all arrived
while the reply headers are at the processor even goes as one). The stack's upstreams therefore
sit behind `PacedUpstream`: the fake upstream's reply relayed as the whole JSON in one write, or
as its SSE events one write each, `PACE` apart, so Envoy reads each event on its own and the count
is the same on every run. Envoy sends the end of a chunked body as a message of its own, whether
it arrives with the last event or after it (both measured): the relay sends them together.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest

from tests.support.e2e import SAMPLES, Reply, chat_body, last_sent, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack, envoy_stats, running_stack
from tests.support.receipts import records

pytestmark = pytest.mark.e2e

# Messages Envoy sends to the processor in one exchange (it receives as many: one answer each).
EXPECTED: dict[str, tuple[int, str]] = {
    "chat, nothing found": (
        4,
        "request headers, request body (read for values), reply headers, reply body (the default "
        "outputGate: report reads every reply)",
    ),
    "chat, email and card, JSON reply": (
        4,
        "the same four: restoring the placeholders rides on the reply body the gate reads anyway",
    ),
    "chat, email and card, SSE reply": (
        8,
        "request headers, request body, reply headers (which switch the reply to streamed), one "
        "per event as Envoy reads it (4), and one for the end of the stream",
    ),
    "gate report, a value in the reply": (
        4,
        "the same four: the output record is a Redis write, not a message",
    ),
    "gate deny, a value in the reply": (
        4,
        "the same four: the refusal (Envoy's immediate response) answers the reply body",
    ),
    "gate off, nothing found": (
        3,
        "request headers, request body, reply headers (for X-Cordon-Receipt); nothing to restore "
        "and no gate, so the reply body is not asked for",
    ),
    "messages, email and card, JSON reply": (
        4,
        "the same four as chat: Anthropic Messages reads and restores the same way",
    ),
}
STREAM_EVENTS = 4  # the fake's chat stream of a one-delta reply: role, the text, stop, [DONE]

TENANTS = {"gate-deny": "outputGate: deny", "gate-off": "outputGate: off"}
STATS = r"^http\.plain\.ext_proc\."
PACE = 0.1  # seconds between a streamed reply's writes: far longer than Envoy takes to read one
SETTLE_SECONDS = 2.0
FOUND = f"Mail {SAMPLES['EMAIL']}, card {SAMPLES['CREDIT_CARD']}."
NO_TENANT = "sk-test-no-tenant"  # matches no policy file: the default tenant
# Never in a request (a request header would be read and rewritten): told to the upstream in process.
REPLY_WITH_VALUE = f"Here it is: {SAMPLES['OPENAI_KEY']}"
ONE_DELTA = {"x-fake-delta-chars": "1000"}  # the whole reply text in one event


class _Relay(BaseHTTPRequestHandler):
    """One Envoy connection: each request forwarded to the fake upstream, its reply written back
    in writes whose boundaries this handler chooses."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Envoy's connection pool expects
    disable_nagle_algorithm = True  # a write leaves at once, never joined to the next
    server: _PacedServer

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        forwarded = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        connection = http.client.HTTPConnection("127.0.0.1", self.server.target_port, timeout=30)
        try:
            connection.request("POST", self.path, body, forwarded)
            reply = connection.getresponse()
            data = reply.read()
            kept = [(k, v) for k, v in reply.getheaders() if k.lower() not in _HOP]
        finally:
            connection.close()
        head = [f"HTTP/1.1 {reply.status} {reply.reason}", *(f"{k}: {v}" for k, v in kept)]
        if not (reply.getheader("content-type") or "").startswith("text/event-stream"):
            head.append(f"content-length: {len(data)}")
            self.wfile.write(_head(head) + data)
            return
        self.wfile.write(_head([*head, "transfer-encoding: chunked"]))
        events = [event + b"\n\n" for event in data.split(b"\n\n") if event.strip()]
        self.server.chunks = len(events)
        for n, event in enumerate(events, start=1):
            time.sleep(PACE)
            frame = b"%x\r\n%s\r\n" % (len(event), event)
            self.wfile.write(frame + b"0\r\n\r\n" if n == len(events) else frame)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the stack's own logs say what happened."""


_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def _head(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _PacedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target_port: int) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.target_port = target_port
        self.chunks = 0  # writes of the last streamed reply's body


class PacedUpstream:
    """A relay in front of a FakeUpstream that fixes how its replies are split into writes."""

    def __init__(self, target: FakeUpstream) -> None:
        self.server = _PacedServer(target.port)
        self.thread = Thread(target=self.server.serve_forever, name="paced-upstream", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> PacedUpstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningStack, PacedUpstream]]:
    tmp = tmp_path_factory.mktemp("round-trips")
    with (
        FakeUpstream() as fake,
        PacedUpstream(fake) as relay,
        running_stack(
            tmp, upstream=fake, tenants=TENANTS, OPENAI_UPSTREAM=relay.url, ANTHROPIC_UPSTREAM=relay.url
        ) as stack,
    ):
        yield stack, relay


@pytest.fixture
def gated(paced: tuple[RunningStack, PacedUpstream]) -> RunningStack:
    running = paced[0]
    running.upstream.reset()
    return running


def ext_proc_counters(stack: RunningStack) -> dict[str, int]:
    """The plain listener's ext_proc filter counters, by their name after the prefix."""
    counters = {name.removeprefix("http.plain.ext_proc."): n for name, n in envoy_stats(stack, STATS).items()}
    assert "stream_msgs_sent" in counters, "Envoy's ext_proc counters have other names"
    return counters


def exchange_delta(stack: RunningStack, send: Callable[[], Reply]) -> tuple[Reply, dict[str, int]]:
    """The counters that moved during one exchange. Envoy may count the stream's last message and
    its close just after the client has the reply: read until they stop moving (bounded)."""
    before = ext_proc_counters(stack)
    reply = send()
    deadline = time.monotonic() + SETTLE_SECONDS
    after = ext_proc_counters(stack)
    while time.monotonic() < deadline:
        time.sleep(0.05)
        again = ext_proc_counters(stack)
        if again == after and again["streams_closed"] > before["streams_closed"]:
            break
        after = again
    return reply, {name: after[name] - before[name] for name in after if after[name] != before[name]}


def messages(n: int, **others: int) -> dict[str, int]:
    """The delta of one exchange of `n` messages each way that ended normally (plus `others`)."""
    ended = {"streams_started": 1, "streams_closed": 1}
    return {**ended, "stream_msgs_sent": n, "stream_msgs_received": n, **others}


def chat(stack: RunningStack, text: str, key: str = NO_TENANT, *, stream: bool = False) -> Reply:
    body = chat_body(text, stream=True) if stream else chat_body(text)
    headers = {"authorization": f"Bearer {key}", **ONE_DELTA}
    return request(stack.settings.listen_port, "POST", "/v1/chat/completions", body, headers)


def anthropic(stack: RunningStack, text: str) -> Reply:
    body = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}
    headers = {"x-api-key": NO_TENANT, "anthropic-version": "2023-06-01"}
    return request(stack.settings.listen_port, "POST", "/v1/messages", body, headers)


def check(shape: str, delta: dict[str, int], **others: int) -> None:
    expected, _ = EXPECTED[shape]
    assert delta == messages(expected, **others), f"{shape}: ext_proc counters moved by {delta}"


def test_chat_with_nothing_to_find(gated: RunningStack) -> None:
    reply, delta = exchange_delta(gated, lambda: chat(gated, "Say hello to the team."))
    assert reply.status == 200
    check("chat, nothing found", delta)


def test_chat_with_findings_restored_in_a_json_reply(gated: RunningStack) -> None:
    reply, delta = exchange_delta(gated, lambda: chat(gated, FOUND))
    assert reply.status == 200 and leaked(last_sent(gated)) == []
    assert sorted(leaked(reply.body)) == ["CREDIT_CARD", "EMAIL"]  # restored for the client
    check("chat, email and card, JSON reply", delta)


def test_chat_with_findings_restored_in_a_stream(
    gated: RunningStack, paced: tuple[RunningStack, PacedUpstream]
) -> None:
    reply, delta = exchange_delta(gated, lambda: chat(gated, FOUND, stream=True))
    assert reply.status == 200 and leaked(last_sent(gated)) == []
    assert sorted(leaked(reply.body)) == ["CREDIT_CARD", "EMAIL"]
    assert paced[1].server.chunks == STREAM_EVENTS, "the fake's stream has another shape"
    check("chat, email and card, SSE reply", delta)


def test_gate_report_with_a_value_in_the_reply(gated: RunningStack) -> None:
    gated.upstream.set_behaviour(reply=REPLY_WITH_VALUE)
    reply, delta = exchange_delta(gated, lambda: chat(gated, "What is the key?"))
    assert reply.status == 200
    receipt = reply.headers["x-cordon-receipt"]
    assert any(record.get("exchange") == receipt for _, record, _ in records(gated, "default"))
    check("gate report, a value in the reply", delta)


def test_gate_deny_with_a_value_in_the_reply(gated: RunningStack) -> None:
    gated.upstream.set_behaviour(reply=REPLY_WITH_VALUE)
    reply, delta = exchange_delta(gated, lambda: chat(gated, "What is the key?", KEYS["gate-deny"]))
    assert reply.status == 422 and reply.headers["x-cordon-stage"] == "output"
    check("gate deny, a value in the reply", delta, immediate_responses_sent=1)


def test_gate_off_with_nothing_to_find(gated: RunningStack) -> None:
    reply, delta = exchange_delta(gated, lambda: chat(gated, "Say hello to the team.", KEYS["gate-off"]))
    assert reply.status == 200 and "x-cordon-receipt" in reply.headers
    check("gate off, nothing found", delta)


def test_anthropic_messages_with_findings(gated: RunningStack) -> None:
    reply, delta = exchange_delta(gated, lambda: anthropic(gated, FOUND))
    assert reply.status == 200 and leaked(last_sent(gated)) == []
    assert sorted(leaked(reply.body)) == ["CREDIT_CARD", "EMAIL"]
    check("messages, email and card, JSON reply", delta)
