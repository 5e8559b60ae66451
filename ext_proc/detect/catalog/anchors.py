"""Anchors: the few windows of a long text where a detector's pattern can match at all.

The regex module spends about 100 ns on every position where a pattern's first character class
matches; for patterns that start with a letter class that is every word of a text. An anchor
finds the windows worth scanning with C-speed `bytes` operations instead, on the views of the
text that `Scratch` computes once per `Catalog.detect` call. Each anchor is a necessary
condition of a match: skipping the rest of the text never loses a finding. `Triggers` does the
same for the literals detectors name (`ghp_`, `hf_`, `@`): which of them a text may hold, in one
pass however many there are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import regex

from ext_proc.detect.catalog.entropy import HIGH_ENTROPY_MIN_LENGTH
from ext_proc.detect.catalog.regexes import Span

_TOKEN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-="
_IDENT_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"


def _class_table(chars: bytes) -> bytes:
    table = bytearray(b" " * 256)
    for ch in chars:
        table[ch] = ord("a")
    return bytes(table)


_TOKEN_TABLE = _class_table(_TOKEN_CHARS)
_ALNUM = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# Letters and digits as themselves, every other byte as a space: `split` gives the words.
_ALNUM_TABLE = bytes(ch if ch in _ALNUM else 0x20 for ch in range(256))
# What keys and tokens are written with (`ghp_…`, `hvs.…`, `sha256~…`, `123:AA…`, `eyJ….ey…`, a
# webhook URL): a detector marked `token` matches one run of these, at least TOKEN_RUN_MIN long.
TOKEN_RUN_CHARS = _ALNUM + b"_-.~:+/="
TOKEN_RUN_MIN = 16
_TOKEN_RUN_TABLE = _class_table(TOKEN_RUN_CHARS)
_IDENT_TABLE = _class_table(_IDENT_CHARS)
# Every secret key contains one of these (lower-cased): the words the assignment anchors look for.
# (`pw` also stands for `pwd`; `sonar` and `sumo` begin the vendors' names for a credential that
# holds no secret word: `SONAR_LOGIN`, `SUMOLOGIC_ACCESSID`.)
SECRET_KEYWORDS = (
    b"pass", b"pw", b"secret", b"token", b"key", b"auth", b"credential", b"contrase", b"sonar", b"sumo",
)  # fmt: skip
# The longest assignment: key and index (84), quotes and spaces around the operator (134), a
# scheme (20) and an escaped quoted value (2 + 2 x 1024 + 2).
KEY_WINDOW = 2400


@dataclass(slots=True)
class Scratch:
    """Per-call views of one text, computed on first use."""

    text: str
    _ascii: bytes | None = None
    _lower: bytes | None = None
    _ident: bytes | None = None
    _tokens: bytes | None = None
    _token_words: frozenset[bytes] | None = None
    cache: dict[str, list[Span]] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)

    def count(self, chars: str) -> int:
        """How many characters of the text are in `chars` (ASCII)."""
        if chars not in self._counts:
            ascii_ = self.ascii
            self._counts[chars] = len(ascii_) - len(ascii_.translate(None, chars.encode()))
        return self._counts[chars]

    def present(self, triggers: Triggers) -> set[str]:
        """Which of `triggers`' literals may occur in the text (never one that does not)."""
        return triggers.present(self)

    @property
    def token_words(self) -> frozenset[bytes]:
        """The distinct words (runs of ASCII letters and digits) of the text's token runs: runs of
        at least TOKEN_RUN_MIN token characters, where every key and token a trigger stands for
        lies. Prose has few such runs, so this is cheap where nothing is to be found."""
        if self._token_words is None:
            runs = _runs(self.ascii.translate(_TOKEN_RUN_TABLE), TOKEN_RUN_MIN)
            ascii_ = self.ascii
            joined = b" ".join(ascii_[start:end] for start, end in runs)
            self._token_words = frozenset(joined.translate(_ALNUM_TABLE).split())
        return self._token_words

    @property
    def ascii(self) -> bytes:
        # One byte per character: offsets in the bytes are offsets in the text.
        if self._ascii is None:
            self._ascii = self.text.encode("ascii", "replace")
        return self._ascii

    @property
    def lower(self) -> bytes:
        if self._lower is None:
            self._lower = self.ascii.lower()
        return self._lower

    @property
    def ident(self) -> bytes:
        if self._ident is None:
            self._ident = self.ascii.translate(_IDENT_TABLE)
        return self._ident

    @property
    def tokens(self) -> bytes:
        if self._tokens is None:
            self._tokens = self.ascii.translate(_TOKEN_TABLE)
        return self._tokens


# A trigger whose first word ends the trigger is looked up by at most this many of its
# characters (one pass over the token words per length: 3, and 2 for `-us` and `:AA`).
TRIGGER_HEAD = 3


