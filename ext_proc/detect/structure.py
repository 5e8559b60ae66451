"""Key context: what the key a value sits under says about the value.

Where it sits: the catalog (ext_proc.detect.catalog) reads one text at a time; the request walk
(ext_proc.transform.walk, driven by ext_proc.exchange.pipeline) and the output gate's tree reading
also know the key path of each string and number they hand over, and any text may carry pairs of
its own (`"key": "value"` JSON in prose, form-encoded fields, `key: value` lines). This module adds
what only that structure says, as findings (kinds and spans, never text):

- Under a key that names a secret (`password`, `api_key`, `client_secret`, `authorization`, …, as
  the catalog's `secret_key_strength` decides, so `max_tokens` or `password_hint` do not count),
  the whole value is a SECRET_ASSIGNMENT, unless it is no value at all: empty, a boolean or null
  word, a mask (`****`), a reference (`${VAR}`, `{{ x }}`, `<your key>`, an environment variable's
  name). A password's value counts whatever it looks like; under the other secret keys a plain
  word, a phrase or a path is no credential (`{"token": "Hello"}`). An authentication scheme
  (`Bearer`) stays readable, as in the catalog.
- Under an identifier key (`ssn`, `social_security_number`, `tax_id`, `phone`, `phone_number`,
  `mobile`, `tel`, `fax`, …) the catalog reads the value as if the key's word were written before
  it, so a bare SSN or phone number counts exactly as in `ssn: …` text. A key that names a
  property of the identifier (`phone_type`, `phone_verified`, `has_phone`) does not count.

A key is found through wrappers (`{"phone": {"number": …}}`, `{"password": {"value": …}}`) and
through name/value pairs (`{"name": "DB_PASSWORD", "value": …}`), which the walk folds into the
path it hands over. Email addresses, cards and IBANs are recognised by their shape wherever they
are, so their keys add nothing.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import regex

from ext_proc.detect.canonical import canonical, canonical_text
from ext_proc.detect.catalog.assignments import STRONG, secret_key_strength
from ext_proc.detect.catalog.engine import PRIORITY, PRIORITY_BASE, Catalog
from ext_proc.detect.catalog.regexes import compile_pattern, is_mask, timed_all, timed_fullmatch, timed_match
from ext_proc.detect.findings import Finding
from ext_proc.detect.memo import MEMO
from ext_proc.errors import DetectionError

# The key path of a value: the object keys from the outside in (list indices left out), JSON
# inside strings continuing the path of the string. The walk keeps the last few steps.
KeyPath = tuple[str, ...]
PATH_STEPS = 4

SECRET = "SECRET_ASSIGNMENT"


@dataclass(frozen=True, slots=True)
class KeyRole:
    """What a key says about its value: a secret, or an identifier of `kind` that the catalog
    reads after `word`. A password's value is the secret whatever it looks like (`whole`); under
    other secret keys (`token`, `api_key`, `auth`) a plain word or a phrase is not a credential."""

    kind: str
    whole: bool = False
    word: str = ""


_SEGMENTS = compile_pattern(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

# Identifier nouns → (kind, the context word the catalog knows for that kind).
_IDENTIFIER_NOUNS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("ssn", "ssns", "itin", "tin", "taxpayer", "taxid"), ("SSN", "ssn")),
    **dict.fromkeys(
        (
            "phone", "phones", "telephone", "tel", "mobile", "cell", "cellphone", "fax", "whatsapp",
            "msisdn", "telefon", "telefono", "telephone", "handy",
        ),
        ("PHONE", "phone"),
    ),
}  # fmt: skip
# Two-word nouns: (first, second) → kind and word.
_IDENTIFIER_PAIRS: dict[tuple[str, str], tuple[str, str]] = {
    ("social", "security"): ("SSN", "ssn"),
    ("tax", "id"): ("SSN", "ssn"),
    ("tax", "number"): ("SSN", "ssn"),
    ("contact", "number"): ("PHONE", "phone"),
    ("contact", "no"): ("PHONE", "phone"),
}
_NUMBER_WORDS = ("number", "no", "num", "nr", "nbr", "nummer", "numero")
# Words that may follow an identifier noun without making the key a property of it.
_IDENTIFIER_AFTER = frozenset(
    {
        *_NUMBER_WORDS, "numbers", "e164", "value", "raw", "full", "formatted", "international",
        "intl", "national", "local", "digits", "home", "work", "mobile", "cell", "primary",
        "secondary", "main", "personal", "business", "office", "alt", "alternate", "other",
        "private", "direct", "emergency", "contact", "list", "security",
    }
)  # fmt: skip
# After an SSN noun, `id` is the number itself (`taxpayer_id`); after a phone, a record's id.
_KIND_AFTER: dict[str, frozenset[str]] = {"SSN": frozenset({"id", "ids"})}
# Words before the noun that make the value a flag, a count or a derived form of the identifier.
_IDENTIFIER_BEFORE_NEGATIVE = frozenset(
    {
        "has", "is", "num", "max", "min", "count", "total", "allow", "allowed", "require",
        "required", "requires", "show", "hide", "use", "verify", "verified", "valid", "validate",
        "enable", "enabled", "mask", "masked", "hash", "hashed", "last", "no",
    }
)  # fmt: skip
# Words of a password's key: its value is the secret whatever it looks like.
_PASSWORD_WORDS = ("password", "passwd", "passphrase", "passcode", "contrasena", "contraseña")
# Secret keys the catalog's key words leave out, as how a key ends (its words joined); each is a
# password's key, or a cookie's (a header of secrets).
_EXTRA_SECRET_ENDINGS = (
    "passcode", "cookie", "passwort", "kennwort", "senha", "wachtwoord", "motdepasse", "contrasena",
)  # fmt: skip
# A model's tokens are text, not credentials: `eos_token`, `pad_token`, a logprob's `token`.
_TEXT_TOKEN_WORDS = frozenset(
    {"eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "stop", "start", "end", "image",
     "audio", "video", "vision", "tool", "think", "thinking", "added"}
)  # fmt: skip
# Subtrees where a key's word means something else (`{"token": "Hello", "logprob": -0.1}`).
_NO_CONTEXT_STEPS = frozenset({"logprobs", "top_logprobs"})
# Keys that only wrap a value: the key above them tells what the value is.
_WRAPPERS = frozenset(
    {"value", "values", "val", "v", "text", "data", "raw", "content", "string", "str", "number",
     "current", "new", "old", "plain", "plaintext"}
)  # fmt: skip
WRAPPER_STEPS = 2


def _segments(key: str) -> list[str]:
    return [m.group().lower() for m in timed_all(_SEGMENTS, key)]


def _identifier_role(segments: list[str]) -> KeyRole | None:
    for i, seg in enumerate(segments):
        end = i + 1
        found = _IDENTIFIER_NOUNS.get(seg)
        if found is None:
            # `phonenumber`, `telno`: the noun and a number word written as one.
            stems = (seg[: -len(w)] for w in _NUMBER_WORDS if seg.endswith(w))
            found = next((_IDENTIFIER_NOUNS[s] for s in stems if s in _IDENTIFIER_NOUNS), None)
        if found is None and i + 1 < len(segments):
            found = _IDENTIFIER_PAIRS.get((seg, segments[i + 1]))
            end = i + 2
        if found is None:
            continue
        if any(s in _IDENTIFIER_BEFORE_NEGATIVE for s in segments[:i]):
            return None
        after = _IDENTIFIER_AFTER | _KIND_AFTER.get(found[0], frozenset())
        if not all(s in after or s.isdigit() for s in segments[end:]):
            return None
        return KeyRole(found[0], word=found[1])
    return None


@functools.lru_cache(maxsize=8192)
def key_role(key: str) -> KeyRole | None:
    """What `key` says about its value, or None (most keys say nothing). A key is read in its
    canonical view: look-alike letters, full-width forms, accents and invisible characters do not
    hide what it names (`pаssword` with a Cyrillic `а`, `teléfono`)."""
    if not key or len(key) > 64:
        return None
    if not key.isascii():
        key = canonical_text(key)
    try:
        strength = secret_key_strength(key)
        segments = _segments(key)
    except TimeoutError:
        raise DetectionError("key reading timed out") from None
    if not strength and "".join(segments).endswith(_EXTRA_SECRET_ENDINGS):
        strength = STRONG
    if (
        strength
        and len(segments) > 1
        and segments[-1] in ("token", "tokens")
        and segments[-2] in _TEXT_TOKEN_WORDS
    ):
        strength = 0
    if strength:
        whole = strength == STRONG and any(s == "pass" or s.startswith(_PASSWORD_WORDS) for s in segments)
        return KeyRole(SECRET, whole=whole or "".join(segments).endswith(_EXTRA_SECRET_ENDINGS))
    return _identifier_role(segments)


def path_role(path: KeyPath) -> KeyRole | None:
    """The role of the key a value sits under: its own key, or the key above a wrapper."""
    if any(step in _NO_CONTEXT_STEPS for step in path):
        return None
    for back in range(1, min(len(path), WRAPPER_STEPS + 1) + 1):
        step = path[-back]
        role = key_role(step)
        if role is not None:
            return role
        if step.lower() not in _WRAPPERS:
            return None
    return None


def reads_number(path: KeyPath) -> bool:
    """Whether a number under `path` may be a value its key names (read it, however short)."""
    return bool(path) and path_role(path) is not None


# --- values ----------------------------------------------------------------------------------------

_NON_VALUES = frozenset(
    {
        "true", "false", "null", "none", "nil", "undefined", "yes", "no", "on", "off", "n/a",
        "na", "tbd", "todo", "redacted", "hidden", "masked", "removed", "empty", "required",
        "optional", "string", "str", "unset", "not set", "omitted", "...", "…",
    }
)  # fmt: skip
_BULLETS = frozenset("*•●·∙xX#")
_REFERENCE = compile_pattern(
    r"\$\{[^}]*\}|\$\([^)]*\)|\$[A-Za-z_][A-Za-z0-9_]*|\{\{.*\}\}|\{%.*%\}|<%.*%>|%\([^)]*\)s?"
    r"|#\{[^}]*\}|<[^<>]*>|\[[^\[\]]*\]|(?i:env|vault|ssm|secretsmanager):\S+|op://\S+|arn:aws:\S+"
)
# The name of a secret, not a secret: `OPENAI_API_KEY` (an environment variable), `refresh_token`.
_SECRET_NAME = compile_pattern(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
_SCHEME = compile_pattern(r"(?i)(?:bearer|basic|token|digest|bot|oauth|jwt|ssws|api-?key|api-?token)[ \t]+")
# Weak keys (`auth`, `pwd`) also name modes and directories: such values are no credential.
_AUTH_WORDS = frozenset(
    {
        "oauth", "oauth1", "oauth2", "basic", "bearer", "digest", "apikey", "api_key", "jwt",
        "saml", "oidc", "ntlm", "kerberos", "hmac", "sigv4", "aws", "iam", "key", "session",
        "cookie", "mtls", "tls", "sso", "ldap", "anonymous", "public", "private", "default",
    }
)  # fmt: skip
_WORDISH = compile_pattern(r"[A-Za-z]+(?:[_\-.][A-Za-z]+)*")


def secret_span(value: str, whole: bool) -> tuple[int, int] | None:
    """The span of `value` that is the secret its key names, or None when it is no value."""
    start, end = 0, len(value)
    while start < end and value[start].isspace():
        start += 1
    while end > start and value[end - 1].isspace():
        end -= 1
    scheme = timed_match(_SCHEME, value, start, end)
    if scheme is not None and end - scheme.end() >= 3:
        start = scheme.end()
    bare = value[start:end]
    if len(bare) < 3 or bare.lower() in _NON_VALUES or is_mask(bare) or set(bare) <= _BULLETS:
        return None
    if timed_fullmatch(_REFERENCE, bare) is not None:
        return None
    if len(bare) <= 64 and timed_fullmatch(_SECRET_NAME, bare) is not None and secret_key_strength(bare):
        return None
    if not whole and _no_credential(bare):
        return None
    return start, end


def _no_credential(bare: str) -> bool:
    """Under a key other than a password's (`token`, `api_key`, `auth`, `pwd`): prose, paths,
    modes and plain words are no credential."""
    if any(ch.isspace() for ch in bare) or bare.lower() in _AUTH_WORDS:
        return True
    if bare.startswith(("/", "~/", "./", "../")) or (len(bare) > 2 and bare[1] == ":" and bare[2] in "\\/"):
        return True
    return timed_fullmatch(_WORDISH, bare) is not None


def _priority(kind: str) -> int:
    return PRIORITY_BASE + PRIORITY.index(kind)


# Identifier values longer than this are prose, not a bare value a key describes.
MAX_IDENTIFIER_VALUE = 256


def _identifier_findings(role: KeyRole, value: str, catalog: Catalog) -> list[Finding]:
    """The catalog's findings of the role's kind in `value`, read as if the key's word preceded it."""
    if len(value) > MAX_IDENTIFIER_VALUE or not any(ch.isdigit() for ch in value):
        return []
    prefix = f"{role.word}: "
    shift = len(prefix)
    return [
        Finding(f.kind, f.start - shift, f.end - shift, f.label, f.priority)
        for f in catalog.detect(prefix + value)
        if f.kind == role.kind and f.start >= shift
    ]


