"""The compiled matchers of a declared-subject header: redaction's `detect` and egress's `first_survivor`.

Where it sits: `exchange` parses the `X-Cordon-Subject` header (ext_proc.detect.subjects.header) and
calls `compile_subjects` once per distinct header (an LRU keyed by `SubjectHeader.digest`); each
declared value is compiled into forms by ext_proc.detect.subjects.values. The compiled object serves
two readers of the same forms over text read by ext_proc.detect.subjects.reading:

* `detect(text)` for redaction: every occurrence as a `Finding` over the caller's original offsets,
  labelled `SUBJECT{n}_{KIND}`, priority below 10 so it wins over the catalog;
* `first_survivor(text)` for the egress check (ext_proc.transform.egress): the label of the first
  declared identifier still readable in a string of the final body (also in its decoded views),
  or None.

What each kind matches, and what it deliberately does not, is described in docs/subjects.md.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import regex

from ext_proc.detect.canonical import blankings, canonical_text
from ext_proc.detect.decode import decoded_views, hidden_view, may_hold_escapes, word_escapes
from ext_proc.detect.findings import Finding
from ext_proc.detect.memo import MEMO
from ext_proc.detect.opaque import is_opaque_token
from ext_proc.detect.subjects.addresses import unit_end
from ext_proc.detect.subjects.dates import DATE_WORDS, MONTH_INSIDES, START_WORDS
from ext_proc.detect.subjects.forms import Case, UnreadableValue
from ext_proc.detect.subjects.gaps import (
    ACROSS_GAP,
    AS_DATE,
    MAX_LOOSE_LETTERS,
    READ_KINDS,
    date_continuation,
    date_start,
    gap_continuation,
    is_skipped,
)
from ext_proc.detect.subjects.header import FIELDS, SubjectHeader, SubjectHeaderError
from ext_proc.detect.subjects.reading import EscapedWords, Located, read
from ext_proc.detect.subjects.values import value_forms
from ext_proc.detect.subjects.words import GAP_CONNECTORS
from ext_proc.errors import DetectionError
from ext_proc.media.parts import MEDIA_MIN_LENGTH, is_media_payload

CACHE_SIZE = 256  # compiled headers kept (an agent session reuses one header many times)
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
class Readings:
    """Where the scan may read a segment otherwise than as written: after a prefix of a number's
    key that ends between two digits (a gap of words may follow), and inside a date's key (a date
    word may follow)."""

    gap_prefixes: frozenset[str] = frozenset()
    date_prefixes: frozenset[str] = frozenset()  # every prefix of a date's key but MONTH_INSIDES
    # Every prefix of a number's keys: a candidate read across a gap can only become one of them
    # (READ_KINDS), so a gap is read only where the text after it stays inside these.
    gap_reach: frozenset[str] = frozenset()
    dated: bool = False  # a date is declared


_NOTHING: frozenset[str] = frozenset()
_NO_WORDS: dict[str, tuple[int, str]] = {}
_DIGITS = "0123456789"


@dataclass(frozen=True, slots=True)
class _Hit:
    first: int  # index of the first segment
    last: int  # index of the last segment
    key: str
    bounds: tuple[int, ...]  # offsets in the key where one segment ended and the next began
    read: int  # AS_WRITTEN, or how ext_proc.detect.subjects.gaps read some of its segments


def _readings(text: str) -> Iterator[str]:
    """What the egress check reads of `text`: the text and its blank readings (`blankings`:
    invisible characters and compatibility digits as spaces), then the decoded views of each
    (`_decodings`), each also with blanks (an escape may write an invisible character)."""
    bases = [text, *blankings(text, within_words=True)]
    yield from bases
    for base in bases:
        for decoded in _decodings(base):
            yield decoded
            yield from blankings(decoded, within_words=True)


def _decodings(text: str) -> Iterator[str]:
    """The decoded views of `text` (ext_proc.detect.decode: text in invisible tag characters;
    percent, entity, backslash, CSS and quoted-printable escapes and `(at)`/`[dot]`, undone round
    after round), for the egress check. Escapes are decoded in the canonical view, so a
    full-width `％４０` is one too."""
    if text.isascii() and not may_hold_escapes(text):
        return  # the canonical view of ASCII text adds no escape
    hidden = hidden_view(text)
    if hidden is not None:
        yield hidden.text
    for decoded in decoded_views(canonical_text(text)):
        yield decoded.text


class CompiledSubjects:
    """The matchers of one header. Immutable after construction; safe to share across requests."""

    __slots__ = (
        "_date_only",
        "_date_prefixes",
        "_dated",
        "_gap_prefixes",
        "_gap_reach",
        "_prefixes",
        "_rereads",
        "_starts",
        "_variants",
        "digest",
        "form_count",
        "labels",
    )

    def __init__(
        self,
        digest: str,
        variants: dict[str, tuple[_Variant, ...]],
        prefixes: frozenset[str],
        labels: frozenset[str],
        readings: Readings | None = None,
    ) -> None:
        self.digest = digest
        self._variants = variants
        self._prefixes = prefixes  # every prefix of every key: can a segment run still become one?
        self.labels = labels
        self.form_count = len(variants)
        readings = readings or Readings()
        self._dated = readings.dated
        self._gap_prefixes = readings.gap_prefixes
        # Where a candidate may go on otherwise than as written (ext_proc.detect.subjects.gaps).
        self._rereads = readings.gap_prefixes | readings.date_prefixes
        # Segments that may begin a candidate: prefixes, and date words that read as one.
        starts = [w for reading, words in START_WORDS.items() if reading in prefixes for w in words]
        self._starts = prefixes.union(starts) if self._dated and starts else prefixes
        self._date_only = self._starts - prefixes  # date words that begin a candidate read as one
        self._date_prefixes = readings.date_prefixes
        self._gap_reach = readings.gap_reach

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
        """Every run of segments that spells a form's key (at least `shortest` characters).

        A segment continues a candidate where the concatenation is still a prefix of a key. Where
        it is not, and the candidate could go on as a written date or a number's digit groups
        (`_rereads`), ext_proc.detect.subjects.gaps may read the segment (and a few after it)
        otherwise. Not in a media file's base64 (`shortest`): nobody writes words there.
        """
        prefixes = self._prefixes
        variants = self._variants
        rereads = self._rereads if not shortest else _NOTHING
        date_words = DATE_WORDS if self._dated else _NO_WORDS
        gap_prefixes = self._gap_prefixes
        gap_reach = self._gap_reach
        starts = self._starts if not shortest else prefixes
        date_only = self._date_only if not shortest else _NOTHING
        digits = _DIGITS
        connectors = GAP_CONNECTORS
        count = len(segments)
        budget = STEPS_PER_SEGMENT * count + STEPS_FLOOR
        for first in itertools.compress(itertools.count(), map(starts.__contains__, segments)):
            text = segments[first]
            if text in date_only:
                start = date_start(segments, first, prefixes)  # "julio 14 de 1986"
                if start is None:
                    continue
                text, read = start, AS_DATE
            else:
                read = 0  # AS_WRITTEN
            bounds: tuple[int, ...] = ()
            last = first
            while True:
                if text in variants and len(text) >= shortest:
                    yield _Hit(first, last, text, bounds, read)
                last += 1
                if last >= count:
                    break
                segment = segments[last]
                longer = text + segment
                if longer not in prefixes:
                    if text not in rereads or segment[0] in digits:
                        break  # both readings start at a word: a date's, or one that may begin a gap
                    if segment in date_words:
                        continued = self._reread(segments, first, last, text, bounds)
                    elif text not in gap_prefixes:
                        break
                    elif last + 1 < count and segments[last + 1][0] in digits:
                        # The common gap, one word between two digit groups, read here.
                        if len(segment) > MAX_LOOSE_LETTERS and segment not in connectors:
                            break
                        continued = (text, text + segments[last + 1], last + 1, ACROSS_GAP)
                        if continued[1] not in gap_reach:
                            break
                    elif len(segment) == 1 or segment in connectors:
                        continued = self._reread(segments, first, last, text, bounds)
                    else:
                        break
                    if continued is None:
                        break
                    base, longer, skipped_to, how = continued
                    if base is not text:  # the previous segment was read again, as a date word
                        bounds = bounds[:-1]
                    budget -= skipped_to - last
                    last = skipped_to
                    read |= how
                    text = base
                bounds += (len(text),)
                text = longer
                budget -= 1
                if budget < 0:
                    raise DetectionError("subject matcher exceeded its work bound")

    def _reread(
        self, segments: list[str], first: int, at: int, text: str, bounds: tuple[int, ...]
    ) -> tuple[str, str, int, int] | None:
        """`text` continued from segment `at` as a written date, or across a gap between digit
        groups: (the text it continues, the continued text, the segment it ends on, how read)."""
        if text in self._date_prefixes and segments[at] in DATE_WORDS:
            continued = date_continuation(segments, first, at, text, self._prefixes)
            if continued is not None:
                return text, *continued, AS_DATE
            # A date's connecting word taken as written because it begins a month's abbreviation
            # ("31 de dezembro": "de" of "dec"): read it again as a connecting word.
            previous = segments[at - 1]
            if at - 1 > first and bounds and bounds[-1] == len(text) - len(previous) and is_skipped(previous):
                base = text[: bounds[-1]]
                continued = date_continuation(segments, first, at - 1, base, self._prefixes)
                if continued is not None:
                    return base, *continued, AS_DATE
        if text in self._gap_prefixes:
            continued = gap_continuation(segments, at, text, self._gap_reach)
            if continued is not None:
                return text, *continued, ACROSS_GAP
        return None

    @staticmethod
    def _fits(variant: _Variant, hit: _Hit) -> bool:
        if hit.read and variant.kind not in READ_KINDS[hit.read]:
            return False  # a date's words make no phone, a gap between digit groups no date
        return not variant.required or variant.required.issubset(hit.bounds)

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
        spans = self._spans(text)
        # Read again with invisible characters and compatibility digits as spaces: one that sets a
        # value apart from a word (`Dear` + U+200B + a name) or a number (a phone and its
        # footnote mark `¹`) must not glue the two together. One for one: the same offsets.
        for spaced in blankings(text, within_words=True):
            spans += self._spans(spaced)
        return _merge(spans)

    def _spans(self, text: str) -> list[tuple[int, int, _Variant]]:
        reading = read(text, offsets=True)
        pieces = reading.spaced.split(" ")
        segments = list(filter(None, pieces))
        if not segments or self._starts.isdisjoint(segments):
            return []
        hits = list(self._scan(segments, _shortest_key(text)))
        if not hits:
            return []
        span = Located(reading, pieces).span
        escapes = word_escapes(text)

        spans: list[tuple[int, int, _Variant]] = []
        for hit in hits:
            start, end = span(hit.first, hit.last)
            if escapes.cut(start, end):
                continue  # a piece of a word with an escaped letter in it
            capitalised: bool | None = None
            for variant in self._variants[hit.key]:
                if not self._fits(variant, hit):
                    continue
                if variant.case is Case.UPPER_ONLY:
                    if not _in_capitals(text[start:end]):
                        continue
                elif variant.case is not Case.ANY:
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
        return spans

    # --- egress

    def first_survivor(self, text: str, *, long_only: bool = False) -> str | None:
        """The label of the first declared identifier readable in `text` (case-folded), or None.
        `long_only`: `text` is random (a credential, a cookie's value) and only forms of
        MEDIA_SHORTEST_KEY characters or more count, as in a media file's base64."""
        if not text:
            return None
        if long_only:
            return MEMO(
                ("survivor-long", self.digest), text, lambda t: self._first_survivor(t, MEDIA_SHORTEST_KEY)
            )
        return MEMO(("survivor", self.digest), text, self._first_survivor)

    def _first_survivor(self, text: str, shortest: int = 0) -> str | None:
        for reading in _readings(text):
            label = self._survivor(reading, shortest)
            if label is not None:
                return label
        return None

    def _survivor(self, text: str, shortest: int = 0) -> str | None:
        segments = read(text, offsets=False).spaced.split()
        if not segments or self._starts.isdisjoint(segments):
            return None
        shortest = max(shortest, _shortest_key(text))
        # The longest form at the first place any form starts names the hit ("mqvance77" is the
        # handle, not the name form "mqvance" inside it); hits of one start come shortest first.
        found: str | None = None
        found_at = -1
        escaped: EscapedWords | None = None  # read at the first hit, once
        for hit in self._scan(segments, shortest):
            if found is not None and hit.first != found_at:
                break
            for variant in self._variants[hit.key]:
                if variant.case is Case.CAPITALISED_ONLY or not self._fits(variant, hit):
                    continue
                if variant.case is Case.UPPER_ONLY and not _capitals_in(text, hit.key):
                    continue
                escaped = escaped or EscapedWords(text, segments)
                if escaped.cut(hit.first, hit.last):
                    break  # a piece of a word with an escaped letter in it: the decoded views read it
                found, found_at = variant.label, hit.first
                break
        return found


def _in_capitals(written: str) -> bool:
    """Every letter of `written` (read in its canonical view) is a capital."""
    letters = [c for c in canonical_text(written) if c.isalpha()]
    return bool(letters) and all(c.isupper() for c in letters)


def _capitals_in(text: str, key: str) -> bool:
    """`key`'s letters written in capitals somewhere in `text` as a word of their own, with
    any separators between them or none (`MQV`, `M. Q. V.`, `m_MQV_x`): the egress check's reading has
    no offsets, so an initials form it found is looked for again in the canonical view."""
    spelled = r"[^A-Za-z0-9]*+".join(map(regex.escape, key.upper()))
    pattern = rf"(?<![A-Za-z]){spelled}(?![A-Za-z])"  # a digit ends a word, as in the reading
    return regex.search(pattern, canonical_text(text)) is not None


# In a media file's base64 (a screenshot passed as a tool's input), a form's key must be this long to
# count: base64 spells a given 3-letter run about once per million characters (initials such as
# "mqv" would be found in one screenshot in a few and corrupt it), a 6-character one about once per
# 10^9; a whole name, an email or a handle written there is still found.
MEDIA_SHORTEST_KEY = 6
# A text that is one hex identifier (a UUID, a trace or request id: dash-separated groups of hex
# digits, 16 or more, letters and digits both) is random in the same way: a 3-letter key such as
# "ada" sits between its digits in about one UUID in 250, a 6-character one in one in 10^8.
HEX_ID_MIN_DIGITS = 16
HEX_ID_MAX_CHARS = 128
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def is_hex_id(text: str) -> bool:
    """Whether `text` is one hex identifier (a UUID, a trace id), read with long keys only."""
    if not HEX_ID_MIN_DIGITS <= len(text) <= HEX_ID_MAX_CHARS or text[0] not in _HEX_DIGITS:
        return False
    groups = text.split("-")
    return (
        len(text) - len(groups) + 1 >= HEX_ID_MIN_DIGITS
        and all(group and _HEX_DIGITS.issuperset(group) for group in groups)
        and any(c.isdigit() for c in text)
        and any(c.isalpha() for c in text)
    )


def _shortest_key(text: str) -> int:
    if len(text) >= MEDIA_MIN_LENGTH and is_media_payload(text):
        return MEDIA_SHORTEST_KEY
    # A provider's opaque blob or id is random the same way (ext_proc.detect.opaque).
    return MEDIA_SHORTEST_KEY if is_hex_id(text) or is_opaque_token(text) else 0


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
    gap_sets: list[frozenset[str]] = []
    reach_sets: list[frozenset[str]] = []
    date_sets: list[frozenset[str]] = []
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
                if compiled.gap_prefixes:
                    gap_sets.append(compiled.gap_prefixes)
                    reach_sets.append(compiled.prefixes)
                if kind == "DOB":
                    date_sets.append(compiled.prefixes)
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
    gap_prefixes: frozenset[str] = frozenset().union(*gap_sets)
    date_prefixes: frozenset[str] = frozenset().union(*date_sets).difference(MONTH_INSIDES)
    readings = Readings(gap_prefixes, date_prefixes, frozenset().union(*reach_sets), bool(date_sets))
    prefixes: frozenset[str] = frozenset().union(*prefix_sets)
    return CompiledSubjects(header.digest, variants, prefixes, frozenset(labels), readings)


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