@dataclass(frozen=True, slots=True)
class Triggers:
    """The trigger literals of a catalog's detectors, indexed so that telling which of them a text
    may hold costs one pass over it, however many there are.

    The triggers of a `token` detector (one whose every match is a run of TOKEN_RUN_CHARS at least
    TOKEN_RUN_MIN long) are looked up among the words of such runs (`Scratch.token_words`), by
    their first word: a trigger that begins with a letter or digit begins a word there (a token
    detector's pattern allows no letter or digit before its trigger), so that word begins with
    the trigger's first word (`AKIA`, `eyJ`), or is it exactly where the trigger goes on past it
    (`hf_` needs the word `hf`); after another character (`_live_`) the first word is a whole
    word of the text too, or begins one. `present` may so report a trigger that is not there,
    never miss one that is. The triggers of other detectors (`@`, `-----BEGIN`: a handful) are
    looked for in the whole text as they are.
    """

    exact: dict[bytes, frozenset[str]]
    heads: dict[int, dict[bytes, frozenset[str]]]
    plain: tuple[tuple[str, bytes], ...]

    @classmethod
    def build(cls, token: Iterable[str], plain: Iterable[str]) -> Triggers:
        exact: dict[bytes, set[str]] = {}
        heads: dict[int, dict[bytes, set[str]]] = {}
        whole: set[str] = set(plain)
        for literal in sorted(set(token)):
            first = _FIRST_WORD.search(literal.encode("ascii"))
            if first is None:
                whole.add(literal)
            elif first.end() < len(literal):
                exact.setdefault(first.group(), set()).add(literal)
            else:
                head = first.group()[:TRIGGER_HEAD]
                heads.setdefault(len(head), {}).setdefault(head, set()).add(literal)
        return cls(
            {w: frozenset(ls) for w, ls in exact.items()},
            {n: {h: frozenset(ls) for h, ls in by.items()} for n, by in sorted(heads.items())},
            tuple((literal, literal.encode("ascii")) for literal in sorted(whole)),
        )

    def present(self, scratch: Scratch) -> set[str]:
        found: set[str] = set()
        words = scratch.token_words if (self.exact or self.heads) else frozenset()
        if words:
            for word in words.intersection(self.exact):
                found |= self.exact[word]
            for n, by_head in self.heads.items():
                for head in by_head.keys() & {w[:n] for w in words}:
                    found |= by_head[head]
        if self.plain:
            text = scratch.text
            if len(text) <= 4096 or text.isascii():
                found.update(literal for literal, _ in self.plain if literal in text)
            else:
                # A long text with wide characters: its one-byte view is faster to search.
                ascii_ = scratch.ascii
                found.update(literal for literal, encoded in self.plain if encoded in ascii_)
        return found


_FIRST_WORD = regex.compile(rb"[A-Za-z0-9]+")


def _runs(mapped: bytes, min_length: int) -> list[Span]:
    """Maximal runs of b"a" at least `min_length` long, widened by one byte on each side."""
    out: list[Span] = []
    needle = b"a" * min_length
    n = len(mapped)
    pos = mapped.find(needle)
    while pos >= 0:
        start = mapped.rfind(b" ", 0, pos) + 1
        end = mapped.find(b" ", pos)
        if end < 0:
            end = n
        out.append((max(0, start - 1), min(n, end + 1)))
        pos = mapped.find(needle, end)
    return out


def _token_runs_20(scratch: Scratch) -> list[Span]:
    if "runs20" not in scratch.cache:
        scratch.cache["runs20"] = _runs(scratch.tokens, HIGH_ENTROPY_MIN_LENGTH)
    return scratch.cache["runs20"]


