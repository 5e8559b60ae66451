"""The compiled matchers of a declared-subject header: redaction's `detect` and egress's `first_survivor`.

Where it sits: `exchange` parses the `X-Cordon-Subject` header (ext_proc.detect.subjects.header) and
calls `compile_subjects` once per distinct header (an LRU keyed by `SubjectHeader.digest`); each
declared value is compiled into forms by ext_proc.detect.subjects.values. The compiled object serves
two readers of the same forms over text read by ext_proc.detect.subjects.reading:

* `detect(text)` for redaction: every occurrence as a `Finding` over the caller's original offsets,
  labelled `SUBJECT{n}_{KIND}`, priority below 10 so it wins over the catalog;
* `first_survivor(text)` for the egress check (ext_proc.transform.egress): the label of the first
  declared identifier still readable in a string of the final body (also in its percent-decoded,
  HTML-unescaped and `\\u`-unescaped copies), or None.

What each kind matches, and what it deliberately does not, is described in docs/subjects.md.
"""

from __future__ import annotations

import html
import itertools
import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote

import regex

from ext_proc.detect.findings import Finding
from ext_proc.detect.memo import MEMO
from ext_proc.detect.subjects.addresses import unit_end
from ext_proc.detect.subjects.forms import REGEX_TIMEOUT, Case, UnreadableValue
from ext_proc.detect.subjects.header import FIELDS, SubjectHeader, SubjectHeaderError
from ext_proc.detect.subjects.reading import read
from ext_proc.detect.subjects.values import value_forms
from ext_proc.errors import DetectionError
from ext_proc.media.parts import MEDIA_MIN_LENGTH, is_media_payload

CACHE_SIZE = 256  # compiled headers kept (an agent session reuses one header many times)
TIMEOUT_CHARS = 250_000  # an egress decoding regex gets REGEX_TIMEOUT per this many characters
# The scan has no regex in it: a trie-shaped regex alternation over ~1,350 forms took half a second
# to compile and ~70 ms to scan 8 KB (the engine tries branches one after another), while sets of
# forms and of their prefixes compile in milliseconds and are probed once per segment.
# The scan extends a candidate segment by segment while the concatenation is a prefix of a form;
# ordinary text stops after a step or two. A text needing more than this many steps per segment
# on average is pathological (thousands of spaced-out single letters that all prefix forms), and
# is refused like a regex timeout rather than read slowly.
STEPS_PER_SEGMENT = 64
STEPS_FLOOR = 100_000

# Tie-break between overlapping findings of equal length (lower wins; all < 10 so that subjects
# win over the catalog, ext_proc.transform.redact.SUBJECT_PRIORITY_LIMIT). The more specific kinds first.
KIND_PRIORITY: dict[str, int] = {
    "EMAIL": 0,
    "PHONE": 1,
    "ID": 2,
    "DOB": 3,
    "ADDRESS": 4,
    "HANDLE": 5,
    "NAME": 6,
    "OTHER": 7,
}
FIELD_OF_KIND: dict[str, str] = {kind: field for field, kind in FIELDS.items()}


@dataclass(frozen=True, slots=True)
class _Variant:
    """One way a form key counts: for which label, under which Case, with which separators."""

    label: str
    kind: str
    priority: int
    subject: int
    case: Case
    required: frozenset[int]  # offsets in the key where the text must have a separator
    weak: bool  # a partial rendering: names the match only when no full form of the key does


@dataclass(frozen=True, slots=True)
class Form:
    """A compiled form, for tests and diagnostics. Holds a declared value: never log it."""

    key: str
    required: frozenset[int]
    label: str
    case: Case


@dataclass(frozen=True, slots=True)
class _Hit:
    first: int  # index of the first segment
    last: int  # index of the last segment
    key: str
    bounds: tuple[int, ...]  # offsets in the key where one segment ended and the next began


def _timeout(length: int) -> float:
    return REGEX_TIMEOUT * (1 + length / TIMEOUT_CHARS)


_ESCAPES = regex.compile(r"\\(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2}))")
_PERCENT = regex.compile(r"%[0-9a-fA-F]{2}")


def _decodings(text: str) -> Iterator[str]:
    """Copies of `text` with encodings that insert letters or digits undone (egress only)."""
    try:
        if "%" in text and _PERCENT.search(text, timeout=_timeout(len(text))):
            yield unquote(text.replace("+", " "))
        if "&" in text and ";" in text:
            unescaped = html.unescape(text)
            if unescaped != text:
                yield unescaped
        if "\\" in text:
            unescaped = _ESCAPES.sub(
                lambda m: chr(int(m.group(1) or m.group(2), 16)), text, timeout=_timeout(len(text))
            )
            if unescaped != text:
                yield unescaped
    except TimeoutError:
        raise DetectionError("subject matcher timed out") from None