def _role_findings(role: KeyRole, value: str, catalog: Catalog, offset: int = 0) -> list[Finding]:
    if role.kind not in catalog.kinds:
        return []
    if role.kind == SECRET:
        span = secret_span(value, role.whole)
        if span is None:
            return []
        return [Finding(SECRET, span[0] + offset, span[1] + offset, priority=_priority(SECRET))]
    found = _identifier_findings(role, value, catalog)
    if offset:
        found = [Finding(f.kind, f.start + offset, f.end + offset, f.label, f.priority) for f in found]
    return found


def value_findings(path: KeyPath, value: str, catalog: Catalog) -> list[Finding]:
    """The findings the key path of a string (or number, as its digits) implies, spans in `value`."""
    if not path:
        return []
    role = path_role(path)
    if role is None:
        return []
    try:
        return _role_findings(role, value, catalog)
    except TimeoutError:
        raise DetectionError("key context reading timed out") from None


# --- pairs in text ---------------------------------------------------------------------------------

# Words one of which every key with a role contains (lower case): text without any has no pairs.
_TRIGGERS = (
    "pass", "pwd", "secret", "token", "key", "auth", "credential", "cookie", "ssn", "social",
    "tax", "tin", "phone", "tel", "mobile", "cell", "fax", "whatsapp", "msisdn", "handy",
    "contact", "senha", "kennwort", "wachtwoord", "contrase",
)  # fmt: skip
# A key and its operator: quoted (`"key":`, `'key':`, `\"key\":` in escaped JSON) or bare
# (`key=`, `key:`). The value is read from the operator on.
_KEY_OP = compile_pattern(
    r"(?:(?P<q>\\?[\"'])(?P<qkey>[A-Za-z_][A-Za-z0-9_.\- ]{0,63})(?P=q)"
    r"|(?<![A-Za-z0-9_.\-\\\"'])(?P<key>[A-Za-z_][A-Za-z0-9_.\-]{0,63}))"
    r"[ \t]{0,8}(?P<op>[:=])[ \t]{0,8}"
)
# A name/value pair written out (`"name": "DB_PASSWORD", "value": …`): the name is the value's key.
_NAMED_VALUE = compile_pattern(
    r"(?P<q>\\?\")(?:name|key|field|label|header|param|parameter|variable|var)(?P=q)[ \t]{0,8}:[ \t]{0,8}"
    r"(?P=q)(?P<name>[A-Za-z_][A-Za-z0-9_.\- ]{0,63})(?P=q)[ \t\r\n]{0,8},[ \t\r\n]{0,8}"
    r"(?P=q)values?(?P=q)[ \t]{0,8}:[ \t]{0,8}"
)
_QUOTED_VALUE = compile_pattern(
    r"\\\"(?P<esc>(?:[^\"\\\n]|\\[^\"\n]){0,1024})\\\"|\"(?P<dq>(?:[^\"\\\n]|\\.){0,1024})\"|'(?P<sq>[^'\n]{0,1024})'"
)
_NUMBER_VALUE = compile_pattern(r"-?[0-9][0-9.eE+\-]{0,40}")
_FORM_VALUE = compile_pattern(r"[^\s&#\"']{1,512}")
_LINE_VALUE = compile_pattern(r"[^\n\r,;&\"'<>{}\[\]]{1,128}")


