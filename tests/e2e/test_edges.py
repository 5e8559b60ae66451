"""What leaves outside the body, credentials, reportOnly and the common-word guard, end to end.

Through real Envoy, ext_proc workers and Redis, with the official SDKs and raw HTTP, in the three
APIs: header values and the query string rewritten (what the upstream receives), what redaction
cannot take there refused before the upstream is called (`Host`, a `content-type` parameter, a
path segment), look-alikes of the filter's own headers and credentials it cannot read refused 400,
a reportOnly tenant's subject request forwarded byte for byte with its verdict in the receipt, and
a common word declared as a name never matched alone.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import unquote_plus

import anthropic
import openai
import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import Reply, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack
from tests.support.receipts import record_for

pytestmark = pytest.mark.e2e

APIS = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
# Invented values: a catalog email, and a person declared in X-Cordon-Subject.
EMAIL = "tobias.wren@example.net"
OTHER_EMAIL = "odile.fairbank@example.org"
PERSON = {
    "names": ["Ottilie Brannigan-Shaw"],
    "emails": ["obshaw@example.org"],
    "handles": ["ottiebs42"],
    "ids": ["QZ7730185"],
}
DECLARED = encode_subject_header({"ref": "edges-1", "subjects": [PERSON]})
# What must not reach the upstream of the person above, as letters and digits (case folded).
CORES = ("ottilie", "branniganshaw", "obshawexampleorg", "ottiebs42", "qz7730185")


def port(stack: RunningStack) -> int:
    return stack.settings.listen_port


def body_for(api: str, text: str) -> dict[str, Any]:
    if api == "chat":
        return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}
    if api == "responses":
        return {"model": "gpt-4.1", "input": text}
    return {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


def send(
    stack: RunningStack,
    api: str,
    text: str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    *,
    path: str | None = None,
    tenant: str | None = None,
) -> Reply:
    """Raw HTTP: `text` as the API's request, with `headers` (and the tenant's key when given)."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    if tenant is not None:
        pairs.append(("authorization", f"Bearer {KEYS[tenant]}"))
    return request(port(stack), "POST", path or PATHS[api], body_for(api, text), pairs)


def sdk_call(stack: RunningStack, api: str, text: str, headers: dict[str, str], query: dict[str, str]) -> str:
    """One request with the official SDK of the API; the reply's text."""
    if api == "messages":
        client = anthropic.Anthropic(
            base_url=stack.base_url, api_key="sk-ant-edges", max_retries=0, timeout=20
        )
        message = client.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=64,
            messages=[{"role": "user", "content": text}],
            extra_headers=headers,
            extra_query=query,
        )
        return "".join(block.text for block in message.content if block.type == "text")
    oa = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="sk-edges", max_retries=0, timeout=20)
    if api == "chat":
        reply = oa.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": text}],
            extra_headers=headers,
            extra_query=query,
        )
        return reply.choices[0].message.content or ""
    response = oa.responses.create(model="gpt-4.1", input=text, extra_headers=headers, extra_query=query)
    return response.output_text


def cores_in(text: str) -> list[str]:
    """Which declared cores are readable in `text` (percent-decoded), as labels of this module."""
    alnum = "".join(c for c in unquote_plus(text).lower() if c.isalnum())
    return [core for core in CORES if core in alnum]


def refused(reply: Reply, upstream: FakeUpstream, status: int, code: str | None = None) -> dict[str, Any]:
    """The refusal's error object, once it is `status` and the upstream was never called."""
    assert reply.status == status, reply.status
    assert upstream.received == [], "the upstream was called"
    error = reply.json()["error"]
    assert isinstance(error, dict)
    if code is not None:
        assert error["code"] == code
    return error


# --- header values and the query string -----------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_header_values_and_the_query_are_rewritten_with_the_sdk(
    stack: RunningStack, upstream: FakeUpstream, api: str
) -> None:
    headers = {"x-user-email": f"on behalf of {EMAIL}", "x-agent": "planner/2.1"}
    text = sdk_call(stack, api, "hello there", headers, {"notify": OTHER_EMAIL})
    assert text.endswith("hello there")
    [received] = upstream.received
    sent = json.dumps(received.headers) + unquote_plus(received.path)
    assert EMAIL not in sent and OTHER_EMAIL not in sent, "a header or query email reached the upstream"
    assert received.headers["x-user-email"].startswith("on behalf of <EMAIL_")
    assert "%3CEMAIL_" in received.path
    assert received.headers["x-agent"] == "planner/2.1"
    assert "authorization" in received.headers or "x-api-key" in received.headers  # never rewritten


