"""Consistent pseudonyms and the vault end to end: real Envoy, real ext_proc workers, real Redis,
the fake upstream, the official SDKs.

Turn 1 sends a value; turn 2 sends a request without it, and the fake upstream is told
(`x-fake-reply`) to answer with turn 1's placeholder only: the client must get the value back, in
JSON and in SSE, in all three dialects, across two independent servers sharing one Redis. With the
vault unreadable the reply keeps that placeholder (counted, logged without values); with the vault
unwritable the request is refused and never reaches the upstream. Nothing in Redis is a value.
Without TENANT_SECRET (or with a weak one) a tenant that wants consistent pseudonyms is refused at
start, and on reload its file is rejected like an invalid one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import redis

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import encode_subject_header
from ext_proc.policy.model import hash_api_key
from ext_proc.transform.grammar import PSEUDONYM_HEX_CHARS
from tests.support.e2e import (
    PERSON,
    SAMPLES,
    SENTENCE,
    chat_body,
    last_sent,
    log_events,
    metric,
    request,
    wait_for,
)
from tests.support.harness import (
    KEYS,
    TENANT_SECRET,
    RunningStack,
    running_stack,
    stack_env,
    two_stacks,
    write_policies,
)
from tests.support.receipts import allow_receipt_keys_only, everything_in_redis, record_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TTL = 3600
TENANTS = {
    "pseudonyms": f"consistentPseudonyms: true\nvaultTtlSeconds: {TTL}",
    "pseudonyms-b": "consistentPseudonyms: true",
}
DIALECTS = ("chat", "responses", "messages")
CHAT = "/v1/chat/completions"
# Each tool declared the way its API declares one; the fake upstream calls the first.
PARAMETERS = {"type": "object", "properties": {"text": {"type": "string"}}}
TOOLS: dict[str, list[dict[str, Any]]] = {
    "chat": [{"type": "function", "function": {"name": "send_note", "parameters": PARAMETERS}}],
    "responses": [{"type": "function", "name": "send_note", "parameters": PARAMETERS}],
    "messages": [{"name": "send_note", "input_schema": PARAMETERS}],
}


def placeholders_in(text: str, label: str = "EMAIL") -> list[str]:
    return re.findall(rf"<{label}_[0-9a-f]{{{PSEUDONYM_HEX_CHARS}}}>", text)


# --- a client per dialect: what the caller sees ---------------------------------------------------


@dataclass
class Answer:
    text: str  # the reply text, streamed deltas joined
    args: str  # the tool call's arguments, if any
    id: str


def ask(
    stack: RunningStack,
    dialect: str,
    prompt: str,
    *,
    stream: bool,
    tenant: str = "pseudonyms",
    reply: str | None = None,
    tool: bool = False,
    previous: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One turn through the stack with the official SDK of the dialect."""
    extra = {**(headers or {})}
    if reply is not None:
        extra["x-fake-reply"] = reply
    if tool:
        extra["x-fake-tool"] = "1"
    key = KEYS[tenant]
    if dialect == "messages":
        return _anthropic(stack, key, prompt, stream, extra, tool)
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key, max_retries=0, timeout=30)
    if dialect == "chat":
        messages: Any = [{"role": "user", "content": prompt}]
        kwargs: dict[str, Any] = {"model": "gpt-4o-mini", "messages": messages, "extra_headers": extra}
        if tool:
            kwargs["tools"] = TOOLS["chat"]
        if not stream:
            done = client.chat.completions.create(**kwargs)
            message = done.choices[0].message
            calls = message.tool_calls or []
            return Answer(message.content or "", calls[0].function.arguments if calls else "", done.id)  # type: ignore[union-attr]
        text, args, rid = "", "", ""
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            rid = chunk.id
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    args += (call.function.arguments or "") if call.function else ""
        return Answer(text, args, rid)
    kwargs = {"model": "gpt-4.1", "input": prompt, "extra_headers": extra}
    if previous is not None:
        kwargs["previous_response_id"] = previous
    if tool:
        kwargs["tools"] = TOOLS["responses"]
    if not stream:
        done_r = client.responses.create(**kwargs)
        args = "".join(item.arguments for item in done_r.output if item.type == "function_call")
        return Answer(done_r.output_text, args, done_r.id)
    text, args, rid = "", "", ""
    for event in client.responses.create(stream=True, **kwargs):
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.function_call_arguments.delta":
            args += event.delta
        elif event.type == "response.completed":
            rid = event.response.id
    return Answer(text, args, rid)


