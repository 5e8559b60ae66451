"""What leaves outside the body, driven in-process: header values and the query string read and
rewritten like body strings, the egress check over the path and every header, and reportOnly.

Each test plays Envoy's side of one stream (`tests.support.fakes.EnvoyStream`) and checks the header
mutation Envoy is told to apply (`Answer.headers`), and the receipt.
"""

from __future__ import annotations

from typing import Any

import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from ext_proc.errors import DetectionError
from ext_proc.exchange.context import RequestContext
from tests.support.e2e import PERSON, SAMPLES
from tests.support.fakes import Answer, EnvoyStream, FakeReceipts, chat, keyed, make_runtime

EMAIL = SAMPLES["EMAIL"]
ACME = keyed("acme", "sk-acme")
STRICT = keyed("strict", "sk-strict", mode="strip")
OPEN = keyed("open", "sk-open", fail_mode="open")
OFF = keyed("quiet", "sk-off", mode="off")
WATCH = keyed("watch", "sk-watch", report_only=True)
SUBJECT = encode_subject_header({"ref": "case-9", "subjects": [PERSON]})
# A short given name whose letters are hex digits: "bea" sits between the digits of some UUIDs.
SHORT = encode_subject_header({"subjects": [{"names": ["Bea Cadell"], "ids": ["A1234567"]}]})
ORGANIZATION = "org-9a8B7c6D5e4F3g2H1i0JkLmN"  # random-looking, like the ids the APIs issue


def stream(receipts: FakeReceipts) -> EnvoyStream:
    return EnvoyStream(make_runtime(ACME, STRICT, OPEN, OFF, WATCH, receipts=receipts))


def key(tenant: str) -> tuple[str, str]:
    return ("authorization", f"Bearer sk-{tenant}")


def nonce(s: EnvoyStream) -> str:
    assert s.exchange.context is not None
    return s.exchange.context.placeholders.nonce


def body(s: EnvoyStream, doc: Any) -> Answer:
    [answer] = s.request_body(doc)
    return answer


# --- the catalog reads header values and the query ------------------------------------------------


def test_a_header_value_is_rewritten_and_credentials_and_framing_are_not() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    headers = [
        key("acme"),
        ("x-user-email", f"owner {EMAIL}"),
        ("user-agent", "OpenAI/Python 3.57.0"),
        ("cookie", f"who={EMAIL}"),
    ]
    answer = s.request_headers(headers=headers)
    assert answer.headers == {"x-user-email": f"owner <EMAIL_{nonce(s)}_1>"}
    # The same value in the body gets the same placeholder.
    assert body(s, chat(f"mail {EMAIL}")).json() == chat(f"mail <EMAIL_{nonce(s)}_1>")
    [receipt] = receipts.receipts
    assert (receipt.decision, dict(receipt.counts)) == ("forwarded", {"EMAIL": 2})


def test_a_bodiless_request_gets_its_headers_rewritten_too() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    answer = s.request_headers(
        "/v1/models", [key("strict"), ("x-user-email", EMAIL)], method="GET", end_of_stream=True
    )
    assert (answer.request_body_mode, answer.response_body_mode) == ("NONE", "NONE")
    assert answer.headers == {"x-user-email": "[EMAIL]"}  # strip writes markers
    assert dict(receipts.receipts[0].counts) == {"EMAIL": 1}


def test_protocol_ids_are_not_taken_for_secrets_but_a_value_in_them_is_read() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    headers = [key("acme"), ("openai-organization", ORGANIZATION), ("openai-project", EMAIL)]
    answer = s.request_headers(headers=headers)
    assert answer.headers == {"openai-project": f"<EMAIL_{nonce(s)}_1>"}
    other = stream(receipts).request_headers(headers=[key("acme"), ("x-custom", ORGANIZATION)])
    assert set(other.headers) == {"x-custom"}  # elsewhere, a random token is a secret


def test_a_header_whose_name_holds_a_value_is_dropped() -> None:
    """A name cannot hold a placeholder: the header does not leave."""
    receipts = FakeReceipts()
    s = stream(receipts)
    headers = [key("acme"), ("x-cordon-subject", SUBJECT), ("x-for-marisol-quintero-vance", "yes")]
    answer = s.request_headers(headers=headers)
    assert not answer.refused and "x-for-marisol-quintero-vance" in answer.removed
    body(s, chat("hello"))
    assert dict(receipts.receipts[0].counts) == {"SUBJECT1_NAME": 1}


def test_a_secret_named_header_has_its_value_rewritten() -> None:
    s = stream(FakeReceipts())
    answer = s.request_headers(headers=[key("acme"), ("x-session-secret", "hunter2hunter2")])
    assert answer.headers["x-session-secret"].startswith("<SECRET_ASSIGNMENT_")


def test_the_query_is_read_decoded_and_written_back_encoded() -> None:
    s = stream(FakeReceipts())
    path = "/v1/chat/completions?user=jane.roe%40example.com&limit=20&note=a+b"
    answer = s.request_headers(path, [key("acme")])
    rewritten = f"/v1/chat/completions?user=%3CEMAIL_{nonce(s)}_1%3E&limit=20&note=a+b"
    assert answer.headers == {":path": rewritten}


