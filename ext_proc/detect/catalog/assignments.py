"""SECRET_ASSIGNMENT: a secret given a value in code, configuration or prose.

`Catalog.detect` calls these validators (through `VALIDATORS`) on the matches of the
SECRET_ASSIGNMENT detectors. `secret_key_strength` decides whether a key names a secret
(`db_password`, `apiKey`) rather than a property of one (`secret_name`, `max_tokens`);
`validate_secret_assignment` and `validate_secret_comparison` then keep the value only when it is
a literal, not code (a variable, an expression, a type annotation), a placeholder or a sentence.
`validate_url_credentials` keeps the password of `scheme://user:password@host`, and
`validate_curl_credentials` the password of a curl command's `-u user:password`. The finding is
always the value alone.
"""

from __future__ import annotations

import functools
import keyword
from collections.abc import Iterable

import regex

from ext_proc.detect.catalog.options import Options
from ext_proc.detect.catalog.regexes import (
    Span,
    compile_pattern,
    is_mask,
    timed_all,
    timed_fullmatch,
    timed_match,
    timed_search,
)

_SECRET_WORDS = frozenset(
    {
        "password", "passwd", "passphrase", "pass", "pwd", "pw", "secret", "token",
        "apikey", "auth", "authorization", "credential", "credentials", "contrasena",
        "contraseña", "privatekey", "secretkey", "accesskey",
    }
)  # fmt: skip
_SECRET_SUFFIXES = (
    "password", "passwd", "secret", "token", "apikey", "accesskey", "secretkey", "privatekey",
    "credential", "credentials",
)  # fmt: skip
_SECRET_PREFIXES = ("password", "passwd", "secret")
_NOT_SECRET_WORDS = frozenset(
    {
        "secretary", "secretaries", "secretariat", "tokenizer", "tokenizers", "tokenize",
        "tokenized", "tokenization", "tokens", "passport", "passage", "passenger",
        # A collection, not one secret: `secrets: inherit`, `passwords: [...]`.
        "secrets", "passwords",
    }
)  # fmt: skip
_KEY_QUALIFIERS = frozenset(
    {
        "api", "access", "secret", "private", "priv", "auth", "client", "service", "account",
        "db", "database", "master", "signing", "sign", "encryption", "encrypt", "license",
        "licence", "subscription", "app", "consumer", "admin", "session", "shared", "webhook",
        "hmac", "jwt", "ssh", "openai", "anthropic", "stripe", "aws", "gcp", "azure", "google",
        "github", "gitlab", "slack", "twilio", "sendgrid", "mailgun", "x",
        # services whose name before `key` makes it theirs (`HEROKU_KEY`, `hubspotKey`)
        "algolia", "atlassian", "bitbucket", "circleci", "clickhouse", "cloudant", "cloudflare",
        "cohere", "databricks", "datadog", "digitalocean", "discord", "doppler", "dropbox",
        "facebook", "figma", "firebase", "grafana", "groq", "heroku", "hubspot",
        "huggingface", "iam", "ibm", "jira", "mailchimp", "mapbox", "mistral",
        "netlify", "newrelic", "notion", "npm", "okta", "pagerduty", "perplexity", "pinecone",
        "postman", "pypi", "replicate", "sentry", "shopify", "snyk", "softlayer", "sonar",
        "sumo", "sumologic", "supabase", "telegram", "terraform", "vercel",
    }
)  # fmt: skip
# A vendor's name for a credential that holds no secret word: SonarQube's `sonar.login` (a token),
# Sumo Logic's access id and key. The key's first segment, then the rest of it joined.
_VENDOR_CREDENTIALS: dict[str, frozenset[str]] = {
    "sonar": frozenset({"login", "token"}),
    "sumo": frozenset({"accessid", "accesskey"}),
    "sumologic": frozenset({"accessid", "accesskey"}),
}
# A word after the secret noun that makes the key a property of the secret, not the secret.
_SUFFIX_NEGATIVE = frozenset(
    {
        "name", "names", "id", "ids", "url", "uri", "urls", "endpoint", "endpoints", "file",
        "files", "path", "paths", "dir", "length", "len", "size", "type", "types", "count",
        "counts", "limit", "limits", "source", "header", "headers", "field", "fields", "env",
        "var", "vars", "variable", "prompt", "policy", "policies", "ttl", "timeout", "expiry",
        "expires", "expiration", "exp", "mode", "method", "methods", "provider", "providers",
        "label", "hint", "version", "format", "location", "manager", "store", "vault", "ref",
        "reference", "arn", "param", "params", "parameter", "regex", "pattern", "required",
        "enabled", "enable", "disabled", "min", "max", "rotation", "algorithm", "alg",
        "scheme", "realm", "domain", "host", "server", "status", "state", "flow", "user",
        "username", "login", "prefix", "suffix", "index", "lookup", "placeholder",
        "description", "desc", "title", "usage", "at", "date", "time", "updated", "changed",
        "created", "issuer", "audience", "results", "result", "strength", "rules", "lifetime",
        "seconds", "secs", "ms", "minutes", "hours", "days", "duration", "age", "interval",
        "callback", "fn", "func", "function", "handler", "factory", "class", "cls", "sign",
        "signer", "cache", "storage", "loader", "getter", "setter", "validator", "schema",
        "kind", "exception", "error", "errors", "test", "tests", "example", "examples",
        "comment", "keyword", "literal", "symbol", "operator", "punctuation", "text",
        "whitespace", "generic", "number", "numbers", "nums",
    }
)  # fmt: skip
# A word before the secret noun that makes the value public or a count.
_PREFIX_NEGATIVE = frozenset(
    {
        "public", "pub", "csrf", "xsrf", "max", "min", "num", "total", "input", "output",
        "prompt", "completion", "cached", "reasoning", "page", "next", "continuation",
        "cursor", "has", "is", "no", "use", "show", "hide", "forgot", "require", "requires",
    }
)  # fmt: skip
_SEGMENTS = compile_pattern(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z\u00f1]+|[A-Z]+|[0-9]+")