# What can follow an `@` in an address the EMAIL pattern accepts (labels, dots, "[dot]" forms),
# and what a local part is made of.
_DOMAIN_RUN = regex.compile(rb"[A-Za-z0-9.\-\[\](){} ]*")
_LOCAL_TABLE = _class_table(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
EMAIL_LOCAL_MAX = 64


def _at_starts(scratch: Scratch) -> list[Span]:
    """Where an EMAIL match can start, one window per `@`: at the first character of the run of
    local-part characters that ends at the `@` (the pattern's look-behind allows no other start),
    up to the end of the domain characters after it plus the look-ahead character. A run longer
    than the longest local part cannot match (a later start fails the look-behind): no window."""
    if "at" not in scratch.cache:
        ascii_ = scratch.ascii
        local = ascii_.translate(_LOCAL_TABLE)
        n = len(ascii_)
        out: list[Span] = []
        pos = ascii_.find(b"@")
        while pos >= 0:
            low = max(0, pos - EMAIL_LOCAL_MAX - 1)
            start = local.rfind(b" ", low, pos) + 1
            if start == 0 and low > 0:
                start = -1  # no boundary within reach: the run is too long to be a local part
            if 0 <= start < pos:
                run = _DOMAIN_RUN.match(ascii_, pos + 1)
                end = run.end() if run is not None else pos + 1
                out.append((start, min(n, end + 1)))
            pos = ascii_.find(b"@", pos + 1)
        scratch.cache["at"] = out
    return scratch.cache["at"]


def _token_runs_40(scratch: Scratch) -> list[Span]:
    return [(s, e) for s, e in _token_runs_20(scratch) if e - s >= 40]


_AFTER_KEY = frozenset(b"\"'`\\] \t[")
_OPERATOR_START = frozenset(b":=(,!?i\"'`@")


def _operator_follows(lower: bytes, end: int, *, flag: bool = False) -> bool:
    """Whether an assignment operator (or a quoted value) can follow an identifier ending at
    `end`: the pattern's own grammar, read cheaply, so most keyword hits in prose cost nothing.
    After a command-line `flag` (`--api-key`), a value after spaces is one too."""
    # Only whitespace, quotes and one short index can stand between a key and its operator, so
    # this walk stays inside the gap after one identifier: linear over all identifiers.
    limit = len(lower)
    i = end
    if flag and i < limit and lower[i] in b" \t":
        j = i
        while j < limit and lower[j] in b" \t":
            j += 1
        if j < limit and lower[j] not in b"-\r\n\f\v":
            return True  # `--api-key value`
    while i < limit and lower[i] in _AFTER_KEY:
        if lower[i] in b"\"'`" and i > end and lower[i - 1] in b" \t":
            return True  # `password "value"`
        if lower[i] == 0x5B:  # `secret[25] = …`: skip the index (at most 16 characters)
            close = lower.find(b"]", i, i + 18)
            if close < 0:
                return False
            i = close
        i += 1
    return i < limit and lower[i] in _OPERATOR_START


def _all_keyword_identifiers(scratch: Scratch) -> list[Span]:
    """Every identifier with a secret keyword, whatever follows (`"value" == password)`)."""
    return _keyword_identifiers(scratch, any_follower=True)


def _keyword_identifiers(scratch: Scratch, *, any_follower: bool = False) -> list[Span]:
    """Start of every identifier that contains a secret keyword and that an operator follows;
    windows for an anchored match."""
    cache_key = "identifiers" if any_follower else "keywords"
    if cache_key in scratch.cache:
        return scratch.cache[cache_key]
    lower, ident = scratch.lower, scratch.ident
    n = len(lower)
    starts: set[int] = set()
    for word in SECRET_KEYWORDS:
        pos = lower.find(word)
        while pos >= 0:
            start = ident.rfind(b" ", max(0, pos - 64), pos) + 1
            if start == 0 and pos > 64:
                start = pos  # an identifier longer than any key: not a key
            end = ident.find(b" ", pos)
            if end < 0:
                end = n
            if start not in starts and (
                any_follower or _operator_follows(lower, end, flag=lower.startswith(b"--", start))
            ):
                starts.add(start)
            if end >= n:
                break  # this identifier runs to the end of the text
            pos = lower.find(word, max(pos + 1, end))
    out = [(s, min(n, s + KEY_WINDOW)) for s in sorted(starts)]
    scratch.cache[cache_key] = out
    return out


def _around(literal: bytes, before: int, after: int) -> Anchor:
    """Windows around each occurrence of `literal`: from `before` characters before it to `after`
    characters past its start (a pattern's look-arounds included), for a shape without a prefix
    whose one literal sits at a fixed place in it."""
    key = "around:" + literal.decode("ascii")

    def windows(scratch: Scratch) -> list[Span]:
        if key not in scratch.cache:
            ascii_ = scratch.ascii
            n = len(ascii_)
            out: list[Span] = []
            pos = ascii_.find(literal)
            while pos >= 0:
                out.append((max(0, pos - before), min(n, pos + after)))
                pos = ascii_.find(literal, pos + 1)
            scratch.cache[key] = out
        return scratch.cache[key]

    return windows


# A Discord bot token, the shortest token read in runs: 23 + 1 + 6 + 1 + 27 characters.
DOTTED_TOKEN_MIN = 58


def _dotted_token_runs(scratch: Scratch) -> list[Span]:
    """Runs of TOKEN_RUN_CHARS (dots included) long enough to hold a three-part dotted token."""
    if "dotted" not in scratch.cache:
        scratch.cache["dotted"] = _runs(scratch.ascii.translate(_TOKEN_RUN_TABLE), DOTTED_TOKEN_MIN)
    return scratch.cache["dotted"]


Anchor = Callable[[Scratch], list[Span]]
ANCHORS: dict[str, Anchor] = {
    # 32 hex digits, `-us` and one or two digits (and a character either side).
    "mailchimp_datacenter": _around(b"-us", 33, 6),
    # Four characters, `Q~` and up to 34 more.
    "azure_secret_marker": _around(b"Q~", 5, 37),
    # `bot`, up to 10 digits, `:AA` and 33 more characters.
    "telegram_token_marker": _around(b":AA", 14, 37),
    "dotted_token_runs": _dotted_token_runs,
    "token_runs_20": _token_runs_20,
    "at_starts": _at_starts,
    "token_runs_40": _token_runs_40,
    "keyword_identifiers": _keyword_identifiers,
    "all_keyword_identifiers": _all_keyword_identifiers,
}


def merge_windows(windows: list[Span]) -> list[Span]:
    """Sorted union of windows that overlap or touch, so no text is scanned twice."""
    merged: list[Span] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged
