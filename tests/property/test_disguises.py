"""Nothing disguised gets past, and nothing ordinary is held back: the request pipeline in-process.

The disguise generator (tests/support/disguises.py) composes transformations (fillers, look-alike
letters and digits, typographic separators, spacing, escapes once or twice encoded, `(at)` words,
accents, case) over renderings of declared identifiers of every kind and over catalog values
(tests/support/disguise_cases.py), and puts the result in a sentence at a random place of a Chat
Completions, Responses or Messages body. The body then takes the exact code path of a request
body (ext_proc.exchange.pipeline), or a whole exchange in-process (tests.support.fakes.EnvoyStream):

* a declared identifier (`redact_and_check`): either the egress check refuses the body, or the
  outgoing bytes hold no declared identifier, read by an oracle that undoes the disguise with the
  generator's own tables and decoders (never the product's canonical or decoded views) and then
  searches for the identifier's letters and digits;
* a catalog value, no subject declared (`redact_document`): the outgoing bytes hold no value, read
  by the same oracle;
* the opposite: ordinary sentences in many languages and scripts, the same transformations applied
  to their (undeclared) words, are forwarded byte for byte, and the egress check refuses none.

Disguises the product does not see through yet are left out of the draws and kept in strict xfail
tests at the end. Failures name labels, families and indexes, never values. `make test-slow` runs
many more examples.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.dialects import DIALECTS
from ext_proc.exchange.pipeline import redact_and_check, redact_document
from ext_proc.policy.model import Policy
from ext_proc.transform.placeholders import PlaceholderMap
from ext_proc.transform.walk import dump_json
from tests.support.disguise_cases import (
    CARRIERS,
    CATALOG_VALUES,
    ESCAPED_TAILS,
    IDENTIFIERS,
    ORDINARY,
    PLACES,
    Value,
    body_of,
    declaration,
    shown,
    value_of,
)
from tests.support.disguises import (
    INVERSE,
    NO_DECOMPOSITION_DIGITS,
    ORDINARY_FAMILIES,
    Disguised,
    applicable,
    disguise,
    disguise_words,
)
from tests.support.examples import example_count
from tests.support.fakes import EnvoyStream, FakeReceipts, FakeVault, keyed, make_runtime

POLICY = Policy(tenant="disguises")
CATALOG = Catalog.for_sets(POLICY.sets)
HEADER = encode_subject_header(declaration())
SUBJECTS = compile_subjects(parse_subject_header(HEADER))
VALUES = [*IDENTIFIERS, *CATALOG_VALUES]  # the declared identifiers first


def declared(value: Value) -> bool:
    return value.label.startswith("SUBJECT")


# --- the request pipeline, and a whole exchange ----------------------------------------------------


def encoded(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def subject_request(dialect: str, doc: dict[str, Any]) -> tuple[str | None, bytes]:
    """(the label the egress check refuses for, or None; the bytes that would leave)."""
    raw = encoded(doc)
    checked = redact_and_check(
        raw,
        json.loads(raw),
        policy=POLICY,
        dialect=DIALECTS[dialect],
        catalog=CATALOG,
        placeholders=PlaceholderMap(),
        subjects=SUBJECTS,
        media=[],
        counts=Counter(),
    )
    return checked.survivor, checked.body


def catalog_request(dialect: str, doc: dict[str, Any]) -> bytes:
    """The bytes a catalog-only request (no subject declared) would send."""
    raw = encoded(doc)
    redaction = redact_document(
        json.loads(raw),
        policy=POLICY,
        dialect=DIALECTS[dialect],
        catalog=CATALOG,
        placeholders=PlaceholderMap(),
        subjects=None,
        media=[],
        counts=Counter(),
    )
    return dump_json(redaction.doc) if redaction.changed else raw


ROUTES = {
    "chat": ("/v1/chat/completions", "openai"),
    "responses": ("/v1/responses", "openai"),
    "messages": ("/v1/messages", "anthropic"),
}


def exchange(dialect: str, doc: dict[str, Any], *, subject: bool) -> tuple[bool, bytes]:
    """(refused?, the bytes Envoy would forward) of one request through a whole exchange."""
    key = "sk-disguises"
    stream = EnvoyStream(make_runtime(keyed("disguises", key), receipts=FakeReceipts(), vault=FakeVault()))
    path, route = ROUTES[dialect]
    headers = [("x-api-key", key), ("content-type", "application/json")]
    if subject:
        headers.append(("x-cordon-subject", HEADER))
    try:
        answer = stream.request_headers(path, headers, route=route)
        assert answer.phase == "request_headers", f"the headers were answered {answer.phase}"
        raw = encoded(doc)
        final = stream.request_body(raw)[-1]
    finally:
        stream.close()
    if final.refused:
        return True, b""
    return False, raw if final.body is None else final.body


# --- the generator's draws ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Example:
    """One draw: which value (an index of VALUES), the families, the disguise's seed, the carrier
    sentence and the place in a body."""

    value: int
    families: tuple[str, ...]
    seed: int
    carrier: int
    place: int


@st.composite
def examples(draw: st.DrawFn) -> Example:
    index = draw(st.integers(0, len(VALUES) - 1))
    families = applicable(VALUES[index].shape)
    chosen = draw(st.permutations(families))[: draw(st.integers(1, 4))]
    return Example(
        index,
        tuple(sorted(chosen, key=families.index)),
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, len(CARRIERS) - 1)),
        draw(st.integers(0, len(PLACES) - 1)),
    )


def build(example: Example) -> tuple[Value, Disguised, str, dict[str, Any]]:
    value = VALUES[example.value]
    disguised = disguise(value.text, example.families, random.Random(example.seed), value.shape)
    carrier = CARRIERS[example.carrier]
    dialect, doc = body_of(carrier.format(disguised.text), example.place)
    return value, disguised, dialect, doc


def where(example: Example, value: Value, dialect: str) -> str:
    """A failure's description: label, families and place, never the value."""
    _, place = PLACES[example.place]
    return f"{value.label} (value #{example.value}) under {list(example.families)} in {dialect}.{place}"