# `pass` alone is an English verb and a Python keyword: it names a secret only as the whole key,
# in an upper-case configuration name (DB_PASS), or after one of these.
_PASS_QUALIFIERS = frozenset(
    {
        "db", "database", "user", "admin", "root", "mysql", "postgres", "pg", "redis", "smtp",
        "mail", "ftp", "sftp", "ldap", "key", "api", "app", "service", "sql", "mongo", "amqp",
        "rabbit", "proxy", "wifi", "vpn", "login", "my",
    }
)  # fmt: skip
# `pw` names a password only as the last part of a snake-case key.
_PW_ENDINGS = ("_pw", "-pw", ".pw", "_PW", "-PW", ".PW")
# Secret words too common in prose and code to stand behind a space or in a comparison alone.
_WEAK_WORDS = frozenset({"pass", "pwd", "pw", "auth", "authorization"})

WEAK, STRONG = 1, 2


@functools.lru_cache(maxsize=4096)
def secret_key_strength(key: str) -> int:
    """0 when `key` does not name a secret; WEAK (`db_pass`, `auth`) or STRONG (`password`, `apiKey`).

    A key names a secret when a segment is a secret noun, and no segment after it makes the key
    a property of the secret (`secret_name`, `token_url`) nor one before it a public or counted
    thing (`public_key`, `max_tokens`).
    """
    segments = [m.group().lower() for m in timed_all(_SEGMENTS, key)]
    if len(segments) > 1 and "".join(segments[1:]) in _VENDOR_CREDENTIALS.get(segments[0], ()):
        return STRONG
    hits: list[int] = []
    strength = 0
    for i, seg in enumerate(segments):
        if seg in _NOT_SECRET_WORDS:
            continue
        if seg == "pass" and not (
            len(segments) == 1 or key.isupper() or (i > 0 and segments[i - 1] in _PASS_QUALIFIERS)
        ):
            continue
        if seg == "pw" and not (i > 0 and i == len(segments) - 1 and key.endswith(_PW_ENDINGS)):
            continue  # `db_pw`, `CLOUDANT_PW`; not the `Pw` ending a word of a value
        if seg in ("key", "keys"):
            if not any(q in _KEY_QUALIFIERS for q in segments[max(0, i - 2) : i]):
                continue
        elif not (seg in _SECRET_WORDS or seg.endswith(_SECRET_SUFFIXES) or seg.startswith(_SECRET_PREFIXES)):
            continue
        hits.append(i)
        # A qualified `pass` (db_pass, DB_PASS) is as clear as `password`.
        weak = seg in _WEAK_WORDS and not (seg == "pass" and len(segments) > 1)
        strength = max(strength, WEAK if weak else STRONG)
    if not hits:
        return 0
    if any(seg in _PREFIX_NEGATIVE for seg in segments[: hits[0]]):
        return 0
    if any(seg in _SUFFIX_NEGATIVE for seg in segments[hits[-1] + 1 :]):
        return 0
    return strength


def secret_key_name(key: str) -> bool:
    """Whether an identifier names a secret (`db_password`, `apiKey`), not one of its properties."""
    return secret_key_strength(key) > 0


_SCHEME = compile_pattern(
    r"(?i)(?:bearer|basic|token|digest|api-?token|api-?key|bot|oauth|jwt|ssws|sso-key)[ \t]+"
)
_VALUE_STOPWORDS = frozenset(
    {
        "true", "false", "null", "none", "nil", "undefined", "yes", "no", "on", "off",
        "required", "optional", "string", "str", "int", "bool", "boolean", "number", "object",
        "any", "empty", "redacted", "hidden", "n/a", "na", "tbd", "todo", "bearer", "basic",
        "digest", "oauth",
    }
)  # fmt: skip
# Type annotations (`token: str | None = None`) after a colon are code, not values.
_TYPE_NAMES = frozenset(
    {
        "str", "bytes", "int", "float", "bool", "dict", "list", "tuple", "set", "frozenset",
        "none", "optional", "any", "union", "type", "object", "callable", "sequence", "mapping",
        "iterable", "iterator", "literal", "path", "secretstr", "string", "number", "boolean",
    }
)  # fmt: skip
_REFERENCE = compile_pattern(
    r"\$\{[^}]*\}?|\$\([^)]*\)?|\$[A-Z_][A-Z0-9_]*|\$[a-z_][a-z0-9_]*|\{\{.*|<%.*|%\(.*|#\{.*"
    r"|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?:[(\[].*)?|[A-Za-z_][A-Za-z0-9_]*[(\[].*"
    # a multi-word identifier: a variable, not a value (user_input, getPassword, ShrinkPass)
    r"|[a-z]+(?:_[a-z]+)+|[a-z]+(?:[A-Z][a-z]+)+|(?:[A-Z][a-z]+){2,}"
)
_CONTINUATION = compile_pattern(r"[ \t]+([^\s\"'`:=#]{1,256}+)")
_TRAILING_PUNCTUATION = ".,;:!?)]}"
# Unquoted, these are variables being passed around (`password=password`, `token = value`).
_VARIABLE_NAMES = frozenset(
    {
        "value", "val", "key", "secret", "password", "passwd", "pwd", "token", "auth", "creds",
        "credentials", "credential", "self", "data", "result", "config", "settings", "env",
        "args", "kwargs", "options", "params", "apikey", "api_key",
    }
)  # fmt: skip
_COLOR = compile_pattern(r"#(?:[0-9a-fA-F]{3,4}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})")
# After `key:`, an identifier followed by `|`, `=`, `,`, `)` or `]` is a type annotation.
_ANNOTATION_TAIL = compile_pattern(r"[ \t]+[|=]|[,)\]]")


