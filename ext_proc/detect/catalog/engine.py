"""The pattern catalog: what has the shape of personal data or a secret.

Where it sits: the dialect walk hands every string leaf of a request (and the output gate every
piece of model output) to `Catalog.detect`; the findings go, with the declared subjects'
findings, to redaction, which resolves overlaps and writes placeholders right to left. The
catalog returns kinds and spans, never text, so nothing downstream can log a value by accident.

This module runs the detectors (`detectors.DETECTORS`) of a policy's sets over the text's canonical
view and its decoded views, merges overlapping findings of one kind and ranks kinds by `PRIORITY`.
What each kind accepts is described for users in docs/catalog.md.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import regex

from ext_proc.detect.canonical import View, blank_views, canonical
from ext_proc.detect.catalog.anchors import ANCHORS, Scratch, Triggers, merge_windows
from ext_proc.detect.catalog.deny import DENY_KIND
from ext_proc.detect.catalog.detectors import (
    DETECTORS,
    DOCUMENTED_EXAMPLES,
    MIN_FINDING_LENGTH,
    Detector,
    Requirement,
)
from ext_proc.detect.catalog.extensions import NO_EXTENSIONS, Extensions, Validator, compiled
from ext_proc.detect.catalog.options import Options
from ext_proc.detect.catalog.regexes import Span, timed_all, timed_match, timed_search
from ext_proc.detect.catalog.validators import VALIDATORS
from ext_proc.detect.decode import Decoded, decoded_views, hidden_view, may_hold_escapes
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
    "API_TOKEN",
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
_SECRET_KINDS = frozenset(SETS["secrets"])
assert all(d.kind in PRIORITY for d in DETECTORS)
assert all(d.validator is None or d.validator in VALIDATORS for d in DETECTORS)
assert all(d.anchor is None or d.anchor in ANCHORS for d in DETECTORS)


# Every text is read in its canonical view (ext_proc.detect.canonical: look-alikes, invisible
# characters, typographic spaces and dashes) and, where it holds escapes, in its decoded views
# (ext_proc.detect.decode); findings are mapped back to the spans of the original text.


def _prepare(text: str) -> View:
    return canonical(text)


class Catalog:
    """The detectors of some sets, compiled once; `detect` is safe to call from many threads."""

    def __init__(
        self,
        sets: tuple[str, ...],
        options: Options,
        only: frozenset[str] | None = None,
        extensions: Extensions = NO_EXTENSIONS,
    ) -> None:
        kinds = {k for s in sets for k in SETS[s]}
        self.sets = sets
        self.only = only  # detector names, when not all of the sets' detectors
        self.options = options
        # A policy's own kinds, allow and deny lists (ext_proc.detect.catalog.extensions); a
        # restricted catalog (`only`) runs the named built-in detectors alone.
        self.extensions = extensions if only is None else NO_EXTENSIONS
        extra = compiled(self.extensions)
        self._extra = extra
        self.detectors: tuple[Detector, ...] = (
            *(d for d in DETECTORS if d.kind in kinds and (only is None or d.name in only)),
            *extra.detectors,
        )
        self._validators: dict[str, Validator] = dict(extra.validators)
        self.kinds: frozenset[str] = frozenset(
            [*(d.kind for d in self.detectors), *([DENY_KIND] if extra.deny else [])]
        )
        # Custom kinds rank after the built-in ones, in the order the policy lists them; deny
        # terms last (a longer finding still wins over a shorter one: ext_proc.transform.redact).
        custom = [*self.extensions.kind_names, DENY_KIND]
        self._priority: dict[str, int] = {
            kind: PRIORITY_BASE + index for index, kind in enumerate([*PRIORITY, *custom])
        }
        self._memo_scope = ("catalog", self.sets, self.options, self.only, extra.digest)
        self._triggers = Triggers.build(
            (t for d in self.detectors if d.token for t in d.triggers),
            (t for d in self.detectors if not d.token for t in d.triggers),
        )
        # Which detectors a text's triggers wake (by index, so they run in catalog order); the
        # ones without triggers always run. Most detectors have triggers (the vendor tokens) and
        # most texts hold none of them: they then cost nothing, not a check each.
        self._untriggered: tuple[int, ...] = tuple(i for i, d in enumerate(self.detectors) if not d.triggers)
        by_trigger: dict[str, set[int]] = {}
        for index, detector in enumerate(self.detectors):
            for trigger in detector.triggers:
                by_trigger.setdefault(trigger, set()).add(index)
        self._by_trigger: dict[str, frozenset[int]] = {t: frozenset(ix) for t, ix in by_trigger.items()}

    @classmethod
    def for_sets(
        cls,
        sets: Iterable[str],
        *,
        skip_documentation_ips: bool = False,
        extensions: Extensions = NO_EXTENSIONS,
    ) -> Catalog:
        names = tuple(sorted(set(sets)))
        unknown = [s for s in names if s not in SETS]
        if unknown:
            raise ValueError(f"unknown catalog set(s): {', '.join(unknown)}")
        return _catalog_for(names, skip_documentation_ips, extensions)

    def restricted(self, detectors: frozenset[str]) -> Catalog:
        """The same catalog with only the detectors named in `detectors` (compiled once)."""
        return _restricted(self.sets, self.options, detectors)

    def __repr__(self) -> str:
        return (
            f"Catalog(sets={self.sets!r}, options={self.options!r}, only={self.only!r}, "
            f"extensions={self._extra.digest})"
        )

    def detect(self, text: str) -> list[Finding]:
        """Every validated finding in `text`, sorted by start; same-kind overlaps merged."""
        if len(text) < MIN_FINDING_LENGTH or not self.kinds:
            return []
        return list(MEMO(self._memo_scope, text, self._detect_checked))

    def allowed(self, text: str, findings: list[Finding]) -> list[Finding]:
        """`findings` of `text` (from any reader) without those the policy's allow list permits."""
        return self._extra.allowed(text, findings)

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
        view = _prepare(original)
        spans = self._scan(view.text)
        if view.maps:
            spans = {kind: [view.span(s, e) for s, e in found] for kind, found in spans.items()}
        # Invisible characters and compatibility digits read as spaces too: one that sets a value
        # apart from a word or a number must not glue the two together. ASCII with nothing
        # removed has nothing to blank.
        blanks = blank_views(original) if view.maps or not original.isascii() else []
        for blank in blanks:
            for kind, found in self._scan(blank.text).items():
                spans.setdefault(kind, []).extend(blank.span(s, e) for s, e in found)
        # Escapes are decoded in the view (a full-width `％４０` is an escape too), and what they
        # decode to is read in its own view again; text spelled in invisible tag characters is
        # read as the ASCII it mirrors. A finding there counts where it covers a decoded
        # character (anything else the plain view read already), and redacts the whole encoded
        # span.
        if may_hold_escapes(view.text):
            for base in (view, *blanks):
                for decoded in decoded_views(base.text):
                    self._scan_decoded(decoded, base, spans)
            if blanks:
                self._scan_decoded_blanks(original, spans)
        hidden = hidden_view(original)
        if hidden is not None:
            self._scan_decoded(hidden, None, spans)
        if not spans:
            return []
        findings: list[Finding] = []
        for kind, kind_spans in spans.items():
            if kind in _SECRET_KINDS:
                kind_spans = [sp for sp in kind_spans if original[sp[0] : sp[1]] not in DOCUMENTED_EXAMPLES]
            priority = self._priority[kind]
            for start, end in _merge_overlaps(kind_spans):
                findings.append(Finding(kind, start, end, priority=priority))
        findings.sort(key=lambda f: (f.start, f.end, f.priority))
        return self._extra.allowed(original, findings)

    def _scan_decoded_blanks(self, original: str, spans: dict[str, list[Span]]) -> None:
        """The blank views of the original's decoded views: an escape's notation must not decide
        where a blank goes (`\\u24fc`, a filler, `4`: the notation ends in a letter, the digit it
        writes does not)."""
        for decoded in decoded_views(original):
            for blank in blank_views(decoded.text):
                self._scan_decoded(decoded, None, spans, blank)

    def _scan_decoded(
        self, decoded: Decoded, view: View | None, spans: dict[str, list[Span]], inner: View | None = None
    ) -> None:
        """Adds the findings of a decoded view (of `view`'s text, or of the original) that cover a
        decoded character, as spans of the original. `inner`: the reading of the decoded text to
        scan (its canonical view unless given)."""
        inner = _prepare(decoded.text) if inner is None else inner
        for kind, found in self._scan(inner.text).items():
            for start, end in found:
                start, end = inner.span(start, end)
                if decoded.touches(start, end):
                    start, end = decoded.span(start, end)
                    spans.setdefault(kind, []).append(view.span(start, end) if view else (start, end))

    def _scan(self, text: str) -> dict[str, list[Span]]:
        """Every detector's validated spans in `text` (already prepared), by kind."""
        length = len(text)
        scratch = Scratch(text)
        present = scratch.present(self._triggers)
        order: Iterable[int] = self._untriggered
        if present:
            order = sorted(self._untriggered + tuple(i for t in present for i in self._by_trigger[t]))
        spans: dict[str, list[Span]] = {}
        gate = self._extra.gate
        first_custom = self._extra.detectors[0] if gate is not None else None
        last = -1
        for index in order:
            if index == last:
                continue  # woken by two of its triggers
            last = index
            detector = self.detectors[index]
            if detector is first_custom and gate is not None and timed_search(gate, text) is None:
                break  # the policy's own kinds come last, and none of their patterns matches
            if length < detector.min_length:
                continue
            if detector.requires and not _requirements_met(detector.requires, scratch):
                continue
            if detector.context and not any(w in scratch.lower for w in detector.context):
                continue
            found = list(self._run(detector, text, scratch))
            if found:
                spans.setdefault(detector.kind, []).extend(found)
        deny = self._extra.deny
        if deny:
            found = deny.find(text)
            if found:
                spans.setdefault(DENY_KIND, []).extend(found)
        return spans

    def _run(self, detector: Detector, text: str, scratch: Scratch) -> Iterator[Span]:
        validate = self._validators.get(detector.name) or (
            VALIDATORS[detector.validator] if detector.validator else _accept
        )
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
def _catalog_for(sets: tuple[str, ...], skip_documentation_ips: bool, extensions: Extensions) -> Catalog:
    return Catalog(sets, Options(skip_documentation_ips=skip_documentation_ips), extensions=extensions)


@functools.lru_cache(maxsize=64)
def _restricted(sets: tuple[str, ...], options: Options, detectors: frozenset[str]) -> Catalog:
    return Catalog(sets, options, detectors)
