"""The output gate over streams cut anywhere: random model output holding catalog values, written
in each dialect's stream shape, split into deltas of 1-7 characters across events, blocks, parts
and channels, framed with any SSE line ending, ended normally, without the terminal event or
without the last blank line, and handed over in chunks of 1-7 bytes, through the whole reply
phase in-process (ext_proc.exchange.reply with ext_proc.restore.sse).

Under `outputGate: deny` the stream ends with the error event and nothing recognisable reaches the
client before it: no value, and no prefix of one beyond what docs/output-gate.md says may leave
(the two letters of an IBAN's country); the catalog finds nothing in what arrived. Under `report`
the stream arrives whole and the output record counts each distinct value exactly once.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import ALL_SETS
from tests.support.examples import example_count
from tests.support.fakes import EnvoyStream, FakeReceipts, chat, keyed, make_runtime
from tests.support.streams import ENDINGS, LINE_ENDINGS, Script, client_texts, released, script


def _luhn(body: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(body)):
        digit = int(ch) * (2 if i % 2 == 0 else 1)
        total += digit - 9 if digit > 9 else digit
    return body + str((10 - total % 10) % 10)


_CARD = _luhn("453201511283036")
# Invented values, one per kind, each read as exactly one finding of its kind.
VALUES: dict[str, str] = {
    "EMAIL": "orla.brennick@example.net",
    "CREDIT_CARD": " ".join(_CARD[i : i + 4] for i in range(0, 16, 4)),
    "AWS_ACCESS_KEY": "AKIAW4RQX7ZP2LK9VN3M",
    "OPENAI_KEY": "sk-proj-" + "Qm7Tn2Vx9Lp4Rk8Wz3Hs6Jd1Fc5Gb0Ye7Ua2Xi9",
    "GITHUB_TOKEN": "ghp_" + "R7t2Lm9Qx4Vn8Kp3Zw6Hs1Jd5Fc0Gb7Ye2Ua9Xi",
    "IBAN": "GB33 BUKB 2020 1555 5555 55",
    "PHONE": "+1 415-555-0178",
}
# How much of a value may reach the client before the error event (docs/output-gate.md).
MAY_LEAVE = {"IBAN": 2}
FILLER = ("please", "note", "the", "value", "below", "and", "keep", "it", "safe", "thanks", "ok")

# Each dialect's joined channels: the channel names a text of it is written to, in turn (a
# value cut between two of them is joined by the SDK: blocks, parts), and its JSON channels.
TEXT_CHANNELS = {
    "chat": [["content"], ["reasoning_content"], ["refusal"], ["audio"]],
    "completions": [["text"]],
    "responses": [["text:0", "text:1", "text:2"], ["summary:0", "summary:1"], ["transcript"], ["code"]],
    "messages": [["text:0", "text:1", "text:2"], ["thinking:5", "thinking:6"]],
}
JSON_CHANNELS = {
    "chat": ["tool:0", "function_call"],
    "completions": [],
    "responses": ["args:0"],
    "messages": ["json:8"],
}

DENY = keyed("deny", "sk-deny", output_gate="deny")
REPORT = keyed("report", "sk-report")
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
CATALOG = Catalog.for_sets(ALL_SETS)


def build(dialect: str, kinds: list[str], rng: random.Random) -> tuple[Script, dict[str, int]]:
    """A script holding the values of `kinds` in random channels of `dialect`, cut into 1-7
    character pieces (a joined channel moving to its next block or part at a random cut); and
    the distinct values per kind it holds."""
    pieces: Script = []
    placed: dict[str, int] = {}
    reached: dict[str, int] = {}  # per joined channel group, the block or part it has reached
    for kind in kinds:
        value = VALUES[kind]
        placed[kind] = 1
        words = [rng.choice(FILLER) for _ in range(rng.randint(0, 6))]
        text = " ".join([*words, value, *[rng.choice(FILLER) for _ in range(rng.randint(0, 3))]]) + " "
        use_json = JSON_CHANNELS[dialect] and rng.random() < 0.3
        if use_json:
            channels = [rng.choice(JSON_CHANNELS[dialect])]
            text = json.dumps({"note": text}, ensure_ascii=rng.random() < 0.5)
        else:
            channels = rng.choice(TEXT_CHANNELS[dialect])
        # A block or part never reopens: a later value starts in the one the group has reached.
        at, turn = 0, reached.get(channels[0], 0)
        while at < len(text):
            size = rng.randint(1, 7)
            channel = channels[min(turn, len(channels) - 1)]
            pieces.append((channel, text[at : at + size]))
            at += size
            if len(channels) > 1 and rng.random() < 0.15:
                turn += 1
        reached[channels[0]] = min(turn, len(channels) - 1)
        if use_json:
            break  # one tool call per script: its JSON stays one document
    return _ordered(dialect, pieces), placed


def _ordered(dialect: str, pieces: Script) -> Script:
    """Blocks and parts in the order the APIs send them (a block never reopens)."""
    if dialect not in ("messages", "responses"):
        return pieces
    order: list[str] = []
    for channel, _ in pieces:
        if channel not in order:
            order.append(channel)
    return [(channel, text) for name in order for channel, text in pieces if channel == name]


def chunks(data: bytes, rng: random.Random) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        size = rng.randint(1, 7)
        out.append(data[at : at + size])
        at += size
    return out


def run(policy_key: str, dialect: str, raw: bytes, rng: random.Random) -> tuple[bytes, FakeReceipts]:
    """The reply phase of one exchange: the request, then `raw` in 1-7 byte chunks."""
    receipts = FakeReceipts()
    stream = EnvoyStream(make_runtime(DENY, REPORT, receipts=receipts))
    header = "x-api-key" if dialect == "messages" else "authorization"
    value = policy_key if dialect == "messages" else f"Bearer {policy_key}"
    stream.request_headers(
        PATHS[dialect], headers=[(header, value)], route="anthropic" if dialect == "messages" else "openai"
    )
    stream.request_body(chat("hello"))
    return stream.stream_reply(chunks(raw, rng)), receipts


def output_counts(receipts: FakeReceipts) -> dict[str, int]:
    found = [dict(r.counts) for r in receipts.receipts if r.decision == "output"]
    return found[0] if found else {}


CASES: dict[str, Any] = {
    "dialect": st.sampled_from(sorted(PATHS)),
    "kinds": st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=2, unique=True),
    "newline": st.sampled_from(LINE_ENDINGS),
    "ending": st.sampled_from(ENDINGS),
    "seed": st.integers(0, 2**32 - 1),
}


def assert_refused_before_any_value(dialect: str, kinds: list[str], pieces: Script, body: bytes) -> None:
    """The stream the client got ends with the error event, no more of each value than
    MAY_LEAVE reached it, and none of its channels holds a catalog value."""
    texts, errored = client_texts(body)
    assert errored, "the stream did not end with the error event"
    for kind in kinds:
        assert released(dialect, pieces, texts, VALUES[kind]) <= MAY_LEAVE.get(kind, 0), (
            f"{kind}: a prefix left"
        )
    for channel, text in texts.items():
        found = [f.kind for f in CATALOG.detect(text)]
        assert not found, f"{channel}: the client got {found}"


def check_deny(dialect: str, kinds: list[str], newline: str, ending: str, seed: int) -> None:
    rng = random.Random(seed)
    pieces, _ = build(dialect, kinds, rng)
    body, _ = run("sk-deny", dialect, script(dialect, pieces, newline=newline, ending=ending), rng)
    assert_refused_before_any_value(dialect, kinds, pieces, body)


def check_report(dialect: str, kinds: list[str], newline: str, ending: str, seed: int) -> None:
    rng = random.Random(seed)
    pieces, placed = build(dialect, kinds, rng)
    body, receipts = run("sk-report", dialect, script(dialect, pieces, newline=newline, ending=ending), rng)
    _, errored = client_texts(body)
    assert not errored
    assert output_counts(receipts) == placed


@settings(max_examples=example_count(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CASES)
def test_deny_lets_nothing_recognisable_out(
    dialect: str, kinds: list[str], newline: str, ending: str, seed: int
) -> None:
    check_deny(dialect, kinds, newline, ending, seed)


@settings(max_examples=example_count(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CASES)
def test_report_counts_each_value_once(
    dialect: str, kinds: list[str], newline: str, ending: str, seed: int
) -> None:
    check_report(dialect, kinds, newline, ending, seed)


@pytest.mark.slow
@settings(max_examples=example_count(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CASES)
def test_deny_lets_nothing_recognisable_out_many(
    dialect: str, kinds: list[str], newline: str, ending: str, seed: int
) -> None:
    check_deny(dialect, kinds, newline, ending, seed)


@pytest.mark.slow
@settings(max_examples=example_count(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CASES)
def test_report_counts_each_value_once_many(
    dialect: str, kinds: list[str], newline: str, ending: str, seed: int
) -> None:
    check_report(dialect, kinds, newline, ending, seed)


# --- single cases: a stream that goes on after its end, and padding between a value's groups ---


@pytest.mark.parametrize("dialect", sorted(PATHS))
def test_text_after_the_streams_end_is_refused_under_deny(dialect: str) -> None:
    """A value cut by the stream's end marker (`[DONE]`, `message_stop`, `response.completed`)
    and going on after it: what came before is judged at the end, what comes after refuses."""
    channel = TEXT_CHANNELS[dialect][0][0]
    card = VALUES["CREDIT_CARD"]
    first, rest = f"card {card[:12]}", f"{card[12:]} end "
    raw = script(dialect, [(channel, first)]) + script(dialect, [(channel, rest)])
    body, _ = run("sk-deny", dialect, raw, random.Random(1))
    texts, errored = client_texts(body)
    assert errored, "the stream went on after its end without an error event"
    for name, text in texts.items():
        assert not CATALOG.detect(text), f"{name}: the client got a value"


# (value, where it is cut, what goes between): invisible characters, or a run of spaces where the
# value has a space (a card's groups).
PADDED = [
    ("EMAIL", VALUES["EMAIL"].index("@"), "\u200b" * 600),
    ("EMAIL", VALUES["EMAIL"].index("@"), "\u00ad" * 300 + "\u2060" * 300),
    ("CREDIT_CARD", 4, " " * 700),
    ("CREDIT_CARD", 4, "\u200b" * 600),
]


def check_padding(dialect: str, case: int) -> None:
    kind, cut, padding = PADDED[case]
    channel = TEXT_CHANNELS[dialect][0][0]
    value = VALUES[kind]
    text = f"write to {value[:cut]}{padding}{value[cut:]} today "
    pieces = [(channel, text[i : i + 7]) for i in range(0, len(text), 7)]
    body, _ = run("sk-deny", dialect, script(dialect, pieces), random.Random(2))
    texts, errored = client_texts(body)
    assert errored, f"the padded {kind} passed the gate"
    for name, text in texts.items():
        assert not CATALOG.detect(text), f"{name}: the client got a value"
        assert value[:cut] not in text, f"{name}: the first part left before the error"


@pytest.mark.parametrize("case", [0, 2])
def test_invisible_padding_inside_a_value_does_not_push_it_out_of_the_window(case: int) -> None:
    """Invisible characters or a run of spaces between a value's parts count for nothing: the
    value is still read whole, however long the padding, and its first part is held. (Each case
    in one dialect here, every dialect in `make test-slow`.)"""
    check_padding(sorted(PATHS)[case % len(PATHS)], case)


@pytest.mark.slow
@pytest.mark.parametrize("dialect", sorted(PATHS))
@pytest.mark.parametrize("case", range(len(PADDED)))
def test_invisible_padding_in_every_dialect(dialect: str, case: int) -> None:
    check_padding(dialect, case)


def test_chat_content_sent_as_a_list_of_parts_is_read_across_events() -> None:
    """No Chat stream sends `delta.content` as a list, but an upstream may: its parts' text is
    read as one channel across events like any value the gate has no schema for."""
    card = VALUES["CREDIT_CARD"]
    text = f"card {card} end"
    base = {"id": "chatcmpl-l1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}
    events = []
    for i in range(0, len(text), 5):
        delta = {"content": [{"type": "text", "text": text[i : i + 5]}]}
        events.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    raw = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    body, _ = run("sk-deny", "chat", raw.encode(), random.Random(3))
    _, errored = client_texts(body)
    assert errored, "the card passed in list-shaped content"
    parts = "".join(
        part.get("text", "")
        for line in body.decode().splitlines()
        if line.startswith("data: {")
        for choice in json.loads(line[6:]).get("choices", [])
        for part in (choice.get("delta", {}).get("content") or [])
        if isinstance(part, dict)
    )
    assert not CATALOG.detect(parts), "the client got the card"


def test_a_byte_order_mark_before_the_first_event_hides_nothing() -> None:
    """The SSE format strips a byte order mark before the first field (a browser's EventSource
    reads that event): the first event, text and all, is read like the others."""
    text = f"card {VALUES['CREDIT_CARD']} end "
    pieces = [("content", text[:19]), ("content", text[19:])]  # most of the card first
    raw = script("chat", pieces)
    raw = raw[raw.index(b"\n\n") + 2 :]  # the stream starts with a text delta
    body, _ = run("sk-deny", "chat", b"\xef\xbb\xbf" + raw, random.Random(4))
    texts, errored = client_texts(body.removeprefix(b"\xef\xbb\xbf"))
    assert errored, "a stream starting with a byte order mark passed the card"
    for name, got in texts.items():
        assert not CATALOG.detect(got), f"{name}: the client got a value"


def test_a_responses_delta_type_without_a_schema_is_read_across_events() -> None:
    card = VALUES["CREDIT_CARD"]
    text = f"card {card} end"
    events = [{"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}]
    for i in range(0, len(text), 6):
        events.append(
            {
                "type": "response.future_text.delta",
                "item_id": "it_1",
                "output_index": 0,
                "delta": text[i : i + 6],
            }
        )
    events.append({"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}})
    raw = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
    body, _ = run("sk-deny", "responses", raw, random.Random(5))
    _, errored = client_texts(body)
    assert errored, "a card split over deltas of an unknown type passed"
    sent = "".join(
        json.loads(line[6:]).get("delta", "")
        for line in body.decode().splitlines()
        if line.startswith("data: {") and '"delta"' in line
    )
    assert not CATALOG.detect(sent), "the client got the card"
