"""A policy's deny terms through the catalog: every disguise of a term is found, whole, and a term
is never found inside a longer word.

Terms are drawn from invented words; each is written back with random case, separators between
its words (spaces, typographic spaces, dashes, underscores, dots, none), letters spaced out, and
look-alike letters, then put in a sentence. Failures name the term's index, never its text.
`make test-slow` runs many more examples.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog.deny import DENY_KIND
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.catalog.extensions import Extensions
from tests.support.examples import example_count

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Cyrillic letters that read as Latin ones in the canonical view.
_LOOKALIKES = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "p": "\u0440", "c": "\u0441", "x": "\u0445"}
_SEPARATORS = (" ", "  ", "\u00a0", "\u2009", "-", "_", ".", "", " \u2014 ")

words = st.text(alphabet=_LETTERS, min_size=3, max_size=9)
terms = st.lists(words, min_size=1, max_size=3)


@st.composite
def disguised(draw: st.DrawFn, term: list[str]) -> str:
    out = []
    for word in term:
        letters = []
        for letter in word:
            if draw(st.booleans()):
                letter = letter.upper()
            elif letter in _LOOKALIKES and draw(st.integers(0, 3)) == 0:
                letter = _LOOKALIKES[letter]
            letters.append(letter)
        spacer = " " if draw(st.integers(0, 5)) == 0 else ""
        out.append(spacer.join(letters))
    return draw(st.sampled_from(_SEPARATORS)).join(out) if len(out) > 1 else out[0]


def _catalog(term: list[str]) -> Catalog:
    return Catalog.for_sets((), extensions=Extensions(deny=(" ".join(term), "unrelated filler term")))


def _check_found(data: st.DataObject, term: list[str]) -> None:
    written = data.draw(disguised(term))
    text = f"({written})"
    found = [f for f in _catalog(term).detect(text) if f.kind == DENY_KIND]
    assert len(found) == 1, "a disguised deny term was not found once"
    start, end = found[0].start, found[0].end
    assert text[start:end] == written, "the finding does not cover the term exactly"


def _check_bounded(term: list[str], tail: str) -> None:
    text = f"({' '.join(term)}{tail})"
    assert _catalog(term).detect(text) == [], "a deny term was found inside a longer word"


@settings(max_examples=example_count(300), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(term=terms, data=st.data())
def test_every_disguise_of_a_deny_term_is_found(term: list[str], data: st.DataObject) -> None:
    _check_found(data, term)


@settings(max_examples=example_count(300), deadline=None)
@given(term=terms, head=st.text(alphabet=_LETTERS, max_size=2), digit=st.sampled_from("0123456789"))
def test_a_deny_term_is_never_found_inside_a_longer_word(term: list[str], head: str, digit: str) -> None:
    # A digit in the word the term runs into: no run of the text's words can spell the term.
    _check_bounded(term, head + digit)


@pytest.mark.slow
@settings(max_examples=5000, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(term=terms, data=st.data())
def test_every_disguise_of_a_deny_term_is_found_many(term: list[str], data: st.DataObject) -> None:
    _check_found(data, term)
