"""The pattern catalog: what has the shape of personal data or a secret.

Where it sits: the dialect walk hands every string leaf of a request (and the output gate every
piece of model output) to `Catalog.detect`; the findings go, with the declared subjects'
findings, to redaction, which resolves overlaps and writes placeholders right to left. The
catalog returns kinds and spans, never text, so nothing downstream can log a value by accident.

This module runs the detectors (`detectors.DETECTORS`) of a policy's sets over a normalised
text, merges overlapping findings of one kind and ranks kinds by `PRIORITY`. What each kind
accepts is described for users in docs/catalog.md.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import regex

from ext_proc.detect.catalog.anchors import ANCHORS, Scratch, merge_windows
from ext_proc.detect.catalog.detectors import DETECTORS, MIN_FINDING_LENGTH, Detector, Requirement
from ext_proc.detect.catalog.options import Options
from ext_proc.detect.catalog.regexes import (
    Span,
    compile_pattern,
    timed_all,
    timed_match,
    timed_search,
    timeout_for,
)
from ext_proc.detect.catalog.validators import VALIDATORS
from ext_proc.detect.findings import CATALOG_KINDS, SETS, Finding
from ext_proc.detect.memo import MEMO
from ext_proc.errors import DetectionError

# Finding.priority = PRIORITY_BASE + index in PRIORITY. Values below PRIORITY_BASE belong to
# declared-subject matchers, which win over every catalog kind (ext_proc.transform.redact).
PRIORITY_BASE = 10
PRIORITY: tuple[str, ...] = (
    "PRIVATE_KEY",
    "JWT",
    "ANTHROPIC_KEY",
    "OPENAI_KEY",
    "GITHUB_TOKEN",
    "SLACK_TOKEN",
    "STRIPE_KEY",
    "GOOGLE_API_KEY",
    "AWS_ACCESS_KEY",
    "SECRET_ASSIGNMENT",
    "EMAIL",
    "IBAN",
    "CREDIT_CARD",
    "SSN",
    "IP",
    "PHONE",
    "HIGH_ENTROPY",
)
assert sorted(PRIORITY) == sorted(CATALOG_KINDS), "every catalog kind has exactly one priority"
assert all(d.kind in PRIORITY for d in DETECTORS)
assert all(d.validator is None or d.validator in VALIDATORS for d in DETECTORS)
assert all(d.anchor is None or d.anchor in ANCHORS for d in DETECTORS)


# Normalisation: fold what changes no offsets, strip what hides a value, map spans back.

_FOLD_PRESENT = compile_pattern(r"[\uff01-\uff5e\u3000]")
_FOLD_TABLE = {0xFF01 + i: 0x21 + i for i in range(94)} | {0x3000: 0x20}
_ZERO_WIDTH = compile_pattern(r"[\u00ad\u200b-\u200f\u2060-\u2064\ufeff]")


@dataclass(frozen=True, slots=True)
class _Prepared:
    text: str
    # For each removed character i (in order): the stripped index of the character after it.
    shifts: tuple[int, ...] = ()

    def original(self, index: int) -> int:
        return index + bisect.bisect_right(self.shifts, index)

    def span(self, start: int, end: int) -> Span:
        if not self.shifts:
            return start, end
        return self.original(start), self.original(end - 1) + 1


_ZERO_WIDTH_CHARS = "\u00ad\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff"


def _prepare(text: str) -> _Prepared:
    if text.isascii():
        return _Prepared(text)
    if timed_search(_FOLD_PRESENT, text) is not None:
        text = text.translate(_FOLD_TABLE)
    if not any(ch in text for ch in _ZERO_WIDTH_CHARS):
        return _Prepared(text)
    removed = [m.start() for m in timed_all(_ZERO_WIDTH, text)]
    if not removed:
        return _Prepared(text)
    stripped = _ZERO_WIDTH.sub("", text, timeout=timeout_for(len(text)))
    return _Prepared(stripped, tuple(pos - i for i, pos in enumerate(removed)))


class Catalog:
    """The detectors of some sets, compiled once; `detect` is safe to call from many threads."""

    def __init__(self, sets: tuple[str, ...], options: Options) -> None:
        kinds = {k for s in sets for k in SETS[s]}
        self.sets = sets
        self.options = options
        self.kinds: frozenset[str] = frozenset(kinds)
        self.detectors: tuple[Detector, ...] = tuple(d for d in DETECTORS if d.kind in kinds)
        self._triggers: tuple[tuple[str, bytes], ...] = tuple(
            (t, t.encode("ascii")) for t in sorted({t for d in self.detectors for t in d.triggers})
        )

    @classmethod
    def for_sets(cls, sets: Iterable[str], *, skip_documentation_ips: bool = False) -> Catalog:
        names = tuple(sorted(set(sets)))
        unknown = [s for s in names if s not in SETS]
        if unknown:
            raise ValueError(f"unknown catalog set(s): {', '.join(unknown)}")
        return _catalog_for(names, skip_documentation_ips)

    def __repr__(self) -> str:
        return f"Catalog(sets={self.sets!r}, options={self.options!r})"

    def detect(self, text: str) -> list[Finding]:
        """Every validated finding in `text`, sorted by start; same-kind overlaps merged."""
        if len(text) < MIN_FINDING_LENGTH or not self.detectors:
            return []
        return list(MEMO(("catalog", self.sets, self.options), text, self._detect_checked))

    def _detect_checked(self, text: str) -> tuple[Finding, ...]:
        # A regex timeout is wall-clock time: a process starved of CPU (or of the GIL) for a
        # quarter of a second times out on a few bytes. One second try tells such a stall from a
        # pattern that runs away on its input, which times out again.
        for attempt in range(2):
            try:
                return tuple(self._detect(text))
            except TimeoutError:
                if attempt:
                    raise DetectionError("catalog regex timed out") from None
        raise AssertionError("unreachable")

    def _detect(self, original: str) -> list[Finding]:
        prepared = _prepare(original)
        text = prepared.text
        length = len(text)
        scratch = Scratch(text)
        present = scratch.present(self._triggers)
        spans: dict[str, list[Span]] = {}
        for detector in self.detectors:
            if length < detector.min_length:
                continue
            if detector.triggers and present.isdisjoint(detector.triggers):
                continue
            if detector.requires and not _requirements_met(detector.requires, scratch):
                continue
            if detector.context and not any(w in scratch.lower for w in detector.context):
                continue
            found = list(self._run(detector, text, scratch))
            if found:
                spans.setdefault(detector.kind, []).extend(found)
        findings: list[Finding] = []
        for kind, kind_spans in spans.items():
            priority = PRIORITY_BASE + PRIORITY.index(kind)
            for start, end in _merge_overlaps(kind_spans):
                start, end = prepared.span(start, end)
                findings.append(Finding(kind, start, end, priority=priority))
        findings.sort(key=lambda f: (f.start, f.end, f.priority))
        return findings

    def _run(self, detector: Detector, text: str, scratch: Scratch) -> Iterator[Span]:
        validate = VALIDATORS[detector.validator] if detector.validator else _accept
        if detector.anchor is None:
            matches: Iterable[regex.Match[str]] = timed_all(detector.pattern, text)
        elif detector.anchored:
            matches = _anchored(detector.pattern, text, ANCHORS[detector.anchor](scratch))
        else:
            matches = _windowed(detector.pattern, text, ANCHORS[detector.anchor](scratch))
        for m in matches:
            span = m.span(detector.group)
            for start, end in validate(text, m, span, self.options):
                if end > start:
                    yield (start, end)


def _accept(_text: str, _m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """The validator of a detector that names none: the match is the value."""
    return (span,)


def _requirements_met(requires: tuple[Requirement, ...], scratch: Scratch) -> bool:
    return all(scratch.count(r.chars) >= r.at_least for r in requires)


def _anchored(pattern: regex.Pattern[str], text: str, windows: list[Span]) -> Iterator[regex.Match[str]]:
    for start, end in windows:
        m = timed_match(pattern, text, start, end)
        if m is not None:
            yield m


def _windowed(pattern: regex.Pattern[str], text: str, windows: list[Span]) -> Iterator[regex.Match[str]]:
    for start, end in merge_windows(windows):
        yield from timed_all(pattern, text, start, end)


def _merge_overlaps(spans: list[Span]) -> list[Span]:
    """Union of overlapping spans of one kind: the longest sensible span, nothing left out."""
    merged: list[Span] = []
    for start, end in sorted(set(spans)):
        if merged and start < merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


@functools.lru_cache(maxsize=64)
def _catalog_for(sets: tuple[str, ...], skip_documentation_ips: bool) -> Catalog:
    return Catalog(sets, Options(skip_documentation_ips=skip_documentation_ips))
