"""Findings → placeholders: overlap resolution and the rewrite of one string, right to left.

Overlapping findings resolve by a documented priority: declared-subject matches win over the
catalog, then the longer span, then the catalog's priority order (ext_proc.detect.catalog.engine),
then the earlier start. A finding that loses still has what it covers beyond the winners redacted
(a declared name inside a password does not let the rest of the password through). Resolution is
O(n log n) in the number of findings; the rewrite is one pass. In strip mode, a redacted object
key that would collide with another gets numbered markers (`distinct_strip_key`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from ext_proc.detect.findings import Finding
from ext_proc.transform.grammar import number_strip_markers, strip_marker
from ext_proc.transform.placeholders import Placeholders

SUBJECT_PRIORITY_LIMIT = 10  # priorities below this are declared-subject matchers


def _rank(finding: Finding) -> tuple[int, int, int, int]:
    return (
        0 if finding.priority < SUBJECT_PRIORITY_LIMIT else 1,
        -finding.length,
        finding.priority,
        finding.start,
    )


def resolve_overlaps(findings: Iterable[Finding], text: str | None = None) -> list[Finding]:
    """The non-overlapping findings to redact, sorted by start.

    Candidates are taken best-ranked first; one is kept when none of its characters is taken yet.
    Occupancy lives in a bytearray over the text, so each check and each mark costs the span's
    length in C: linear in the total length of the candidates, whatever their order.

    With `text`, a candidate that lost also keeps, under its own label, each stretch it covers
    that no winner does and that holds a letter or a digit.
    """
    ranked = sorted((f for f in findings if f.length > 0), key=_rank)
    if not ranked:
        return []
    taken = bytearray(max(f.end for f in ranked))
    chosen: list[Finding] = []
    lost: list[Finding] = []
    for finding in ranked:
        if taken.find(1, finding.start, finding.end) != -1:
            lost.append(finding)
            continue
        taken[finding.start : finding.end] = b"\x01" * finding.length
        chosen.append(finding)
    if text is not None:
        for finding in lost:
            chosen += _uncovered(finding, taken, text)
    chosen.sort(key=lambda f: f.start)
    return chosen


def _uncovered(finding: Finding, taken: bytearray, text: str) -> list[Finding]:
    """The stretches of `finding` no finding took yet (taken now), as findings of its label."""
    pieces: list[Finding] = []
    pos = finding.start
    while pos < finding.end:
        start = taken.find(0, pos, finding.end)
        if start == -1:
            break
        end = taken.find(1, start, finding.end)
        end = finding.end if end == -1 else end
        if any(ch.isalnum() for ch in text[start:end]):
            taken[start:end] = b"\x01" * (end - start)
            pieces.append(Finding(finding.kind, start, end, finding.label, finding.priority))
        pos = end
    return pieces


Replacement = Callable[[Finding, str], str]


def reversible(pmap: Placeholders) -> Replacement:
    return lambda finding, original: pmap.placeholder_for(finding.label, original)


def strip(finding: Finding, original: str) -> str:
    return strip_marker(finding.label)


def distinct_strip_key(key: str, number: int) -> str | None:
    """A redacted object key with its strip markers numbered, so it stays apart from another key
    that redacted to the same text; None when it holds no marker (nothing to number)."""
    return number_strip_markers(key, number)


def rewrite(text: str, findings: list[Finding], replacement: Replacement, counts: Counter[str]) -> str:
    """`text` with each (resolved, sorted, non-overlapping) finding replaced."""
    if not findings:
        return text
    pieces: list[str] = []
    cursor = 0
    for finding in findings:
        pieces.append(text[cursor : finding.start])
        pieces.append(replacement(finding, text[finding.start : finding.end]))
        counts[finding.label] += 1
        cursor = finding.end
    pieces.append(text[cursor:])
    return "".join(pieces)
