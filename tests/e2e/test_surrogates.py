"""Realistic surrogates end to end (`mode: surrogate`, issue 7 part 4): real Envoy, real ext_proc
workers, real Redis, the fake upstream, the official SDKs.

The upstream must receive fictional values of each kind and none of the caller's; the caller must
get its values back exactly, in JSON and SSE (cut in 7-byte chunks), in all three dialects, tool
arguments included. The same value gets the same surrogate in every request of the tenant, across
two servers sharing one Redis, and another tenant gets another one. Declared subjects pass the
egress check with their surrogates (a date moved by the tenant's shift). Under `outputGate: deny`
a reply echoing the surrogates is not refused. Redis holds no value; a registry that cannot be
written refuses the request (503 `vault`) before the upstream; without TENANT_SECRET the mode is
refused at start.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import encode_subject_header
from ext_proc.storage.vault import derive_keys
from ext_proc.transform.surrogates import FAMILY_NAMES, GIVEN_NAMES, SURROGATE_DOMAIN, date_shift_days
from tests.e2e import test_restore_context as context
from tests.e2e.test_pseudonyms import ask
from tests.support.e2e import PERSON, SAMPLES, SENTENCE, chat_body, last_sent, leaked, request
from tests.support.fake_upstream import ECHO_PREFIX
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
    "surrogate": f"mode: surrogate\nvaultTtlSeconds: {TTL}",
    "surrogate-b": "mode: surrogate",
    "surrogate-deny": "mode: surrogate\noutputGate: deny",
}
DIALECTS = ("chat", "responses", "messages")
CHAT = "/v1/chat/completions"
SURROGATE_EMAIL = re.compile(rf"[a-z]+\.[a-z]+[0-9]{{2}}@{re.escape(SURROGATE_DOMAIN)}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(
        tmp_path_factory.mktemp("surrogates"), tenants=TENANTS, TENANT_SECRET=TENANT_SECRET
    ) as s:
        yield s


@pytest.fixture
def fresh(stack: RunningStack) -> RunningStack:
    stack.upstream.reset()
    return stack


def alnum(text: str) -> str:
    return "".join(c for c in fold(text) if c.isalnum())


def assert_no_value(sent: str) -> None:
    assert leaked(sent) == [], leaked(sent)
    folded = alnum(sent)
    for kind, value in SAMPLES.items():
        assert alnum(value) not in folded, f"the {kind} value went upstream"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_round_trip_is_exact_and_the_upstream_sees_only_surrogates(
    fresh: RunningStack, dialect: str, stream: bool
) -> None:
    split = {"x-fake-chunk-bytes": "7"} if stream else {}
    answer = ask(fresh, dialect, SENTENCE, stream=stream, tenant="surrogate", headers=split)
    assert answer.text == ECHO_PREFIX + SENTENCE
    sent = last_sent(fresh)
    assert_no_value(sent)
    assert "<EMAIL_" not in sent and "[EMAIL]" not in sent
    (email,) = SURROGATE_EMAIL.findall(sent)
    # The model names the surrogate in a tool call, in another case: restored, JSON kept valid.
    answer = ask(
        fresh, dialect, SENTENCE, stream=stream, tenant="surrogate", reply=f"Mail {email.upper()}", tool=True
    )
    assert answer.args.replace(" ", "") == f'{{"text":"Mail{SAMPLES["EMAIL"]}"}}'


def test_the_same_value_gets_the_same_surrogate_and_another_tenant_another(fresh: RunningStack) -> None:
    ask(fresh, "chat", SENTENCE, stream=False, tenant="surrogate")
    first = last_sent(fresh)
    ask(fresh, "messages", SENTENCE, stream=True, tenant="surrogate")
    assert SURROGATE_EMAIL.findall(last_sent(fresh)) == SURROGATE_EMAIL.findall(first)
    ask(fresh, "chat", SENTENCE, stream=False, tenant="surrogate-b")
    other = last_sent(fresh)
    assert_no_value(other)
    assert SURROGATE_EMAIL.findall(other) != SURROGATE_EMAIL.findall(first)


def test_a_surrogate_already_written_in_the_request_is_not_used(fresh: RunningStack) -> None:
    """The caller's prompt already holds the text the value's surrogate would be: the value gets
    another one, and the caller's text comes back as the caller wrote it."""
    email = SAMPLES["EMAIL"]
    ask(fresh, "chat", f"Mail {email}", stream=False, tenant="surrogate")
    (usual,) = SURROGATE_EMAIL.findall(last_sent(fresh))
    prompt = f"Mail {email}; my test inbox is {usual}."
    for stream in (False, True):
        answer = ask(fresh, "chat", prompt, stream=stream, tenant="surrogate")
        assert answer.text == ECHO_PREFIX + prompt
        sent = last_sent(fresh)
        assert email not in sent and sent.count(usual) == 1
        assert len(set(SURROGATE_EMAIL.findall(sent))) == 2