def test_the_receipt_counts_what_the_headers_and_query_held(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    headers = {"x-user-email": EMAIL, "openai-organization": "org-Qm7Lz2Xw9Pk4Rt8Vn3Bc6Hd1"}
    reply = send(stack, "chat", "hi", headers, path=f"{PATHS['chat']}?cc={OTHER_EMAIL}", tenant="strip")
    assert reply.status == 200
    [received] = upstream.received
    assert received.headers["x-user-email"] == "[EMAIL]"
    assert received.path == f"{PATHS['chat']}?cc=%5BEMAIL%5D"
    # An organisation id is the API's own identifier, not a secret: it goes as it was.
    assert received.headers["openai-organization"] == "org-Qm7Lz2Xw9Pk4Rt8Vn3Bc6Hd1"
    record = record_for(stack, "strip", reply.headers.get("x-cordon-receipt"))
    assert (record["decision"], record["counts"]) == ("forwarded", {"EMAIL": 2})


@pytest.mark.parametrize("api", APIS)
def test_a_declared_name_in_a_header_and_the_query_is_rewritten(
    stack: RunningStack, upstream: FakeUpstream, api: str
) -> None:
    headers = {
        "x-cordon-subject": DECLARED,
        "x-caller": "Ottilie Brannigan-Shaw",
        "x-for-ottilie-brannigan-shaw": "1",  # a name cannot take a placeholder: dropped
    }
    reply = send(stack, api, "hello", headers, path=f"{PATHS[api]}?user=obshaw%40example.org")
    assert reply.status == 200, reply.status
    [received] = upstream.received
    assert cores_in(json.dumps(received.headers) + received.path) == []
    assert received.headers["x-caller"].startswith("<SUBJECT1_NAME_")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("header", "value", "label"),
    [
        ("host", "ottiebs42.example", "SUBJECT1_HANDLE"),
        ("content-type", "application/json; charset=utf-8; owner=brannigan", "SUBJECT1_NAME"),
        ("x-caller", "brannigan", "SUBJECT1_NAME"),
    ],
    ids=["host", "content-type", "lower-case-name"],
)
def test_what_redaction_cannot_take_outside_the_body_is_refused(
    stack: RunningStack, upstream: FakeUpstream, api: str, header: str, value: str, label: str
) -> None:
    """`Host` is forwarded as it is when the upstream is given by address (the test stack's
    is); a lone surname in lower case is left by redaction and read by the egress check."""
    reply = send(stack, api, "hello", {"x-cordon-subject": DECLARED, header: value})
    error = refused(reply, upstream, 422)
    assert (error["stage"], error["kind"]) == ("egress", label)
    assert error["message"] == f"a declared identifier ({label}) is in a request header"


