"""The request-body phase, driven in-process: redaction, body errors, failMode, reportOnly,
declared subjects and the media policy.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from ext_proc.detect.catalog import regexes
from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import PERSON, SAMPLES
from tests.support.fakes import Answer, EnvoyStream, FakeReceipts, chat, keyed, make_runtime

SECRET = b"receipt-secret"
ACME = keyed("acme", "sk-acme")
OPEN = keyed("open", "sk-open", fail_mode="open")
REPORT = keyed("watch", "sk-watch", report_only=True)
MASKING = keyed("masking", "sk-mask", subject_media="mask")
ALLOWING = keyed("allowing", "sk-allow", subject_media="allow")
KEYS = {
    "acme": "sk-acme",
    "open": "sk-open",
    "watch": "sk-watch",
    "masking": "sk-mask",
    "allowing": "sk-allow",
}
SUBJECT = encode_subject_header({"ref": "case-7", "subjects": [PERSON]})
# Runs away under a tiny regex budget (the catalog's own adversarial input).
ADVERSARIAL = ("1 2-3." * 50_000) + ("a@" * 50_000) + ("x" * 100_000)
IMAGE: dict[str, Any] = {
    "type": "image_url",
    "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"},
}


def admitted(receipts: FakeReceipts, tenant: str = "acme", *extra: tuple[str, str]) -> EnvoyStream:
    runtime = make_runtime(ACME, OPEN, REPORT, MASKING, ALLOWING, receipts=receipts, secret=SECRET)
    s = EnvoyStream(runtime)
    answer = s.request_headers(headers=[("x-api-key", KEYS[tenant]), *extra])
    assert answer.phase == "request_headers" and answer.request_body_mode is None, "the body is read"
    return s


def send(s: EnvoyStream, body: bytes | str | Any) -> Answer:
    [answer] = s.request_body(body)
    return answer


def nonce(s: EnvoyStream) -> str:
    assert s.exchange.context is not None
    return s.exchange.context.placeholders.nonce


def refusal(answer: Answer, status: int, stage: str, code: str = "request_refused") -> str:
    """The refusal's message, once its status, stage and code are as expected."""
    assert answer.refused and answer.status == status
    detail = answer.json()["error"]
    assert (detail["stage"], detail["code"]) == (stage, code)
    assert answer.headers["x-cordon-stage"] == stage
    return str(detail["message"])


def deep(levels: int) -> dict[str, Any]:
    nested: Any = "x"
    for _ in range(levels):
        nested = [nested]
    return {"model": "gpt-test", "metadata": nested}


# --- without declared subjects --------------------------------------------------------------------


def test_catalog_redaction_rewrites_the_body_and_its_length() -> None:
    receipts = FakeReceipts()
    s = admitted(receipts)
    answer = send(s, chat(f"mail {SAMPLES['EMAIL']} or call {SAMPLES['PHONE']}"))
    n = nonce(s)
    expected = json.dumps(
        chat(f"mail <EMAIL_{n}_1> or call <PHONE_{n}_1>"), separators=(",", ":"), ensure_ascii=False
    ).encode()
    assert answer.phase == "request_body"
    assert answer.body == expected
    assert answer.headers == {"content-length": str(len(expected))}
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage, receipt.egress) == ("forwarded", None, "skipped")
    assert (receipt.media, dict(receipt.counts)) == (0, {"EMAIL": 1, "PHONE": 1})


def test_a_body_with_nothing_to_redact_goes_unchanged() -> None:
    receipts = FakeReceipts()
    answer = send(admitted(receipts), chat("what is the capital of France?"))
    assert answer.phase == "request_body"
    assert (answer.body, answer.headers) == (None, {})
    [receipt] = receipts.receipts
    assert (receipt.decision, dict(receipt.counts)) == ("forwarded", {})


def test_an_empty_body_goes_unchanged() -> None:
    receipts = FakeReceipts()
    answer = send(admitted(receipts), b"  ")
    assert (answer.phase, answer.body) == ("request_body", None)
    assert receipts.receipts[0].decision == "forwarded"


@pytest.mark.parametrize("tenant", ["acme", "open"])
def test_invalid_json_is_refused_400(tenant: str) -> None:
    receipts = FakeReceipts()
    message = refusal(send(admitted(receipts, tenant), b"{not json"), 400, "request", "invalid_json")
    assert message.startswith("the request body is not valid JSON")
    assert (receipts.receipts[0].decision, receipts.receipts[0].stage) == ("refused", "request")


def test_a_body_that_is_not_utf8_is_refused_400() -> None:
    receipts = FakeReceipts()
    message = refusal(send(admitted(receipts), b'{"a":"\xff"}'), 400, "request", "invalid_json")
    assert message == "the request body is not valid UTF-8"


@pytest.mark.parametrize("tenant", ["acme", "open"])
def test_nesting_past_the_limit_is_refused_422_under_either_fail_mode(tenant: str) -> None:
    receipts = FakeReceipts()
    answer = send(admitted(receipts, tenant), deep(70))
    message = refusal(answer, 422, "detection", "nesting_too_deep")
    assert message == (
        "the JSON body is nested deeper than 64 levels (counting JSON inside strings); it was not forwarded"
    )
    assert (receipts.receipts[0].tenant, receipts.receipts[0].stage) == (tenant, "detection")