class CompiledSubjects:
    """The matchers of one header. Immutable after construction; safe to share across requests."""

    __slots__ = ("_prefixes", "_variants", "digest", "form_count", "labels")

    def __init__(
        self,
        digest: str,
        variants: dict[str, tuple[_Variant, ...]],
        prefixes: frozenset[str],
        labels: frozenset[str],
    ) -> None:
        self.digest = digest
        self._variants = variants
        self._prefixes = prefixes  # every prefix of every key: can a segment run still become one?
        self.labels = labels
        self.form_count = len(variants)

    def __repr__(self) -> str:  # never the forms: they are declared values
        labels = sorted(self.labels)
        return f"CompiledSubjects(digest={self.digest[:12]}…, labels={labels}, forms={self.form_count})"

    def forms(self) -> Iterator[Form]:
        """Every compiled form (tests and diagnostics only: these are declared values)."""
        for key, variants in self._variants.items():
            for v in variants:
                yield Form(key, v.required, v.label, v.case)

    # --- scanning

    def _scan(self, segments: list[str], shortest: int = 0) -> Iterator[_Hit]:
        """Every run of segments that spells a form's key (at least `shortest` characters)."""
        prefixes = self._prefixes
        variants = self._variants
        count = len(segments)
        budget = STEPS_PER_SEGMENT * count + STEPS_FLOOR
        for first in itertools.compress(itertools.count(), map(prefixes.__contains__, segments)):
            text = segments[first]
            bounds: tuple[int, ...] = ()
            last = first
            while True:
                if text in variants and len(text) >= shortest:
                    yield _Hit(first, last, text, bounds)
                last += 1
                if last >= count:
                    break
                longer = text + segments[last]
                if longer not in prefixes:
                    break
                bounds += (len(text),)
                text = longer
                budget -= 1
                if budget < 0:
                    raise DetectionError("subject matcher exceeded its work bound")

    @staticmethod
    def _fits(variant: _Variant, bounds: tuple[int, ...]) -> bool:
        return not variant.required or variant.required.issubset(bounds)

    # --- redaction

    def detect(self, text: str) -> list[Finding]:
        """Every occurrence of a declared identifier, as non-overlapping spans of `text`.

        Overlapping matches (a name inside a longer name form, two subjects sharing a surname)
        are merged into their union, labelled by the longest, so no character of any match is left
        out whatever the caller's overlap resolution does.
        """
        if not text:
            return []
        return list(MEMO(("subjects", self.digest), text, lambda t: tuple(self._detect(t))))

    def _detect(self, text: str) -> list[Finding]:
        reading = read(text, offsets=True)
        inserted = reading.inserted
        pieces = reading.spaced.split(" ")
        segments = list(filter(None, pieces))
        if not segments or self._prefixes.isdisjoint(segments):
            return []
        hits = list(self._scan(segments, _shortest_key(text)))
        if not hits:
            return []
        piece_of = list(itertools.compress(itertools.count(), pieces))
        starts = list(itertools.accumulate(map(len, pieces), initial=0))

        def original(segment: int, end: bool) -> int:
            piece = piece_of[segment]
            at = starts[piece] + piece + (len(pieces[piece]) if end else 0)
            return at - bisect_left(inserted, at) if inserted else at

        def span(first: int, last: int) -> tuple[int, int]:
            """Segments first..last as a span of the caller's text."""
            start, end = original(first, False), original(last, True)
            return reading.folded.span(start, end) if reading.folded is not None else (start, end)

        spans: list[tuple[int, int, _Variant]] = []
        for hit in hits:
            start, end = span(hit.first, hit.last)
            capitalised: bool | None = None
            for variant in self._variants[hit.key]:
                if not self._fits(variant, hit.bounds):
                    continue
                if variant.case is not Case.ANY:
                    if capitalised is None:
                        written = text[start:end]
                        capitalised = written != written.lower()
                    if not capitalised:
                        continue
                if variant.kind == "ADDRESS":
                    unit = unit_end(segments, hit.last, text, span)
                    if unit > hit.last:
                        end = span(unit, unit)[1]
                spans.append((start, end, variant))
                break
        return _merge(spans)

    # --- egress

    def first_survivor(self, text: str) -> str | None:
        """The label of the first declared identifier readable in `text` (case-folded), or None."""
        if not text:
            return None
        return MEMO(("survivor", self.digest), text, self._first_survivor)

    def _first_survivor(self, text: str) -> str | None:
        label = self._survivor(text)
        if label is None:
            for decoded in _decodings(text):
                label = self._survivor(decoded)
                if label is not None:
                    break
        return label

    def _survivor(self, text: str) -> str | None:
        segments = read(text, offsets=False).spaced.split()
        if not segments or self._prefixes.isdisjoint(segments):
            return None
        shortest = _shortest_key(text)
        # The longest form at the first place any form starts names the hit ("mqvance77" is the
        # handle, not the name form "mqvance" inside it); hits of one start come shortest first.
        found: str | None = None
        found_at = -1
        for hit in self._scan(segments, shortest):
            if found is not None and hit.first != found_at:
                break
            for variant in self._variants[hit.key]:
                if variant.case is not Case.CAPITALISED_ONLY and self._fits(variant, hit.bounds):
                    found, found_at = variant.label, hit.first
                    break
        return found