def _anthropic(
    stack: RunningStack, key: str, prompt: str, stream: bool, extra: dict[str, str], tool: bool
) -> Answer:
    client = anthropic.Anthropic(base_url=stack.base_url, api_key=key, max_retries=0, timeout=30)
    kwargs: dict[str, Any] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": prompt}],
        "extra_headers": extra,
    }
    if tool:
        kwargs["tools"] = TOOLS["messages"]
    if not stream:
        done = client.messages.create(**kwargs)
        text = "".join(block.text for block in done.content if block.type == "text")
        args = "".join(json.dumps(block.input) for block in done.content if block.type == "tool_use")
        return Answer(text, args, done.id)
    text, args, rid = "", "", ""
    with client.messages.stream(**kwargs) as events:
        for event in events:
            if event.type == "message_start":
                rid = event.message.id
            elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                args += event.delta.partial_json
    return Answer(text, args, rid)


# --- the stack ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vaulted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """A stack with TENANT_SECRET and two tenants that use consistent pseudonyms."""
    with running_stack(
        tmp_path_factory.mktemp("pseudonyms"), tenants=TENANTS, TENANT_SECRET=TENANT_SECRET
    ) as s:
        yield s


@pytest.fixture
def fresh(vaulted: RunningStack) -> RunningStack:
    vaulted.upstream.reset()
    return vaulted


def turn_one(stack: RunningStack, dialect: str, email: str, *, stream: bool = False) -> tuple[str, Answer]:
    """Send `email`; returns the placeholder the upstream saw for it, and the answer."""
    answer = ask(stack, dialect, f"Please write to {email} today.", stream=stream)
    sent = last_sent(stack)
    assert email not in sent
    found = set(placeholders_in(sent))
    assert len(found) == 1, sent
    assert answer.text.endswith(f"Please write to {email} today.")  # the echo, restored from the map
    return found.pop(), answer


# --- multi-turn -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_reply_naming_an_earlier_turn_gets_the_value(
    fresh: RunningStack, dialect: str, stream: bool
) -> None:
    email = f"casey.{dialect}.{int(stream)}@example.com"
    placeholder, first = turn_one(fresh, dialect, email, stream=stream)
    # The model mentions turn 1's placeholder in the forms models write: as sent, without brackets,
    # upper-cased, with markdown-escaped underscores. The request itself carries no value.
    bare = placeholder[1:-1]
    markdown = bare.replace("_", "\\_")
    forms = f"Sent to {placeholder}; bare {bare}; loud {placeholder.upper()}; md {markdown}."
    # Streamed, the upstream writes 7 bytes at a time: placeholders reach the server cut in pieces.
    split = {"x-fake-chunk-bytes": "7"} if stream else {}
    second = ask(
        fresh,
        dialect,
        "Which address did I give you?",
        stream=stream,
        reply=forms,
        previous=first.id,
        headers=split,
    )
    assert "@" not in last_sent(fresh)
    assert second.text == f"Sent to {email}; bare {email}; loud {email}; md {email}."
    # The same value in a later request gets the same placeholder.
    ask(fresh, dialect, f"Again: {email}", stream=stream)
    assert placeholders_in(last_sent(fresh)) == [placeholder]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_arguments_naming_an_earlier_turn_are_restored(fresh: RunningStack, dialect: str) -> None:
    email = f"tool.{dialect}@example.com"
    placeholder, _ = turn_one(fresh, dialect, email)
    for stream in (False, True):
        answer = ask(fresh, dialect, "Send the note.", stream=stream, reply=f"Mail {placeholder}", tool=True)
        assert json.loads(answer.args) == {"text": f"Mail {email}"}


def test_json_escaped_brackets_are_restored(fresh: RunningStack) -> None:
    email = "escaped.brackets@example.com"
    placeholder, _ = turn_one(fresh, "responses", email)
    headers = {"x-fake-escape-brackets": "deep"}
    for stream in (False, True):
        answer = ask(
            fresh, "responses", "again?", stream=stream, reply=f"<{placeholder}>", tool=True, headers=headers
        )
        assert json.loads(answer.args) == {"text": f"<{email}>"}


