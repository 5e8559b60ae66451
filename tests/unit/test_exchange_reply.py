"""The reply phases, driven in-process: restore of this request's placeholders (buffered JSON and
SSE cut anywhere), placeholders of earlier requests from the vault, and the output gate.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest

from tests.support.e2e import SAMPLES
from tests.support.fakes import (
    Answer,
    EnvoyStream,
    FakeReceipts,
    FakeVault,
    chat,
    chat_reply,
    chat_stream,
    keyed,
    make_runtime,
)

EMAIL, PHONE = SAMPLES["EMAIL"], SAMPLES["PHONE"]
ACME = keyed("acme", "sk-acme")
DENY = keyed("deny", "sk-deny", output_gate="deny")
QUIET = keyed("quiet", "sk-quiet", output_gate="off")
PSEUDO = keyed("pseudo", "sk-pseudo", consistent_pseudonyms=True)
KEYS = {"acme": "sk-acme", "deny": "sk-deny", "quiet": "sk-quiet", "pseudo": "sk-pseudo"}
SSE = [("content-type", "text/event-stream")]


def redacted(
    receipts: FakeReceipts, tenant: str = "acme", text: str = f"mail {EMAIL}", vault: FakeVault | None = None
) -> tuple[EnvoyStream, str]:
    """A stream whose request was redacted and forwarded; and its placeholder nonce."""
    runtime = make_runtime(ACME, DENY, QUIET, PSEUDO, receipts=receipts, vault=vault)
    s = EnvoyStream(runtime)
    s.request_headers(headers=[("x-api-key", KEYS[tenant])])
    [answer] = s.request_body(chat(text))
    assert answer.phase == "request_body"
    assert s.exchange.context is not None
    return s, s.exchange.context.placeholders.nonce


def outputs(receipts: FakeReceipts) -> list[tuple[str | None, dict[str, int], str | None]]:
    """The output records: (stage, counts, the exchange record's hash)."""
    return [(r.stage, dict(r.counts), r.exchange) for r in receipts.receipts if r.decision == "output"]


# --- buffered JSON --------------------------------------------------------------------------------


def test_a_json_reply_is_restored() -> None:
    receipts = FakeReceipts()
    s, n = redacted(receipts)
    headers = s.response_headers()
    assert (headers.request_body_mode, headers.response_body_mode) == ("NONE", "BUFFERED")
    assert headers.headers == {"x-cordon-receipt": receipts.receipts[0].hash}
    answer = s.response_body(chat_reply(f"I will mail <EMAIL_{n}_1> today."))
    expected = chat_reply(f"I will mail {EMAIL} today.")
    assert answer.phase == "response_body" and answer.json() == expected
    assert answer.headers == {"content-length": str(len(answer.body or b""))}
    assert outputs(receipts) == []  # the gate read the model's text: a placeholder, no value


def test_a_reply_without_placeholders_goes_unchanged() -> None:
    receipts = FakeReceipts()
    s, _ = redacted(receipts)
    s.response_headers()
    answer = s.response_body(chat_reply("Done."))
    assert (answer.phase, answer.body, answer.headers) == ("response_body", None, {})


def test_another_requests_placeholder_is_not_restored() -> None:
    receipts = FakeReceipts()
    s, n = redacted(receipts)
    s.response_headers()
    other = "0" * 8 if n != "0" * 8 else "1" * 8
    answer = s.response_body(chat_reply(f"see <EMAIL_{other}_1>"))
    assert answer.body is None


def test_a_reply_with_nothing_to_restore_or_gate_is_not_read() -> None:
    receipts = FakeReceipts()
    s, _ = redacted(receipts, "quiet", text="hello")
    headers = s.response_headers()
    assert (headers.request_body_mode, headers.response_body_mode) == ("NONE", "NONE")
    assert s.exchange.reply is None


def test_a_compressed_reply_is_not_read() -> None:
    receipts = FakeReceipts()
    s, _ = redacted(receipts)
    headers = s.response_headers([("content-type", "application/json"), ("content-encoding", "gzip")])
    assert headers.response_body_mode == "NONE" and s.exchange.reply is None


# --- SSE ------------------------------------------------------------------------------------------


def sse_text(stream: bytes) -> str:
    """The content a Chat stream's events carry, joined; every event must be whole JSON."""
    text = ""
    for event in stream.decode().split("\n\n"):
        if event and event != "data: [DONE]":
            assert event.startswith("data: ")
            text += json.loads(event.removeprefix("data: "))["choices"][0]["delta"]["content"]
    return text


def _cuts(size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return sorted(rng.sample(range(1, size), k=min(size - 1, rng.randint(1, 12))))


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@pytest.mark.parametrize("how", ["whole", "bytes", "sevens", *(f"random-{seed}" for seed in range(8))])
def test_an_sse_reply_cut_anywhere_is_restored(how: str) -> None:
    receipts = FakeReceipts()
    s, n = redacted(receipts, text=f"mail {EMAIL} or call {PHONE}")
    upstream = chat_stream("Sure, I'll mail ", f"<EMAIL_{n}_1> and c", f"all <PHONE_{n}_", "1> today.")
    if how == "whole":
        chunks = [upstream]
    elif how == "bytes":
        chunks = [upstream[i : i + 1] for i in range(len(upstream))]
    elif how == "sevens":
        chunks = [upstream[i : i + 7] for i in range(0, len(upstream), 7)]
    else:
        chunks = _split(upstream, _cuts(len(upstream), int(how.split("-")[1])))
    headers = s.response_headers(SSE)
    assert headers.response_body_mode == "STREAMED" and headers.removed == ("content-length",)
    received = s.stream_reply(chunks)
    assert sse_text(received) == f"Sure, I'll mail {EMAIL} and call {PHONE} today."
    assert received.endswith(b"data: [DONE]\n\n")
    assert f"_{n}_".encode() not in received
    assert outputs(receipts) == []


# --- the vault: placeholders of earlier requests --------------------------------------------------


def test_a_pseudonym_of_an_earlier_request_is_restored_from_the_vault() -> None:
    receipts, vault = FakeReceipts(), FakeVault()
    redacted(receipts, "pseudo", vault=vault)
    [earlier] = vault.entries["pseudo"]
    later, _ = redacted(receipts, "pseudo", text="what did I send you?", vault=vault)
    later.response_headers()
    answer = later.response_body(chat_reply(f"You sent {earlier}."))
    assert answer.json() == chat_reply(f"You sent {EMAIL}.")
    assert vault.journal == ["vault.put", "vault.get"]
    metrics = later.runtime.metrics
    assert metrics.counter("cordon_vault_lookups_total", result="hit") == 1


def test_a_vault_that_fails_on_read_leaves_the_pseudonym() -> None:
    receipts, vault = FakeReceipts(), FakeVault()
    redacted(receipts, "pseudo", vault=vault)
    [earlier] = vault.entries["pseudo"]
    later, _ = redacted(receipts, "pseudo", text="what did I send you?", vault=vault)
    later.response_headers()
    vault.fail_next("get")
    answer = later.response_body(chat_reply(f"You sent {earlier}."))
    assert answer.body is None  # unchanged: the placeholder stays
    metrics = later.runtime.metrics
    assert metrics.counter("cordon_vault_unrestored_total", reason="unavailable") == 1
    assert metrics.counter("cordon_vault_errors_total", op="read") == 1


# --- the output gate ------------------------------------------------------------------------------


def test_the_gate_under_report_records_a_catalog_value_and_lets_the_reply_go() -> None:
    receipts = FakeReceipts()
    s, n = redacted(receipts)
    s.response_headers()
    answer = s.response_body(chat_reply(f"Mail <EMAIL_{n}_1> or call {PHONE}."))
    assert answer.json() == chat_reply(f"Mail {EMAIL} or call {PHONE}.")
    exchange = receipts.receipts[0]
    assert outputs(receipts) == [(None, {"PHONE": 1}, exchange.hash)]
    output = receipts.receipts[1]
    assert (output.tenant, output.dialect, output.prev) == ("acme", "chat", exchange.hash)


def test_the_gate_under_deny_turns_a_json_reply_into_the_dialects_error() -> None:
    receipts = FakeReceipts()
    s, n = redacted(receipts, "deny")
    s.response_headers()
    answer = s.response_body(chat_reply(f"Mail <EMAIL_{n}_1> or call {PHONE}."))
    exchange = receipts.receipts[0]
    assert answer.refused and answer.status == 422
    assert answer.json() == {
        "error": {
            "message": "the model's reply carried PHONE; this tenant's output gate refuses it",
            "stage": "output",
            "type": "invalid_request_error",
            "param": None,
            "code": "output_blocked",
        }
    }
    assert answer.headers == {
        "content-type": "application/json",
        "x-cordon-stage": "output",
        "x-cordon-receipt": exchange.hash,
    }
    assert outputs(receipts) == [("output", {"PHONE": 1}, exchange.hash)]
    assert s.runtime.metrics.counter("cordon_output_denied_total", dialect="chat") == 1


def test_the_gate_under_deny_ends_an_sse_stream_with_the_error_event() -> None:
    receipts = FakeReceipts()
    s, _ = redacted(receipts, "deny")
    events = [event + b"\n\n" for event in chat_stream("Sure, call ", PHONE, " today.").split(b"\n\n")[:-1]]
    assert len(events) == 4  # three deltas and [DONE]
    s.response_headers(SSE)
    answers: list[Answer] = [s.response_body(events[0], end_of_stream=False)]
    answers += [s.response_body(events[1], end_of_stream=False)]
    answers += [s.response_body(b"".join(events[2:]), end_of_stream=True)]
    # Held: under 24 new characters are not worth a decision yet (output_gate.DECIDE_CHARS);
    # then the first delta is decided and goes, while the number at the end could still grow.
    assert answers[0].body == b""
    assert answers[1].body == events[0]
    assert answers[2].body == (
        b'data: {"error":{"message":"the model\'s reply carried PHONE; this tenant\'s output gate '
        b'refuses it","stage":"output","type":"invalid_request_error","param":null,'
        b'"code":"output_blocked"}}\n\n'
    )
    # Judged once the text after it showed it whole: counted, and nothing of it left.
    assert outputs(receipts) == [("output", {"PHONE": 1}, receipts.receipts[0].hash)]


def test_an_output_record_that_cannot_be_written_is_a_gap() -> None:
    receipts = FakeReceipts()
    s, _ = redacted(receipts)
    s.response_headers()
    receipts.down = True
    answer = s.response_body(chat_reply(f"call {PHONE}"))
    assert answer.body is None  # the reply goes as the gate decided
    assert s.exchange.record.gap == "output_audit"
    assert outputs(receipts) == []