def test_a_declared_identifier_in_a_path_segment_is_refused(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    reply = request(port(stack), "GET", "/v1/files/QZ7730185/content", headers={"x-cordon-subject": DECLARED})
    error = refused(reply, upstream, 422)
    assert error["message"] == "a declared identifier (SUBJECT1_ID) is in the request path"


def test_a_random_request_id_is_no_mention_of_a_short_name(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """Hex ids (a client's x-request-id, a trace id) are read with long keys only: "bea" between
    their digits is chance, not a mention of a declared "Bea"."""
    short = encode_subject_header({"subjects": [{"names": ["Bea Cadell"]}]})
    headers = {
        "x-cordon-subject": short,
        "traceparent": "00-7bea1f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    reply = send(stack, "chat", "hello", {**headers, "x-request-id": "3bea5c1d-0a2e-4c6f-8b1d-2e3f4a5b6c7d"})
    assert reply.status == 200
    for _ in range(20):  # and random request ids, whatever they spell
        ids = {**headers, "x-request-id": str(uuid.uuid4())}
        assert send(stack, "chat", "hello", ids).status == 200


def test_envoy_adds_no_request_id_and_a_clients_own_is_read(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """Envoy generates no x-request-id (one value less for the provider, one less to read); a
    client's own goes as it was sent, and a value written into one is replaced."""
    assert send(stack, "chat", "hi").status == 200
    assert "x-request-id" not in upstream.received[-1].headers
    own = "5f0c2b1e-7d3a-4e8b-9c6f-1a2b3c4d5e6f"
    assert send(stack, "chat", "hi", {"x-request-id": own}).status == 200
    assert upstream.received[-1].headers["x-request-id"] == own
    assert send(stack, "chat", "hi", {"x-request-id": f"run-7 {EMAIL}"}).status == 200
    assert upstream.received[-1].headers["x-request-id"].startswith("run-7 <EMAIL_")


def test_headers_a_client_repeats_are_read_again_once_they_change(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """A set of headers found clean is answered from memory when it comes again; the same set
    with a value in one header is read (and rewritten) again."""
    headers = {"x-agent": "planner/2.1", "x-run-note": "nightly batch"}
    for _ in range(3):
        assert send(stack, "chat", "hi", headers).status == 200
        assert upstream.received[-1].headers["x-run-note"] == "nightly batch"
    assert send(stack, "chat", "hi", {**headers, "x-run-note": f"nightly batch {EMAIL}"}).status == 200
    received = upstream.received[-1].headers
    assert EMAIL not in json.dumps(received), "an email in a repeated header set reached the upstream"
    assert received["x-run-note"].startswith("nightly batch <EMAIL_")
    assert received["x-agent"] == "planner/2.1"


# --- the filter's own headers and credentials -----------------------------------------------------


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("name", ["X_Cordon_Subject", "x_tenant", "X-Redact_Mode", "x_api_key"])
def test_a_look_alike_of_the_filters_headers_is_refused(
    stack: RunningStack, upstream: FakeUpstream, api: str, name: str
) -> None:
    """Envoy forwards names with underscores as they are: such a header would carry the declared
    identities (or a key) upstream unread."""
    value = DECLARED if "subject" in name.lower() else "strip"
    error = refused(send(stack, api, "hello", [(name, value)]), upstream, 400, "invalid_header")
    assert error["message"].startswith(f"the {name.lower()} header is not read")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    "header",
    [
        ("authorization", "Bearer\t{key}"),
        ("authorization", "Token {key}"),
        ("authorization", "Basic c2stdGVzdDp4"),
        ("authorization", "Bearer  {key}"),
        ("authorization", ""),
        ("api-key", "{key}"),
        ("x-goog-api-key", "{key}"),
        ("openai-api-key", "{key}"),
        ("x-api-key", "{key} {key}"),
    ],
    ids=["tab", "token", "basic", "two-spaces", "empty", "api-key", "goog", "openai-api-key", "spaced"],
)
def test_a_credential_the_proxy_cannot_read_is_refused_not_defaulted(
    stack: RunningStack, upstream: FakeUpstream, api: str, header: tuple[str, str]
) -> None:
    """The strip tenant's key, sent so the proxy cannot read it, would have run under the default
    (reversible) tenant while the provider accepted it."""
    name, template = header
    key = KEYS["strip"]
    reply = send(stack, api, f"mail {EMAIL}", [(name, template.format(key=key))])
    error = refused(reply, upstream, 400, "invalid_credentials")
    shown = "Authorization" if name == "authorization" else name
    assert shown in error["message"] and key not in error["message"]


@pytest.mark.parametrize("api", APIS)
def test_both_keys_of_one_tenant_select_it(stack: RunningStack, upstream: FakeUpstream, api: str) -> None:
    key = KEYS["strip"]
    headers = [("authorization", f"Bearer {key}"), ("x-api-key", key)]
    reply = send(stack, api, f"mail {EMAIL}", headers)
    assert reply.status == 200
    assert "[EMAIL]" in upstream.received[0].text() and EMAIL not in upstream.received[0].text()
    assert record_for(stack, "strip", reply.headers.get("x-cordon-receipt"))["tenant"] == "strip"


# --- reportOnly -------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("text", "stage", "egress", "counts"),
    [
        (
            "Ask Ottilie Brannigan-Shaw (ottiebs42).",
            None,
            "verified",
            {"SUBJECT1_NAME": 1, "SUBJECT1_HANDLE": 1},
        ),
        ("Ask Ottilie Brannigan-Shaw, or just brannigan.", "egress", "refused", {"SUBJECT1_NAME": 1}),
    ],
    ids=["would-pass", "would-refuse"],
)
def test_report_only_forwards_a_subject_request_unchanged_with_its_verdict(
    stack: RunningStack,
    upstream: FakeUpstream,
    api: str,
    text: str,
    stage: str | None,
    egress: str,
    counts: dict[str, int],
) -> None:
    raw = json.dumps(body_for(api, text), separators=(",", ":"))
    headers = {
        "authorization": f"Bearer {KEYS['report']}",
        "x-cordon-subject": DECLARED,
        "x-caller": "Ottilie",
    }
    reply = request(port(stack), "POST", PATHS[api], raw, headers)
    assert reply.status == 200
    [received] = upstream.received
    assert received.body == raw.encode()  # byte for byte
    assert received.headers["x-caller"] == "Ottilie"  # nothing rewritten, headers included
    assert "x-cordon-subject" not in received.headers
    record = record_for(stack, "report", reply.headers.get("x-cordon-receipt"))
    assert (record["decision"], record.get("stage"), record["egress"]) == ("reported", stage, egress)
    assert record["counts"] == {**counts, "SUBJECT1_NAME": counts["SUBJECT1_NAME"] + 1}  # + x-caller


def test_report_only_records_a_refusal_at_the_headers_and_reads_no_further(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    headers = {"authorization": f"Bearer {KEYS['report']}", "x-cordon-subject": DECLARED}
    reply = request(port(stack), "GET", "/v1/files/QZ7730185/content", headers=headers)
    # Forwarded as it was (the fake upstream has no files API: its own 404 comes back).
    assert upstream.received[0].path == "/v1/files/QZ7730185/content"
    assert "x-cordon-stage" not in reply.headers
    record = record_for(stack, "report", reply.headers.get("x-cordon-receipt"))
    assert (record["decision"], record["stage"], record["egress"]) == ("reported", "egress", "refused")


# --- a common word declared as a name -----------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_a_common_word_declared_as_a_name_is_never_matched_alone(
    stack: RunningStack, upstream: FakeUpstream, api: str
) -> None:
    people = [{"names": ["Grace"]}, {"names": ["Will Okonkwo-Lind"]}]
    header = encode_subject_header({"subjects": people})
    text = "Grace said hello. Will you help? Will said so, and so did Will Okonkwo-Lind."
    reply = send(stack, api, text, {"x-cordon-subject": header})
    assert reply.status == 200, reply.status
    sent = upstream.received[0].text()
    assert "Grace said hello. Will you help? Will said so" in sent  # alone, capitalised or not
    assert "Okonkwo" not in sent and "<SUBJECT2_NAME_" in sent  # its other forms still are


def test_x_envoy_headers_are_rewritten_and_checked_like_any_other(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    # A client on an internal address may send x-envoy-* headers, which Envoy forwards; a change
    # to one is applied (not dropped), for the catalog and for the declared subjects.
    reply = send(stack, "chat", "hi", {"x-envoy-note": f"for {EMAIL}", "x-envoy-original-path": EMAIL})
    assert reply.status == 200
    [received] = upstream.received
    assert EMAIL not in json.dumps(received.headers), "an x-envoy header carried the email upstream"
    upstream.clear()
    reply = send(stack, "chat", "hi", {"x-cordon-subject": DECLARED, "x-envoy-foo": "Ottilie Brannigan-Shaw"})
    assert reply.status == 200
    [received] = upstream.received
    assert not cores_in(json.dumps(received.headers)), "an x-envoy header carried the declared name"


def test_a_declared_identity_in_a_cookie_or_key_header_is_refused(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    # Credentials and cookies are never rewritten; the egress check reads them for long forms.
    for headers in (
        {"cookie": "session=k3J9xQ2mZp; user=Ottilie Brannigan-Shaw"},
        {"x-api-key": "sk-ant-obshaw@example.org"},
    ):
        reply = send(stack, "messages", "hi", {"x-cordon-subject": DECLARED, **headers})
        assert reply.status == 422, list(headers)
    assert upstream.received == []
    # A random cookie value and key are not read for short forms: forwarded.
    reply = send(
        stack,
        "chat",
        "hi",
        {"x-cordon-subject": DECLARED, "cookie": "session=7OBS3kQ9zL0pWx2VbN5m; theme=dark"},
    )
    assert reply.status == 200