def test_look_alikes_and_other_tenants_placeholders_stay(fresh: RunningStack) -> None:
    """Only this tenant's placeholders whose vault entry exists are restored: a typed look-alike, a
    placeholder of another tenant (same value, another key) and per-request forms stay as they are."""
    email = "only.mine@example.com"
    mine, _ = turn_one(fresh, "chat", email)
    ask(fresh, "chat", f"Write to {email}", stream=False, tenant="pseudonyms-b")
    theirs = placeholders_in(last_sent(fresh))[0]
    assert theirs != mine
    look_alike = "<EMAIL_" + "0123456789" * (PSEUDONYM_HEX_CHARS // 10) + ">"
    reply = f"{mine} | {theirs} | {look_alike} | <EMAIL_ab12cd34_1>"
    for stream in (False, True):
        answer = ask(fresh, "chat", "hi", stream=stream, tenant="pseudonyms-b", reply=reply)
        assert answer.text == f"{mine} | {email} | {look_alike} | <EMAIL_ab12cd34_1>"
        answer = ask(fresh, "chat", "hi", stream=stream, tenant="pseudonyms", reply=reply)
        assert answer.text == f"{email} | {theirs} | {look_alike} | <EMAIL_ab12cd34_1>"
    # The default tenant (per-request placeholders) restores none of them.
    plain = request(fresh.settings.listen_port, "POST", CHAT, chat_body("hi"), {"x-fake-reply": reply})
    assert plain.json()["choices"][0]["message"]["content"] == reply


def test_x_tenant_cannot_switch_to_consistent_pseudonyms_or_a_longer_ttl(fresh: RunningStack) -> None:
    """Stable placeholders let the model link more, a longer TTL keeps values longer: both are
    looser, so X-Tenant may not select them (403 naming the knob, no upstream call)."""
    cases = [(None, "pseudonyms", "consistentPseudonyms"), ("pseudonyms", "pseudonyms-b", "vaultTtlSeconds")]
    for key, wanted, knob in cases:
        fresh.upstream.clear()
        headers = {"x-tenant": wanted, **({"authorization": f"Bearer {KEYS[key]}"} if key else {})}
        reply = request(fresh.settings.listen_port, "POST", CHAT, chat_body(SENTENCE), headers)
        assert reply.status == 403 and knob in reply.json()["error"]["message"]
        assert fresh.upstream.received == []


def test_declared_subjects_keep_their_placeholder_whatever_their_order(fresh: RunningStack) -> None:
    """SUBJECT_NAME, not SUBJECT1_NAME: the same person listed second gets the same placeholder;
    the egress check passes over pseudonyms; the reply is restored."""
    other = {"names": ["Octavia Brennan-Hale"]}
    headers = {"authorization": f"Bearer {KEYS['pseudonyms']}"}
    seen = []
    for subjects in ([PERSON], [other, PERSON]):
        header = encode_subject_header({"ref": "case-77", "subjects": subjects})
        body = chat_body("Draft a letter to Marisol Quintero-Vance.")
        reply = request(
            fresh.settings.listen_port, "POST", CHAT, body, {**headers, "x-cordon-subject": header}
        )
        assert reply.status == 200, reply.body
        assert reply.json()["choices"][0]["message"]["content"].endswith(
            "Draft a letter to Marisol Quintero-Vance."
        )
        sent = last_sent(fresh)
        assert "Marisol" not in sent and "Quintero" not in sent
        seen.append(placeholders_in(sent, "SUBJECT_NAME"))
        record = record_for(fresh, "pseudonyms", reply.headers["x-cordon-receipt"])
        assert record["egress"] == "verified"
    assert len(seen[0]) == 1 and seen[0] == seen[1]


def test_vault_holds_no_plaintext_and_expires(fresh: RunningStack) -> None:
    """Traffic with every catalog sample and the declared person, then every Redis key is read."""
    port = fresh.settings.listen_port
    headers = {"authorization": f"Bearer {KEYS['pseudonyms']}"}
    person_text = " ".join(v for values in PERSON.values() for v in values)
    subject = {"x-cordon-subject": encode_subject_header({"ref": "case-vault", "subjects": [PERSON]})}
    assert (
        request(port, "POST", CHAT, chat_body(SENTENCE + " " + person_text), {**headers, **subject}).status
        == 200
    )
    assert request(port, "POST", CHAT, chat_body(SENTENCE, stream=True), headers).status == 200
    ask(fresh, "messages", SENTENCE, stream=True)
    blob = everything_in_redis(fresh)
    folded = "".join(c for c in fold(blob.decode("utf-8", "replace")) if c.isalnum())
    for kind, value in SAMPLES.items():
        assert "".join(c for c in fold(value) if c.isalnum()) not in folded, f"a {kind} value is in Redis"
    for field, values in PERSON.items():
        for value in values:
            assert "".join(c for c in fold(value) if c.isalnum()) not in folded, (
                f"a declared {field} is in Redis"
            )
    assert TENANT_SECRET.encode() not in blob
    assert fresh.redis is not None
    with redis.Redis.from_url(fresh.redis.url) as r:
        keys = list(r.scan_iter("cordon:{pseudonyms}:vault:*"))
        labels = {k.decode().split(":vault:")[1].rsplit("_", 1)[0] for k in keys}
        assert {"EMAIL", "CREDIT_CARD", "SUBJECT_NAME", "SUBJECT_PHONE"} <= labels
        assert all(0 < r.ttl(k) <= TTL for k in keys)


# --- the vault failing ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_vault_unreadable_on_the_reply_side(
    fresh: RunningStack, acl: redis.Redis, dialect: str, stream: bool
) -> None:
    """MGET refused: the reply restores what this request's map holds, keeps the earlier placeholder,
    and the miss is counted and logged (without the placeholder or any value)."""
    email, phone = f"earlier.{dialect}.{int(stream)}@example.com", "+1 212-555-0143"
    placeholder, _ = turn_one(fresh, dialect, email)
    ask(fresh, dialect, f"Call {phone}", stream=False)
    (phone_placeholder,) = placeholders_in(last_sent(fresh), "PHONE")
    before = metric(fresh, 'cordon_vault_unrestored_total{reason="unavailable"}')
    acl.execute_command("ACL", "SETUSER", "default", "-mget")
    reply = f"Mail {placeholder}, call {phone_placeholder}."
    answer = ask(fresh, dialect, f"Call {phone} again", stream=stream, reply=reply)
    assert answer.text == f"Mail {placeholder}, call {phone}."  # the map restores its own, not the rest
    wait_for(lambda: metric(fresh, 'cordon_vault_unrestored_total{reason="unavailable"}') >= before + 1)
    events = log_events(fresh, "vault_read_failed")
    assert events and all(e["tenant"] == "pseudonyms" and e["placeholders"] >= 1 for e in events)
    log = (fresh.settings.run_dir / "logs" / "ext_proc.log").read_text()
    assert email not in log and placeholder[1:-1] not in log and phone not in log


