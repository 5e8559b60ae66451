"""What a policy adds to the catalog: its own kinds, values never redacted, terms always redacted,
and an action per kind; as values (`Extensions`) and compiled (`Compiled`).

Where this sits: a tenant's policy (ext_proc.policy) holds one `Extensions`, validated at load
time (`check_pattern` refuses a pattern that runs away on adversarial input); `Catalog`
(ext_proc.detect.catalog.engine) compiles it once per distinct value (`compiled`) and runs the
custom kinds as detectors and the deny list (ext_proc.detect.catalog.deny) over every text and its
decoded views, then drops the findings the allow list covers. Actions are applied by the request
pipeline (ext_proc.transform.actions), not here: the catalog reports what a text holds.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import regex

from ext_proc.detect.canonical import canonical_text
from ext_proc.detect.catalog.deny import DENY_KIND, DenyList
from ext_proc.detect.catalog.detectors import Detector
from ext_proc.detect.catalog.options import Options
from ext_proc.detect.catalog.regexes import REGEX_TIMEOUT, Span, compile_pattern, digits_of
from ext_proc.detect.catalog.validators import luhn_valid
from ext_proc.detect.findings import CATALOG_KINDS, Finding
from ext_proc.errors import CordonError

ACTIONS: tuple[str, ...] = ("redact", "block", "allow")
# Rank of an action, higher = stricter (the X-Tenant strictness order).
ACTION_STRICTNESS: Mapping[str, int] = {"allow": 0, "redact": 1, "block": 2}
CUSTOM_VALIDATORS: tuple[str, ...] = ("none", "luhn", "mod97")
# How far (in characters, either side of a match) a custom kind's context words are looked for.
CONTEXT_CHARS = 40
# A kind's findings passed through under `allow` are counted under this prefix (`ALLOWED_IP`).
ALLOWED_PREFIX = "ALLOWED_"

_NAME = regex.compile(r"[A-Z][A-Z_]{0,38}[A-Z]")
_RESERVED_PREFIXES = ("SUBJECT", ALLOWED_PREFIX)
# Emails and host names are compared case-insensitively; every other allowed value exactly.
_CASELESS = regex.compile(r"[^\s@]+@[^\s@]+|(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,63}\.?")


@dataclass(frozen=True, slots=True)
class CustomKind:
    """A company's own identifier, redacted like a catalog kind."""

    name: str
    pattern: str
    validate: str = "none"
    context: tuple[str, ...] = ()  # case-folded words, one of which must be near a match
    min_length: int = 0


@dataclass(frozen=True, slots=True)
class Extensions:
    """A policy's additions to the catalog, as written (hashable: compiled catalogs are cached on it)."""

    custom_kinds: tuple[CustomKind, ...] = ()
    allow_values: tuple[str, ...] = ()
    allow_patterns: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    actions: tuple[tuple[str, str], ...] = ()  # (kind, action), sorted; `redact` is never listed

    def __bool__(self) -> bool:
        return bool(self.custom_kinds or self.allow_values or self.allow_patterns or self.deny)

    def action(self, kind: str) -> str:
        for name, action in self.actions:
            if name == kind:
                return action
        return "redact"

    @property
    def kind_names(self) -> tuple[str, ...]:
        return tuple(kind.name for kind in self.custom_kinds)


NO_EXTENSIONS = Extensions()


# --- validation (what `policy check` and the loader call) ------------------------------------------


class PatternProblem(CordonError, ValueError):
    """A pattern that cannot be used; the message is the reason (never a text it was run on)."""


def check_name(name: str) -> str | None:
    """Why `name` cannot name a custom kind, or None."""
    if not _NAME.fullmatch(name):
        return "must be UPPER_SNAKE: capitals and underscores, 2 to 40, starting and ending with a capital"
    if name in CATALOG_KINDS or name == DENY_KIND:
        return f"{name} is a built-in kind; choose another name"
    if name.startswith(_RESERVED_PREFIXES):
        return "must not start with SUBJECT or ALLOWED_ (reserved for declared subjects and allowed counts)"
    return None


