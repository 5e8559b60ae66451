"""The placeholder grammar: how placeholders and strip markers are written, and every pattern that
reads them back.

Redaction writes through `format_placeholder`, `format_pseudonym` and `strip_marker` (the maps of
ext_proc.transform.placeholders hand them out); restore (ext_proc.restore) finds placeholders in
replies in every form a model turns them into; the egress check and the output gate read this
request's own markers as separators; the surrogate claim swaps this request's placeholders for
surrogates. Each of those patterns is built here, from the one set of parts below.

- per-request placeholder `<{LABEL}_{nonce}_{index}>`: `nonce` is NONCE_HEX_CHARS lowercase hex,
  random per request; `index` (from 1) counts the distinct originals under the label;
- consistent pseudonym `<{LABEL}_{digest}>`: `digest` is PSEUDONYM_HEX_CHARS lowercase hex;
- strip marker `[{LABEL}]`: written where nothing is to be restored; `[{LABEL}_{n}]` (n from 2)
  where two object keys would otherwise become one.

A label is a catalog kind (`EMAIL`, `CREDIT_CARD`) or a declared subject's (`SUBJECT1_NAME`, and
`SUBJECT_NAME` for consistent pseudonyms).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import regex

from ext_proc.detect.catalog.deny import DENY_KIND
from ext_proc.detect.findings import CATALOG_KINDS
from ext_proc.detect.subjects.header import KINDS as SUBJECT_KINDS

NONCE_HEX_CHARS = 8
PSEUDONYM_HEX_CHARS = 20  # 80 bits of HMAC-SHA256

# Every label a consistent pseudonym can carry: restore looks for all of them, since a reply may
# mention a placeholder of an earlier request whose labels this request never used.
# (A tenant's own kinds are not among them: `customKinds` is refused with consistentPseudonyms.)
PSEUDONYM_LABELS: tuple[str, ...] = (
    *CATALOG_KINDS,
    DENY_KIND,
    *(f"SUBJECT_{kind}" for kind in SUBJECT_KINDS),
)
_PSEUDONYM_LABEL_SET = frozenset(PSEUDONYM_LABELS)

# --- the parts ---------------------------------------------------------------------------------

# A placeholder's label as read back: capitals, digits and underscores, starting with a capital.
_LABEL = r"[A-Z][A-Z0-9_]*"
# A strip marker has no nonce to tell it from text a caller wrote, so only a kind, with the
# position of its subject (and the number that keeps two redacted object keys apart), is one.
_STRIP_KIND = r"(?:SUBJECT[0-9]+_)?[A-Z][A-Z_]*?"
_STRIP_LABEL = _STRIP_KIND + r"(?:_[0-9]+)?"
_NONCE = rf"[0-9a-f]{{{NONCE_HEX_CHARS}}}"
_DIGEST = rf"[0-9a-f]{{{PSEUDONYM_HEX_CHARS}}}"
_INDEX = r"[0-9]+"
_OPEN, _CLOSE = "<", ">"
_HEX = frozenset("0123456789abcdef")


def format_placeholder(label: str, nonce: str, index: int) -> str:
    return f"{_OPEN}{label}_{nonce}_{index}{_CLOSE}"


def format_pseudonym(label: str, digest: str) -> str:
    return f"{_OPEN}{label}_{digest}{_CLOSE}"


def strip_marker(label: str, number: int = 1) -> str:
    """What `strip` mode writes instead of a reversible placeholder (`number` > 1: the marker of
    an object key that would otherwise collide with another)."""
    return f"[{label}]" if number == 1 else f"[{label}_{number}]"


_STRIP_MARKER = regex.compile(rf"\[(?P<kind>{_STRIP_KIND})(?:_[0-9]+)?\]")


def number_strip_markers(text: str, number: int) -> str | None:
    """`text` with each strip marker in it numbered `number`; None when it holds none."""
    numbered, count = _STRIP_MARKER.subn(lambda m: strip_marker(m.group("kind"), number), text)
    return numbered if count else None


# --- canonical forms: the map keys, exactly as written -------------------------------------------

_CANONICAL = regex.compile(rf"{_OPEN}(?P<label>{_LABEL})_(?P<nonce>{_NONCE})_(?P<index>{_INDEX}){_CLOSE}")
_CANONICAL_PSEUDONYM = regex.compile(rf"{_OPEN}(?P<label>{_LABEL})_(?P<digest>{_DIGEST}){_CLOSE}")
# A consistent pseudonym as written, anywhere in a text.
PSEUDONYM = _CANONICAL_PSEUDONYM


@dataclass(frozen=True, slots=True)
class PlaceholderParts:
    label: str
    nonce: str
    index: str  # the digits as written


def parse_placeholder(text: str) -> PlaceholderParts | None:
    """The parts of a per-request placeholder exactly as `format_placeholder` writes it, else None."""
    m = _CANONICAL.fullmatch(text)
    if m is None:
        return None
    return PlaceholderParts(m.group("label"), m.group("nonce"), m.group("index"))


def pseudonym_label(text: str) -> str | None:
    """The label of a consistent pseudonym exactly as `format_pseudonym` writes it for one of
    PSEUDONYM_LABELS, else None."""
    m = _CANONICAL_PSEUDONYM.fullmatch(text)
    if m is None or m.group("label") not in _PSEUDONYM_LABEL_SET:
        return None
    return m.group("label")


# --- this request's own markers -------------------------------------------------------------------


def _own_placeholder(nonce: str) -> str:
    if not nonce or not set(nonce) <= _HEX:
        raise ValueError("a nonce is lowercase hex")
    return rf"{_OPEN}{_LABEL}_{nonce}_{_INDEX}{_CLOSE}"


# Any request's placeholder (its nonce a group) and every strip marker; compiled once. A request's
# own are told apart by the nonce as they are found: compiling a pattern per request (its nonce
# written in) cost more than all of a small exchange's detection.
_ANY_MARKER = regex.compile(rf"{_OPEN}{_LABEL}_(?P<nonce>{_NONCE})_{_INDEX}{_CLOSE}|\[{_STRIP_LABEL}\]")
_ANY_PLACEHOLDER_BYTES = regex.compile(rf"{_OPEN}{_LABEL}_{_NONCE}_{_INDEX}{_CLOSE}".encode("ascii"))


# After this many markers of one request found with the shared pattern, the request's own pattern
# (its nonce written in) is compiled: about 0.3 ms, which a substitution in C instead of a Python
# callback per marker (about 0.5 µs less each) pays back after about 700 more (a redacted megabyte
# carries thousands).
COMPILE_AFTER = 1024


class OwnMarkers:
    """This request's placeholders (its nonce) and every strip marker: the only text known to carry
    no value, which the egress check and the output gate read as a separator (the random nonce
    could, by chance, spell a short declared identifier). A placeholder with another nonce, typed
    by a user, is not matched."""

    __slots__ = ("_found", "_own", "nonce")

    def __init__(self, nonce: str) -> None:
        self.nonce = nonce
        self._found = 0
        self._own: regex.Pattern[str] | None = None

    def sub(self, replacement: str, text: str, *, timeout: float | None = None) -> str:
        own = self._own
        if own is not None:
            return own.sub(replacement, text, timeout=timeout)
        nonce = self.nonce
        found = 0

        def replace(m: regex.Match[str]) -> str:
            nonlocal found
            found += 1
            return replacement if m.group("nonce") in (None, nonce) else m.group(0)

        out = _ANY_MARKER.sub(replace, text, timeout=timeout)
        self._found += found
        if self._found >= COMPILE_AFTER:
            self._own = regex.compile(rf"{_own_placeholder(nonce)}|\[{_STRIP_LABEL}\]")
        return out


@functools.lru_cache(maxsize=256)
def own_markers(nonce: str) -> OwnMarkers:
    """The markers of the request with this nonce (one object per nonce while it is in use)."""
    _own_placeholder(nonce)  # the nonce is checked
    return OwnMarkers(nonce)


def own_placeholders_bytes(nonce: str) -> regex.Pattern[bytes]:
    """Placeholders in a UTF-8 body, as written (where surrogates replace them): any request's;
    the caller keeps those of `nonce` (its map knows them) and leaves the others as they are."""
    _own_placeholder(nonce)
    return _ANY_PLACEHOLDER_BYTES


# --- the tolerated forms: what restore finds in a reply --------------------------------------------
#
# Models drop the angle brackets, change case, escape underscores for markdown (`\_`) and write the
# brackets as the JSON escapes `\u003c` / `\u003e`; every pattern below takes all of these.

# Where a placeholder may start: an opening bracket (`<` or its JSON escape), or else a word start:
# neither `xEMAIL_…` nor `SUBJECT2_EMAIL_…` is read as a placeholder of `EMAIL`. Markdown emphasis
# (`_`, `__`) before a word start is no part of the word; nor is the `n` of a JSON `\n`.
_TOLERANT_OPEN = r"(?:<|\\u003c|(?<![A-Za-z0-9_])|(?<=(?<![A-Za-z0-9_\\])_{1,2})|(?<=\\[nrt]))"
_CLOSER_ESCAPE = "\\u003e"
_TOLERANT_CLOSE = r"(?P<close>>|\\u003e)?"
_TOLERANT_UNDERSCORE = r"\\?_"
# How far back the opening's look-behind reads (`x__EMAIL`): a stream keeps that much context.
LOOKBEHIND_CHARS = 3
# The longest placeholder in any tolerated form (label, digest or nonce and index, escapes).
LONGEST_FORM_CHARS = 160


def _label_alternation(labels: Iterable[str]) -> str:
    # Longest label first: where two labels could both match from one position, the longer wins.
    return "|".join(
        regex.escape(label).replace("_", _TOLERANT_UNDERSCORE)
        for label in sorted(labels, key=lambda lb: (-len(lb), lb))
    )


@functools.lru_cache(maxsize=512)
def placeholder_pattern(labels: tuple[str, ...], digits: int) -> regex.Pattern[str]:
    """Per-request placeholders of these labels in every tolerated form, with any nonce (the
    restorer compares the match's nonce with its own), and an index of at most `digits` digits.

    Compiled once per set of labels, not once per exchange: compiling costs about 0.5 ms, and the
    label sets repeat (EMAIL, PHONE, SUBJECT1_NAME, ...) while every exchange has its own nonce.
    """
    return regex.compile(
        _TOLERANT_OPEN
        + rf"(?P<label>{_label_alternation(labels)}){_TOLERANT_UNDERSCORE}(?P<nonce>{_NONCE})"
        + _TOLERANT_UNDERSCORE
        # The index ends at a non-digit: `_12` is never read as `_1` followed by `2`.
        + rf"(?P<index>[0-9]{{1,{digits}}})(?![0-9])"
        + _TOLERANT_CLOSE,
        regex.IGNORECASE | regex.ASCII,
    )


@functools.lru_cache(maxsize=1)
def pseudonym_pattern() -> regex.Pattern[str]:
    """Consistent pseudonyms of every label, in every tolerated form. The digest ends at a
    character that cannot continue it: `EMAIL_<20 hex>f` is a longer token, not a placeholder."""
    return regex.compile(
        _TOLERANT_OPEN
        + rf"(?P<label>{_label_alternation(PSEUDONYM_LABELS)}){_TOLERANT_UNDERSCORE}"
        + rf"(?P<digest>{_DIGEST})(?![0-9a-z])"
        + _TOLERANT_CLOSE,
        regex.IGNORECASE | regex.ASCII,
    )


# The cheap pre-check for consistent pseudonyms: a digest right after an underscore, whole.
_DIGEST_HINT = rf"_[0-9a-fA-F]{{{PSEUDONYM_HEX_CHARS}}}(?![0-9a-zA-Z])"
_DIGEST_HINT_TEXT = regex.compile(_DIGEST_HINT)
_DIGEST_HINT_BYTES = regex.compile(_DIGEST_HINT.encode("ascii"))


def may_hold_pseudonym(data: bytes | str) -> bool:
    """Whether `data` holds a whole digest right after an underscore (any case)."""
    if isinstance(data, str):
        return _DIGEST_HINT_TEXT.search(data) is not None
    return _DIGEST_HINT_BYTES.search(data) is not None


def is_final(text: str, m: regex.Match[str]) -> bool:
    """Whether a complete match of a restore pattern is final: more text could not make it a
    different match.

    It is not while its index could take another digit or a closing bracket could still follow
    (nothing after it yet, or only a beginning of `\\u003e`). Every restore pattern sets the group
    `close` when what it matched has ended for certain.
    """
    if m.group("close") is not None:
        return True
    rest = text[m.end() : m.end() + len(_CLOSER_ESCAPE)]
    return bool(rest) and not _CLOSER_ESCAPE.startswith(rest.lower())
