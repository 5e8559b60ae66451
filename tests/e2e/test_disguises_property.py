"""Spot checks of the disguise generator through real Envoy, ext_proc, Redis and the fake upstream.

One generated disguise per transformation family (tests/support/disguises.py), and one of them all
composed, over a declared identifier or a catalog value (tests/support/disguise_cases.py), each in
a sentence of a Chat Completions, Responses or Messages request on the default tenant, the
declaration of both invented persons sent in X-Cordon-Subject. What the fake upstream received is
read by the generator's own oracle: a declared identifier is refused (422, stage `egress`, the
upstream never called) or reaches it in no rendering; a catalog value never reaches it. And the
opposite: ordinary sentences in other scripts, with every family applied to their words, reach the
upstream byte for byte. The property behind these runs in-process (tests/property/test_disguises.py).

Assertions name families, labels and indexes, never the values.
"""

from __future__ import annotations

import json
import random

import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.disguise_cases import (
    CARRIERS,
    ESCAPED_TAILS,
    ORDINARY,
    PLACES,
    Value,
    body_of,
    declaration,
    shown,
    value_of,
)
from tests.support.disguises import FAMILIES, ORDINARY_FAMILIES, Disguised, disguise, disguise_words
from tests.support.e2e import Reply, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import RunningStack

pytestmark = pytest.mark.e2e

HEADER = encode_subject_header(declaration())
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
# (families, the value disguised, the place in a body: an index of PLACES)
SPOTS: list[tuple[tuple[str, ...], str, int]] = [
    (("case",), "Marisol Quintero-Vance", 0),
    (("homoglyphs",), "tamsin.rook@example.net", 5),
    (("small_capitals",), "Teodora Vukasinovic", 9),
    (("modifier_letters",), "mqvance77", 2),
    (("math",), "4929 5083 1764 2207", 6),
    (("enclosed",), "+1 404-555-0187", 11),
    (("fullwidth",), "ZK-7731904", 3),
    (("accents",), "Project Bluebird", 7),
    (("script_digits",), "372-81-4406", 10),
    (("separators",), "DE44 5001 0517 5407 3249 31", 0),
    (("spacing",), "1428 Elm Street", 8),
    (("fillers",), "July 14, 1986", 12),
    (("escapes",), "t.vukasinovic@example.org", 1),
    (("double_escapes",), "ferdia.quell77@example.org", 5),
    (("at_words",), "mq@example.com", 13),
    (("boundary",), "Marisol Quintero-Vance", 4),
    (("boundary", "enclosed"), "4929 5083 1764 2207", 2),
    (("fillers", "homoglyphs", "separators", "escapes"), "+44 20 7946 0321", 0),
]
assert {f for families, _, _ in SPOTS for f in families} == set(FAMILIES), "a family has no spot check"


def generated(families: tuple[str, ...], value: Value) -> Disguised:
    """The first disguise (by seed) that changes the value and uses each of `families`."""
    for seed in range(1000):
        disguised = disguise(value.text, families, random.Random(seed), value.shape)
        escaped = not {"escapes", "double_escapes"} & set(families) or disguised.escapes
        if disguised.text != value.text and escaped:
            return disguised
    raise AssertionError(f"no disguise of {value.label} under {list(families)}")


def send(port: int, dialect: str, body: bytes) -> Reply:
    key = "sk-ant-test-default" if dialect == "messages" else "sk-test-no-tenant"
    auth = ("x-api-key", key) if dialect == "messages" else ("authorization", f"Bearer {key}")
    headers = [auth, ("x-cordon-subject", HEADER)]
    if dialect == "messages":
        headers.append(("anthropic-version", "2023-06-01"))
    return request(port, "POST", PATHS[dialect], body, headers)


@pytest.mark.parametrize("spot", range(len(SPOTS)), ids=lambda n: "+".join(SPOTS[n][0]))
def test_a_generated_disguise_does_not_reach_the_upstream(
    stack: RunningStack, upstream: FakeUpstream, spot: int
) -> None:
    families, text, place = SPOTS[spot]
    value = value_of(text)
    disguised = generated(families, value)
    dialect, doc = body_of(CARRIERS[0].format(disguised.text), place)
    sent = json.dumps(doc, ensure_ascii=False).encode("utf-8")
    case = f"{value.label} under {list(families)} in {dialect}.{PLACES[place][1]}"
    readable = shown(sent, value, disguised)
    assert readable, f"{case}: the oracle does not read the disguise"
    reply = send(stack.settings.listen_port, dialect, sent)
    if reply.status == 422:
        assert value.label.startswith("SUBJECT"), f"{case}: a catalog value refused"
        assert json.loads(reply.body)["error"]["stage"] == "egress", case
        assert upstream.received == [], f"{case}: refused, yet the upstream was called"
        return
    assert reply.status == 200, f"{case}: {reply.status}"
    assert len(upstream.received) == 1, case
    leaked = shown(upstream.received[0].body, value, disguised)  # a bool: nothing of the value shown
    assert not leaked, f"{case}: the value reached the upstream"


# Sentences in other scripts and with near misses of the declared values (indexes of ORDINARY).
ORDINARY_SPOTS = [(1, 5, 8), (32, 35, 41), (38, 44, 46)]


@pytest.mark.parametrize("spot", range(len(ORDINARY_SPOTS)))
def test_ordinary_text_in_disguise_reaches_the_upstream_unchanged(
    stack: RunningStack, upstream: FakeUpstream, spot: int
) -> None:
    rng = random.Random(spot)
    families = list(ORDINARY_FAMILIES)
    text = " ".join(
        disguise_words(ORDINARY[n], families, rng, unescaped=ESCAPED_TAILS) for n in ORDINARY_SPOTS[spot]
    )
    dialect, doc = body_of(text, (0, 5, 9)[spot])
    raw = json.dumps(doc, ensure_ascii=False).encode("utf-8")
    reply = send(stack.settings.listen_port, dialect, raw)
    assert reply.status == 200, f"ordinary spot {spot}: {reply.status}"
    assert len(upstream.received) == 1
    unchanged = upstream.received[0].body == raw
    assert unchanged, f"ordinary spot {spot}: the body was changed"
