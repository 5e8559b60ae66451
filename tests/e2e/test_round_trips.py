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
while the reply headers are at the processor even goes as one). The fake upstream is therefore
told to pace its writes (`x-fake-pace-ms`): each SSE event its own write, `PACE_MS` after the last,
so Envoy reads each event on its own and the count is the same on every run. Envoy sends the end
of a chunked body as a message of its own, whether it arrives with the last event or after it
(both measured): the paced fake sends them together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.e2e import SAMPLES, Reply, chat_body, last_sent, leaked, request
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
PACE_MS = "100"  # before each of the upstream's writes: far longer than Envoy takes to read one
SETTLE_SECONDS = 2.0
FOUND = f"Mail {SAMPLES['EMAIL']}, card {SAMPLES['CREDIT_CARD']}."
NO_TENANT = "sk-test-no-tenant"  # matches no policy file: the default tenant
# Never in a request (a request header would be read and rewritten): told to the upstream in process.
REPLY_WITH_VALUE = f"Here it is: {SAMPLES['OPENAI_KEY']}"
ONE_DELTA = {"x-fake-delta-chars": "1000"}  # the whole reply text in one event
PACED = {"x-fake-pace-ms": PACE_MS}


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("round-trips"), tenants=TENANTS) as stack:
        yield stack


@pytest.fixture
def gated(paced: RunningStack) -> RunningStack:
    paced.upstream.reset()
    return paced


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
    headers = {"authorization": f"Bearer {key}", **ONE_DELTA, **PACED}
    return request(stack.settings.listen_port, "POST", "/v1/chat/completions", body, headers)


def anthropic(stack: RunningStack, text: str) -> Reply:
    body = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}
    headers = {"x-api-key": NO_TENANT, "anthropic-version": "2023-06-01", **PACED}
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


def test_chat_with_findings_restored_in_a_stream(gated: RunningStack) -> None:
    reply, delta = exchange_delta(gated, lambda: chat(gated, FOUND, stream=True))
    assert reply.status == 200 and leaked(last_sent(gated)) == []
    assert sorted(leaked(reply.body)) == ["CREDIT_CARD", "EMAIL"]
    events = [line for line in reply.body.decode().splitlines() if line.startswith("data:")]
    assert len(events) == STREAM_EVENTS, "the fake's stream has another shape"
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
