"""Restorers: this exchange's placeholders in reply text → the caller's own values.

Where it sits: the request went upstream with placeholders in place of each detected value
(redaction fills the exchange's map, ext_proc.transform.placeholders); before the caller sees the
reply, a `Restorer` puts the originals back. The JSON body (ext_proc.restore.json_body) and the SSE
stream (ext_proc.restore.sse, ext_proc.restore.stream) are restored through one of these.

Only this exchange's placeholders are touched: the nonce is part of the pattern, so `<EMAIL_1>`
typed by a user, or a placeholder of another request, comes back as it was. The pattern
(ext_proc.transform.grammar) tolerates what models do to placeholders: dropped angle brackets,
changed case, markdown-escaped underscores (`\\_`) and brackets written as the JSON escapes
`\\u003c` / `\\u003e`.

An original is written for where it lands (ext_proc.restore.json_context): as it is in prose,
JSON-escaped inside a JSON string (once per string it sits in: structured output, tool-call
arguments, JSON inside a JSON string), as a JSON value of its own outside strings; so a value
holding `"` or `\\` can neither break the reply's JSON nor add keys to it.

Consistent pseudonyms are stable across requests, so a reply may mention one this request never
sent: `PseudonymRestorer` restores this request's map first and collects the others for the
exchange to look up in the tenant's vault (ext_proc.storage.vault) before the same bytes are
restored again. Only what this request's map or the tenant's vault holds is restored; a look-alike
a user typed is neither.

Realistic surrogates (`mode: surrogate`, ext_proc.transform.surrogates) are ordinary-looking text:
`SurrogateRestorer` matches this request's surrogates themselves, case-insensitively and on word
boundaries, and fits the same streaming machinery.

Nothing here logs: the originals are in every string this module produces.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import regex

from ext_proc.restore.json_context import JsonContext, encode, looks_like_json
from ext_proc.transform.grammar import (
    LONGEST_FORM_CHARS,
    format_placeholder,
    format_pseudonym,
    is_final,
    may_hold_pseudonym,
    parse_placeholder,
    placeholder_pattern,
    pseudonym_label,
    pseudonym_pattern,
)
from ext_proc.transform.placeholders import PlaceholderMap, PseudonymMap
from ext_proc.transform.surrogates import SURROGATE_DOMAIN


class Restorer:
    """The placeholders of one exchange and the compiled pattern that finds them, in any tolerated form.

    Build it once the request's map is final (after redaction); it takes a snapshot of the map.
    """

    __slots__ = ("_escaped", "_nonce_bytes", "_originals", "nonce", "pattern")

    def __init__(self, pmap: PlaceholderMap) -> None:
        self.nonce = pmap.nonce
        self._originals: dict[str, str] = dict(pmap.originals)
        # (key, enclosing strings, as a JSON value) → the original written so: computed once.
        self._escaped: dict[tuple[str, int, bool], str] = {}
        self.pattern: regex.Pattern[str] | None = None
        self._nonce_bytes = self.nonce.encode("ascii")
        if not self._originals:
            return
        labels: set[str] = set()
        digits = 1
        for text in self._originals:
            parts = parse_placeholder(text)
            if parts is None or parts.nonce != self.nonce:
                # Not the placeholder grammar: a programming error, not something to skip
                # silently (the value would then never be restored).
                raise ValueError("placeholder map holds a key outside the placeholder grammar")
            labels.add(parts.label)
            digits = max(digits, len(parts.index))
        self.pattern = placeholder_pattern(tuple(sorted(labels)), digits)

    @property
    def active(self) -> bool:
        """Whether there is anything to restore at all (the request had placeholders)."""
        return self.pattern is not None

    def owns(self, value: str) -> bool:
        """Whether a value the output gate found is one this restorer wrote, in another layout (a
        placeholder never is: it is read as a space)."""
        return False

    def neutralise(self, text: str) -> str:
        """`text` with every form of placeholder this restorer matches read as a space: the output
        gate's view of model output (a placeholder is never a finding)."""
        if self.pattern is None or not self.has_any(text):
            return text
        return self.pattern.sub(" ", text)

    def open_tail(self, text: str) -> int:
        """Where a placeholder that more text could still complete begins at the end of `text`
        (len(text) if none): what a stream holds back, and the output gate reads later."""
        pattern = self.pattern
        if pattern is None:
            return len(text)
        i = max(0, len(text) - LONGEST_FORM_CHARS)
        while (m := pattern.search(text, i, partial=True)) is not None:
            if m.partial or not self.final(text, m):
                return m.start()
            i = m.end()
        return len(text)

    def whole_at(self, text: str, at: int) -> int:
        """`at`, or the start of a placeholder (in any form this restorer reads) that a cut at
        `at` would split: the output gate never decides half of one (a surrogate phone's `+1 `
        judged apart from the rest would leave the rest to be read as a number)."""
        pattern = self.pattern
        if pattern is None or not 0 < at < len(text):
            return at
        for m in pattern.finditer(text, max(0, at - LONGEST_FORM_CHARS)):
            if m.start() >= at:
                break
            if m.end() > at:
                return m.start()
        return at

    def final(self, text: str, m: regex.Match[str]) -> bool:
        """Whether a complete match in `text` is final: more text could not make it another match
        (a longer index, a closing bracket still to come)."""
        return is_final(text, m)

    def has_any(self, data: bytes | str) -> bool:
        """Cheap pre-check: could `data` hold one of this exchange's placeholders (its nonce, any case)?"""
        if self.pattern is None:
            return False
        if isinstance(data, str):
            return self.nonce in data or self.nonce in data.lower()
        return self._nonce_bytes in data or self._nonce_bytes in data.lower()

    def restore_text(self, text: str, *, json_escaped: bool = False) -> str:
        """`text` with every placeholder of this exchange replaced by its original, written for
        where it sits (ext_proc.restore.json_context): as it is in prose; JSON-escaped, once per
        enclosing string, inside JSON strings; as a JSON value of its own outside them.

        `json_escaped`: `text` is JSON text whatever it looks like (tool-call arguments);
        otherwise it is read as JSON when it begins with `{` or `[`. Returns `text` itself when
        unchanged.
        """
        if self.pattern is None or not self.has_any(text):
            return text
        return self.restore_span(text, 0, context_for(text, json_escaped=json_escaped))

    def restore_span(self, s: str, start: int, context: JsonContext | None) -> str:
        """Restore `s[start:]`, read on by `context` (None: prose); `s[:start]` is only context
        for the word-start look-behind."""
        assert self.pattern is not None
        out: list[str] = []
        i = start
        for m in self.pattern.finditer(s, start):
            before = s[i : m.start()]
            out.append(before)
            if context is not None:
                context.feed(before)
            out.append(self.emit(m, context))
            i = m.end()
        if i == start:
            return s[start:] if start else s
        out.append(s[i:])
        return "".join(out)

    def key_of(self, m: regex.Match[str]) -> str | None:
        """The canonical placeholder a match stands for, or None when it cannot be one of ours."""
        index = m.group("index")
        if index.startswith("0") or m.group("nonce").lower() != self.nonce:
            return None  # `_01`, or another request's nonce: not ours
        return format_placeholder(m.group("label").replace("\\", "").upper(), self.nonce, int(index))

    def lookup(self, m: regex.Match[str]) -> tuple[str, str] | None:
        """The key and original a match stands for; None when the map does not hold it."""
        key = self.key_of(m)
        original = self._originals.get(key) if key is not None else None
        return None if key is None or original is None else (key, original)

    def emit(self, m: regex.Match[str], context: JsonContext | None) -> str:
        """What goes out for a match: its original, written for where it sits; the matched text
        as it was when it is not in the map, or where nothing can be inserted safely (right after
        a backslash in JSON). `context` has read everything before the match and reads what is
        emitted."""
        found = self.lookup(m)
        if found is None:
            if context is not None:
                context.feed(m.group(0))
            return m.group(0)
        if context is None or context.prose:
            return found[1]
        spot = context.spot()
        if spot is None:
            context.feed(m.group(0))
            return m.group(0)
        key, original = found
        context.inserted(spot, original)
        if not spot.strings and not spot.literal:
            return original
        cached = self._escaped.get((key, spot.strings, spot.literal))
        if cached is None:
            cached = self._escaped[(key, spot.strings, spot.literal)] = encode(original, spot)
        return cached