# In a media file's base64 (a screenshot passed as a tool's input), a form's key must be this long to
# count: base64 spells a given 3-letter run about once per million characters (initials such as
# "mqv" would be found in one screenshot in a few and corrupt it), a 6-character one about once per
# 10^9; a whole name, an email or a handle written there is still found.
MEDIA_SHORTEST_KEY = 6


def _shortest_key(text: str) -> int:
    return MEDIA_SHORTEST_KEY if len(text) >= MEDIA_MIN_LENGTH and is_media_payload(text) else 0


def _merge(spans: list[tuple[int, int, _Variant]]) -> list[Finding]:
    if not spans:
        return []
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[Finding] = []
    start, end, best = spans[0]
    best_rank = (-(end - start), best.priority, best.subject)
    for s, e, variant in spans[1:]:
        if s < end:
            rank = (-(e - s), variant.priority, variant.subject)
            if rank < best_rank:
                best, best_rank = variant, rank
            end = max(end, e)
            continue
        out.append(Finding(best.kind, start, end, best.label, best.priority))
        start, end, best = s, e, variant
        best_rank = (-(end - start), best.priority, best.subject)
    out.append(Finding(best.kind, start, end, best.label, best.priority))
    return out


# ---------------------------------------------------------------------------------------------
# Compilation and its cache

_cache: OrderedDict[str, CompiledSubjects] = OrderedDict()
_cache_lock = threading.Lock()


def _variant_order(v: _Variant) -> tuple[bool, int, int, Case, int]:
    return (v.weak, v.priority, v.subject, v.case, len(v.required))


def _compile(header: SubjectHeader) -> CompiledSubjects:
    collected: dict[str, list[_Variant]] = {}
    prefix_sets: list[frozenset[str]] = []
    labels: set[str] = set()
    for subject in header.subjects:
        for kind, values in subject.values.items():
            label = f"SUBJECT{subject.index}_{kind}"
            labels.add(label)
            priority = KIND_PRIORITY[kind]
            # Most forms of a value share (case, separators, weak): one _Variant object each.
            interned: dict[tuple[Case, frozenset[int], bool], _Variant] = {}
            for position, value in enumerate(values):
                try:
                    compiled = value_forms(kind, value)
                except UnreadableValue as exc:
                    path = f"subjects[{subject.index - 1}].{FIELD_OF_KIND[kind]}[{position}]"
                    raise SubjectHeaderError(f"{path} {exc}") from None
                except TimeoutError:
                    raise DetectionError("subject compilation timed out") from None
                prefix_sets.append(compiled.prefixes)
                for key, required, case, weak in compiled.forms:
                    variant = interned.get((case, required, weak))
                    if variant is None:
                        variant = _Variant(label, kind, priority, subject.index, case, required, weak)
                        interned[(case, required, weak)] = variant
                    known = collected.get(key)
                    if known is None:
                        collected[key] = [variant]
                    elif variant not in known:
                        known.append(variant)
    variants = {
        key: tuple(vs) if len(vs) == 1 else tuple(sorted(vs, key=_variant_order))
        for key, vs in collected.items()
    }
    return CompiledSubjects(header.digest, variants, frozenset().union(*prefix_sets), frozenset(labels))


def compile_subjects(header: SubjectHeader) -> CompiledSubjects:
    """The matchers for `header`, compiled once per distinct header (LRU of CACHE_SIZE by digest).

    Raises SubjectHeaderError naming the field path (never the value) when a declared value cannot
    be understood: a phone phonenumbers cannot parse, a date python-dateutil cannot read as a full
    date, an email without `@`.
    """
    with _cache_lock:
        compiled = _cache.get(header.digest)
        if compiled is not None:
            _cache.move_to_end(header.digest)
            return compiled
    compiled = _compile(header)
    with _cache_lock:
        _cache[header.digest] = compiled
        _cache.move_to_end(header.digest)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def clear_caches() -> None:
    """Forget every compiled header and value (benchmarks measure compilation from cold)."""
    with _cache_lock:
        _cache.clear()
    value_forms.cache_clear()


__all__ = [
    "CACHE_SIZE",
    "KIND_PRIORITY",
    "CompiledSubjects",
    "Form",
    "clear_caches",
    "compile_subjects",
]