def test_vault_unwritable_refuses_the_request(fresh: RunningStack, acl: redis.Redis) -> None:
    """The vault keys refused, the receipt keys allowed: the request is refused 503 at stage
    `vault`, the upstream never called, and the receipt records the refusal. failMode does not
    matter; a request with nothing to store still goes through."""
    allow_receipt_keys_only(acl)
    headers = {"authorization": f"Bearer {KEYS['pseudonyms']}"}
    for stream in (False, True):
        reply = request(fresh.settings.listen_port, "POST", CHAT, chat_body(SENTENCE, stream=stream), headers)
        assert reply.status == 503, reply.body
        error = reply.json()["error"]
        assert error["stage"] == "vault" and "vault" in error["message"]
        assert SAMPLES["EMAIL"] not in reply.body.decode()
        record = record_for(fresh, "pseudonyms", reply.headers.get("x-cordon-receipt"))
        assert record["decision"] == "refused" and record["stage"] == "vault"
    assert fresh.upstream.received == []
    nothing = request(fresh.settings.listen_port, "POST", CHAT, chat_body("no values here"), headers)
    assert nothing.status == 200 and len(fresh.upstream.received) == 1
    events = log_events(fresh, "vault_write_failed")
    assert events and all(e["tenant"] == "pseudonyms" for e in events)
    wait_for(lambda: metric(fresh, 'cordon_vault_errors_total{op="write"}') >= 2)