def test_mode_off_reads_no_header() -> None:
    answer = stream(FakeReceipts()).request_headers(
        "/v1/chat/completions?to=jane.roe%40example.com", [key("off"), ("x-user-email", EMAIL)]
    )
    assert answer.headers == {}


def test_report_only_counts_what_the_headers_hold_and_rewrites_nothing() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    answer = s.request_headers(
        "/v1/chat/completions?cc=jane.roe%40example.com", [key("watch"), ("x-user-email", EMAIL)]
    )
    assert answer.headers == {}
    assert body(s, chat("hello")).body is None
    [receipt] = receipts.receipts
    assert (receipt.decision, dict(receipt.counts)) == ("reported", {"EMAIL": 2})


# --- detection failures ---------------------------------------------------------------------------


class _Failing:
    def detect(self, text: str) -> list[Any]:
        raise DetectionError("catalog timed out")


@pytest.mark.parametrize(
    ("tenant", "extra", "outcome"),
    [
        ("acme", [], (503, "detection")),
        ("open", [], None),
        ("open", [("x-cordon-subject", SUBJECT)], (422, "detection")),
    ],
    ids=["closed", "open", "subjects"],
)
def test_a_detection_failure_on_the_headers_follows_fail_mode(
    monkeypatch: pytest.MonkeyPatch,
    tenant: str,
    extra: list[tuple[str, str]],
    outcome: tuple[int, str] | None,
) -> None:
    monkeypatch.setattr(RequestContext, "catalog", lambda self: _Failing())
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[key(tenant), ("x-user-email", EMAIL), *extra])
    if outcome is None:
        assert not answer.refused and answer.headers == {}  # forwarded as it is, the gap recorded
    else:
        assert answer.refused and (answer.status, answer.headers["x-cordon-stage"]) == outcome


# --- declared subjects ----------------------------------------------------------------------------


def test_a_declared_name_in_a_header_is_rewritten_not_refused() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    headers = [key("acme"), ("x-cordon-subject", SUBJECT), ("x-caller", "Marisol Quintero-Vance")]
    answer = s.request_headers("/v1/chat/completions?user=mq%40example.com", headers)
    n = nonce(s)
    assert answer.headers == {
        "x-caller": f"<SUBJECT1_NAME_{n}_1>",
        ":path": f"/v1/chat/completions?user=%3CSUBJECT1_EMAIL_{n}_1%3E",
    }


def test_a_random_request_id_is_no_mention_of_a_short_name() -> None:
    s = stream(FakeReceipts())
    headers = [
        key("acme"),
        ("x-cordon-subject", SHORT),
        ("x-request-id", "3bea5c1d-0a2e-4c6f-8b1d-2e3f4a5b6c7d"),
    ]
    assert not s.request_headers(headers=headers).refused


def test_a_declared_id_written_as_a_request_id_is_still_read() -> None:
    s = stream(FakeReceipts())
    headers = [
        key("acme"),
        ("x-cordon-subject", SHORT),
        ("x-request-id", "a1234567-0a2e-4c6f-8b1d-2e3f4a5b6c7d"),
    ]
    answer = s.request_headers(headers=headers)
    assert answer.headers == {"x-request-id": f"<SUBJECT1_ID_{nonce(s)}_1>-0a2e-4c6f-8b1d-2e3f4a5b6c7d"}


def test_a_bodiless_subject_request_records_its_headers_as_verified() -> None:
    receipts = FakeReceipts()
    stream(receipts).request_headers(
        "/v1/models", [key("acme"), ("x-cordon-subject", SUBJECT)], method="GET", end_of_stream=True
    )
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.egress) == ("forwarded", "verified")


# --- reportOnly with declared subjects ----------------------------------------------------------------


def test_report_only_forwards_a_subject_request_and_records_the_verdict_it_passed() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    s.request_headers(headers=[key("watch"), ("x-cordon-subject", SUBJECT)])
    assert body(s, chat("Call Marisol Quintero-Vance at mq@example.com")).body is None  # unchanged
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage, receipt.egress) == ("reported", None, "verified")
    assert dict(receipt.counts) == {"SUBJECT1_NAME": 1, "SUBJECT1_EMAIL": 1}


def test_report_only_forwards_a_subject_request_it_would_have_refused_at_egress() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    s.request_headers(headers=[key("watch"), ("x-cordon-subject", SUBJECT)])
    # Redaction takes a lone surname only capitalised; the egress check reads it in any case.
    assert body(s, chat("ask Marisol Quintero-Vance, or just vance")).body is None
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage, receipt.egress) == ("reported", "egress", "refused")
    assert dict(receipt.counts) == {"SUBJECT1_NAME": 1}


def test_report_only_forwards_a_subject_request_it_would_have_refused_for_its_media() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    s.request_headers(headers=[key("watch"), ("x-cordon-subject", SUBJECT)])
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    doc = {"model": "gpt-test", "messages": [{"role": "user", "content": [image]}]}
    assert body(s, doc).body is None
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage) == ("reported", "media")
