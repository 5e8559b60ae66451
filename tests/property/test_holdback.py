"""The hold-back's shortcut (ext_proc.restore.holdback) changes no answer: the undecided tail a
stream channel keeps is the same with it as with the full reading."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import SETS
from ext_proc.restore import holdback
from ext_proc.restore.holdback import HOLD_CHARS, one_short_run, open_start
from tests.support.examples import example_count

CATALOG = Catalog.for_sets(SETS)

# Pieces the spanning patterns are made of (digits in groups, IBAN and PEM prefixes, phone
# punctuation, keys and quotes, addresses) between ordinary words.
PIECES = st.sampled_from(
    ["4111", "1111", "12", "3", "555", "0199", "-", " ", "  ", "(", ")", "+1", "+44", ".", "/",
     "DE89", "GB", "3704", "-----BEGIN", " RSA", " PRIVATE KEY", "-----", "password", " = ",
     "'", '"', "token:", "ann", "@", "example", ".com", "[dot]", "the", "order", "of", "\n", "\u00a0"]
)  # fmt: skip
TEXTS = st.lists(PIECES, max_size=24).map("".join)


@settings(max_examples=example_count(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS, TEXTS)
def test_one_short_run_is_answered_as_the_full_reading_would(before: str, run: str) -> None:
    """A run without spaces after `floor` is undecided: the shortcut and the full reading agree."""
    text = before + run
    floor = len(before)
    if one_short_run(text, floor):
        assert open_start(text, floor, CATALOG) == floor
        assert _full_open_start(text, floor) == floor


def _full_open_start(text: str, floor: int) -> int:
    original = holdback.one_short_run
    holdback.one_short_run = lambda _text, _floor: False  # type: ignore[assignment]
    try:
        return open_start(text, floor, CATALOG)
    finally:
        holdback.one_short_run = original


@pytest.mark.parametrize("text", ["call 4111 1111", "key -----BEGIN RSA", "ok DE89 3704 0044", "+44 20 7946"])
def test_a_value_still_growing_is_held(text: str) -> None:
    assert open_start(text, 0, CATALOG) < len(text) - len(text.split()[-1])
    assert len(text) <= HOLD_CHARS