# --- two servers, one Redis ---------------------------------------------------------------------------


def test_two_servers_share_the_vault(tmp_path: Path) -> None:
    """Turn 1 through one server, turn 2 through another (own supervisor, own workers): same
    placeholder for the same value, and the second restores the first's."""
    with two_stacks(tmp_path, tenants=TENANTS, TENANT_SECRET=TENANT_SECRET) as (a, b):
        email = "two.servers@example.com"
        placeholder, first = turn_one(a, "responses", email)
        ask(b, "chat", f"Also {email}", stream=False)
        assert placeholders_in(last_sent(b)) == [placeholder]
        for dialect in DIALECTS:
            for stream in (False, True):
                answer = ask(
                    b, dialect, "And?", stream=stream, reply=f"As asked: {placeholder}", previous=first.id
                )
                assert answer.text == f"As asked: {email}"


# --- TENANT_SECRET ------------------------------------------------------------------------------------


def consistent_policies(root: Path) -> Path:
    write_policies(root, {"pseudonyms": "consistentPseudonyms: true"})
    return root


@pytest.mark.parametrize(
    ("secret", "expected"),
    [
        ("", "pseudonyms.yaml: consistentPseudonyms: needs TENANT_SECRET"),
        ("too-short-secret", "TENANT_SECRET is too weak"),
        ("a" * 48, "TENANT_SECRET is too weak"),  # long, but not random
    ],
    ids=["unset", "short", "repetitive"],
)
def test_serve_refuses_to_start_without_a_usable_secret(tmp_path: Path, secret: str, expected: str) -> None:
    env = stack_env(
        tmp_path / "run",
        consistent_policies(tmp_path / "policies"),
        "redis://127.0.0.1:1/0",
        "http://127.0.0.1:1",
    )
    env = {k: v for k, v in env.items() if k != "TENANT_SECRET"}
    if secret:
        env["TENANT_SECRET"] = secret
    for command in (["serve"], ["stack", "up"]):
        done = subprocess.run(
            [sys.executable, "-m", "ext_proc", *command],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode != 0, command
        assert expected in done.stderr, (command, done.stderr[-2000:])
        if secret:
            assert secret not in done.stderr and secret not in done.stdout
    assert list((tmp_path / "run" / "pids").glob("*.pid")) == []
    check = subprocess.run(
        [sys.executable, "-m", "ext_proc", "policy", "check", str(tmp_path / "policies")],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr  # CI holds no secret: the files themselves are valid


def test_reload_rejects_consistent_pseudonyms_without_the_secret(tmp_path: Path) -> None:
    """Without TENANT_SECRET, a file turned to consistent pseudonyms keeps its last good version and
    a new one is left out; the log names file and key."""
    with running_stack(tmp_path, workers=1, TENANT_SECRET="") as stack:
        port = stack.settings.listen_port
        strip_file = tmp_path / "policies" / "strip.yaml"
        strip_file.write_text(strip_file.read_text() + "consistentPseudonyms: true\n")
        digest = hash_api_key(KEYS["pseudonyms"])
        (tmp_path / "policies" / "pseudonyms.yaml").write_text(
            f'tenant: pseudonyms\napiKeys: ["sha256:{digest}"]\nconsistentPseudonyms: true\n'
        )

        def rejected() -> set[str]:
            return {
                Path(e["file"]).name
                for e in log_events(stack, "policy_reload_error")
                if e["key"] == "consistentPseudonyms" and "TENANT_SECRET" in e["reason"]
            }

        wait_for(lambda: rejected() == {"strip.yaml", "pseudonyms.yaml"})
        strip = request(port, "POST", CHAT, chat_body(SENTENCE), {"authorization": f"Bearer {KEYS['strip']}"})
        assert record_for(stack, "strip", strip.headers["x-cordon-receipt"])["mode"] == "strip"
        assert "[EMAIL]" in stack.upstream.received[-1].text()
        new = request(
            port, "POST", CHAT, chat_body(SENTENCE), {"authorization": f"Bearer {KEYS['pseudonyms']}"}
        )
        assert record_for(stack, "default", new.headers["x-cordon-receipt"])["tenant"] == "default"