@dataclass(frozen=True, slots=True)
class _Pair:
    role: KeyRole
    start: int
    end: int
    form: bool  # a form-encoded field (percent-encoded)


def _pairs(text: str) -> Iterator[_Pair]:
    if '"' in text:
        for m in timed_all(_NAMED_VALUE, text):
            role = key_role(m.group("name"))
            value = timed_match(_QUOTED_VALUE, text, m.end(), min(len(text), m.end() + 1100))
            if role is not None and value is not None:
                group = next(g for g in ("esc", "dq", "sq") if value.group(g) is not None)
                yield _Pair(role, value.start(group), value.end(group), False)
    for m in timed_all(_KEY_OP, text):
        quoted_key = m.group("qkey") is not None
        role = key_role(m.group("qkey") if quoted_key else m.group("key"))
        if role is None:
            continue
        pos = m.end()
        value = timed_match(_QUOTED_VALUE, text, pos, min(len(text), pos + 1100))
        if value is not None:
            group = next(g for g in ("esc", "dq", "sq") if value.group(g) is not None)
            yield _Pair(role, value.start(group), value.end(group), False)
            continue
        number = timed_match(_NUMBER_VALUE, text, pos, min(len(text), pos + 48))
        if quoted_key and number is not None:
            yield _Pair(role, number.start(), number.end(), False)
            continue
        start = m.start()
        if m.group("op") == "=" and not quoted_key and _form_field(text, start):
            field = timed_match(_FORM_VALUE, text, pos, min(len(text), pos + 512))
            if field is not None:
                yield _Pair(role, field.start(), field.end(), True)
            continue
        if role.kind == SECRET and _env_line(text, m):
            # `DB_PASSWORD=…` in an environment file: configuration, never code.
            field = timed_match(_FORM_VALUE, text, pos, min(len(text), pos + 512))
            if field is not None:
                yield _Pair(role, field.start(), field.end(), False)
            continue
        if role.kind != SECRET:
            # `phone_number: 415 555 0132` on a line: the rest of the line (to a separator).
            line = timed_match(_LINE_VALUE, text, pos, min(len(text), pos + 128))
            if line is not None:
                yield _Pair(role, line.start(), line.end(), False)


