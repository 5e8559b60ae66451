"""Regex calls with a time budget, and the small text helpers the validators share.

Every pattern of the catalog is compiled here and every call to one goes through a `timed_*`
helper, so a pattern that runs away on its input raises `TimeoutError` (which `Catalog` turns into
a `DetectionError`) instead of stalling the request. The budget is read from `REGEX_TIMEOUT` at
call time, in this module alone.
"""

from __future__ import annotations

import regex

# Per regex call, for each TIMEOUT_CHARS characters it reads. Read at call time so tests (and
# operators under load) can change it.
REGEX_TIMEOUT = 0.25
TIMEOUT_CHARS = 250_000

# Offsets of a value in a text: (start, end).
Span = tuple[int, int]

DIGITS = "0123456789"
DIGIT_SET = frozenset(DIGITS)


def compile_pattern(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    return regex.compile(pattern, flags | regex.VERSION0)


def timeout_for(length: int) -> float:
    # The budget grows with the text a call reads, so a large body is not mistaken for a
    # runaway pattern: REGEX_TIMEOUT per TIMEOUT_CHARS characters, about 10x what a linear
    # pattern needs on this class of machine.
    return REGEX_TIMEOUT * (1 + length / TIMEOUT_CHARS)


def timed_search(
    pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None
) -> regex.Match[str] | None:
    end = len(text) if endpos is None else endpos
    return pattern.search(text, pos, end, timeout=timeout_for(end - pos))


def timed_match(
    pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None
) -> regex.Match[str] | None:
    end = len(text) if endpos is None else endpos
    return pattern.match(text, pos, end, timeout=timeout_for(end - pos))


def timed_fullmatch(pattern: regex.Pattern[str], text: str) -> regex.Match[str] | None:
    return pattern.fullmatch(text, timeout=timeout_for(len(text)))


def timed_all(
    pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None
) -> list[regex.Match[str]]:
    """Every match, collected in one call before any validator runs: one timeout set-up per
    pattern and text, and the scanner's budget (which runs from its creation) covers the scan
    alone, never the validators' work between matches."""
    end = len(text) if endpos is None else endpos
    return list(pattern.finditer(text, pos, end, timeout=timeout_for(end - pos)))


# A run of digits: the groups of a card number or of a phone number.
DIGIT_GROUP = compile_pattern(r"[0-9]+")

_MASK_CHARS = frozenset("xX*#.•_- ")


# A key's prefix before its mask (`sk-xxxx`, `sk-proj-****`, `ghp_XXXX`).
_MASK_PREFIX = regex.compile(r"(?:[A-Za-z]{1,10}[\-_]){1,2}")
MASK_MIN_CHARS = 4


def is_mask(body: str) -> bool:
    """`xxxx`, `XXXX-XXXX`, `****`, `sk-xxxxxxxx`: a documented placeholder, not a value."""
    if not body:
        return False
    if all(ch in _MASK_CHARS for ch in body):
        return True
    prefix = _MASK_PREFIX.match(body)
    rest = body[prefix.end() :] if prefix is not None else ""
    return len(rest) >= MASK_MIN_CHARS and all(ch in _MASK_CHARS for ch in rest)


def digits_of(value: str) -> str:
    return "".join(ch for ch in value if ch in DIGIT_SET)