def compile_checked(source: str) -> regex.Pattern[str]:
    """`source` compiled as the catalog compiles its patterns, and proven not to run away."""
    try:
        pattern = compile_pattern(source)
    except regex.error as exc:
        raise PatternProblem(f"is not a valid regex ({getattr(exc, 'msg', 'syntax error')})") from None
    if pattern.fullmatch("") is not None:
        raise PatternProblem("matches the empty string")
    witness = runaway_witness(pattern)
    if witness is not None:
        raise PatternProblem(
            f"backtracks catastrophically: a search of {witness} takes longer than the catalog's "
            f"{REGEX_TIMEOUT} s timeout; bound its repetitions ({{1,12}}) or make them possessive (++)"
        )
    return pattern


# Lengths of the adversarial texts: long enough that a search quadratic in its input runs past
# the timeout, as a large request body would at run time.
_PROBE_CHARS = 10_000
_CLASS_SAMPLES = "aA0 .-_@:/,\t\n"
_LITERAL_RUN = regex.compile(r"(?<!\\)[A-Za-z0-9]{2,}|[-.@:/_#=]")


def _probe_units(source: str) -> list[str]:
    """What adversarial texts repeat: one character of each class a pattern may read, its literal
    characters and literal runs, and each of those followed by another."""
    singles = list(dict.fromkeys([*_CLASS_SAMPLES, *(c for c in source if c.isprintable() and c != "\\")]))
    literals = list(dict.fromkeys(m.group() for m in _LITERAL_RUN.finditer(source)))
    units = [*singles, *literals]
    units += [a + b for a in [*singles[:16], *literals] for b in singles[:16]]
    return list(dict.fromkeys(units))


# A run of literal characters in a pattern's source (an escaped punctuation character is one).
_STRETCH = regex.compile(r"(?:\\[^A-Za-z0-9]|[^\\\[\](){}.*+?|^$])+")
_NOT_LITERAL = regex.compile(
    r"\(\?(?:[:=!>|]|<[=!]|P?<\w+>|[a-zA-Z]+[:)])|\\[A-Za-z0-9]|\{\d*,?\d*\}|\[(?:\\.|[^\]])*\]"
)
_MAX_PREFIXES = 12


def _prefixes(source: str) -> list[str]:
    r"""Texts that may lead a match into its repetitions: no prefix, and each literal stretch of
    the pattern (`REF-` of `REF-(?:\d|\d\d)+#`), escapes undone."""
    # Group openings, class escapes (`\d`) and counted repetitions break a stretch; a character
    # class is left out whole.
    plain = _NOT_LITERAL.sub("(", source)
    stretches = [regex.sub(r"\\(.)", r"\1", m.group()) for m in _STRETCH.finditer(plain)]
    # And runs of consecutive stretches (`ID` and `-` of `(ID)-(\w+\s?)+;` make `ID-`).
    runs = ["".join(stretches[i : i + n]) for n in (1, 2, 3) for i in range(len(stretches) - n + 1)]
    return ["", *list(dict.fromkeys(r for r in runs if 0 < len(r) <= 24))[:_MAX_PREFIXES]]