def _env_line(text: str, m: regex.Match[str]) -> bool:
    """`KEY=value` at the start of a line (after `export `), an upper-case key, no spaces around
    `=`: an environment file's line."""
    key = m.group("key")
    if key is None or not key.isupper() or m.end("key") + 1 != m.end():
        return False
    start = m.start()
    if text.endswith("export ", 0, start):
        start -= len("export ")
    return start == 0 or text[start - 1] == "\n"


def _form_field(text: str, start: int) -> bool:
    """A `key=` at `start` is a form-encoded field: after `?` or `&`, or first in a query string."""
    return (start > 0 and text[start - 1] in "?&") or (start == 0 and "&" in text)


def _pair_findings(original: str, catalog: Catalog) -> tuple[Finding, ...]:
    view = canonical(original)
    found = _view_pairs(view.text, catalog)
    if view.identical:
        return tuple(found)
    return tuple(Finding(f.kind, *view.span(f.start, f.end), f.label, f.priority) for f in found)


def _view_pairs(text: str, catalog: Catalog) -> list[Finding]:
    """The pairs of a text's canonical view (spans in the view)."""
    found: list[Finding] = []
    for pair in _pairs(text):
        if pair.role.kind not in catalog.kinds:
            continue
        raw = text[pair.start : pair.end]
        if not pair.form:
            # A bare secret on a line is the catalog's to judge (code or configuration); a quoted
            # value, a number and an identifier's line are read here.
            found += _role_findings(pair.role, raw, catalog, pair.start)
            continue
        decoded = urllib.parse.unquote_plus(raw) if ("%" in raw or "+" in raw) else raw
        if decoded == raw:
            found += _role_findings(pair.role, raw, catalog, pair.start)
        elif _role_findings(pair.role, decoded, catalog):
            # Percent-encoded: spans of the decoded value do not map back, so the whole field goes.
            found.append(Finding(pair.role.kind, pair.start, pair.end, priority=_priority(pair.role.kind)))
    return found