class PseudonymRestorer(Restorer):
    """Restores consistent pseudonyms: this request's map first, then what the vault returned.

    Matching does not depend on what is known, so restore runs in two steps where a reply mentions
    a placeholder the map lacks: a first run restores what it can and collects those placeholders
    in `unresolved` (at most `max_lookups` per exchange; any further one is counted in `skipped`
    and left as it is); the caller looks them up (asynchronously, in the vault), hands the answer
    to `learn`, rolls its stream state back (`SseRestorer.checkpoint`) and runs again. A
    placeholder the vault does not hold (expired, another tenant's, or typed by a user) is
    remembered as absent and left as it is.
    """

    __slots__ = ("_absent", "_budget", "skipped", "unresolved")

    def __init__(self, pmap: PseudonymMap, *, max_lookups: int = 256) -> None:
        self.nonce = pmap.nonce
        self._originals = dict(pmap.originals)
        self._escaped = {}
        self._nonce_bytes = b""
        for text in self._originals:
            if pseudonym_label(text) is None:
                raise ValueError("pseudonym map holds a key outside the pseudonym grammar")
        self.pattern = pseudonym_pattern()  # always: the vault may know what this request did not send
        self._absent: set[str] = set()
        self._budget = max_lookups
        self.unresolved: set[str] = set()
        self.skipped = 0

    def has_any(self, data: bytes | str) -> bool:
        """Cheap pre-check: does `data` hold a whole digest right after an underscore?"""
        return may_hold_pseudonym(data)

    def key_of(self, m: regex.Match[str]) -> str | None:
        return format_pseudonym(m.group("label").replace("\\", "").upper(), m.group("digest").lower())

    def lookup(self, m: regex.Match[str]) -> tuple[str, str] | None:
        key = self.key_of(m)
        if key is not None and not self._known(key):
            if self._budget > 0:
                self._budget -= 1
                self.unresolved.add(key)
            else:
                self._absent.add(key)
                self.skipped += 1
        return super().lookup(m)

    def _known(self, key: str) -> bool:
        return key in self._originals or key in self._absent or key in self.unresolved

    def take_unresolved(self) -> set[str]:
        wanted, self.unresolved = self.unresolved, set()
        return wanted

    def learn(self, found: Mapping[str, str], asked: Iterable[str]) -> None:
        """The vault's answer: `found` is restored from now on, the rest of `asked` stays as it is."""
        for placeholder in asked:
            original = found.get(placeholder)
            if original is None:
                self._absent.add(placeholder)
            else:
                self._originals[placeholder] = original