def test_a_detection_failure_under_fail_mode_closed_is_refused_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(regexes, "REGEX_TIMEOUT", 1e-9)
    receipts = FakeReceipts()
    s = admitted(receipts)
    message = refusal(send(s, chat(ADVERSARIAL)), 503, "detection")
    assert message.startswith("detection failed (") and message.endswith("); failMode is closed")
    assert "1 2-3" not in message
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage) == ("refused", "detection")
    assert s.exchange.record.gap is None


def test_a_detection_failure_under_fail_mode_open_is_forwarded_with_a_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(regexes, "REGEX_TIMEOUT", 1e-9)
    receipts = FakeReceipts()
    s = admitted(receipts, "open")
    answer = send(s, chat(ADVERSARIAL))
    assert (answer.phase, answer.body) == ("request_body", None)  # the original goes
    assert s.exchange.record.gap == "detection"
    assert s.runtime.metrics.counter("cordon_gaps_total", what="detection") == 1
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage) == ("forwarded", None)


# --- reportOnly -----------------------------------------------------------------------------------


def test_report_only_forwards_the_original_and_records_the_findings() -> None:
    receipts = FakeReceipts()
    answer = send(admitted(receipts, "watch"), chat(f"mail {SAMPLES['EMAIL']}"))
    assert (answer.phase, answer.body) == ("request_body", None)
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage, dict(receipt.counts)) == ("reported", None, {"EMAIL": 1})


@pytest.mark.parametrize(("body", "stage"), [(b"{not json", "request"), (deep(70), "detection")])
def test_report_only_forwards_what_it_would_have_refused_and_records_the_stage(
    body: bytes | dict[str, Any], stage: str
) -> None:
    receipts = FakeReceipts()
    answer = send(admitted(receipts, "watch"), body)
    assert (answer.phase, answer.body) == ("request_body", None)
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage) == ("reported", stage)


# --- declared subjects ----------------------------------------------------------------------------


def test_a_subject_request_is_redacted_and_its_egress_verified() -> None:
    receipts = FakeReceipts()
    s = admitted(receipts, "acme", ("x-cordon-subject", SUBJECT))
    text = f"Write to Marisol Quintero-Vance at mq@example.com or {SAMPLES['EMAIL']}; born 1986-07-14"
    answer = send(s, chat(text))
    n = nonce(s)
    assert answer.json() == chat(
        f"Write to <SUBJECT1_NAME_{n}_1> at <SUBJECT1_EMAIL_{n}_1> or <EMAIL_{n}_1>; "
        f"born <SUBJECT1_DOB_{n}_1>"
    )
    assert answer.headers == {"content-length": str(len(answer.body or b""))}
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.egress, receipt.media) == ("forwarded", "verified", 0)
    assert dict(receipt.counts) == {"EMAIL": 1, "SUBJECT1_DOB": 1, "SUBJECT1_EMAIL": 1, "SUBJECT1_NAME": 1}
    assert receipt.ref_digest == hmac.new(SECRET, b"case-7", hashlib.sha256).hexdigest()
    assert s.exchange.record.timings["egress_ms"] >= 0


def test_a_subject_request_without_its_values_goes_unchanged_and_verified() -> None:
    receipts = FakeReceipts()
    answer = send(admitted(receipts, "acme", ("x-cordon-subject", SUBJECT)), chat("hello there"))
    assert (answer.phase, answer.body) == ("request_body", None)
    assert receipts.receipts[0].egress == "verified"


def test_a_subject_request_nested_too_deep_is_refused() -> None:
    receipts = FakeReceipts()
    answer = send(admitted(receipts, "open", ("x-cordon-subject", SUBJECT)), deep(70))
    refusal(answer, 422, "detection", "nesting_too_deep")


def test_a_subject_request_with_media_under_block_is_refused() -> None:
    receipts = FakeReceipts()
    body = chat("hi")
    body["messages"].append({"role": "user", "content": [IMAGE]})
    answer = send(admitted(receipts, "acme", ("x-cordon-subject", SUBJECT)), body)
    message = refusal(answer, 422, "media")
    assert message == "1 media part(s) in a request that declares subjects (media: block)"
    [receipt] = receipts.receipts
    assert (receipt.stage, receipt.media, receipt.egress) == ("media", 1, "skipped")


def test_media_without_subjects_is_redacted_as_usual() -> None:
    receipts = FakeReceipts()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": [IMAGE]}]}
    answer = send(admitted(receipts), body)
    assert (answer.phase, answer.body) == ("request_body", None)
    assert receipts.receipts[0].media == 1


@pytest.mark.parametrize(
    ("tenant", "header"),
    [
        ("masking", SUBJECT),
        ("allowing", encode_subject_header({"ref": "case-7", "media": "mask", "subjects": [PERSON]})),
    ],
    ids=["tenant-mask", "header-mask"],
)
def test_mask_without_an_ocr_pool_is_refused(tenant: str, header: str) -> None:
    receipts = FakeReceipts()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": [IMAGE]}]}
    answer = send(admitted(receipts, tenant, ("x-cordon-subject", header)), body)
    message = refusal(answer, 422, "media")
    assert message == "media masking by OCR is not configured; the request was refused"
    assert receipts.receipts[0].media == 1


def test_media_under_allow_goes_with_its_text_checked() -> None:
    receipts = FakeReceipts()
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": [IMAGE]}]}
    answer = send(admitted(receipts, "allowing", ("x-cordon-subject", SUBJECT)), body)
    assert (answer.phase, answer.body) == ("request_body", None)
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.media, receipt.egress) == ("forwarded", 1, "verified")