def check(example: Example) -> None:
    """A declared identifier is refused or leaves no trace; a catalog value leaves no trace."""
    value, disguised, dialect, doc = build(example)
    readable = shown(encoded(doc), value, disguised)
    assert readable, f"the oracle does not read {where(example, value, dialect)}"
    if declared(value):
        survivor, body = subject_request(dialect, doc)
        event("declared: refused by the egress check" if survivor else "declared: forwarded")
        if survivor is not None:
            return
    else:
        event("catalog")
        body = catalog_request(dialect, doc)
    leaked = shown(body, value, disguised)  # a bool: the assertion shows no value
    assert not leaked, f"leak: {where(example, value, dialect)}"


def check_exchange(example: Example) -> None:
    """The same through a whole exchange (headers, admission, body, answer), as Envoy drives it."""
    value, disguised, dialect, doc = build(example)
    refused, body = exchange(dialect, doc, subject=declared(value))
    assert not refused or declared(value), f"refused: {where(example, value, dialect)}"
    leaked = not refused and shown(body, value, disguised)
    assert not leaked, f"leak: {where(example, value, dialect)}"


# --- the oracle is sound: it sees each value written plainly, and redaction removes that ----------


@pytest.mark.parametrize("index", range(len(VALUES)))
def test_a_plain_value_is_seen_by_the_oracle_and_redacted(index: int) -> None:
    value = VALUES[index]
    dialect, doc = body_of(CARRIERS[0].format(value.text), 0)
    seen = shown(encoded(doc), value, None)
    assert seen, f"the oracle misses {value.label} #{index}"
    if declared(value):
        survivor, body = subject_request(dialect, doc)
        assert survivor is None, f"{value.label} #{index} refused"
    else:
        body = catalog_request(dialect, doc)
    leaked = shown(body, value, None)
    assert not leaked, f"{value.label} #{index} not redacted"


def test_the_carriers_show_no_value() -> None:
    for n, carrier in enumerate(CARRIERS):
        body = json.dumps({"text": carrier.format("")}).encode()
        shows = any(shown(body, value, None) for value in VALUES)
        assert not shows, f"carrier {n}"


# --- the properties -------------------------------------------------------------------------------

FAST = settings(max_examples=example_count(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=10000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(example=examples())
def test_no_disguised_value_reaches_the_upstream(example: Example) -> None:
    check(example)


@pytest.mark.slow
@SLOW
@given(example=examples())
def test_no_disguised_value_reaches_the_upstream_many(example: Example) -> None:
    check(example)


@settings(FAST, max_examples=example_count(150))
@given(example=examples())
def test_no_disguised_value_gets_through_an_exchange(example: Example) -> None:
    check_exchange(example)


@pytest.mark.slow
@settings(SLOW, max_examples=2000)
@given(example=examples())
def test_no_disguised_value_gets_through_an_exchange_many(example: Example) -> None:
    check_exchange(example)


# --- the opposite: ordinary text in many languages passes unchanged -------------------------------

Ordinary = tuple[tuple[int, ...], tuple[str, ...], int, int]


@st.composite
def ordinary_texts(draw: st.DrawFn) -> Ordinary:
    sentences = draw(st.lists(st.integers(0, len(ORDINARY) - 1), min_size=1, max_size=3))
    families = draw(st.permutations(ORDINARY_FAMILIES))[: draw(st.integers(1, 4))]
    return tuple(sentences), tuple(families), draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 13))


def check_ordinary(sample: Ordinary) -> None:
    sentences, families, seed, place = sample
    rng = random.Random(seed)
    text = " ".join(disguise_words(ORDINARY[n], families, rng, unescaped=ESCAPED_TAILS) for n in sentences)
    dialect, doc = body_of(text, place)
    raw = encoded(doc)
    described = f"sentences {list(sentences)} under {list(families)} in {dialect}.{PLACES[place][1]}"
    survivor, body = subject_request(dialect, doc)
    assert survivor is None, f"refused for {survivor}: {described}"
    unchanged = body == raw
    assert unchanged, f"changed with subjects declared: {described}"
    unchanged = catalog_request(dialect, doc) == raw
    assert unchanged, f"changed by the catalog: {described}"


def test_the_ordinary_sentences_pass_as_written() -> None:
    for n, sentence in enumerate(ORDINARY):
        dialect, doc = body_of(sentence, 0)
        unchanged = subject_request(dialect, doc) == (None, encoded(doc))
        assert unchanged, f"sentence {n}"


@settings(FAST, max_examples=example_count(500))
@given(sample=ordinary_texts())
def test_ordinary_text_in_disguise_is_forwarded_unchanged(sample: Ordinary) -> None:
    check_ordinary(sample)


@pytest.mark.slow
@SLOW
@given(sample=ordinary_texts())
def test_ordinary_text_in_disguise_is_forwarded_unchanged_many(sample: Ordinary) -> None:
    check_ordinary(sample)


# --- single cases: fixed gaps kept as tests, and reported gaps, each a strict xfail that fails the
# day it is fixed (then drop the exclusion named in its reason from tests/support/disguises.py or
# from this module, and make it a plain test) ------------------------------------------------------


def leaks(text: str, value: Value, forms: Sequence[str] = (), carrier: str = CARRIERS[0]) -> bool:
    """Whether `value` written `text` reaches the upstream (a refusal: it does not)."""
    dialect, doc = body_of(carrier.format(text), 0)
    if declared(value):
        survivor, body = subject_request(dialect, doc)
        if survivor is not None:
            return False
    else:
        body = catalog_request(dialect, doc)
    return shown(body, value, Disguised(text, (), tuple(forms)))


def test_enclosed_digits_without_a_decomposition_are_read() -> None:
    card = value_of("4929 5083 1764 2207")  # every digit
    declared_digits = [value_of(t) for t in ("A1234567", "+1 404-555-0187", "1986-07-14")]
    missed = []
    for glyph in sorted(NO_DECOMPOSITION_DIGITS):
        digit = INVERSE[glyph]
        for value in (card, next(v for v in declared_digits if digit in v.text)):
            if leaks(value.text.replace(digit, glyph, 1), value):
                missed.append(f"U+{ord(glyph):04X} in {value.label}")
    assert not missed, missed


def test_an_email_right_before_a_dash_is_redacted() -> None:
    carriers = ["Write to {}—she answers.", "Write to {}- she answers.", "{}\u2013", "{}-"]
    emails = [v for v in VALUES if v.label.endswith("EMAIL")]
    missed = [
        f"{v.label} in carrier {n}" for v in emails for n, c in enumerate(carriers) if leaks(v.text, v, (), c)
    ]
    assert not missed, missed


@pytest.mark.xfail(
    strict=True, reason="a declared email with a +tag is not read with separators in its domain; its Shape"
)
def test_a_declared_email_with_a_tag_is_read_with_separators() -> None:
    tagged = value_of("mq+news@example.com")
    renderings = ["mq+news@example\u2212com", "mq+news@exam ple.com", "mq + news @ example . com"]
    missed = [n for n, text in enumerate(renderings) if leaks(text, tagged)]
    assert not missed, missed


@pytest.mark.xfail(
    strict=True,
    reason="a CSS escape's terminating space followed by a separator space reads as one space; "
    "disguises.CSS_BEFORE_SPACE",
)
def test_a_css_escape_before_a_space_keeps_the_space() -> None:
    ssn, card = value_of("219 48 7731"), value_of("4929 5083 1764 2207")
    cases = [("219 4\\38  7731", ssn), ("4929 5083 1764 220\\37  ok", card), ("219 4\\38 \u00ad 7731", ssn)]
    missed = [n for n, (text, value) in enumerate(cases) if leaks(text, value, ["css"])]
    assert not missed, missed


@pytest.mark.xfail(
    strict=True,
    reason="a CSS escape that also reads as an octal escape (\\011066 ) is read as octal only; "
    "disguises.CSS_AS_OCTAL",
)
def test_a_css_escape_that_reads_as_octal_too_is_read_both_ways() -> None:
    # U+11066 is a Brahmi digit zero: `(4𑁦4) 555-0187` is the declared phone.
    leaked = leaks("(4\\011066 4) 555-0187", value_of("(404) 555-0187"), ["css"])
    assert not leaked, "SUBJECT1_PHONE"


@pytest.mark.xfail(
    strict=True,
    reason="an escape right before a word's tail that spells a declared token leaves the tail as a "
    "word (a%64vance is refused); ESCAPED_TAILS",
)
def test_an_escape_inside_an_ordinary_word_is_no_word_boundary() -> None:
    texts = ["We should a%64vance the release.", "We should a&#100;vance it.", "We should A&#x44;VANCE it."]
    changed = []
    for n, text in enumerate(texts):
        dialect, doc = body_of(text, 0)
        if subject_request(dialect, doc) != (None, encoded(doc)):
            changed.append(n)
    assert not changed, changed