class SurrogateRestorer(Restorer):
    """Restores this request's realistic surrogates (`mode: surrogate`).

    A surrogate is ordinary-looking text (`Nadia Okafor`, `nadia.okafor07@example.invalid`), so
    the pattern is the alternation of this request's surrogates themselves, longest first, matched
    case-insensitively (the registry never gives two values surrogates that differ only in case)
    and on word boundaries: an edge of a surrogate that is a word character must not continue a
    word (`Nadia Okaforson` is not `Nadia Okafor`). An earlier turn's surrogates come back with the
    history the caller resends (its values are in the request again, and get the same surrogates).

    The `close` group, which `StreamRestorer` reads to decide whether a match could still grow,
    is set when the text after the match (or the surrogate's own last character) ends the word; a
    match that ends where the text ends stays held back until more text, or the channel's end,
    decides it. So does a match that a longer surrogate begins with (a date, and the same date
    with the age written beside it) while the text after it could still spell the rest.
    """

    __slots__ = ("_cores", "_longer")

    def __init__(self, originals: Mapping[str, str], nonce: str) -> None:
        self.nonce = nonce  # the request's placeholder nonce: what the gate reads strip markers by
        self._nonce_bytes = b""
        self._escaped = {}
        self._originals = {}
        self.pattern = None
        for surrogate, original in originals.items():
            folded = surrogate.casefold()
            if folded in self._originals and self._originals[folded] != original:
                raise ValueError("two values of one request share a surrogate")
            self._originals[folded] = original
        # Each surrogate → the longer ones that begin with it. Sorted, those follow it directly,
        # so this costs the number of such pairs, not the square of the count.
        self._longer: dict[str, tuple[str, ...]] = {}
        ordered = sorted(self._originals)
        for i, short in enumerate(ordered):
            j = i + 1
            while j < len(ordered) and ordered[j].startswith(short):
                j += 1
            if j > i + 1:
                self._longer[short] = tuple(ordered[i + 1 : j])
        if originals:
            self.pattern = _surrogate_pattern(tuple(sorted(originals, key=lambda t: (-len(t), t))))
        # Each surrogate by its letters and digits alone (and a phone's without its country
        # code): a model that rewrites `+1 634 555 0152` as `(634) 555-0152` still wrote it.
        self._cores: frozenset[str] = frozenset(
            core for surrogate in originals for core in _cores(surrogate) if len(core) >= 7
        )

    def final(self, text: str, m: regex.Match[str]) -> bool:
        if not is_final(text, m):
            return False
        key = m.group("surrogate").casefold()
        after = text[m.end() :]
        for longer in self._longer.get(key, ()):
            rest = longer[len(key) :]
            seen = after[: len(rest)].casefold()
            if len(seen) < len(rest) and rest.startswith(seen):
                return False  # the text so far could still go on to spell the longer one
        return True

    def has_any(self, data: bytes | str) -> bool:
        """Cheap pre-check: does `data` hold one of this request's surrogates, in any case (one
        substring search each, in C; the pattern then decides about word boundaries)."""
        if self.pattern is None:
            return False
        text = data if isinstance(data, str) else data.decode("utf-8", "surrogateescape")
        folded = text.casefold()
        return any(surrogate in folded for surrogate in self._originals)

    def key_of(self, m: regex.Match[str]) -> str | None:
        return m.group("surrogate").casefold()

    def owns(self, value: str) -> bool:
        """A value the gate found that is one of this request's surrogates, written otherwise."""
        return bool(self._cores) and not _cores(value).isdisjoint(self._cores)

    def neutralise(self, text: str) -> str:
        """This request's surrogates, and every address of the surrogates' shape at the surrogate
        domain (an earlier turn's surrogate, which the catalog would read as an email), read as a
        space: the output gate's view of model output. Only the address itself goes: whatever is
        glued in front of it is read."""
        text = super().neutralise(text)
        if SURROGATE_DOMAIN in text or SURROGATE_DOMAIN in text.lower():
            text = _SURROGATE_EMAIL.sub(" ", text)
        return text


