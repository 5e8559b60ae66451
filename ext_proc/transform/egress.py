"""The egress check: the final outgoing body, read again, independently of redaction.

Redaction decides what to replace; this module only asks whether any declared identifier is
still there, in the bytes that would leave. It re-parses the final body itself and reads:
- every string value and every object key;
- every number as its exact decimal (JSON numbers are parsed as `Decimal`, so `1e21` reads as
  `1000000000000000000000` and `4.045550187e9` as `4045550187`);
- number literals inside strings, expanded the same way (`"4.045550187e9"`);
- JSON carried inside strings (tool-call `arguments`), parsed and read at any depth up to the
  limit, in addition to the string's own text.
It skips only real media bytes at their schema positions (the dialect's, ext_proc.dialects),
which the media policy judges; a payload there that decodes to text is read as that text too. It
runs whatever the tenant redacts: system prompts under `redactSystem: false`, metadata, tool
definitions and object keys are all read.

Matching (separator-blind, case- and accent-insensitive, word/number-bounded, over each string's
canonical view and its decoded views: ext_proc.detect.canonical, ext_proc.detect.decode) belongs
to the compiled subjects; this module is the traversal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

import regex

from ext_proc.detect.canonical import canonical_text
from ext_proc.detect.memo import MEMO
from ext_proc.dialects import Dialect
from ext_proc.errors import DetectionError
from ext_proc.transform.grammar import PSEUDONYM, own_markers
from ext_proc.transform.walk import MAX_DEPTH, NestingTooDeep, looks_like_json

# Exponent literals in text; plain integers in text need no expansion (they read as themselves).
NUMBER_LITERAL = regex.compile(r"(?<![\p{L}\p{N}.])[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+(?![\p{L}\p{N}])")
# An exponent beyond this cannot move a declared identifier's digits anywhere new; it would only
# produce a huge run of zeros. Such numbers are read as their mantissa digits instead.
MAX_EXPANDED_DIGITS = 400
REGEX_TIMEOUT = 0.5


class SurvivorFinder(Protocol):
    def first_survivor(self, text: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class EgressHit:
    label: str  # e.g. SUBJECT1_PHONE: a kind and a position, never the value


def exact_decimal(number: Decimal | int) -> str:
    """A number as the plain decimal a reader would see written out (no exponent)."""
    if isinstance(number, int):
        return str(number)
    if not number.is_finite():
        return ""
    if abs(number.adjusted()) > MAX_EXPANDED_DIGITS:
        sign, digits, _ = number.as_tuple()
        return ("-" if sign else "") + "".join(map(str, digits))
    text = format(number, "f")
    return text


def _expand_literals(text: str) -> list[str]:
    if "e" not in text and "E" not in text:
        return []
    try:
        matches = NUMBER_LITERAL.findall(text, timeout=REGEX_TIMEOUT)
    except TimeoutError:
        raise DetectionError("egress number scan timed out") from None
    out = []
    for literal in matches:
        try:
            out.append(exact_decimal(Decimal(literal)))
        except InvalidOperation:
            continue
    return out


def _parse(text: str) -> Any:
    try:
        return json.loads(text, parse_float=Decimal)
    except RecursionError:
        raise NestingTooDeep() from None


def neutralise_own_markers(text: str, nonce: str, pseudonyms: frozenset[str] = frozenset()) -> str:
    """`text` with this request's own placeholders, the consistent pseudonyms it wrote
    (`pseudonyms`: their hex digests could spell a short identifier by chance) and every strip
    marker read as a space (ext_proc.transform.grammar.own_markers); a placeholder with another
    nonce, or a pseudonym this request did not write, is read as text."""
    text = own_markers(nonce).sub(" ", text, timeout=REGEX_TIMEOUT)
    if pseudonyms and "<" in text:
        text = PSEUDONYM.sub(
            lambda m: " " if m.group(0) in pseudonyms else m.group(0), text, timeout=REGEX_TIMEOUT
        )
    return text


# A media position: None when its payload is real media (not read), else the text its base64
# payload decodes to (read as well as the string itself).
MediaPositions = dict[tuple[int, object], str | None]


class _Reader:
    def __init__(
        self, finder: SurvivorFinder, media: MediaPositions, nonce: str | None, pseudonyms: frozenset[str]
    ) -> None:
        self.finder = finder
        self.media = media
        self.nonce = nonce
        self.pseudonyms = pseudonyms

    def text(self, text: str, depth: int) -> str | None:
        if self.nonce is not None and ("<" in text or "[" in text):
            text = neutralise_own_markers(text, self.nonce, self.pseudonyms)
        digest = getattr(self.finder, "digest", None)
        if digest is None:
            return self._text(text, depth)
        # The verdict is a pure function of (subjects, depth, text after this request's own markers
        # are gone): a string already read in an earlier request is not read again. Any trace of
        # this request's nonce left in the text makes its key this request's own.
        return MEMO(("egress", digest, depth), text, lambda t: self._text(t, depth))

    def _text(self, text: str, depth: int) -> str | None:
        hit = self.finder.first_survivor(text)
        if hit is not None:
            return hit
        # Literals are read in the canonical view (`４.０４５５５５０１８７ｅ９` is one too); an ASCII
        # literal reads the same in it.
        for expanded in _expand_literals(text if text.isascii() else canonical_text(text)):
            hit = self.finder.first_survivor(expanded)
            if hit is not None:
                return hit
        if looks_like_json(text):
            try:
                inner = _parse(text)
            except ValueError:
                return None
            if isinstance(inner, (dict, list)):
                return self.value(inner, depth + 1)
        return None

    def value(self, value: Any, depth: int) -> str | None:
        if isinstance(value, str):
            return self.text(value, depth)
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, (int, Decimal)):
            return self.finder.first_survivor(exact_decimal(value))
        if depth >= MAX_DEPTH:
            raise NestingTooDeep()
        if isinstance(value, dict):
            ident = id(value)
            for key, item in value.items():
                # A key is read exactly like a value: literals expanded, JSON inside it parsed.
                hit = self.text(key, depth)
                if hit is not None:
                    return hit
                hit = self._member((ident, key), item, depth)
                if hit is not None:
                    return hit
            return None
        if isinstance(value, list):
            ident = id(value)
            for index, item in enumerate(value):
                hit = self._member((ident, index), item, depth)
                if hit is not None:
                    return hit
        return None

    def _member(self, position: tuple[int, object], item: Any, depth: int) -> str | None:
        if position in self.media:
            decoded = self.media[position]
            if decoded is None:
                return None  # real media bytes: judged by the media policy
            hit = self.text(decoded, depth + 1)
            if hit is not None:
                return hit
        return self.value(item, depth + 1)


def check_body(
    body: bytes,
    dialect: Dialect,
    finder: SurvivorFinder,
    *,
    nonce: str | None = None,
    pseudonyms: frozenset[str] = frozenset(),
) -> EgressHit | None:
    """The first declared identifier still present in the outgoing body, or None.

    With `nonce`, this request's own placeholders (and the consistent `pseudonyms` it wrote) and
    strip markers are read as separators.

    Raises NestingTooDeep or DetectionError when the body cannot be read in full: the caller
    refuses the request then (the check never passes what it could not read).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise DetectionError("the outgoing body is not UTF-8") from None
    if not text.strip():
        return None
    try:
        doc = _parse(text)
    except ValueError:
        # Not JSON (cannot happen for a body the pipeline forwards, but never pass unread bytes).
        hit = _Reader(finder, {}, nonce, pseudonyms).text(text, 0)
        return EgressHit(hit) if hit else None
    media: MediaPositions = {}
    for part in dialect.media(doc):
        if part.is_bytes:
            media[(id(part.container), part.key)] = None
        elif (decoded := part.encoded_text) is not None:
            media[(id(part.container), part.key)] = decoded
    try:
        hit = _Reader(finder, media, nonce, pseudonyms).value(doc, 0)
    except TimeoutError:
        raise DetectionError("egress marker scan timed out") from None
    return EgressHit(hit) if hit else None
