"""Overlap resolution, the rewrite of one string, and the per-request placeholder map."""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.detect.findings import Finding
from ext_proc.transform.grammar import NONCE_HEX_CHARS, format_placeholder, strip_marker
from ext_proc.transform.placeholders import PlaceholderMap
from ext_proc.transform.redact import SUBJECT_PRIORITY_LIMIT, resolve_overlaps, reversible, rewrite, strip
from tests.support.examples import example_count

PLACEHOLDER = re.compile(r"^<[A-Z0-9_]+_[0-9a-f]{8}_[1-9][0-9]*>$")


def catalog(kind: str, start: int, end: int, priority: int = 100) -> Finding:
    return Finding(kind, start, end, priority=priority)


def subject(kind: str, start: int, end: int, priority: int = 1) -> Finding:
    return Finding(kind, start, end, label=f"SUBJECT1_{kind}", priority=priority)


def overlaps(a: Finding, b: Finding) -> bool:
    return a.start < b.end and b.start < a.end


# --- overlap resolution -------------------------------------------------------------------------


def test_subject_beats_longer_catalog_finding() -> None:
    """A declared-subject match wins over the catalog whatever the lengths."""
    long_catalog = catalog("EMAIL", 0, 30)
    short_subject = subject("NAME", 5, 8, priority=SUBJECT_PRIORITY_LIMIT - 1)
    assert resolve_overlaps([long_catalog, short_subject]) == [short_subject]
    assert resolve_overlaps([short_subject, long_catalog]) == [short_subject]


def test_priority_at_limit_is_catalog() -> None:
    """Priority SUBJECT_PRIORITY_LIMIT is already catalog: length decides."""
    longer = catalog("EMAIL", 0, 30, priority=50)
    at_limit = catalog("PHONE", 5, 8, priority=SUBJECT_PRIORITY_LIMIT)
    assert resolve_overlaps([at_limit, longer]) == [longer]


def test_longer_span_wins_among_catalog() -> None:
    """Among catalog findings the longer span wins even against a lower priority."""
    short_high = catalog("SSN", 2, 6, priority=1 + SUBJECT_PRIORITY_LIMIT)
    long_low = catalog("HIGH_ENTROPY", 0, 10, priority=200)
    assert resolve_overlaps([short_high, long_low]) == [long_low]


def test_longer_span_wins_among_subjects() -> None:
    """Among subject findings too, the longer span wins first."""
    short = subject("NAME", 0, 4, priority=1)
    longer = subject("ADDRESS", 2, 12, priority=5)
    assert resolve_overlaps([short, longer]) == [longer]


def test_equal_length_lower_priority_wins() -> None:
    """Equal lengths: the lower priority number wins."""
    a = catalog("PHONE", 0, 10, priority=30)
    b = catalog("SSN", 3, 13, priority=20)
    assert resolve_overlaps([a, b]) == [b]
    assert resolve_overlaps([b, a]) == [b]


def test_equal_length_and_priority_earlier_start_wins() -> None:
    """Equal length and priority: the earlier start wins."""
    early = catalog("IP", 0, 10)
    late = catalog("IP", 5, 15)
    assert resolve_overlaps([late, early]) == [early]


def test_adjacent_spans_are_both_kept() -> None:
    """Spans that touch without overlapping are both redacted."""
    left, right = catalog("EMAIL", 0, 5), catalog("PHONE", 5, 9)
    assert resolve_overlaps([right, left]) == [left, right]


def test_zero_and_negative_length_findings_are_ignored() -> None:
    """Empty (or inverted) spans are dropped and never block a real one."""
    empty = subject("NAME", 3, 3)
    inverted = subject("NAME", 6, 4)
    real = catalog("EMAIL", 0, 10)
    assert resolve_overlaps([empty, inverted, real]) == [real]
    assert resolve_overlaps([empty]) == []
    assert resolve_overlaps([]) == []


def test_result_is_sorted_by_start() -> None:
    """The kept findings come back in text order, whatever order they came in."""
    found = [catalog("EMAIL", 40, 50), catalog("PHONE", 0, 3), subject("NAME", 20, 22), catalog("IP", 10, 18)]
    assert [f.start for f in resolve_overlaps(found)] == [0, 10, 20, 40]


def test_a_winner_can_drop_several_losers() -> None:
    """One long span covering several short ones keeps only the long one."""
    cover = catalog("PRIVATE_KEY", 0, 100)
    inside = [catalog("EMAIL", i, i + 5) for i in range(0, 95, 10)]
    assert resolve_overlaps([*inside, cover]) == [cover]