@functools.lru_cache(maxsize=256)
def _surrogate_pattern(surrogates: tuple[str, ...]) -> regex.Pattern[str]:
    alternation = "|".join(regex.escape(text) for text in surrogates)
    return regex.compile(
        # Standing alone: not inside a longer token either, such as a decimal (`16435545.5`) or a
        # host (`…@example.invalid.evil.test`): a `.`, `@` or `-` between word characters joins.
        rf"(?:(?<!\w)(?<!\w[.@\-])|(?=\W))(?P<surrogate>{alternation})"
        rf"(?:(?P<close>(?<=\W)|(?=\W))|(?!\w))(?:(?<=\W)|(?![.@\-]\w))",
        regex.IGNORECASE,
    )


# A surrogate address exactly as `mode: surrogate` writes them (`given.familyNN@example.invalid`),
# standing alone: anything glued in front of it (a key, a card) is not part of it and stays read.
_SURROGATE_EMAIL = regex.compile(
    rf"(?<![\w.+%-])[a-z]{{1,32}}\.[a-z]{{1,32}}[0-9]{{2}}@{regex.escape(SURROGATE_DOMAIN)}(?![\w.-])",
    regex.IGNORECASE,
)


def context_for(text: str, *, json_escaped: bool = False) -> JsonContext | None:
    """The reader of a whole text: JSON text (lenient when the caller knows it is JSON, strict
    when it only begins like JSON), or None for prose."""
    if json_escaped:
        return JsonContext(lenient=True)
    return JsonContext() if looks_like_json(text) else None


def restorer_for(pmap: PlaceholderMap | PseudonymMap) -> Restorer:
    """The restorer of an exchange's map, per-request or consistent."""
    if isinstance(pmap, PseudonymMap):
        return PseudonymRestorer(pmap)
    return Restorer(pmap)


def _cores(value: str) -> set[str]:
    """A value by its letters and digits alone, case folded; one that starts with `+1` or `1`
    also without that country code."""
    core = "".join(c for c in value.casefold() if c.isalnum())
    cores = {core}
    if core.startswith("1") and core[1:].isdigit():
        cores.add(core[1:])
    return cores
