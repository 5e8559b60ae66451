"""The request-headers phase, driven in-process: tenant, mode, route, upstream and subjects.

Each test plays Envoy's side of one stream (`tests.support.fakes.EnvoyStream`) against a runtime
with an in-memory receipt store, and checks the answer Envoy gets and the receipt written.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import PERSON, SAMPLES
from tests.support.fakes import Answer, EnvoyStream, FakeReceipts, chat, keyed, make_runtime

SECRET = b"receipt-secret"
ACME = keyed("acme", "sk-acme", allow_header_override=True)
STRICT = keyed("strict", "sk-strict", mode="strip")
LOOSE = keyed("loose", "sk-loose", fail_mode="open")
OFF = keyed("quiet", "sk-off", mode="off")
SUBJECTS_REQUIRED = keyed("careful", "sk-careful", require_subject=True)
ANTHROPIC_ONLY = keyed("claude", "sk-claude", upstreams=frozenset({"anthropic"}))
WATCH = keyed("watch", "sk-watch", report_only=True)
SUBJECT = encode_subject_header({"ref": "case-7", "subjects": [PERSON]})
LOOSENED = "X-Redact-Mode may only tighten the tenant's mode (reversible), never loosen it"


def stream(receipts: FakeReceipts, *, trust_tenant_header: bool = False) -> EnvoyStream:
    runtime = make_runtime(
        ACME,
        STRICT,
        LOOSE,
        OFF,
        SUBJECTS_REQUIRED,
        ANTHROPIC_ONLY,
        WATCH,
        receipts=receipts,
        secret=SECRET,
        trust_tenant_header=trust_tenant_header,
    )
    return EnvoyStream(runtime)


def bearer(key: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {key}")


def error(answer: Answer) -> dict[str, object]:
    detail = answer.json()["error"]
    assert isinstance(detail, dict)
    return detail


def assert_refused(answer: Answer, receipts: FakeReceipts, status: int, stage: str) -> None:
    """A local answer with `status`, in the OpenAI error shape, whose receipt names it."""
    assert answer.refused and answer.status == status
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["x-cordon-stage"] == stage
    assert error(answer)["stage"] == stage
    receipt = receipts.by_hash(answer.headers["x-cordon-receipt"])
    assert (receipt.decision, receipt.stage) == ("refused", stage)


# --- the tenant -----------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [bearer("sk-acme"), ("x-api-key", "sk-acme")])
def test_a_keys_tenant_applies(header: tuple[str, str]) -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    answer = s.request_headers("/v1/chat/completions", [header], method="GET", end_of_stream=True)
    assert answer.phase == "request_headers" and not answer.refused
    assert (answer.request_body_mode, answer.response_body_mode) == ("NONE", "NONE")
    assert set(answer.removed) == {"x-cordon-subject", "x-tenant", "x-redact-mode", "accept-encoding"}
    [receipt] = receipts.receipts
    assert (receipt.tenant, receipt.dialect, receipt.mode, receipt.decision) == (
        "acme",
        "chat",
        "reversible",
        "forwarded",
    )
    assert receipt.stage is None and dict(receipt.counts) == {}


def test_no_key_is_the_default_tenant() -> None:
    receipts = FakeReceipts()
    stream(receipts).request_headers(method="GET", end_of_stream=True)
    assert [r.tenant for r in receipts.receipts] == ["default"]


@pytest.mark.parametrize(
    "headers",
    [
        [("x-api-key", "sk-acme"), ("x-api-key", "sk-strict")],
        [bearer("sk-acme"), bearer("sk-acme")],
        [("x-tenant", "strict"), ("x-tenant", "strict")],
        [("x-redact-mode", "strip,strip")],  # joined by a proxy before Envoy: a repeat too
        [("x-cordon-subject", SUBJECT), ("x-cordon-subject", SUBJECT)],
    ],
    ids=["x-api-key", "authorization", "x-tenant", "x-redact-mode", "x-cordon-subject"],
)
def test_a_header_sent_twice_is_refused_under_the_default_policy(headers: list[tuple[str, str]]) -> None:
    receipts = FakeReceipts()
    answer = stream(receipts, trust_tenant_header=True).request_headers(headers=[bearer("sk-acme"), *headers])
    assert_refused(answer, receipts, 400, "request")
    name = headers[0][0]
    assert error(answer)["message"] == f"send each of these headers once: {name}"
    [receipt] = receipts.receipts
    assert (receipt.tenant, receipt.dialect) == ("default", "none")


def test_two_keys_of_different_tenants_are_refused() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer("sk-acme"), ("x-api-key", "sk-loose")])
    assert_refused(answer, receipts, 400, "request")
    assert receipts.receipts[0].tenant == "default"


def test_x_tenant_when_trusted_may_select_a_stricter_tenant() -> None:
    receipts = FakeReceipts()
    s = stream(receipts, trust_tenant_header=True)
    s.request_headers(headers=[bearer("sk-acme"), ("x-tenant", "strict")])
    answer = s.request_body(chat(f"mail {SAMPLES['EMAIL']}"))[0]
    assert answer.json() == chat("mail [EMAIL]")  # strict strips
    assert [(r.tenant, r.mode, r.decision) for r in receipts.receipts] == [("strict", "strip", "forwarded")]


def test_x_tenant_may_not_select_a_looser_tenant() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts, trust_tenant_header=True).request_headers(
        headers=[bearer("sk-acme"), ("x-tenant", "loose")]
    )
    assert_refused(answer, receipts, 403, "policy")
    assert error(answer)["code"] == "tenant_forbidden"
    assert error(answer)["message"] == (
        "X-Tenant may only select a tenant at least as strict as the API key's tenant; "
        "the one named is less strict on: failMode"
    )
    assert receipts.receipts[0].tenant == "acme"  # the key's tenant records the refusal


def test_x_tenant_naming_no_tenant_is_refused() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts, trust_tenant_header=True).request_headers(headers=[("x-tenant", "nobody")])
    assert_refused(answer, receipts, 403, "policy")
    assert error(answer)["message"] == "X-Tenant names no configured tenant"


def test_x_tenant_is_ignored_unless_trusted() -> None:
    receipts = FakeReceipts()
    stream(receipts).request_headers(headers=[bearer("sk-acme"), ("x-tenant", "loose")], end_of_stream=True)
    assert [(r.tenant, r.decision) for r in receipts.receipts] == [("acme", "forwarded")]


# --- X-Redact-Mode --------------------------------------------------------------------------------


def test_x_redact_mode_may_tighten_the_mode() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    s.request_headers(headers=[bearer("sk-acme"), ("x-redact-mode", "STRIP")])
    assert s.request_body(chat(f"mail {SAMPLES['EMAIL']}"))[0].json() == chat("mail [EMAIL]")
    assert [(r.tenant, r.mode) for r in receipts.receipts] == [("acme", "strip")]


@pytest.mark.parametrize(
    ("key", "mode", "status", "message"),
    [
        (
            "sk-acme",
            "surrogate",
            403,
            LOOSENED,
        ),
        ("sk-acme", "off", 403, LOOSENED),
        (
            "sk-loose",
            "strip",
            403,
            "this tenant does not let X-Redact-Mode change its mode (allowHeaderOverride)",
        ),
        ("sk-acme", "loud", 400, "X-Redact-Mode must be one of reversible, surrogate, strip, off"),
    ],
)
def test_x_redact_mode_never_loosens(key: str, mode: str, status: int, message: str) -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer(key), ("x-redact-mode", mode)])
    assert_refused(answer, receipts, status, "request" if status == 400 else "policy")
    assert error(answer)["message"] == message


def test_the_same_mode_needs_no_permission() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(
        headers=[bearer("sk-loose"), ("x-redact-mode", "reversible")], end_of_stream=True
    )
    assert not answer.refused
    assert receipts.receipts[0].tenant == "loose"


# --- compressed bodies ----------------------------------------------------------------------------


def test_a_compressed_request_body_is_refused_415() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer("sk-acme"), ("content-encoding", "gzip")])
    assert_refused(answer, receipts, 415, "request")


def test_a_compressed_request_body_under_report_only_is_released_with_the_stage() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer("sk-watch"), ("content-encoding", "gzip")])
    assert answer.phase == "request_headers" and answer.request_body_mode == "NONE"
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage) == ("reported", "request")


def test_subjects_under_report_only_are_read_and_forwarded() -> None:
    """reportOnly measures a subject request: its body is read, nothing is refused or rewritten."""
    receipts = FakeReceipts()
    s = stream(receipts)
    answer = s.request_headers(headers=[bearer("sk-watch"), ("x-cordon-subject", SUBJECT)])
    assert answer.phase == "request_headers" and not answer.refused and answer.headers == {}
    assert answer.request_body_mode is None  # the body is read, for the record
    assert s.exchange.context is not None and s.exchange.context.subjects is not None


def test_a_declared_identifier_in_the_path_under_report_only_is_recorded_not_refused() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(
        "/v1/files/A1234567", [bearer("sk-watch"), ("x-cordon-subject", SUBJECT)]
    )
    assert answer.phase == "request_headers" and not answer.refused
    assert (answer.request_body_mode, answer.response_body_mode) == ("NONE", "NONE")
    [receipt] = receipts.receipts
    assert (receipt.decision, receipt.stage, receipt.egress) == ("reported", "egress", "refused")
    assert receipt.ref_digest == hmac.new(SECRET, b"case-7", hashlib.sha256).hexdigest()


# --- the route and the upstream ------------------------------------------------------------------


def test_the_not_found_route_is_answered_404_without_a_receipt() -> None:
    """A path no route knows: refused in the OpenAI shape, counted, and no receipt written (a scan
    of random paths must not fill the tenant's chain)."""
    receipts = FakeReceipts()
    s = stream(receipts)
    answer = s.request_headers("/v2/nowhere", [bearer("sk-acme")], route="not-found")
    assert answer.phase == "immediate_response"
    assert answer.refused and answer.status == 404
    assert answer.headers["x-cordon-stage"] == "routing"
    assert "x-cordon-receipt" not in answer.headers
    assert error(answer)["code"] == "not_found"
    assert receipts.receipts == []
    metrics = s.exchange.runtime.metrics
    assert metrics.counter("cordon_unrouted_total") == 1
    assert metrics.counter("cordon_exchanges_total", dialect="none", decision="refused", tenant="acme") == 0


@pytest.mark.parametrize("route", ["", None])
def test_an_unknown_route_is_answered_404_here(route: str | None) -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    answer = s.request_headers("/v2/nowhere", [bearer("sk-acme")], route=route)
    # An immediate response: Envoy answers the client itself and calls no upstream.
    assert answer.phase == "immediate_response"
    assert_refused(answer, receipts, 404, "routing")
    assert error(answer) == {
        "message": "no upstream is configured for this path",
        "stage": "routing",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }
    assert s.exchange.context is None
    [receipt] = receipts.receipts
    assert (receipt.tenant, receipt.dialect) == ("acme", "none")


def test_an_upstream_the_tenant_may_not_reach_is_refused() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers("/v1/chat/completions", [bearer("sk-claude")])
    assert_refused(answer, receipts, 403, "policy")
    assert error(answer)["message"] == "this tenant may not reach the openai upstream"
    assert receipts.receipts[0].dialect == "chat"


def test_the_allowed_upstream_is_reached_with_its_dialect() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    answer = s.request_headers("/anthropic/v1/messages", [bearer("sk-claude")], route="anthropic-prefixed")
    assert answer.phase == "request_headers" and answer.request_body_mode is None  # the body is read
    assert s.exchange.context is not None and s.exchange.context.dialect.name == "messages"
    assert receipts.receipts == []  # written once the body is decided


# --- declared subjects ----------------------------------------------------------------------------


def test_an_unreadable_subject_header_is_refused_naming_it() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer("sk-acme"), ("x-cordon-subject", "%%%")])
    assert_refused(answer, receipts, 400, "request")
    detail = error(answer)
    assert detail["code"] == "invalid_subject_header"
    assert str(detail["message"]).startswith("X-Cordon-Subject: ")


