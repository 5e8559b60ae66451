"""A policy's own kinds, allow list, deny list and actions, end to end: real Envoy, real ext_proc
workers, real Redis, the fake upstream, the official SDKs and raw HTTP.

A custom kind is redacted upstream and restored for the caller in JSON and SSE, in all three APIs,
and surrogated under `mode: surrogate`; an allowed value is forwarded as written; a deny term is
redacted in a disguised form (look-alike letters, odd spacing); `actions: block` refuses 422 with
the upstream never called; `actions: allow` forwards the value and counts it in the receipt.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.e2e.test_pseudonyms import ask
from tests.support.e2e import SAMPLES, chat_body, last_sent, leaked, request
from tests.support.fake_upstream import ECHO_PREFIX
from tests.support.harness import KEYS, TENANT_SECRET, RunningStack, running_stack
from tests.support.receipts import record_for

pytestmark = pytest.mark.e2e

# Invented identifiers of an invented company.
EMPLOYEE = "EMP-730214"
SUPPORT = "helpdesk@corp-acme.example"
CODENAME = "Project Kestrel"
DISGUISED = "pr\u043eject \u00a0 KESTR\u0415L"  # Cyrillic o and E, a no-break space among spaces

EXTENSIONS = f"""\
customKinds:
  - name: EMPLOYEE_ID
    pattern: 'EMP-\\d{{6}}'
    context: [employee, staff]
allow:
  - {SUPPORT}
  - re: '10\\.20\\.\\d{{1,3}}\\.\\d{{1,3}}'
deny:
  - {CODENAME}
actions:
  CREDIT_CARD: block
  IP: allow
"""
TENANTS = {
    "extend": EXTENSIONS,
    "extend-surrogate": "mode: surrogate\n" + EXTENSIONS,
}
DIALECTS = ("chat", "responses", "messages")
CHAT = "/v1/chat/completions"
PLACEHOLDER = re.compile(r"<EMPLOYEE_ID_[0-9a-f]{8}_1>")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("extend"), tenants=TENANTS, TENANT_SECRET=TENANT_SECRET) as s:
        yield s


@pytest.fixture
def fresh(stack: RunningStack) -> RunningStack:
    stack.upstream.reset()
    return stack


def post(stack: RunningStack, content: str, tenant: str = "extend") -> tuple[int, dict[str, str], bytes]:
    headers = {"authorization": f"Bearer {KEYS[tenant]}"}
    reply = request(stack.settings.listen_port, "POST", CHAT, chat_body(content), headers)
    return reply.status, reply.headers, reply.body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_custom_kind_is_redacted_and_restored(fresh: RunningStack, dialect: str, stream: bool) -> None:
    prompt = f"Our employee {EMPLOYEE} asked for leave."
    split = {"x-fake-chunk-bytes": "7"} if stream else {}
    answer = ask(fresh, dialect, prompt, stream=stream, tenant="extend", headers=split)
    assert answer.text == ECHO_PREFIX + prompt
    sent = last_sent(fresh)
    assert EMPLOYEE not in sent, "the custom kind's value went upstream"
    assert PLACEHOLDER.search(sent) is not None, "no EMPLOYEE_ID placeholder upstream"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_custom_kind_in_tool_arguments_is_restored(fresh: RunningStack, dialect: str) -> None:
    prompt = f"staff id {EMPLOYEE}"
    answer = ask(fresh, dialect, prompt, stream=True, tenant="extend", reply="Look up {{said}}", tool=True)
    assert EMPLOYEE in answer.args, "the placeholder in the tool call's arguments was not restored"
    assert PLACEHOLDER.search(last_sent(fresh)) is not None


def test_a_custom_kind_gets_a_token_surrogate_of_its_shape(fresh: RunningStack) -> None:
    prompt = f"employee {EMPLOYEE} again"
    answer = ask(fresh, "chat", prompt, stream=False, tenant="extend-surrogate")
    assert answer.text == ECHO_PREFIX + prompt
    sent = last_sent(fresh)
    assert EMPLOYEE not in sent and "<EMPLOYEE_ID_" not in sent
    assert re.search(r"employee [A-Z]{3}-[0-9]{6} again", sent), "the surrogate does not keep the shape"


def test_an_allowed_value_is_forwarded_as_written(fresh: RunningStack) -> None:
    other = SAMPLES["EMAIL"]
    status, _, _ = post(fresh, f"Write to {SUPPORT} or to {other}; router 10.20.4.5")
    assert status == 200
    sent = last_sent(fresh)
    assert SUPPORT in sent, "the allowed email was redacted"
    assert "10.20.4.5" in sent, "the allowed address was redacted"
    assert leaked(sent) == [], leaked(sent)


def test_a_disguised_deny_term_is_redacted(fresh: RunningStack) -> None:
    status, _, body = post(fresh, f"Status of {DISGUISED}?")
    assert status == 200
    sent = last_sent(fresh)
    assert "<DENY_TERM_" in sent
    assert "kestr" not in sent.lower(), "the deny term went upstream"
    assert b"\\u0415L" in body or "KESTR\u0415L" in body.decode(), "the caller did not get the term back"


def test_a_blocked_kind_refuses_before_the_upstream(fresh: RunningStack) -> None:
    status, headers, body = post(fresh, f"Charge card {SAMPLES['CREDIT_CARD']} please")
    assert status == 422
    assert b"CREDIT_CARD" in body
    assert leaked(body) == [], leaked(body)
    assert fresh.upstream.received == [], "the upstream was called"
    record = record_for(fresh, "extend", headers.get("x-cordon-receipt"))
    assert (record["decision"], record["stage"]) == ("refused", "policy")


def test_a_blocked_kind_in_a_header_refuses_too(fresh: RunningStack) -> None:
    headers = {"authorization": f"Bearer {KEYS['extend']}", "x-note": f"card {SAMPLES['CREDIT_CARD']}"}
    reply = request(fresh.settings.listen_port, "POST", CHAT, chat_body("hello"), headers)
    assert reply.status == 422
    assert fresh.upstream.received == []


def test_an_allowed_kind_is_forwarded_and_counted(fresh: RunningStack) -> None:
    status, headers, _ = post(fresh, f"host {SAMPLES['IP']} and mail {SAMPLES['EMAIL']}")
    assert status == 200
    sent = last_sent(fresh)
    assert SAMPLES["IP"] in sent, "the IP (actions: allow) was redacted"
    assert leaked(sent) == ["IP"], leaked(sent)
    counts = record_for(fresh, "extend", headers.get("x-cordon-receipt"))["counts"]
    assert counts == {"ALLOWED_IP": 1, "EMAIL": 1}