_FUNCTION_WORDS = frozenset(
    {
        "the", "a", "an", "this", "that", "these", "those", "it", "its", "to", "of", "for",
        "with", "is", "are", "was", "be", "if", "when", "which", "and", "or", "in", "on", "at",
        "by", "from", "as", "not", "all", "each", "any", "some", "see", "use", "used", "must",
        "should", "will", "can", "may", "optional", "required", "defaults", "default",
    }
)  # fmt: skip
_SETTERS = frozenset({"assign", "set", "update", "put"})
_SECRET_CALL = compile_pattern(
    r"(?:(?:api|access|private|client|secret|auth|db)_)?(?:secrete?|password|passwd|token|key|credentials?)"
)
_COMPARISONS = frozenset({"==", "===", "!=", "!=="})
_NAME_LIKE = compile_pattern(r"[a-z][a-z0-9]*+(?:[_\-.][a-z0-9]++)*+")
_CONSTANT = compile_pattern(
    r"[a-z]++(?:_[a-z]++)++|[a-z]++(?:[A-Z][a-z]++)++|(?:[A-Z][a-z]++){2,}+|[A-Z]++(?:_[A-Z]++)++"
)


def _value_ok(value: str, *, quoted: bool) -> bool:
    """The checks every form shares: something that can be a secret, not a placeholder."""
    bare = value.strip().rstrip(_TRAILING_PUNCTUATION)
    if len(bare) < 3 or not any(ch.isalnum() for ch in bare):
        return False
    if bare.lower() in _VALUE_STOPWORDS or is_mask(bare) or timed_fullmatch(_COLOR, bare):
        return False
    if value[0] in "<{[" or value.startswith(("${", "$(", "{{", "<%", "%(", "#{")):
        return False
    # The name of a secret field ("refresh_token", "api-key", "ANTHROPIC_API_KEY") or another
    # identifier-shaped constant ("receive_message", "clientAuth") is not a secret.
    if secret_key_strength(bare) and timed_fullmatch(_NAME_LIKE, bare.lower()):
        return False
    return not timed_fullmatch(_CONSTANT, bare)


def _variable(word: str, *, assignment: bool) -> bool:
    """An unquoted first word that is code: a variable, a keyword, an expression."""
    bare = word.rstrip(_TRAILING_PUNCTUATION)
    if not bare or not any(ch.isalnum() for ch in bare) or bare[0] in "(*&!:":
        return True
    if keyword.iskeyword(bare) or bare in ("await", "async", "yield", "new", "typeof", "this"):
        return True
    if bare.isidentifier() and secret_key_strength(bare):
        return True
    if assignment and bare.lower() in _VARIABLE_NAMES:
        return True
    if bare.isalpha() and bare.istitle():
        return True  # `token = Error`, `token = Keyword`: a name in code
    return timed_fullmatch(_REFERENCE, bare) is not None


def _strong_value(value: str) -> bool:
    """For the forms that prose and code also produce (`pass "x"`, `token == "integer"`): only a
    value that reads as neither a word nor an identifier counts."""
    bare = value.rstrip(_TRAILING_PUNCTUATION)
    if len(bare) < 6 or (bare.isalpha() and (bare.islower() or bare.istitle())):
        return False
    return not timed_fullmatch(_REFERENCE, bare)


def _random_looking(value: str) -> bool:
    """For a bare `"key", "value"` pair (a list of names, or getenv("key", "default")): only a
    value with letters and digits that is no identifier counts."""
    return (
        len(value) >= 8
        and any(ch.isdigit() for ch in value)
        and any(ch.isalpha() for ch in value)
        and _strong_value(value)
    )


def _prose(value: str) -> bool:
    """`auth: The authentication method and …`: a sentence after a colon, as in docstrings."""
    words = value.split()
    if len(words) < 2:
        return False
    first = words[0]
    core = first.lstrip("*_(`[")
    if len(words) == 2:
        return core.lower() in _FUNCTION_WORDS
    return first[0] in "(*" or (core.istitle() and core.isalpha()) or core.lower() in _FUNCTION_WORDS