def runaway_witness(pattern: regex.Pattern[str]) -> str | None:
    """A description of an adversarial text the pattern cannot search within the catalog's
    timeout, or None. Each text is a prefix (nothing, or a literal stretch of the pattern that a
    match may start with), then a unit repeated (a character, a literal of the pattern, a pair),
    then a character no pattern expects, which forces every backtracking path."""
    units = _probe_units(pattern.pattern)
    for prefix in _prefixes(pattern.pattern):
        # After a prefix, the single units (characters and literals) suffice: a pair is a
        # repetition of two of them, which the text without a prefix tries.
        for unit in units if not prefix else [u for u in units if len(u) == 1 or u in pattern.pattern]:
            for end in ("\x00", "!"):
                text = prefix + unit * (_PROBE_CHARS // len(unit)) + end
                try:
                    pattern.search(text, timeout=REGEX_TIMEOUT)
                except TimeoutError:
                    lead = f"{prefix!r}, then " if prefix else ""
                    return f"{lead}{_PROBE_CHARS:,} characters repeating {unit!r} then {end!r}"
    return None


# --- compiled ------------------------------------------------------------------------------------

Validator = Callable[[str, regex.Match[str], Span, Options], Iterable[Span]]


def _luhn(value: str) -> bool:
    digits = digits_of(value)
    return len(digits) >= 2 and luhn_valid(digits)


def _mod97(value: str) -> bool:
    """ISO 7064 MOD 97-10 over the value's letters and digits (letters as 10 to 35): the whole
    value, or, as an IBAN writes it, with its first four characters moved to the end."""
    chars = "".join(c for c in value.upper() if c.isascii() and c.isalnum())
    if len(chars) < 3:
        return False
    return any(
        int("".join(str(int(c, 36)) for c in form)) % 97 == 1 for form in (chars, chars[4:] + chars[:4])
    )


_CHECKS: dict[str, Callable[[str], bool] | None] = {"none": None, "luhn": _luhn, "mod97": _mod97}


def _validator(kind: CustomKind) -> Validator:
    check = _CHECKS[kind.validate]
    near = (
        regex.compile(r"(?<![^\W_])(?:" + "|".join(map(regex.escape, kind.context)) + r")(?![^\W_])", regex.I)
        if kind.context
        else None
    )
    min_length = kind.min_length

    def validate(text: str, _m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
        start, end = span
        if end - start < min_length:
            return ()
        if check is not None and not check(text[start:end]):
            return ()
        if near is not None:
            window = text[max(0, start - CONTEXT_CHARS) : end + CONTEXT_CHARS]
            if near.search(window) is None:
                return ()
        return (span,)

    return validate


def _detector(kind: CustomKind) -> Detector:
    ascii_context = all(word.isascii() for word in kind.context)
    return Detector(
        f"custom:{kind.name}",
        kind.name,
        compile_pattern(kind.pattern),
        # Words the whole text must hold somewhere (a fast skip); nearness is the validator's.
        context=tuple(word.encode("ascii") for word in kind.context)
        if kind.context and ascii_context
        else (),
        min_length=max(1, kind.min_length),
    )


@dataclass(frozen=True, slots=True)
class Allow:
    """The allow list: exact values (emails and host names case-insensitively) and anchored regexes."""

    exact: frozenset[str]
    caseless: frozenset[str]
    patterns: tuple[regex.Pattern[str], ...]

    def __bool__(self) -> bool:
        return bool(self.exact or self.caseless or self.patterns)

    def permits(self, value: str) -> bool:
        value = canonical_text(value)
        if value in self.exact or value.casefold() in self.caseless:
            return True
        return any(p.fullmatch(value, timeout=REGEX_TIMEOUT) is not None for p in self.patterns)


@dataclass(frozen=True, slots=True)
class Compiled:
    """An `Extensions` ready to run: detectors and their validators, the deny list, the allow list,
    the priority of each custom kind, and a digest that tells two of them apart in caches."""

    detectors: tuple[Detector, ...]
    validators: Mapping[str, Validator]
    deny: DenyList
    allow: Allow
    digest: str
    # Every custom pattern in one alternation: a text it does not match holds none of them, and
    # one search replaces one per kind. None where joining could change what a pattern means.
    gate: regex.Pattern[str] | None = None

    def allowed(self, text: str, findings: list[Finding]) -> list[Finding]:
        """`findings` without those whose value the allow list permits (a deny term stays)."""
        if not self.allow or not findings:
            return findings
        return [f for f in findings if f.kind == DENY_KIND or not self.allow.permits(text[f.start : f.end])]


@functools.lru_cache(maxsize=64)
def compiled(extensions: Extensions) -> Compiled:
    values = {canonical_text(v) for v in extensions.allow_values}
    allow = Allow(
        frozenset(v for v in values if not _CASELESS.fullmatch(v)),
        frozenset(v.casefold() for v in values if _CASELESS.fullmatch(v)),
        tuple(compile_pattern(p) for p in extensions.allow_patterns),
    )
    detectors = tuple(_detector(kind) for kind in extensions.custom_kinds)
    validators = {f"custom:{kind.name}": _validator(kind) for kind in extensions.custom_kinds}
    digest = hashlib.sha256(repr(extensions).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    deny = DenyList.compile(extensions.deny)
    return Compiled(detectors, validators, deny, allow, digest, _gate(extensions.custom_kinds))


# What joining patterns into one alternation would change: a flag written for the whole pattern
# (`(?x)` would apply to the others too) and references to groups by number or name.
_NOT_JOINABLE = regex.compile(r"\\[1-9]|\\g<|\(\?P=|\(\?[a-zA-Z]+\)|\(\?P?<[A-Za-z_]")


def _gate(kinds: tuple[CustomKind, ...]) -> regex.Pattern[str] | None:
    if len(kinds) < 2 or any(_NOT_JOINABLE.search(kind.pattern) for kind in kinds):
        return None
    try:
        return compile_pattern("|".join(f"(?:{kind.pattern})" for kind in kinds))
    except regex.error:
        return None
