"""The output gate end to end (SPEC §15, issue 7 part 3): real Envoy, ext_proc, Redis and the fake
upstream, told (in-process, `set_behaviour(reply=…)`) to answer with a secret that was never in the
request: a request header would be read and rewritten like any other.

The default tenant reports: the reply is unchanged and a receipt of its own (decision `output`,
`exchange` = the exchange's receipt) counts the distinct values by kind. `gate-deny` refuses: a
JSON reply becomes the dialect's error (422, stage `output`), a stream ends with the dialect's
error event. `gate-off` reads nothing. A value cut into 3-character deltas and 7-byte writes is
still seen; this request's own placeholders never count.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.support.e2e import SAMPLES, request
from tests.support.harness import KEYS, RunningStack, running_stack
from tests.support.receipts import records

pytestmark = pytest.mark.e2e

TENANTS = {
    "gate-deny": "outputGate: deny",
    "gate-off": "outputGate: off",
    "gate-pii": "outputSets: [pii]",  # reads replies with the pii set only (the tenant redacts all three)
}
DIALECTS = ("chat", "responses", "messages")
SECRET = {"OPENAI_KEY": SAMPLES["OPENAI_KEY"], "EMAIL": SAMPLES["EMAIL"]}
REPLY = f"Sure. The key is {SECRET['OPENAI_KEY']} and the contact {SECRET['EMAIL']}; again {SECRET['EMAIL']}."


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("gate"), tenants=TENANTS) as stack:
        yield stack


def call(
    stack: RunningStack,
    dialect: str,
    tenant: str,
    text: str,
    *,
    stream: bool,
    reply: str | None = REPLY,
    split: bool = False,
) -> tuple[int, dict[str, str], bytes]:
    key = KEYS[tenant] if tenant != "default" else "sk-test-no-tenant"
    headers = {"x-fake-delta-chars": "3", "x-fake-chunk-bytes": "7"} if split else {}
    stack.upstream.set_behaviour(reply=reply)
    if dialect == "messages":
        path = "/v1/messages"
        body: dict[str, Any] = {
            "model": "claude-x",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": text}],
        }
        headers["x-api-key"] = key
    else:
        path = "/v1/chat/completions" if dialect == "chat" else "/v1/responses"
        body = {"model": "gpt-x", "messages": [{"role": "user", "content": text}]}
        if dialect == "responses":
            body = {"model": "gpt-x", "input": text}
        headers["authorization"] = f"Bearer {key}"
    if stream:
        body["stream"] = True
    reply_ = request(stack.settings.listen_port, "POST", path, body, headers)
    return reply_.status, reply_.headers, reply_.body


def output_record(stack: RunningStack, tenant: str, receipt: str) -> dict[str, Any] | None:
    """The output record that follows the exchange whose receipt is `receipt` (None if there is none)."""
    found = [record for _, record, _ in records(stack, tenant) if record.get("exchange") == receipt]
    assert len(found) <= 1
    return found[0] if found else None


def text_of(body: bytes) -> str:
    """Everything the client got, with JSON string escapes undone (SSE deltas joined roughly)."""
    return body.decode("utf-8")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_report_counts_distinct_values_and_leaves_the_reply_alone(
    gated: RunningStack, dialect: str, stream: bool
) -> None:
    status, headers, body = call(gated, dialect, "default", "What is the key?", stream=stream)
    assert status == 200
    if not stream:
        assert REPLY in json.dumps(json.loads(body))  # unchanged: report never alters a reply
    record = output_record(gated, "default", headers["x-cordon-receipt"])
    assert record is not None
    assert record["decision"] == "output" and "stage" not in record
    assert record["counts"] == {"EMAIL": 1, "OPENAI_KEY": 1}  # distinct values: the email twice is one


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_value_split_across_deltas_and_writes_is_counted(gated: RunningStack, dialect: str) -> None:
    status, headers, _ = call(gated, dialect, "default", "What is the key?", stream=True, split=True)
    assert status == 200
    record = output_record(gated, "default", headers["x-cordon-receipt"])
    assert record is not None and record["counts"] == {"EMAIL": 1, "OPENAI_KEY": 1}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_this_requests_placeholders_are_never_findings(
    gated: RunningStack, dialect: str, stream: bool
) -> None:
    """The echo sends the request's placeholders back: restored for the client, never counted."""
    text = f"My mail is {SECRET['EMAIL']} and my key {SECRET['OPENAI_KEY']}."
    status, headers, body = call(gated, dialect, "default", text, stream=stream, reply=None, split=stream)
    assert status == 200
    assert SECRET["EMAIL"] in body.decode() or stream  # restored (a stream carries it in deltas)
    assert output_record(gated, "default", headers["x-cordon-receipt"]) is None