def validate_secret_assignment(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    key = m.group("key")
    strength = secret_key_strength(key)
    if not strength:
        return ()
    op = (m.group("op") or "").strip()
    comma, call = m.group("comma") is not None, m.group("call") is not None
    loose = m.group("op") is None or op in _COMPARISONS or op.startswith("is")
    if loose and strength < STRONG:
        return ()  # `pass "x"`, `auth == "x"`: too common in prose and code
    if call:
        # `secret("…")`, `secrete.assign("…")`; not `password.encode("latin1")` nor a class
        # `ParseErrorPreviousToken("…")`.
        last = key.rsplit(".", 1)[-1].lower().strip("_")
        if any(ch.isupper() for ch in key) or not (last in _SETTERS or timed_fullmatch(_SECRET_CALL, last)):
            return ()  # `make_token("…")`, `ask_password("Password: ")`: a function of a secret
    for name in ("esc", "dq", "sq", "bq"):
        if m.group(name) is not None:
            start, end = m.span(name)
            quoted = True
            break
    else:
        start, end = m.span("bare")
        quoted = False
        spans = _bare_value(text, m, op, start, end)
        if spans is None:
            return ()
        start, end = spans
    if quoted and m.group("scheme") is None:
        scheme = timed_match(_SCHEME, text, start, end)
        if scheme is not None and scheme.end() < end:
            start = scheme.end()
    value = text[start:end]
    if not _value_ok(value, quoted=quoted):
        return ()
    if loose and not _strong_value(value):
        return ()
    if op.startswith("is") and not any(ch.isdigit() for ch in value):
        return ()  # "the token is write-only": prose; "my password is hunter2" has a digit
    if comma and not _random_looking(value):
        return ()
    if strength < STRONG and not quoted and " " in value.strip():
        return ()  # "the content pass: everything above moved": prose after a weak word
    return ((start, end),)


_TOKEN_VALUE = compile_pattern(r"[A-Za-z0-9+/=_\-.~]{20,256}")


def _token_like(value: str) -> bool:
    """A long run of token characters with letters and digits, no name (`apikey:Zq8v…`): a value
    after a colon whatever the spacing around it (`io.jsonwebtoken:jjwt` and `:ref:` are short)."""
    return (
        timed_fullmatch(_TOKEN_VALUE, value) is not None
        and any(ch.isdigit() for ch in value)
        and any(ch.isalpha() for ch in value)
        and timed_fullmatch(_CONSTANT, value) is None
        and "//" not in value
    )


def _bare_value(text: str, m: regex.Match[str], op: str, start: int, end: int) -> Span | None:
    """The span of an unquoted value, or None when the "value" is code, markup or prose."""
    if op in _COMPARISONS:
        return None  # comparing with a variable: code, not a value
    key_end = m.end("key")
    if op == ":" and not _token_like(text[start:end]):
        if m.end("op") == start and not m.group("key")[0].isupper():
            return None  # `passwd:uid`, `io.jsonwebtoken:jjwt`: a pair, not YAML (`key: value`)
        if text[key_end : m.start("op")].strip(" \t") == "" and text[key_end] in " \t":
            return None  # `authorization :ref:` (reST), `key : value` is not YAML either
    first_word = text[start:end]
    if _variable(first_word, assignment=op != ":"):
        return None
    if op != ":" and first_word.isalpha() and first_word.islower():
        return None  # `token = nextchar`: a variable in code (ini and .env values have digits)
    if m.group("key").startswith(("self.", "this.", "cls.")) or first_word.startswith(
        ("self.", "this.", "cls.")
    ):
        return None  # code: an attribute assigned, or an expression
    name = first_word.rstrip(",)]")
    if op == ":" and (
        first_word.rstrip(_TRAILING_PUNCTUATION + "|[").lower() in _TYPE_NAMES
        or (name.isidentifier() and timed_match(_ANNOTATION_TAIL, text, start + len(name), end + 4))
    ):
        return None  # a type annotation: `token: str | None`, `api_key: _KeyT,`
    # Trailing list/statement punctuation belongs to the syntax, not to the value.
    while end > start and text[end - 1] in ",;":
        end -= 1
    if op == ":" and m.group("scheme") is None:
        # YAML-style: an unquoted value runs to the end of the line.
        pos = end
        for _ in range(8):
            cont = timed_match(_CONTINUATION, text, pos, min(len(text), pos + 300))
            if cont is None:
                break
            pos = cont.end()
            end = cont.end(1)
            while end > start and text[end - 1] in ",;":
                end -= 1
        if _prose(text[start:end]):
            return None
    return start, end


def validate_secret_comparison(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """`"value" == password`: the key comes after the quoted value, read backwards from it."""
    if secret_key_strength(m.group("key")) < STRONG:
        return ()
    j = span[0]
    while j > 0 and text[j - 1] in " \t":
        j -= 1
    for op in ("===", "!==", "==", "!="):
        if text.endswith(op, 0, j):
            j -= len(op)
            break
    else:
        return ()
    while j > 0 and text[j - 1] in " \t":
        j -= 1
    if j == 0 or text[j - 1] not in "\"'":
        return ()
    close = j - 1
    opening = text.rfind(text[close], max(0, close - 1025), close)
    if opening < 0 or "\n" in text[opening + 1 : close]:
        return ()
    start, end = opening + 1, close
    if not (_value_ok(text[start:end], quoted=True) and _strong_value(text[start:end])):
        return ()
    return ((start, end),)


# A curl command's `-u user:password` / `--user=user:password`, in its line and the lines its
# trailing backslashes join to it.
_CURL_USER = compile_pattern(r"(?<!\S)(?:--user(?:=|[ \t]+)|-u[ \t]*)(?=\S)")
_CURL_LINE = compile_pattern(r"(?:\\\r?\n|[^\n])*+")
CURL_COMMAND_CHARS = 4096  # read after `curl`, at most
_QUOTES = "'\""


def _shell_word(text: str, start: int, end: int) -> list[tuple[str, int]]:
    """The characters of the shell word at `start` (quotes removed), each with its offset."""
    out: list[tuple[str, int]] = []
    i = start
    while i < end and not text[i].isspace():
        ch = text[i]
        if ch in _QUOTES:
            close = text.find(ch, i + 1, end)
            if close < 0:
                break
            out.extend((text[j], j) for j in range(i + 1, close))
            i = close + 1
        elif ch == "\\" and i + 1 < end and not text[i + 1].isspace():
            out.append((text[i + 1], i + 1))
            i += 2
        else:
            out.append((ch, i))
            i += 1
    return out


def _curl_secret(chars: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The secret of `user:password`: the password, or the user when the password is empty (an
    API key sent as the user name, `-u "key:"`); nothing without a colon (curl asks for it)."""
    word = "".join(ch for ch, _ in chars)
    colon = word.find(":")
    if colon < 0 or word.startswith(("<", "[")):
        return []
    secret = chars[colon + 1 :] or chars[:colon]
    value = "".join(ch for ch, _ in secret)
    if len(value) > 2 and value[0] == "{" and value[-1] == "}" and value[1] != "{":
        secret = secret[1:-1]  # `{…}` around a value in documentation: the value inside
        value = value[1:-1]
    if not value or value.startswith(("$", "<", "[", "{")) or "${" in value or "$(" in value:
        return []
    if is_mask(value) or len(set(value)) == 1 or not _strong_value(value):
        return []
    return secret


def validate_curl_credentials(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """`curl … -u user:password …`: the password of every `-u` / `--user` of the command (read up
    to the next `curl`, so a text full of them is still read once)."""
    limit = min(len(text), span[1] + CURL_COMMAND_CHARS)
    following = timed_search(m.re, text, span[1], limit)
    if following is not None:
        limit = following.start()
    line = timed_match(_CURL_LINE, text, span[1], limit)
    end = line.end() if line is not None else span[1]
    for option in timed_all(_CURL_USER, text, span[1], end):
        secret = _curl_secret(_shell_word(text, option.end(), end))
        if secret:
            yield (secret[0][1], secret[-1][1] + 1)


def validate_url_credentials(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    value = text[span[0] : span[1]]
    if value.startswith(("$", "{", "<", "[", "%")) or is_mask(value):
        return ()
    return (span,)