def test_accepts_any_iterable() -> None:
    """A generator of findings is resolved like a list."""
    found = (catalog("EMAIL", i * 4, i * 4 + 3) for i in range(5))
    assert len(resolve_overlaps(found)) == 5


def _rank(f: Finding) -> tuple[int, int, int, int]:
    """The documented priority order, restated independently of the module."""
    return (0 if f.priority < SUBJECT_PRIORITY_LIMIT else 1, -(f.end - f.start), f.priority, f.start)


findings_strategy = st.lists(
    st.builds(
        Finding,
        kind=st.sampled_from(["EMAIL", "PHONE", "NAME", "IP"]),
        start=st.integers(0, 60),
        end=st.integers(0, 70),
        priority=st.sampled_from([1, 2, 9, 10, 20, 100]),
    ),
    max_size=40,
)


@settings(max_examples=example_count(400), deadline=None)
@given(findings_strategy)
def test_resolution_property(found: list[Finding]) -> None:
    """Never overlapping, sorted, a subset, and every dropped span lost to a kept one of better rank."""
    kept = resolve_overlaps(found)
    assert all(f in found for f in kept)
    assert all(f.length > 0 for f in kept)
    assert all(a.end <= b.start for a, b in pairwise(kept))
    for f in found:
        if f.length > 0 and f not in kept:
            assert any(overlaps(f, k) and _rank(k) <= _rank(f) for k in kept)


def test_resolution_of_many_findings_runs() -> None:
    """20,000 findings of mixed lengths and kinds resolve (cost is watched by the benchmark)."""
    rng = random.Random(20000)
    found = []
    for i in range(20000):
        start = i * 6 + rng.randrange(3)
        found.append(Finding("EMAIL", start, start + 1 + rng.randrange(9), priority=rng.choice([1, 50, 100])))
    kept = resolve_overlaps(found)
    assert 0 < len(kept) <= len(found)
    assert all(a.end <= b.start for a, b in pairwise(kept))


def _timed(found: list[Finding]) -> float:
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        resolve_overlaps(found)
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.slow
def test_resolution_scales_near_linearly() -> None:
    """Four times the findings costs well under eight times the time (quadratic gives ~16)."""
    rng = random.Random(7)

    def make(n: int) -> list[Finding]:
        return [Finding("EMAIL", i * 10, i * 10 + 1 + rng.randrange(8)) for i in range(n)]

    small, large = make(50_000), make(200_000)
    assert _timed(large) < 8 * _timed(small)


# --- rewrite --------------------------------------------------------------------------------------


def test_rewrite_replaces_the_right_spans_and_counts_labels() -> None:
    """Each span is replaced in place, the rest is kept byte for byte, and labels are counted."""
    text = "Mail ann@x.io or ann@x.io, call 555-0100; Ann says hi"
    found = resolve_overlaps(
        [
            catalog("EMAIL", 5, 13),
            catalog("EMAIL", 17, 25),
            catalog("PHONE", 32, 40),
            subject("NAME", 42, 45),
        ]
    )
    pmap = PlaceholderMap(nonce="0badf00d")
    counts: Counter[str] = Counter()
    out = rewrite(text, found, reversible(pmap), counts)
    assert out == (
        "Mail <EMAIL_0badf00d_1> or <EMAIL_0badf00d_1>, call <PHONE_0badf00d_1>; "
        "<SUBJECT1_NAME_0badf00d_1> says hi"
    )
    assert counts == Counter({"EMAIL": 2, "PHONE": 1, "SUBJECT1_NAME": 1})
    assert pmap.originals == {
        "<EMAIL_0badf00d_1>": "ann@x.io",
        "<PHONE_0badf00d_1>": "555-0100",
        "<SUBJECT1_NAME_0badf00d_1>": "Ann",
    }


def test_rewrite_at_the_edges() -> None:
    """Spans at the very start and end, and the whole string, are replaced."""
    counts: Counter[str] = Counter()
    assert rewrite("abcdef", [catalog("IP", 0, 2), catalog("IP", 4, 6)], strip, counts) == "[IP]cd[IP]"
    assert rewrite("abcdef", [catalog("SSN", 0, 6)], strip, counts) == "[SSN]"
    assert counts == Counter({"IP": 2, "SSN": 1})


def test_rewrite_without_findings_is_identity() -> None:
    """No findings: the same string, no counts."""
    counts: Counter[str] = Counter()
    text = "nothing here"
    assert rewrite(text, [], strip, counts) is text
    assert counts == Counter()


def test_rewrite_adds_to_existing_counts() -> None:
    """Counts accumulate across the strings of one body."""
    counts: Counter[str] = Counter({"EMAIL": 3})
    rewrite("a@b.co", [catalog("EMAIL", 0, 6)], strip, counts)
    assert counts["EMAIL"] == 4