def test_declared_subjects_pass_the_egress_check_with_surrogates(fresh: RunningStack) -> None:
    headers = {
        "authorization": f"Bearer {KEYS['surrogate']}",
        "x-cordon-subject": encode_subject_header({"ref": "case-s1", "subjects": [PERSON]}),
    }
    prompt = (
        "Marisol Quintero-Vance (born 1986-07-14, mq@example.com, +1 404-555-0187) lives at "
        "1428 Elm Street Apt 4, Atlanta; id A1234567, handle mqvance77, on Project Bluebird."
    )
    reply = request(fresh.settings.listen_port, "POST", CHAT, chat_body(prompt), headers)
    assert reply.status == 200, reply.body
    assert reply.json()["choices"][0]["message"]["content"] == ECHO_PREFIX + prompt
    record = record_for(fresh, "surrogate", reply.headers["x-cordon-receipt"])
    assert record["egress"] == "verified" and record["mode"] == "surrogate"
    sent = last_sent(fresh)
    for values in PERSON.values():
        for value in values:
            assert alnum(value) not in alnum(sent), "a declared value went upstream"
    shift = date_shift_days(derive_keys(TENANT_SECRET, "surrogate").pseudonym)
    assert f"born {dt.date(1986, 7, 14) + dt.timedelta(days=shift):%Y-%m-%d}," in sent
    name = sent.split(ECHO_PREFIX)[-1] if ECHO_PREFIX in sent else sent
    assert any(f"{g} {f}" in name for g in GIVEN_NAMES for f in FAMILY_NAMES)
    assert "-555-01" in sent  # a fictional NANP number for the declared phone


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_output_gate_does_not_count_surrogates(fresh: RunningStack, dialect: str, stream: bool) -> None:
    """Under deny, the echo of every surrogate (an example.invalid address is an email to the
    catalog; a token may read as high entropy), and another turn's surrogate address, go through
    restored; a real address in the reply is refused (the gate is on)."""
    reply = "and elodie.marchetti42@example.invalid too"
    answer = ask(fresh, dialect, SENTENCE, stream=stream, tenant="surrogate-deny")
    assert answer.text == ECHO_PREFIX + SENTENCE
    answer = ask(fresh, dialect, SENTENCE, stream=stream, tenant="surrogate-deny", reply=reply)
    assert answer.text == reply
    # Told in-process: in a request header, the address would be read and rewritten first.
    fresh.upstream.set_behaviour(reply="write to real.person@example.org")
    headers = {"authorization": f"Bearer {KEYS['surrogate-deny']}"}
    try:
        refused = request(fresh.settings.listen_port, "POST", CHAT, chat_body("hi"), headers)
    finally:
        fresh.upstream.reset_behaviour()
    assert refused.status == 422 and "EMAIL" in refused.body.decode()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_structured_output_reads_back_exactly_the_values(
    fresh: RunningStack, dialect: str, stream: bool
) -> None:
    """The model writes the surrogates into JSON (structured output, and the same card as JSON
    text in a tool call's arguments): the originals, with their quotes and backslashes, go in
    escaped for where each surrogate sat; `json.loads` reads back exactly the values."""
    card = json.dumps(context.CARD)
    answer = context.ask(fresh, dialect, card, stream=stream, tenant="surrogate")
    sent = alnum(last_sent(fresh))
    for i, value in enumerate(context.LINES):
        assert alnum(value) not in sent, f"line {i} went upstream"
    assert context.differing(json.loads(answer.text), context.EXPECTED) == []
    answer = context.ask(fresh, dialect, card, stream=stream, tenant="surrogate", tool=True)
    inner = json.loads(json.loads(answer.args)["text"])
    assert context.differing(inner, context.EXPECTED) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_short_id_gets_a_surrogate_no_number_of_the_reply_is_mistaken_for(
    fresh: RunningStack, dialect: str, stream: bool
) -> None:
    """A declared two-digit id: its surrogate is long enough that the model's own numbers (a
    count, a list's numbering) are never taken for it and "restored" into the id."""
    short = "73"
    subject = {"ref": "case-short", "subjects": [{"ids": [short]}]}
    counts = " ".join(str(n) for n in range(100) if str(n) != short)
    fresh.upstream.set_behaviour(reply=f"Ticket {{{{said}}}}: steps {counts}.")
    try:
        answer = context.ask(
            fresh, dialect, None, stream=stream, tenant="surrogate", subject=subject, prompt=short
        )
    finally:
        fresh.upstream.reset_behaviour()
    sent = fresh.upstream.received[-1].json()
    said = sent["input"] if dialect == "responses" else sent["messages"][0]["content"]
    assert said.isdigit() and len(said) >= 8  # the surrogate: a number, of at least 8 digits
    assert answer.text == f"Ticket {short}: steps {counts}."


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_shifted_date_keeps_its_weekday_and_moves_the_age_beside_it(
    fresh: RunningStack, dialect: str, stream: bool
) -> None:
    """Neither the weekday written next to a declared date nor the age beside it tells the
    upstream the tenant's shift: the weekday still holds for the surrogate date, the age is the
    one the surrogate date gives today; the caller reads back exactly what it sent."""
    born = dt.date(1986, 7, 14)  # a Monday
    today = dt.date.today()
    age = today.year - born.year - ((today.month, today.day) < (born.month, born.day))
    prompt = f"Born Monday, 14 July 1986, aged {age}."
    subject = {"ref": "case-dob", "subjects": [{"dates": ["1986-07-14"]}]}
    echo = ECHO_PREFIX + "{{said}}"
    answer = context.ask(
        fresh, dialect, echo, stream=stream, tenant="surrogate", subject=subject, prompt=prompt
    )
    assert answer.text == ECHO_PREFIX + prompt
    found = re.search(r"Born Monday, ([0-9]{1,2} [A-Za-z]+ [0-9]{4}), aged ([0-9]+)\.", last_sent(fresh))
    assert found is not None, "the date and age are not where they were written"
    shifted = dt.datetime.strptime(found.group(1), "%d %B %Y").date()
    assert shifted != born and shifted.weekday() == born.weekday() == 0
    new_age = today.year - shifted.year - ((today.month, today.day) < (shifted.month, shifted.day))
    assert int(found.group(2)) == new_age != age


