"""Receipts end to end (SPEC §9): every answer the pipeline gives carries `X-Cordon-Receipt`, the
hash names exactly one record of the tenant's chain in Redis, the record says what happened, and
nothing in Redis is a value, a header or a ref. Plus the admin query.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import PERSON, SAMPLES, SENTENCE, chat_body, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import ADMIN_TOKEN, KEYS, RunningStack
from tests.support.receipts import everything_in_redis, expected_ref_digest, record_for, records, verify

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"


def auth(tenant: str | None = None) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}


def subject_header(ref: str) -> str:
    return encode_subject_header({"ref": ref, "subjects": [PERSON]})


def test_forwarded_json_reply_names_its_record(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(stack.settings.listen_port, "POST", CHAT, chat_body(SENTENCE))
    assert reply.status == 200
    record = record_for(stack, "default", reply.headers.get("x-cordon-receipt"))
    assert record["decision"] == "forwarded"
    assert record["dialect"] == "chat" and record["mode"] == "reversible" and record["tenant"] == "default"
    assert record["egress"] == "skipped" and "stage" not in record and "refDigest" not in record
    assert record["counts"]["EMAIL"] == 1 and record["counts"]["CREDIT_CARD"] == 1
    assert len(upstream.received) == 1


def test_streamed_reply_carries_the_receipt(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(stack.settings.listen_port, "POST", CHAT, chat_body(SENTENCE, stream=True))
    assert reply.status == 200 and b"data:" in reply.body
    assert record_for(stack, "default", reply.headers.get("x-cordon-receipt"))["decision"] == "forwarded"


def test_unread_bodies_get_receipts_too(stack: RunningStack, upstream: FakeUpstream) -> None:
    """A mode-off tenant and a bodiless GET are forwarded without reading a body: still recorded."""
    off = request(stack.settings.listen_port, "POST", CHAT, chat_body(SENTENCE), auth("mode-off"))
    assert off.status == 200
    record = record_for(stack, "mode-off", off.headers.get("x-cordon-receipt"))
    assert record["mode"] == "off" and record["decision"] == "forwarded" and record["counts"] == {}
    models = request(stack.settings.listen_port, "GET", "/v1/models", None)
    assert record_for(stack, "default", models.headers.get("x-cordon-receipt"))["decision"] == "forwarded"


OFF_SUBJECT = {**auth("mode-off"), "x-cordon-subject": subject_header("r-off")}
PATH_SUBJECT = {"x-cordon-subject": subject_header("r-path")}
REFUSALS: list[tuple[str, dict[str, Any], int, str, str]] = [
    # (case, request, status, tenant, stage)
    ("bad subject header", {"headers": {"x-cordon-subject": "{not json"}}, 400, "default", "request"),
    ("subject required", {"headers": auth("require")}, 400, "require", "request"),
    ("upstream not allowed", {"headers": auth("openai-only"), "path": "/v1/messages"}, 403, "openai-only",
     "policy"),
    ("not json", {"body": "this is not json"}, 400, "default", "request"),
    ("subject to mode off", {"headers": OFF_SUBJECT}, 422, "mode-off", "policy"),
    ("subject in path", {"headers": PATH_SUBJECT, "path": "/v1/files/A1234567/content"}, 422, "default",
     "egress"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "spec", "status", "tenant", "stage"), REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_refusals_carry_their_receipt(
    stack: RunningStack,
    upstream: FakeUpstream,
    case: str,
    spec: dict[str, Any],
    status: int,
    tenant: str,
    stage: str,
) -> None:
    body = spec.get("body", chat_body("hello"))
    reply = request(stack.settings.listen_port, "POST", spec.get("path", CHAT), body, spec.get("headers"))
    assert reply.status == status
    assert upstream.received == []
    record = record_for(stack, tenant, reply.headers.get("x-cordon-receipt"))
    assert record["decision"] == "refused" and record["stage"] == stage
    if stage == "egress":
        assert record["egress"] == "refused"


def test_subject_request_records_the_ref_digest_only(stack: RunningStack, upstream: FakeUpstream) -> None:
    ref = f"case-{secrets.token_hex(4)}"
    headers = {"x-cordon-subject": subject_header(ref)}
    reply = request(
        stack.settings.listen_port, "POST", CHAT, chat_body("Write to Marisol Quintero-Vance."), headers
    )
    assert reply.status == 200
    record = record_for(stack, "default", reply.headers.get("x-cordon-receipt"))
    assert record["refDigest"] == expected_ref_digest(ref)
    assert record["egress"] == "verified" and record["decision"] == "forwarded"
    assert any(kind.startswith("SUBJECT1_") for kind in record["counts"])
    assert ref.encode() not in everything_in_redis(stack)


def test_redis_holds_no_value_header_or_ref(stack: RunningStack, upstream: FakeUpstream) -> None:
    """Traffic with every catalog sample and the declared person, then every Redis key is read."""
    ref = f"ticket-{secrets.token_hex(6)}"
    person_text = " ".join(v for values in PERSON.values() for v in values)
    headers = {"x-cordon-subject": subject_header(ref), "x-custom-trace": "trace-7f3a9c"}
    port = stack.settings.listen_port
    assert request(port, "POST", CHAT, chat_body(SENTENCE + " " + person_text), headers).status == 200
    assert request(port, "POST", CHAT, chat_body(SENTENCE, stream=True), auth("strip")).status == 200
    # A refused one too: a declared surname in a header, in lower case (only the egress check reads it).
    refused = request(port, "POST", CHAT, chat_body("hi"), {**headers, "x-note": "quintero"})
    assert refused.status == 422
    blob = everything_in_redis(stack)
    folded = "".join(c for c in fold(blob.decode("utf-8", "replace")) if c.isalnum())
    for kind, value in SAMPLES.items():
        core = "".join(c for c in fold(value) if c.isalnum())
        assert core not in folded, f"a {kind} value is in Redis"
    for field, values in PERSON.items():
        for value in values:
            core = "".join(c for c in fold(value) if c.isalnum())
            assert core not in folded, f"a declared {field} value is in Redis"
    assert ref.encode() not in blob and b"trace-7f3a9c" not in blob
    assert KEYS["strip"].encode() not in blob


# --- admin ------------------------------------------------------------------------------------


def admin(stack: RunningStack, path: str, token: str | None = ADMIN_TOKEN, method: str = "GET") -> Any:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    return request(stack.settings.listen_port, method, path, None, headers)


def test_admin_query_returns_the_records_of_a_ref(stack: RunningStack, upstream: FakeUpstream) -> None:
    ref = f"case-{secrets.token_hex(4)}"
    headers = {"x-cordon-subject": subject_header(ref)}
    port = stack.settings.listen_port
    hashes = set()
    for tenant in (None, "strip", None):
        reply = request(port, "POST", CHAT, chat_body("Call Marisol."), {**headers, **auth(tenant)})
        assert reply.status == 200
        hashes.add(reply.headers["x-cordon-receipt"])
    found = admin(stack, f"/admin/receipts?ref={ref}")
    assert found.status == 200, found.body
    answer = found.json()
    assert {r["hash"] for r in answer["records"]} == hashes
    assert all(r["refDigest"] == expected_ref_digest(ref) for r in answer["records"])
    assert ref.encode() not in found.body
    assert {"default", "strip"} <= set(answer["verified"])
    only = admin(stack, f"/admin/receipts?ref={ref}&tenant=strip").json()
    assert [r["tenant"] for r in only["records"]] == ["strip"] and only["verified"] == ["strip"]
    assert admin(stack, "/admin/receipts?ref=never-used-ref").json()["records"] == []
    assert upstream.received and all("/admin" not in r.path for r in upstream.received)


@pytest.mark.parametrize(
    ("path", "token", "method", "status"),
    [
        ("/admin/receipts?ref=x", None, "GET", 401),
        ("/admin/receipts?ref=x", "wrong-token", "GET", 401),
        ("/admin/receipts?ref=x", ADMIN_TOKEN[:-1], "GET", 401),
        ("/admin/nothing", ADMIN_TOKEN, "GET", 404),
        ("/admin/receipts", ADMIN_TOKEN, "GET", 400),
        ("/admin/receipts?ref=a&ref=b", ADMIN_TOKEN, "GET", 400),
        ("/admin/receipts?ref=a&color=red", ADMIN_TOKEN, "GET", 400),
        ("/admin/receipts?ref=a&tenant=no%20such", ADMIN_TOKEN, "GET", 400),
        ("/admin/receipts?ref=a", ADMIN_TOKEN, "POST", 405),
    ],
)
def test_admin_refuses_what_it_cannot_answer(
    stack: RunningStack, upstream: FakeUpstream, path: str, token: str | None, method: str, status: int
) -> None:
    reply = admin(stack, path, token, method)
    assert reply.status == status
    assert reply.json()["error"]["stage"] == "admin"
    assert upstream.received == []


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_exchanges_make_one_chain_with_one_record_each(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """Many exchanges at once across both workers: one unbroken chain, one record per exchange."""
    before = len(records(stack, "chain"))
    port = stack.settings.listen_port

    def one(i: int) -> str:
        body = chat_body(f"request {i}: mail {SAMPLES['EMAIL']}", stream=i % 3 == 0)
        reply = request(port, "POST", CHAT, body, auth("chain"))
        assert reply.status == 200
        return reply.headers["x-cordon-receipt"]

    with ThreadPoolExecutor(16) as pool:
        hashes = list(pool.map(one, range(160)))
    chain = records(stack, "chain")
    assert len(chain) - before == 160 and len(set(hashes)) == 160
    assert set(hashes) <= {digest for _, _, digest in chain}
    result = verify(stack, "chain")
    assert result.ok and result.hashed == len(chain)


def test_receipts_log_names_the_hash_not_values(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(stack.settings.listen_port, "POST", CHAT, chat_body(SENTENCE))
    receipt = reply.headers["x-cordon-receipt"]
    log_path = stack.settings.run_dir / "logs" / "ext_proc.log"
    lines = []
    for _ in range(50):
        lines = [json.loads(line) for line in log_path.read_text().splitlines() if receipt in line]
        if lines:
            break
        time.sleep(0.05)
    assert len(lines) == 1 and lines[0]["event"] == "exchange" and lines[0]["counts"]["EMAIL"] == 1
    assert "receipt_ms" in lines[0]


def test_metrics_count_without_values(stack: RunningStack, upstream: FakeUpstream) -> None:
    """/metrics sums both workers; labels are kinds, stages, dialects and tenants, never a value."""
    url = f"http://127.0.0.1:{stack.settings.metrics_port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as reply:
            assert reply.headers["content-type"].startswith("text/plain")
            return reply.read().decode()

    def value(text: str, series: str) -> float:
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series + " "))

    before = value(scrape(), 'cordon_findings_total{kind="EMAIL",tenant="default"}')
    port = stack.settings.listen_port
    for _ in range(4):
        assert request(port, "POST", CHAT, chat_body(SENTENCE)).status == 200
    assert request(port, "POST", CHAT, "not json").status == 400
    deadline = time.monotonic() + 5
    text = scrape()
    while (
        value(text, 'cordon_findings_total{kind="EMAIL",tenant="default"}') < before + 4
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
        text = scrape()
    assert value(text, 'cordon_findings_total{kind="EMAIL",tenant="default"}') >= before + 4
    assert value(text, 'cordon_refusals_total{stage="request",tenant="default"}') >= 1
    assert 'cordon_phase_seconds_bucket{phase="receipt",le="+Inf"}' in text
    assert leaked(text) == []