def test_strip_writes_the_label() -> None:
    """Strip mode writes [LABEL] and records nothing to restore."""
    assert strip(subject("PHONE", 0, 3), "555") == "[SUBJECT1_PHONE]"
    assert strip_marker("CREDIT_CARD") == "[CREDIT_CARD]"


@settings(max_examples=example_count(200), deadline=None)
@given(st.text(min_size=1, max_size=80), st.data())
def test_rewrite_keeps_everything_outside_the_spans(text: str, data: st.DataObject) -> None:
    """Between the replacements, the text is exactly the original's."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), min_size=2, max_size=8, unique=True)))
    found = [catalog("X", a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False)]
    out = rewrite(text, found, strip, Counter())
    expected, cursor = [], 0
    for f in found:
        expected += [text[cursor : f.start], "[X]"]
        cursor = f.end
    assert out == "".join([*expected, text[cursor:]])


# --- placeholders ---------------------------------------------------------------------------------


def test_same_label_and_original_same_placeholder() -> None:
    """Repeating a value under a label gives back the same placeholder."""
    pmap = PlaceholderMap()
    first = pmap.placeholder_for("EMAIL", "a@b.co")
    assert pmap.placeholder_for("EMAIL", "a@b.co") == first
    assert len(pmap) == 1


def test_indexes_count_per_label() -> None:
    """Each label numbers its distinct originals from 1."""
    pmap = PlaceholderMap(nonce="00c0ffee")
    assert pmap.placeholder_for("EMAIL", "a@b.co") == "<EMAIL_00c0ffee_1>"
    assert pmap.placeholder_for("PHONE", "555-0100") == "<PHONE_00c0ffee_1>"
    assert pmap.placeholder_for("EMAIL", "c@d.co") == "<EMAIL_00c0ffee_2>"
    assert pmap.placeholder_for("SUBJECT2_NAME", "Ann") == "<SUBJECT2_NAME_00c0ffee_1>"
    assert pmap.placeholder_for("EMAIL", "a@b.co") == "<EMAIL_00c0ffee_1>"
    assert len(pmap) == 4


def test_same_original_under_two_labels_gets_two_placeholders() -> None:
    """The label is part of the identity: one text under two kinds gets two placeholders."""
    pmap = PlaceholderMap()
    assert pmap.placeholder_for("SUBJECT1_ID", "A1234567") != pmap.placeholder_for("HIGH_ENTROPY", "A1234567")


def test_empty_map_is_falsy() -> None:
    """A map that made no placeholder is falsy (nothing to restore)."""
    pmap = PlaceholderMap()
    assert not pmap
    pmap.placeholder_for("IP", "10.0.0.1")
    assert pmap


def test_two_maps_have_different_nonces() -> None:
    """Each request gets its own random nonce of lowercase hex."""
    nonces = {PlaceholderMap().nonce for _ in range(50)}
    assert len(nonces) == 50
    assert all(re.fullmatch(f"[0-9a-f]{{{NONCE_HEX_CHARS}}}", n) for n in nonces)
    one, two = PlaceholderMap(), PlaceholderMap()
    assert one.placeholder_for("EMAIL", "a@b.co") != two.placeholder_for("EMAIL", "a@b.co")


def test_format_placeholder() -> None:
    """The grammar `<LABEL_nonce_i>`."""
    assert format_placeholder("CREDIT_CARD", "deadbeef", 12) == "<CREDIT_CARD_deadbeef_12>"


@settings(max_examples=example_count(300), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["EMAIL", "PHONE", "CREDIT_CARD", "SUBJECT1_NAME", "SUBJECT8_DOB"]), st.text()
        ),
        max_size=30,
    )
)
def test_placeholder_map_property(pairs: list[tuple[str, str]]) -> None:
    """Well-formed placeholders; equal pairs share one, distinct pairs never do; originals map back."""
    pmap = PlaceholderMap()
    given_out: dict[tuple[str, str], str] = {}
    for label, original in pairs:
        text = pmap.placeholder_for(label, original)
        assert PLACEHOLDER.fullmatch(text)
        assert text.startswith(f"<{label}_{pmap.nonce}_")
        assert given_out.setdefault((label, original), text) == text
        assert pmap.originals[text] == original
    assert len(set(given_out.values())) == len(given_out) == len(pmap)
    for label in {label for label, _ in given_out}:
        indexes = sorted(int(t.rsplit("_", 1)[1][:-1]) for (lab, _), t in given_out.items() if lab == label)
        assert indexes == list(range(1, len(indexes) + 1))