@pytest.mark.parametrize("dialect", DIALECTS)
def test_deny_turns_a_json_reply_into_the_dialect_error(gated: RunningStack, dialect: str) -> None:
    status, headers, body = call(gated, dialect, "gate-deny", "What is the key?", stream=False)
    assert status == 422 and headers["x-cordon-stage"] == "output"
    error = json.loads(body)["error"]
    assert error["stage"] == "output" and "OPENAI_KEY" in error["message"]
    for value in SECRET.values():
        assert value not in body.decode()
    record = output_record(gated, "gate-deny", headers["x-cordon-receipt"])
    assert record is not None and record["stage"] == "output"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_deny_ends_a_stream_with_the_dialect_error_event(gated: RunningStack, dialect: str) -> None:
    status, headers, body = call(gated, dialect, "gate-deny", "What is the key?", stream=True, split=True)
    assert status == 200  # the stream had started
    text = body.decode()
    assert SECRET["OPENAI_KEY"] not in text and SECRET["EMAIL"] not in text
    last = [event for event in text.split("\n\n") if event.strip()][-1]
    assert '"stage":"output"' in last
    if dialect != "chat":
        assert last.startswith("event: error")
    record = output_record(gated, "gate-deny", headers["x-cordon-receipt"])
    assert record is not None and record["stage"] == "output"


def test_deny_raises_in_the_official_sdks(gated: RunningStack) -> None:
    base = f"http://127.0.0.1:{gated.settings.listen_port}"
    gated.upstream.set_behaviour(reply=REPLY)
    headers: dict[str, str] = {}
    oai = openai.OpenAI(
        base_url=base + "/v1", api_key=KEYS["gate-deny"], max_retries=0, default_headers=headers
    )
    with pytest.raises(openai.UnprocessableEntityError):
        oai.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "key?"}])
    with pytest.raises(openai.APIError):
        for _ in oai.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "key?"}], stream=True
        ):
            pass
    claude = anthropic.Anthropic(
        base_url=base, api_key=KEYS["gate-deny"], max_retries=0, default_headers=headers
    )
    with pytest.raises(anthropic.APIStatusError):
        claude.messages.create(
            model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "key?"}]
        )
    with (
        pytest.raises(anthropic.APIStatusError),
        claude.messages.stream(
            model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "k"}]
        ) as s,
    ):
        for _ in s:
            pass


@pytest.mark.parametrize("stream", [False, True])
def test_off_reads_nothing(gated: RunningStack, stream: bool) -> None:
    status, headers, _ = call(gated, "chat", "gate-off", "What is the key?", stream=stream)
    assert status == 200
    assert output_record(gated, "gate-off", headers["x-cordon-receipt"]) is None


def test_output_sets_choose_what_the_gate_reads(gated: RunningStack) -> None:
    status, headers, _ = call(gated, "chat", "gate-pii", "What is the key?", stream=False)
    assert status == 200
    record = output_record(gated, "gate-pii", headers["x-cordon-receipt"])
    assert record is not None and record["counts"] == {"EMAIL": 1}  # the key is not in the pii set