def test_a_tenant_that_requires_subjects_refuses_a_request_without() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer("sk-careful")])
    assert_refused(answer, receipts, 400, "request")
    assert error(answer)["code"] == "subject_required"
    assert error(answer)["message"] == "this tenant requires an X-Cordon-Subject header"


def test_a_tenant_that_requires_subjects_admits_a_request_with() -> None:
    receipts = FakeReceipts()
    s = stream(receipts)
    answer = s.request_headers(headers=[bearer("sk-careful"), ("x-cordon-subject", SUBJECT)])
    assert answer.phase == "request_headers" and not answer.refused
    assert s.exchange.record.ref == "case-7"


def test_subjects_under_mode_off_are_refused() -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer("sk-off"), ("x-cordon-subject", SUBJECT)])
    assert_refused(answer, receipts, 422, "policy")
    assert error(answer)["message"] == (
        "this tenant does not redact (mode: off); a request declaring subjects is refused"
    )
    receipt = receipts.receipts[0]
    assert (receipt.tenant, receipt.mode) == ("quiet", "off")


@pytest.mark.parametrize(
    ("path", "extra", "where", "label"),
    [
        ("/v1/files/A1234567/content", [], "in the request path", "SUBJECT1_ID"),
        ("/v1/chat/completions", [("x-caller", "vance")], "in a request header", "SUBJECT1_NAME"),
        (
            "/v1/chat/completions",
            [(":authority", "mqvance77.example")],
            "in a request header",
            "SUBJECT1_HANDLE",
        ),
        (
            "/v1/chat/completions",
            [("content-type", "application/json; owner=vance")],
            "in a request header",
            "SUBJECT1_NAME",
        ),
    ],
    ids=["path-segment", "lower-case-name", "authority", "content-type"],
)
def test_a_declared_identifier_redaction_cannot_take_outside_the_body_is_refused(
    path: str, extra: list[tuple[str, str]], where: str, label: str
) -> None:
    """What redaction does not rewrite (a path segment, `:authority`, framing, a lower-case name
    that only the egress check reads) but that would leave is refused."""
    receipts = FakeReceipts()
    headers = [bearer("sk-acme"), ("x-cordon-subject", SUBJECT), *extra]
    answer = stream(receipts).request_headers(path, headers)
    assert_refused(answer, receipts, 422, "egress")
    detail = error(answer)
    assert detail["kind"] == label
    assert detail["message"] == f"a declared identifier ({label}) is {where}"
    assert receipts.receipts[0].egress == "refused"


@pytest.mark.parametrize(
    ("key", "path", "extra"),
    [
        ("sk-off", "/v1/chat/completions", []),
        ("sk-acme", "/v1/files/A1234567", []),
        ("sk-acme", "/v1/chat/completions", [("x-caller", "vance")]),
    ],
    ids=["mode-off", "path", "header"],
)
def test_a_refusal_after_the_subject_header_was_read_records_its_ref_digest(
    key: str, path: str, extra: list[tuple[str, str]]
) -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(path, [bearer(key), ("x-cordon-subject", SUBJECT), *extra])
    assert answer.refused
    [receipt] = receipts.receipts
    assert receipt.ref_digest == hmac.new(SECRET, b"case-7", hashlib.sha256).hexdigest()


# --- credentials and the filter's own header names ----------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["Bearer\tsk-acme", "Token sk-acme", "Basic c2stYWNtZTo=", "Bearer  sk-acme", "", "Bearer", "sk-acme"],
    ids=["tab", "token-scheme", "basic", "two-spaces", "empty", "scheme-alone", "no-scheme"],
)
def test_an_authorization_header_that_cannot_be_read_is_refused_not_defaulted(value: str) -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[("authorization", value)])
    assert_refused(answer, receipts, 400, "request")
    detail = error(answer)
    assert detail["code"] == "invalid_credentials"
    assert "Authorization header" in str(detail["message"]) and "sk-acme" not in str(detail["message"])
    assert receipts.receipts[0].tenant == "default"


@pytest.mark.parametrize("value", ["", "sk acme"], ids=["empty", "space"])
def test_an_x_api_key_that_cannot_be_read_is_refused(value: str) -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[("x-api-key", value)])
    assert_refused(answer, receipts, 400, "request")
    assert error(answer)["code"] == "invalid_credentials"


@pytest.mark.parametrize(
    "name",
    [
        "api-key",
        "x-goog-api-key",
        "openai-api-key",
        "anthropic-api-key",
        "apikey",
        "x-auth-token",
        "x-access-token",
        "ocp-apim-subscription-key",
        "proxy-authorization",
        "x-authorization",
    ],
)
def test_a_key_header_the_proxy_does_not_read_is_refused_naming_it(name: str) -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer("sk-acme"), (name, "sk-strict")])
    assert_refused(answer, receipts, 400, "request")
    detail = error(answer)
    assert detail["code"] == "invalid_credentials"
    assert str(detail["message"]).startswith(f"the {name} header carries a credential")
    assert receipts.receipts[0].tenant == "default"


@pytest.mark.parametrize(
    "name", ["x_cordon_subject", "X_Tenant", "x-redact_mode", "x_api_key"], ids=lambda name: name
)
def test_a_look_alike_of_the_filters_own_headers_is_refused(name: str) -> None:
    receipts = FakeReceipts()
    answer = stream(receipts).request_headers(headers=[bearer("sk-acme"), (name, SUBJECT)])
    assert_refused(answer, receipts, 400, "request")
    detail = error(answer)
    assert detail["code"] == "invalid_header"
    assert detail["message"] == (
        f"the {name.lower()} header is not read; write it as {name.lower().replace('_', '-')} (with hyphens)"
    )


