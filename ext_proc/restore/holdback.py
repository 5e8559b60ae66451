"""Where a catalog value may still be growing at the end of a stream channel's text.

Where it sits: the output gate (ext_proc.restore.output_gate) judges a channel's text only once it
is decided, and under `outputGate: deny` releases nothing before; `open_start` says where the
undecided tail begins, the earliest position from which the text could still grow into a catalog
value (a digit run that more digits make a card, `AKIA` and 15 more characters, a local part
before its `@`, a quoted value after `password =`).

Two rules, both read off the catalog itself, so a new detector is held back like the others:
- The last run of non-space characters is always undecided: a value of a pattern that matches no
  whitespace can only be growing there (what follows a word may make it a key, an address, a
  token), and holding a word back costs only the wait for the next space.
- The patterns that can match whitespace (a card with its spaces, an IBAN, a phone number, a PEM
  header, a quoted secret after its key, an address written `[dot] com`; found by reading each
  pattern's source) are matched partially (the `regex` module reports a match that runs into the
  end of the text): where one reaches the end, the text from its start is undecided.

The text is read as the catalog reads it: its canonical view and its decoded views (an escape
that more characters complete, `\\u00` or `&#5`, is held too). Only the last `HOLD_CHARS`
characters can be held: a value never needs more, and a longer run is judged as it stands (cut
after a separator where one is near, so a token is rarely judged in halves). A line break ends
every catalog value, so nothing before the last one is held.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ext_proc.detect.canonical import View, canonical, read_char
from ext_proc.detect.catalog.anchors import ANCHORS, Scratch
from ext_proc.detect.catalog.detectors import Detector
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.catalog.regexes import timeout_for
from ext_proc.detect.decode import decoded_views, hidden_view, may_hold_escapes

# The most a channel holds back: longer than any catalog value read whole (a PEM header, a key,
# an address, a card with its separators); a run longer than this is judged as it stands.
HOLD_CHARS = 256

# Invisible characters count for nothing in HOLD_CHARS, but the held text is read again with every
# delta: past this many characters in all, it is judged as it stands (a value padded with more
# invisible characters than this may have its first part released before the refusal).
HOLD_RAW_CHARS = 8192

# Characters before the held region that the patterns read too: their look-behinds, and a key
# with its operator before a quoted value that is still open.
CONTEXT_CHARS = 160

_SPACE = re.compile(r"\s")

# Where a run longer than HOLD_CHARS is cut: after one of these, within this many characters.
_SEPARATORS = re.compile(r"[\s,;:\"'`(){}\[\]<>|]")
SOFT_CUT_CHARS = 64

# An escape that more characters could still complete, at the very end of the text: backslash
# forms (`\\u00`, `\\x4`, `\\N{COMM`, octal and CSS), entities (`&#5`, `&am`), percent and
# quoted-printable (`%4`, `=4`), and the spelled-out `(at)` / `[dot]` forms.
_OPEN_ESCAPE = re.compile(
    r"(?:\\(?:u\{?[0-9A-Fa-f]{0,5}|U[0-9A-Fa-f]{0,7}|x[0-9A-Fa-f]?|N(?:\{[A-Za-z0-9 \-]{0,88})?"
    r"|[0-9A-Fa-f]{1,6})?|&(?:#[xX]?[0-9A-Fa-f]{0,6}|[A-Za-z][A-Za-z0-9]{0,31})?|%[0-9A-Fa-f]?"
    r"|=[0-9A-Fa-f]?|[(\[{<] ?(?:[aA][tT]?|[dD](?:[oO][tT]?)?)? ?)\Z"
)


def open_start(text: str, floor: int, catalog: Catalog) -> int:
    """The earliest position at or after `floor` from which `text` could still grow into a value
    of `catalog` (len(text) when nothing can): where the undecided tail begins."""
    n = len(text)
    if catalog.detectors and one_short_run(text, floor):
        return floor
    lo = max(floor, text.rfind("\n", floor) + 1)
    if n - lo > HOLD_RAW_CHARS:
        lo = _soft_cut(text, n - HOLD_RAW_CHARS)
    if n - lo > HOLD_CHARS:
        at = visible_start(text, lo, HOLD_CHARS)
        if at > lo:
            lo = _soft_cut(text, at)
    if lo >= n or not catalog.detectors:
        return n
    start = _last_run_start(text, lo)
    base = max(0, lo - CONTEXT_CHARS)
    region = text[base:]
    escape = _OPEN_ESCAPE.search(region, lo - base)
    if escape is not None:
        # Held, and the text is read as if it ended before it: a value that runs up to an open
        # escape may go on in what the escape turns out to be.
        start = min(start, base + escape.start())
        region = region[: escape.start()]
    spanning = _spanning(catalog)
    if not spanning or not region:
        return max(start, lo)
    # The held part in its canonical view after its context as written (what the patterns'
    # look-behinds and anchors read there): a match maps back through the held part's view alone.
    context, held = region[: lo - base], canonical(region[lo - base :])
    at = _open_in(context + held.text, spanning, len(context)) - len(context)
    if at < len(held.text):
        start = min(start, lo + _source(held, max(at, 0)))
    if may_hold_escapes(region):
        view = canonical(region)
        for decoded in decoded_views(view.text):
            at = _open_in(decoded.text, spanning, 0)
            if at < len(decoded.text):
                inner = decoded.span(at, len(decoded.text))[0]
                start = min(start, base + _source(view, inner))
    hidden = hidden_view(region)
    if hidden is not None:
        at = _open_in(hidden.text, spanning, 0)
        if at < len(hidden.text):
            start = min(start, base + hidden.span(at, len(hidden.text))[0])
    return max(start, lo)


def one_short_run(text: str, floor: int) -> bool:
    """Whether `text[floor:]` is one run of non-space characters too short to be cut: the last
    run, so all of it is undecided (the common case between two words of a stream, answered
    without reading the text)."""
    return len(text) - floor <= HOLD_CHARS and _SPACE.search(text, floor) is None


def visible_start(text: str, lo: int, count: int) -> int:
    """Where the last `count` characters of `text[lo:]` begin, counted in its canonical view:
    invisible characters and the extra spaces of a run count for nothing, so padding a value
    with them never pushes its start out of what is held (or read again)."""
    if len(text) - lo <= count:
        return lo
    seen = 0
    spaced = False  # the character to the right counted as a space
    i = len(text)
    while i > lo:
        char = text[i - 1]
        reading = char if char.isascii() else read_char(char)
        if reading:
            space = reading.isspace()
            if not (space and spaced):
                seen += 1 if space else len(reading)
                if seen > count:
                    return i
            spaced = space
        i -= 1
    return lo


def _source(view: View, at: int) -> int:
    """The original position view position `at` was read from."""
    return view.span(at, len(view.text))[0] if at < len(view.text) else len(view.text)


def _soft_cut(text: str, at: int) -> int:
    """Where to cut a run that exceeds the hold: just after a separator shortly before `at`."""
    best = at
    for m in _SEPARATORS.finditer(text, max(0, at - SOFT_CUT_CHARS), at):
        best = m.end()
    return best


def _last_run_start(text: str, lo: int) -> int:
    """Where the last run of non-space characters begins (len(text) if the text ends in a space)."""
    i = len(text)
    while i > lo and not text[i - 1].isspace():
        i -= 1
    return i


def _open_in(text: str, spanning: Spanning, lo: int) -> int:
    """The earliest start from which the rest of `text` is a match of one of the `spanning`
    detectors, whole or still partial (more text could complete or extend it); len(text) if
    none. Matches without an anchor are looked for from `lo` (one that started before it would
    have been held then); an anchored one wherever its anchor is."""
    n = len(text)
    best = n
    timeout = timeout_for(n)
    scratch: Scratch | None = None
    for detector in spanning.anchored:
        # Its anchor says where a match can start (a key with a secret keyword, the local part
        # before an `@`); what is still to come cannot start one elsewhere.
        if scratch is None:
            scratch = Scratch(text)
        for s in sorted({s for s, _ in ANCHORS[detector.anchor or ""](scratch) if s < best}):
            if detector.pattern.fullmatch(text, s, partial=True, timeout=timeout) is not None:
                best = s
                break
    for detector in spanning.unanchored:
        for m in detector.pattern.finditer(text, min(lo, best), partial=True, timeout=timeout):
            s = m.start()
            if s >= best:
                break
            # A match that ends before the text does may still grow (an IBAN's next group after
            # a space): what counts is whether all the rest could belong to one.
            if m.end() == n or detector.pattern.fullmatch(text, s, partial=True, timeout=timeout):
                best = s
                break
    return best


@dataclass(frozen=True, slots=True)
class Spanning:
    """A catalog's detectors whose pattern can match whitespace, one per distinct pattern: those
    with an anchor that says where a match starts, and the others. (Joined into one alternation,
    the others were searched 5 to 16 times slower than one by one: each pattern's own prefix
    optimisation is lost.)"""

    anchored: tuple[Detector, ...]
    unanchored: tuple[Detector, ...]

    def __bool__(self) -> bool:
        return bool(self.anchored or self.unanchored)


@functools.lru_cache(maxsize=64)
def _spanning(catalog: Catalog) -> Spanning:
    """The catalog's spanning detectors (catalogs are built once per set of sets: cached by the
    object)."""
    seen: dict[int, Detector] = {}
    for detector in catalog.detectors:
        if matches_space(detector.pattern.pattern):
            seen.setdefault(id(detector.pattern), detector)
    anchored = tuple(d for d in seen.values() if d.anchor is not None and d.anchored)
    unanchored = tuple(d for d in seen.values() if not (d.anchor is not None and d.anchored))
    return Spanning(anchored, unanchored)


# Escapes that never match a whitespace character (outside and inside a class).
_NO_SPACE_ESCAPES = frozenset("dwSbBAZG.-[](){}*+?|^$/\\\"'`:=@#&,!<>_%~;0123456789")


def matches_space(source: str) -> bool:
    """Whether a pattern (its source) can match a whitespace character: a space, a class that
    holds one (or a negated class without `\\s`), `.`, or an escape other than the ones known to
    match none. Unsure reads as yes."""
    i = 0
    n = len(source)
    while i < n:
        char = source[i]
        if char == "\\":
            if source[i + 1 : i + 2] not in _NO_SPACE_ESCAPES:
                return True
            i += 2
            continue
        if char == "[":
            end, spaced = _class(source, i)
            if spaced:
                return True
            i = end
            continue
        if char == "." or char.isspace():
            return True
        i += 1
    return False


def _class(source: str, start: int) -> tuple[int, bool]:
    """The end of the character class at `start`, and whether it can match whitespace."""
    i = start + 1
    negated = source[i : i + 1] == "^"
    if negated:
        i += 1
    spaced = False
    excludes_space = False
    first = True
    while i < len(source):
        char = source[i]
        if char == "]" and not first:
            break
        first = False
        if char == "\\":
            escape = source[i + 1 : i + 2]
            if escape == "s":
                excludes_space = True
            elif escape not in _NO_SPACE_ESCAPES:
                spaced = True
            i += 2
            continue
        if char == "[" and source[i + 1 : i + 2] == ":":
            spaced = True  # a POSIX class: unsure
        if char.isspace():
            spaced = True
        i += 1
    if negated:
        return i + 1, not excludes_space
    return i + 1, spaced or excludes_space