def pair_findings(text: str, catalog: Catalog) -> list[Finding]:
    """What the keys written in `text` imply about their values: quoted JSON-style pairs (also
    escaped), form-encoded fields, and identifier keys on a line (`phone_number: …`)."""
    if len(text) < 5 or not (catalog.kinds & {SECRET, "SSN", "PHONE"}):
        return []
    if ":" not in text and "=" not in text:
        return []
    lower = text.lower() if text.isascii() else canonical_text(text).lower()
    if not any(word in lower for word in _TRIGGERS):
        return []
    scope = ("pairs", catalog.sets, catalog.options)
    try:
        return list(MEMO(scope, text, lambda t: _pair_findings(t, catalog)))
    except TimeoutError:
        raise DetectionError("key/value pair reading timed out") from None


def structured_findings(text: str, path: KeyPath | None, catalog: Catalog) -> list[Finding]:
    """Everything structure adds to the catalog's own reading of `text`: its pairs, and (for a
    value, `path` not None) what its key path implies."""
    found = pair_findings(text, catalog)
    if path:
        found += value_findings(path, text, catalog)
    return found


__all__ = [
    "PATH_STEPS",
    "KeyPath",
    "KeyRole",
    "key_role",
    "pair_findings",
    "path_role",
    "reads_number",
    "secret_span",
    "structured_findings",
    "value_findings",
]