def test_both_keys_of_one_tenant_are_read() -> None:
    receipts = FakeReceipts()
    headers = [bearer("sk-acme"), ("x-api-key", "sk-acme"), ("x-api-version", "2024-06-01")]
    answer = stream(receipts).request_headers(headers=headers, method="GET", end_of_stream=True)
    assert not answer.refused
    assert receipts.receipts[0].tenant == "acme"


# --- the admin API --------------------------------------------------------------------------------


def test_the_admin_route_answers_from_the_receipt_store_without_a_receipt() -> None:
    receipts = FakeReceipts()
    runtime = make_runtime(ACME, receipts=receipts, secret=SECRET)
    runtime.admin_token = "admin-token"
    s = EnvoyStream(runtime)
    s.request_headers(headers=[bearer("sk-acme"), ("x-cordon-subject", SUBJECT)], end_of_stream=True)
    [forwarded] = receipts.receipts
    admin = EnvoyStream(runtime).request_headers(
        "/admin/receipts?ref=case-7", [bearer("admin-token")], method="GET", route="admin"
    )
    assert admin.immediate and admin.status == 200  # answered here, never forwarded
    assert admin.json() == {"verified": ["acme"], "records": [forwarded.to_json()]}
    assert receipts.receipts == [forwarded]


def test_the_admin_route_refuses_a_wrong_token() -> None:
    runtime = make_runtime(ACME, receipts=FakeReceipts())
    runtime.admin_token = "admin-token"
    answer = EnvoyStream(runtime).request_headers(
        "/admin/receipts?ref=x", [bearer("nope")], method="GET", route="admin"
    )
    assert answer.status == 401
