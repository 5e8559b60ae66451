"""Every policy knob of SPEC §10 end to end through Envoy, asserting what the upstream received (or
that it was never called) and what the receipt recorded. The session stack trusts X-Tenant
(TRUST_TENANT_HEADER=true); e2e/test_audit.py checks the default, where it is ignored.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import PERSON, SAMPLES, SENTENCE, chat_body, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack
from tests.support.receipts import record_for
from tests.unit.test_policy import KNOB_ATTRS

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
SUBJECT = {"x-cordon-subject": encode_subject_header({"ref": "knobs", "subjects": [PERSON]})}


def auth(tenant: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}


def post(stack: RunningStack, body: Any, headers: dict[str, str] | None = None, path: str = CHAT) -> Any:
    return request(stack.settings.listen_port, "POST", path, body, headers)


# --- reportOnly -------------------------------------------------------------------------------


def test_report_only_forwards_the_original_and_records_the_counts(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    body = json.dumps(chat_body(SENTENCE), separators=(",", ":"))
    reply = post(stack, body, auth("report"))
    assert reply.status == 200
    assert upstream.received[0].body == body.encode()  # byte for byte
    record = record_for(stack, "report", reply.headers.get("x-cordon-receipt"))
    assert record["decision"] == "reported" and "stage" not in record
    assert record["counts"]["EMAIL"] == 1 and record["counts"]["IBAN"] == 1
    # Nothing was replaced upstream, so nothing is restored: the reply is the upstream's own.
    assert set(leaked(reply.body)) == set(leaked(upstream.received[0].body))


def test_report_only_records_a_refusal_it_did_not_make(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = post(stack, "this is not json", {**auth("report"), "content-type": "application/json"})
    # Forwarded as it was: the answer is the upstream's own complaint, not ours.
    assert upstream.received[0].body == b"this is not json"
    assert reply.status == 400 and b"fake upstream" in reply.body
    record = record_for(stack, "report", reply.headers.get("x-cordon-receipt"))
    assert record["decision"] == "reported" and record["stage"] == "request"


def test_report_only_forwards_a_request_declaring_subjects_with_its_verdict(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """Measured before enforced: forwarded as it was, the receipt saying what enforcement would
    have done (here: refused at the egress check, for the lower-case surname redaction leaves)."""
    body = json.dumps(chat_body("Call Marisol Quintero-Vance, or quintero."), separators=(",", ":"))
    reply = post(stack, body, {**auth("report"), **SUBJECT})
    assert reply.status == 200
    assert upstream.received[0].body == body.encode()  # byte for byte
    record = record_for(stack, "report", reply.headers.get("x-cordon-receipt"))
    assert (record["decision"], record["stage"], record["egress"]) == ("reported", "egress", "refused")
    assert record["counts"] == {"SUBJECT1_NAME": 1}


# --- sets and skipDocumentationIps ----------------------------------------------------------------


def test_sets_limit_what_is_redacted_to_the_tenants_sets(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = post(stack, chat_body(SENTENCE), auth("secrets-only"))
    assert reply.status == 200
    secrets = {"AWS_ACCESS_KEY", "GITHUB_TOKEN", "OPENAI_KEY"}
    # Only the secrets set is read: the personal and card values go out as written.
    assert set(leaked(upstream.received[0].body)) == set(SAMPLES) - secrets
    record = record_for(stack, "secrets-only", reply.headers.get("x-cordon-receipt"))
    assert set(record["counts"]) == secrets


DOCUMENTATION_IPS = ["198.51.100.23", "2001:db8::1"]
PUBLIC_IPS = ["93.184.216.34", "2606:4700::1111"]


@pytest.mark.parametrize(("tenant", "kept"), [(None, []), ("doc-ips", DOCUMENTATION_IPS)])
def test_skip_documentation_ips_keeps_only_those_ranges(
    stack: RunningStack, upstream: FakeUpstream, tenant: str | None, kept: list[str]
) -> None:
    reply = post(stack, chat_body("hosts " + " and ".join(DOCUMENTATION_IPS + PUBLIC_IPS)), auth(tenant))
    assert reply.status == 200
    sent = upstream.received[0].text()
    assert [ip for ip in DOCUMENTATION_IPS + PUBLIC_IPS if ip in sent] == kept
    record = record_for(stack, tenant or "default", reply.headers.get("x-cordon-receipt"))
    assert record["counts"] == {"IP": 4 - len(kept)}


# --- X-Redact-Mode ----------------------------------------------------------------------------

MODE_CASES = [
    # (tenant, header value, status, mode the upstream body shows)
    ("override", "strip", 200, "strip"),
    ("override", "STRIP", 200, "strip"),
    ("override", "reversible", 200, "reversible"),
    ("override", "off", 403, None),
    ("strip", "reversible", 403, None),
    (None, "strip", 403, None),  # the default tenant does not allow the override
    (None, "reversible", 200, "reversible"),  # asking for the mode it has is no override
    ("override", "shred", 400, None),
]


@pytest.mark.parametrize(("tenant", "value", "status", "mode"), MODE_CASES)
def test_x_redact_mode_only_tightens(
    stack: RunningStack, upstream: FakeUpstream, tenant: str | None, value: str, status: int, mode: str | None
) -> None:
    reply = post(stack, chat_body(SENTENCE), {**auth(tenant), "x-redact-mode": value})
    assert reply.status == status
    if mode is None:
        assert upstream.received == []
        assert reply.json()["error"]["stage"] in ("policy", "request")
        return
    sent = upstream.received[0]
    assert leaked(sent.body) == [] and "x-redact-mode" not in sent.headers
    placeholders = "<EMAIL_" in sent.text()
    assert placeholders == (mode == "reversible")
    record = record_for(stack, tenant or "default", reply.headers.get("x-cordon-receipt"))
    assert record["mode"] == mode


# --- X-Tenant ---------------------------------------------------------------------------------

TENANT_CASES = [
    # (key's tenant, X-Tenant, status, tenant recorded, knobs named in the refusal)
    (None, "strip", 200, "strip", []),  # stricter mode, equal elsewhere
    (None, "require", 400, "require", []),  # stricter (requireSubject), so selected: and it requires
    (None, "mode-off", 403, "default", ["mode"]),
    (None, "open", 403, "default", ["failMode"]),
    (None, "nosystem", 403, "default", ["redactSystem"]),
    (None, "report", 403, "default", ["reportOnly"]),
    (None, "override", 403, "default", ["allowHeaderOverride"]),
    (None, "allow-media", 403, "default", ["subjectMedia"]),
    (None, "openai-only", 403, "default", ["upstreams"]),
    (None, "secrets-only", 403, "default", ["sets"]),  # a subset of the default's sets
    (None, "doc-ips", 403, "default", ["skipDocumentationIps"]),
    ("strip", "default", 403, "strip", ["mode"]),
    ("open", "default", 200, "default", []),
    (None, "no-such-tenant", 403, "default", []),
]


@pytest.mark.parametrize(("key", "wanted", "status", "recorded", "knobs"), TENANT_CASES)
def test_x_tenant_selects_only_a_tenant_at_least_as_strict(
    stack: RunningStack,
    upstream: FakeUpstream,
    key: str | None,
    wanted: str,
    status: int,
    recorded: str,
    knobs: list[str],
) -> None:
    reply = post(stack, chat_body(SENTENCE), {**auth(key), "x-tenant": wanted})
    assert reply.status == status
    record = record_for(stack, recorded, reply.headers.get("x-cordon-receipt"))
    if status != 200:
        assert upstream.received == []
        assert record["decision"] == "refused"
        message = reply.json()["error"]["message"]
        for knob in knobs:
            assert knob in message
        return
    sent = upstream.received[0]
    assert leaked(sent.body) == [] and "x-tenant" not in sent.headers
    assert record["decision"] == "forwarded"


@pytest.mark.parametrize(
    "twice",
    [
        [("authorization", f"Bearer {KEYS['strip']}"), ("authorization", "Bearer sk-junk")],
        [("x-api-key", KEYS["require"]), ("x-api-key", "sk-junk")],
        [("x-tenant", "strip"), ("x-tenant", "mode-off")],
        [("x-redact-mode", "strip"), ("x-redact-mode", "strip")],
        [("x-cordon-subject", SUBJECT["x-cordon-subject"])] * 2,
    ],
    ids=["authorization", "x-api-key", "x-tenant", "x-redact-mode", "x-cordon-subject"],
)
def test_a_header_that_selects_policy_sent_twice_is_refused(
    stack: RunningStack, upstream: FakeUpstream, twice: list[tuple[str, str]]
) -> None:
    """Joined, two keys would hash to no tenant and so select the default policy, while the
    provider authenticates the first: one of each, or 400 and no upstream call."""
    reply = request(stack.settings.listen_port, "POST", CHAT, chat_body(SENTENCE), twice)
    assert reply.status == 400 and upstream.received == []
    error = reply.json()["error"]
    assert error["stage"] == "request" and twice[0][0] in error["message"]
    assert record_for(stack, "default", reply.headers.get("x-cordon-receipt"))["decision"] == "refused"


def test_require_subject_with_a_subject_is_forwarded(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = post(
        stack,
        chat_body(f"Write to Marisol Quintero-Vance at {SAMPLES['EMAIL']}."),
        {**auth("require"), **SUBJECT},
    )
    assert reply.status == 200 and len(upstream.received) == 1
    assert "Marisol" not in upstream.received[0].text()


def test_nesting_past_the_limit_is_refused_under_either_fail_mode(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """A body nested past the limit inside a string is refused under `failMode: open` too: it is
    never forwarded half-read (SPEC §11). failMode open vs closed on Redis: e2e/test_audit.py."""
    deep = "[" * 80 + "]" * 80
    for tenant in (None, "open"):
        upstream.clear()
        reply = post(stack, chat_body(deep), auth(tenant))
        assert reply.status == 422 and upstream.received == []


# --- every knob has its end-to-end test ------------------------------------------------------

# Each policy knob (SPEC §10) → the end-to-end tests (module, function) that drive it through Envoy
# and assert on the upstream. A knob added to the policy without one fails the test below.
KNOB_TESTS: dict[str, list[tuple[str, str]]] = {
    "apiKeys": [("e2e.test_http", "test_strip_mode_writes_kinds_and_restores_nothing")],
    "mode": [
        ("e2e.test_http", "test_strip_mode_writes_kinds_and_restores_nothing"),
        ("e2e.test_http", "test_mode_off_forwards_unchanged"),
        ("e2e.test_subjects", "test_subject_request_to_mode_off_is_refused"),
        ("e2e.test_surrogates", "test_round_trip_is_exact_and_the_upstream_sees_only_surrogates"),
    ],
    "sets": [("e2e.test_knobs", "test_sets_limit_what_is_redacted_to_the_tenants_sets")],
    "failMode": [
        ("e2e.test_audit", "test_redis_killed_and_restarted_matrix"),
        ("e2e.test_knobs", "test_nesting_past_the_limit_is_refused_under_either_fail_mode"),
    ],
    "redactSystem": [("e2e.test_http", "test_redact_system_false_keeps_the_system_prompt")],
    "consistentPseudonyms": [("e2e.test_pseudonyms", "test_a_reply_naming_an_earlier_turn_gets_the_value")],
    "vaultTtlSeconds": [("e2e.test_pseudonyms", "test_vault_holds_no_plaintext_and_expires")],
    "requireSubject": [
        ("e2e.test_subjects", "test_require_subject"),
        ("e2e.test_knobs", "test_require_subject_with_a_subject_is_forwarded"),
    ],
    "subjectMedia": [
        ("e2e.test_subjects", "test_media_is_blocked_by_default_and_allowed_by_policy"),
        ("e2e.test_media", "test_the_stricter_of_tenant_and_header_wins"),
    ],
    "media": [
        ("e2e.test_media_catalog", "test_mask_paints_the_card_and_the_email_and_counts_them_by_kind"),
        ("e2e.test_media_catalog", "test_block_refuses_any_media_before_the_upstream"),
        ("e2e.test_media_catalog", "test_the_default_forwards_the_image_byte_for_byte"),
        ("e2e.test_media_catalog", "test_x_tenant_may_tighten_media_but_not_loosen_it"),
    ],
    "reportOnly": [
        ("e2e.test_knobs", "test_report_only_forwards_the_original_and_records_the_counts"),
        ("e2e.test_knobs", "test_report_only_records_a_refusal_it_did_not_make"),
        ("e2e.test_knobs", "test_report_only_forwards_a_request_declaring_subjects_with_its_verdict"),
        ("e2e.test_edges", "test_report_only_forwards_a_subject_request_unchanged_with_its_verdict"),
    ],
    "allowHeaderOverride": [("e2e.test_knobs", "test_x_redact_mode_only_tightens")],
    "upstreams": [("e2e.test_http", "test_tenant_limited_to_openai_cannot_reach_anthropic")],
    "skipDocumentationIps": [("e2e.test_knobs", "test_skip_documentation_ips_keeps_only_those_ranges")],
    "outputGate": [
        ("e2e.test_output_gate", "test_report_counts_distinct_values_and_leaves_the_reply_alone"),
        ("e2e.test_output_gate", "test_deny_turns_a_json_reply_into_the_dialect_error"),
        ("e2e.test_output_gate", "test_off_reads_nothing"),
    ],
    "outputSets": [("e2e.test_output_gate", "test_output_sets_choose_what_the_gate_reads")],
    "customKinds": [("e2e.test_policy_extensibility", "test_a_custom_kind_is_redacted_and_restored")],
    "allow": [("e2e.test_policy_extensibility", "test_an_allowed_value_is_forwarded_as_written")],
    "deny": [("e2e.test_policy_extensibility", "test_a_disguised_deny_term_is_redacted")],
    "actions": [
        ("e2e.test_policy_extensibility", "test_a_blocked_kind_refuses_before_the_upstream"),
        ("e2e.test_policy_extensibility", "test_an_allowed_kind_is_forwarded_and_counted"),
    ],
}


def test_every_policy_knob_has_an_end_to_end_test() -> None:
    assert set(KNOB_TESTS) == {*KNOB_ATTRS, "apiKeys"}
    for knob, tests in KNOB_TESTS.items():
        for module, name in tests:
            function = getattr(importlib.import_module(f"tests.{module}"), name, None)
            assert callable(function), f"{knob}: tests.{module}.{name} does not exist"