def test_redis_holds_no_value(fresh: RunningStack) -> None:
    headers = {
        "authorization": f"Bearer {KEYS['surrogate']}",
        "x-cordon-subject": encode_subject_header({"ref": "case-s2", "subjects": [PERSON]}),
    }
    person_text = " ".join(v for values in PERSON.values() for v in values)
    body = chat_body(SENTENCE + " " + person_text)
    assert request(fresh.settings.listen_port, "POST", CHAT, body, headers).status == 200
    blob = everything_in_redis(fresh)
    folded = alnum(blob.decode("utf-8", "replace"))
    for kind, value in SAMPLES.items():
        assert alnum(value) not in folded, f"a {kind} value is in Redis"
    for values in PERSON.values():
        for value in values:
            assert alnum(value) not in folded, "a declared value is in Redis"
    assert SURROGATE_DOMAIN.encode() not in blob  # nor a surrogate: keys are keyed digests
    assert TENANT_SECRET.encode() not in blob
    assert fresh.redis is not None
    with redis.Redis.from_url(fresh.redis.url) as r:
        keys = list(r.scan_iter("cordon:{surrogate}:surrogate:*"))
        assert len(keys) >= len(SAMPLES) + sum(map(len, PERSON.values()))
        assert all(0 < r.ttl(k) <= TTL for k in keys)


def test_a_registry_that_cannot_be_written_refuses_the_request(fresh: RunningStack, acl: redis.Redis) -> None:
    allow_receipt_keys_only(acl)
    headers = {"authorization": f"Bearer {KEYS['surrogate']}"}
    for stream in (False, True):
        reply = request(fresh.settings.listen_port, "POST", CHAT, chat_body(SENTENCE, stream=stream), headers)
        assert reply.status == 503, reply.body
        assert reply.json()["error"]["stage"] == "vault"
        assert leaked(reply.body) == []
        record = record_for(fresh, "surrogate", reply.headers.get("x-cordon-receipt"))
        assert record["decision"] == "refused" and record["stage"] == "vault"
    assert fresh.upstream.received == []
    nothing = request(fresh.settings.listen_port, "POST", CHAT, chat_body("no values here"), headers)
    assert nothing.status == 200 and len(fresh.upstream.received) == 1


def test_two_servers_on_one_redis_agree(tmp_path: Path) -> None:
    with two_stacks(tmp_path, tenants=TENANTS, TENANT_SECRET=TENANT_SECRET) as (a, b):
        ask(a, "responses", SENTENCE, stream=False, tenant="surrogate")
        first = last_sent(a)
        ask(b, "chat", SENTENCE, stream=True, tenant="surrogate")
        second = last_sent(b)
        assert SURROGATE_EMAIL.findall(first) == SURROGATE_EMAIL.findall(second) != []
        (email,) = SURROGATE_EMAIL.findall(first)
        for dialect in DIALECTS:
            answer = ask(b, dialect, SENTENCE, stream=True, tenant="surrogate", reply=f"To {email}.")
            assert answer.text == f"To {SAMPLES['EMAIL']}."


def test_serve_refuses_surrogate_mode_without_the_secret(tmp_path: Path) -> None:
    write_policies(tmp_path / "policies", {"surrogate": "mode: surrogate"})
    env = stack_env(tmp_path / "run", tmp_path / "policies", "redis://127.0.0.1:1/0", "http://127.0.0.1:1")
    env = {k: v for k, v in env.items() if k != "TENANT_SECRET"}
    done = subprocess.run(
        [sys.executable, "-m", "ext_proc", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "surrogate.yaml: mode: surrogate needs TENANT_SECRET" in done.stderr, done.stderr[-2000:]
