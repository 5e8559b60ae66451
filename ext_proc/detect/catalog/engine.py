"""The pattern catalog (SPEC §4): what has the shape of personal data or a secret.

Where it sits: the dialect walk hands every string leaf of a request (and the output gate every
piece of model output) to `Catalog.detect`; the findings go, with the declared subjects'
findings, to redaction, which resolves overlaps (subjects first, then the longer span, then
`Finding.priority`) and writes placeholders right to left. The catalog returns kinds and spans,
never text, so nothing downstream can log a value by accident.

Detectors are data: a frozen `Detector` per pattern holds its kind, a compiled `regex` pattern,
the capture group that is the value, an optional validator named in the explicit `VALIDATORS`
registry, and its fast path (literals, character counts and context words without which it
cannot match, and an optional anchor from `ANCHORS` that finds the few windows of a long text
worth scanning). `Catalog.for_sets` selects the detectors of a policy's sets once and caches
the catalog per argument tuple.

Rules
-----
* Every regex call has a timeout (`REGEX_TIMEOUT` for each `TIMEOUT_CHARS` characters it reads);
  a timeout raises `DetectionError` (SPEC §11), never a silent skip.
* Cost is linear in the text: bounded or possessive repetition only, merged windows, bounded
  work per candidate in validators.
* Full-width ASCII (U+FF01–FF5E) and the ideographic space are folded to ASCII one for one, and
  zero-width characters (U+00AD, U+200B–U+200F, U+2060–U+2064, U+FEFF) are removed before
  matching; spans are mapped back, so `jo\u200bhn@example.com` or a card in full-width digits
  is found and redacted whole.
* Overlapping findings of one kind are merged into their union (fail closed). Different kinds
  may overlap; `Finding.priority` is `PRIORITY_BASE` (10; lower values belong to declared
  subjects) plus the kind's index in `PRIORITY`, lower first:
  PRIVATE_KEY, JWT, ANTHROPIC_KEY, OPENAI_KEY, GITHUB_TOKEN, SLACK_TOKEN, STRIPE_KEY,
  GOOGLE_API_KEY, AWS_ACCESS_KEY, SECRET_ASSIGNMENT, EMAIL, IBAN, CREDIT_CARD, SSN, IP, PHONE,
  HIGH_ENTROPY. Specific credentials before the generic assignment and the entropy heuristic; a
  card before a phone reading of the same digits.
* Example and documentation values are redacted (fail closed): AKIAIOSFODNN7EXAMPLE, its
  secret key, "somefakekey". Only bodies made of mask characters (x, X, *, #: `ghp_xxxx…`,
  `AKIAXXXXXXXXXXXXXXXX`) and references (`${X}`, `$VAR`, `<your key>`) are placeholders.

Per kind
--------
* EMAIL: ASCII local part and domain (IDN in punycode); `[dot]` / `(dot)` in the domain.
* PHONE: digit groups with separators; phonenumbers decides. With a `+` country code: valid in
  its region. Without: a valid US number, a NANP-formatted one (`(415) 555-0132`, `555-123-4567`:
  the shape is enough), or a 9+ digit number with a national trunk `0` valid in one of
  `TRUNK_REGIONS`. A bare digit run counts only after a phone word on its line (phone, tel,
  mobile, call, …). Not phones: dates, times, year ranges, IPv4 and SSN shapes, cards, rows of
  one-digit numbers, hex-dump bytes.
* SSN: `AAA-GG-SSSS` with one separator (dash, space or dot) throughout; area not 000, 666 or
  9xx, group not 00, serial not 0000. Nine plain digits (or partial dashes, `078-051120`) only
  after an SSN word (ssn, social security, ss#, taxpayer, tin) within 48 characters.
* IP: IPv4 with octet validation (no leading zeros, no fifth dotted group: `1.2.3.4.5` is a
  version) and CIDR; IPv6 in every form `ipaddress` accepts (compressed, embedded IPv4, zone id,
  CIDR). The unspecified `::` is not an address of anyone and a token in C++/Rust/Haskell: not
  reported. 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 and 2001:db8::/32 (and IPv4-mapped
  forms) are skipped only with `skip_documentation_ips=True`.
* IBAN: the country's registry length (`IBAN_LENGTHS`) and mod-97, with or without spaces.
* CREDIT_CARD: 13–19 digits with spaces, dashes or (in 4-digit groups) dots, in a card network's
  issuer range for that length, and a valid Luhn check digit; every start in a longer digit run
  is tried, so digits before a card cannot hide it.
* AWS_ACCESS_KEY: key ids (AKIA, ASIA, ABIA, ACCA, AGPA, AIDA, AROA, AIPA, ANPA, ANVA, APKA,
  A3T…) and 40-character secret keys: a `[A-Za-z0-9/+]{40}` token with mixed case and a digit,
  after an aws/secret/access-key word earlier on its line (64 characters), or alone when it
  also has `/` or `+`, is no path, and has entropy >= `AWS_SECRET_MIN_ENTROPY` (4.2).
* PRIVATE_KEY: the PEM header line `-----BEGIN … PRIVATE KEY( BLOCK)-----` only, never the body
  (HIGH_ENTROPY sees its lines); a header closed at once by its END line wraps nothing.
* JWT: `eyJ…` header, `ey…` payload, optional (or empty) signature; by shape, so a truncated or
  damaged token is still redacted.
* OPENAI_KEY: `sk-`, `sk-proj-`, `sk-svcacct-`, `sk-admin-` and any `sk-` token of 20+
  characters with a digit or capital (OpenAI-compatible providers share the prefix);
  ANTHROPIC_KEY `sk-ant-`; GITHUB_TOKEN `ghp_ gho_ ghu_ ghs_ ghr_ github_pat_`; SLACK_TOKEN
  `xox?-`, `xoxe.xox?-`, `xapp-`, hooks.slack.com URLs; STRIPE_KEY `sk_ rk_ pk_` + `live/test/
  prod`; GOOGLE_API_KEY `AIza` + 35. A prefix must start a token: `sk-` in "task-force" is none.
* SECRET_ASSIGNMENT: `key: value`, `key = value`, `:=`, `=>`, `"key": "value"`, comparisons
  (`key == "v"`, `"v" == key`), `key("v")`, `key "v"`, `key is v`, `getenv("key", "v")` and
  `scheme://user:password@host`. The key names a secret (password, passwd, pass, pwd, secret,
  token, credential, auth, authorization, an api/access/private/client… key) and not a property
  of one (`secret_name`, `token_url`, `max_tokens`, `public_key`, `csrf_token`); the finding is
  the value only (an auth scheme such as `Bearer` stays with the key). After `:` an unquoted
  value runs to the end of the line (YAML). Code and prose are not values: type annotations
  (`token: str | None`), variables and expressions (`password=password`, `token = self.x`),
  identifier-shaped constants (`"refresh_token"`, `ANTHROPIC_API_KEY`), sentences after a colon
  (docstrings). The loose forms (comparison, call, `key "v"`, `is`, `"k", "v"`) need an
  unambiguous key and a value that reads as no word.
* HIGH_ENTROPY: tokens of 20+ characters over `[A-Za-z0-9+/_-]` (`=` padding; `=` inside a
  token splits it) with a letter and a digit. Hex tokens count at Shannon entropy >=
  `HEX_MIN_ENTROPY` (3.0 bits/char): hex digests and git object ids cannot be told from hex keys
  and are redacted. Other tokens count at entropy >= min(`BASE64_ENTROPY_CAP` 4.3,
  `BASE64_ENTROPY_SLOPE` 0.88 × log2(length)): 3.80 at 20 characters, 4.03 at 24, 4.23 at 28,
  4.3 from 30 (random base62 scores 4.0–4.2 at 20, 4.3–4.8 at 32; identifiers and slugs
  3.5–4.2). Never flagged: UUIDs (at most 4.09 bits), identifiers made mostly of words and
  numbers (`WORD_COVERAGE_LIMIT`: PytestRemovedIn10Warning), sequences (`ABCDEFG…0123456789`),
  ids the LLM APIs issue (`PROVIDER_ID_PREFIXES`: toolu_, msg_, chatcmpl-, …), lowercase paths,
  base64 of 64+ characters that decodes to a media file's magic number (an image a tool passes
  around: bytes, not a key); in a path or URL only a long segment is judged.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import itertools
import keyword
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import phonenumbers
import regex

from ext_proc.detect.findings import CATALOG_KINDS, SETS, Finding
from ext_proc.detect.memo import MEMO
from ext_proc.errors import DetectionError
from ext_proc.media.parts import MEDIA_MIN_LENGTH, is_media_base64

# Per regex call, for each TIMEOUT_CHARS characters it reads. Read at call time so tests (and
# operators under load) can change it.
REGEX_TIMEOUT = 0.25
TIMEOUT_CHARS = 250_000

# Nothing in the catalog is shorter than this ("::1").
MIN_FINDING_LENGTH = 3

# Finding.priority = PRIORITY_BASE + index in PRIORITY. Values below PRIORITY_BASE belong to
# declared-subject matchers, which win over every catalog kind (ext_proc.transform.redact).
PRIORITY_BASE = 10
PRIORITY: tuple[str, ...] = (
    "PRIVATE_KEY",
    "JWT",
    "ANTHROPIC_KEY",
    "OPENAI_KEY",
    "GITHUB_TOKEN",
    "SLACK_TOKEN",
    "STRIPE_KEY",
    "GOOGLE_API_KEY",
    "AWS_ACCESS_KEY",
    "SECRET_ASSIGNMENT",
    "EMAIL",
    "IBAN",
    "CREDIT_CARD",
    "SSN",
    "IP",
    "PHONE",
    "HIGH_ENTROPY",
)
assert sorted(PRIORITY) == sorted(CATALOG_KINDS), "every catalog kind has exactly one priority"

HEX_MIN_ENTROPY = 3.0
BASE64_ENTROPY_CAP = 4.3
BASE64_ENTROPY_SLOPE = 0.88
HIGH_ENTROPY_MIN_LENGTH = 20
# Ids the LLM APIs issue for their own objects (tool calls, messages, completions, files): they
# travel in every agent conversation and identify no one.
PROVIDER_ID_PREFIXES: tuple[str, ...] = (
    "toolu_", "srvtoolu_", "msg_", "msgbatch_", "wrkspc_", "req_", "call_", "chatcmpl-",
    "resp_", "run_", "thread_", "asst_", "file-", "file_", "batch_", "fc_", "rs_", "ws_",
    "step_", "vs_", "ftjob-", "evt_", "sess_", "rlg_",
)  # fmt: skip
# A token at least this much made of word-like runs (and separated numbers) is an identifier.
WORD_COVERAGE_LIMIT = 0.6
AWS_SECRET_MIN_ENTROPY = 4.2

TRUNK_REGIONS: tuple[str, ...] = (
    "GB", "DE", "FR", "IT", "NL", "BE", "CH", "AT", "IE", "SE", "IL", "IN", "JP", "KR", "CN",
    "AU", "NZ", "BR", "TR", "ZA",
)  # fmt: skip
# Regions tried for a bare digit run that follows a phone word.
CONTEXT_REGIONS: tuple[str, ...] = ("US", *TRUNK_REGIONS)

# ISO 13616 registry lengths.
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22,
    "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32,
    "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19,
    "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24, "SC": 31,
    "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28, "TL": 23,
    "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Options:
    """Per-catalog switches that validators read."""

    skip_documentation_ips: bool = False


Span = tuple[int, int]
# (text, match, span of the detector's group, options) -> accepted spans of the value.
Validator = Callable[[str, "regex.Match[str]", Span, Options], Iterable[Span]]


@dataclass(frozen=True, slots=True)
class Requirement:
    """Every match contains at least `at_least` characters from `chars` (counted in the text)."""

    chars: str
    at_least: int


DIGITS = "0123456789"


@dataclass(frozen=True, slots=True)
class Detector:
    """One pattern of the catalog.

    The fast path is data too, and each part is a necessary condition of a match, so skipping
    on it never loses one: `min_length` (no shorter text can hold a match), `triggers`
    (literals of which every match contains one), `requires` (character counts every match
    needs, e.g. 13 digits for a card), `context` (lower-case words one of which every match
    needs nearby), and `anchor`, an entry of `ANCHORS` that returns the windows of a long text
    that can hold a match (`anchored`: each window starts exactly where a match would).
    """

    name: str
    kind: str
    pattern: regex.Pattern[str]
    group: int | str = 0
    validator: str | None = None
    triggers: tuple[str, ...] = ()
    requires: tuple[Requirement, ...] = ()
    context: tuple[bytes, ...] = ()
    min_length: int = MIN_FINDING_LENGTH
    anchor: str | None = None
    anchored: bool = False


def _c(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    return regex.compile(pattern, flags | regex.VERSION0)


# ---------------------------------------------------------------------------------------------
# Shared helpers


def _timeout(length: int) -> float:
    # The budget grows with the text a call reads, so a large body is not mistaken for a
    # runaway pattern: REGEX_TIMEOUT per TIMEOUT_CHARS characters, about 10x what a linear
    # pattern needs on this class of machine.
    return REGEX_TIMEOUT * (1 + length / TIMEOUT_CHARS)


def _search(
    pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None
) -> regex.Match[str] | None:
    end = len(text) if endpos is None else endpos
    return pattern.search(text, pos, end, timeout=_timeout(end - pos))


def _match(
    pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None
) -> regex.Match[str] | None:
    end = len(text) if endpos is None else endpos
    return pattern.match(text, pos, end, timeout=_timeout(end - pos))


def _fullmatch(pattern: regex.Pattern[str], text: str) -> regex.Match[str] | None:
    return pattern.fullmatch(text, timeout=_timeout(len(text)))


def _all(
    pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None
) -> list[regex.Match[str]]:
    """Every match, collected in one call before any validator runs: one timeout set-up per
    pattern and text, and the scanner's budget (which runs from its creation) covers the scan
    alone, never the validators' work between matches."""
    end = len(text) if endpos is None else endpos
    return list(pattern.finditer(text, pos, end, timeout=_timeout(end - pos)))


def shannon_entropy(value: str) -> float:
    """Bits per character of `value`'s own character distribution."""
    if not value:
        return 0.0
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


_MASK_CHARS = frozenset("xX*#.•_- ")


def _is_mask(body: str) -> bool:
    """`xxxx`, `XXXX-XXXX`, `****`: a documented placeholder, not a value."""
    return bool(body) and all(ch in _MASK_CHARS for ch in body)


_DIGIT_SET = frozenset(DIGITS)


def _digits_of(value: str) -> str:
    return "".join(ch for ch in value if ch in _DIGIT_SET)


# ---------------------------------------------------------------------------------------------
# Validators


def _accept(_text: str, _m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    return (span,)


def _token_body(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Provider tokens: reject a body made only of mask characters (`ghp_xxxx…`)."""
    body = next(
        (m.group(g) for g in ("body", "pat") if g in m.re.groupindex and m.group(g) is not None),
        text[span[0] : span[1]],
    )
    return () if _is_mask(body) else (span,)


def _openai_key(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    body = m.group("body")
    # A hyphenated lower-case phrase ("sk-some-long-identifier-name") is not a key.
    if _is_mask(body) or not any(ch.isdigit() or ch.isupper() for ch in body):
        return ()
    return (span,)


_PEM_END = _c(r"[ \t]*\r?\n?[ \t]*-----END ")


def _private_key(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    # A header immediately closed by its END line wraps no key material.
    if _match(_PEM_END, text, span[1], min(len(text), span[1] + 16)):
        return ()
    return (span,)


def _email(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    value = text[span[0] : span[1]]
    local = value.split("@", 1)[0]
    if local.startswith(".") or ".." in local:
        return ()
    return (span,)


_DOC_NETS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)


def _is_documentation(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr.version == net.version and addr in net for net in _DOC_NETS)


def _ipv4(text: str, m: regex.Match[str], span: Span, options: Options) -> Iterable[Span]:
    if options.skip_documentation_ips and _is_documentation(ipaddress.IPv4Address(m.group("addr"))):
        return ()
    return (span,)


def _ipv6(text: str, m: regex.Match[str], span: Span, options: Options) -> Iterable[Span]:
    candidate = m.group("addr")
    try:
        addr = ipaddress.IPv6Address(candidate)
    except ValueError:
        return ()
    if addr.is_unspecified:
        return ()
    bare = candidate.split("%", 1)[0]
    # "dead::beef"-like words: an address here carries a digit or at least three groups.
    if not any(ch.isdigit() for ch in bare) and bare.count(":") < 3:
        return ()
    if options.skip_documentation_ips and _is_documentation(addr):
        return ()
    start, end = m.span("addr")
    cidr = m.group("cidr")
    if cidr and int(cidr[1:]) <= 128:
        end = m.end("cidr")
    return ((start, end),)


def _iban(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    # The pattern starts at the check digits (a digit anchor scans fast); the country code is
    # the two letters before.
    start = span[0] - 2
    country = text[start : span[0]].upper()
    length = IBAN_LENGTHS.get(country)
    if length is None:
        return ()
    compact: list[str] = []
    end = start
    for i in range(start, span[1]):
        ch = text[i]
        if ch == " ":
            continue
        compact.append(ch.upper())
        if len(compact) == length:
            end = i + 1
            break
    if len(compact) < length:
        return ()
    if end < len(text) and text[end].isalnum():
        return ()
    iban = "".join(compact)
    rearranged = iban[4:] + iban[:4]
    number = "".join(str(int(ch, 36)) for ch in rearranged)
    if int(number) % 97 != 1:
        return ()
    return ((start, end),)


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _plausible_card(digits: str) -> bool:
    """Issuer ranges of the card networks, by length (ISO/IEC 7812 major industry digits 1-6)."""
    n = len(digits)
    if not 13 <= n <= 19:
        return False
    first = digits[0]
    if first == "4":  # Visa
        return True
    if first == "5":  # Mastercard 51-55, Maestro 50, 56-59
        return n >= 16 or digits[1] in "0678"
    if first == "2":  # Mastercard 2221-2720
        return n == 16 and 2221 <= int(digits[:4]) <= 2720
    if first == "3":  # Amex 34/37 (15), Diners 30/36/38/39, JCB 35
        return n == 15 if digits[1] in "47" else n >= 14
    if first == "6":  # Discover, UnionPay, Maestro, RuPay
        return True
    return first == "1" and n == 15  # UATP


_GROUP_RE = _c(r"[0-9]+")


def _card(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Luhn-valid windows of whole digit groups inside a run of digits and separators."""
    groups = [g.span() for g in _all(_GROUP_RE, text, span[0], span[1])]
    k = len(groups)
    # Every start is tried, and overlapping windows are merged later: a number that happens to
    # precede a card ("ref 123 4012 8888 8888 1881") cannot hide part of the card.
    for i in range(k):
        found = 0
        digits = ""
        for j in range(i, k):
            g0, g1 = groups[j]
            size = g1 - g0
            if j > i:
                sep = text[groups[j - 1][1] : g0]
                # Dots only in 4-digit groups (4012.8888.8888.1881), never in dotted versions.
                if "." in sep and (size > 4 or groups[j - 1][1] - groups[j - 1][0] != 4):
                    break
            digits += text[g0:g1]
            if len(digits) > 19:
                break
            # Only the last group of a card may be shorter than 3 digits.
            if j > i and groups[j - 1][1] - groups[j - 1][0] < 3:
                break
            if _plausible_card(digits) and luhn_valid(digits):
                found = j + 1
        if found:
            yield (groups[i][0], groups[found - 1][1])


_SSN_CONTEXT = _c(r"(?i)\b(?:ssn|ss\s?#|soc(?:ial)?[\s.\-]*sec(?:urity)?|taxpayer|tin)\b")


def _ssn_parts_ok(digits: str) -> bool:
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return not (area in ("000", "666") or area[0] == "9" or group == "00" or serial == "0000")


def _ssn(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    return (span,) if _ssn_parts_ok(_digits_of(text[span[0] : span[1]])) else ()


def _ssn_plain(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    if not _ssn_parts_ok(_digits_of(text[span[0] : span[1]])):
        return ()
    if _search(_SSN_CONTEXT, text, max(0, span[0] - 48), span[0]) is None:
        return ()
    return (span,)


_PHONE_CONTEXT = _c(
    r"(?i)(?:\b(?:phone|tel|telephone|mobile|cell|call|fax|sms|whatsapp|contact|ring|dial"
    r"|t[ée]l[ée]phone|telefon|tel[ée]fono|m[óo]vil|handy|num[ée]ro)\b|电话|手机|電話)[^\n]*\Z"
)
_DATE_LIKE = _c(
    r"(?:[0-9]{4}[-/.][0-9]{1,2}[-/.][0-9]{1,2}|[0-9]{1,2}[-/.][0-9]{1,2}[-/.][0-9]{2,4}"
    r"|(?:19|20)[0-9]{2}\s?[-/]\s?(?:19|20)?[0-9]{2}|[0-9]{1,3}(?:\.[0-9]{1,3}){3})"
)
_DATE_INSIDE = _c(
    r"(?<![0-9])(?:(?:19|20)[0-9]{2}[-/.][0-9]{1,2}[-/.][0-9]{1,2}"
    r"|[0-9]{1,2}[-/.][0-9]{1,2}[-/.](?:19|20)[0-9]{2})(?![0-9])"
)
_SSN_SHAPE = _c(r"[0-9]{3}([- .])[0-9]{2}\1[0-9]{4}")
_NANP_SHAPE = _c(r"(?:\+?1[ .\-]?)?(?:\([0-9]{3}\)[ ]?|[0-9]{3}([ .\-]))[0-9]{3}[ .\-][0-9]{4}")
_WS_RUN = _c(r"[^ \u00a0]+")


@functools.lru_cache(maxsize=4096)
def _phone_valid(number: str, region: str | None) -> bool:
    try:
        parsed = phonenumbers.parse(number, region)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(parsed)


@functools.lru_cache(maxsize=16384)
def _phone_ok(window: str, has_context: bool) -> bool:
    """Is this window (a candidate's chunks) a phone number? Pure, so cached: a conversation
    resends its history every turn, and the same numbers come back again and again."""
    digits = _digits_of(window)
    if not 7 <= len(digits) <= 15:
        return False
    if window.count("(") != window.count(")"):
        return False
    if _fullmatch(_DATE_LIKE, window) or _search(_DATE_INSIDE, window) is not None:
        return False
    if _fullmatch(_SSN_SHAPE, window):
        return False
    if window.startswith("+"):
        return _phone_valid(window, None)
    if window == digits:
        # A bare digit run is an id, an amount or a timestamp unless a phone word precedes it.
        return has_context and any(_phone_valid(window, r) for r in CONTEXT_REGIONS)
    if _fullmatch(_NANP_SHAPE, window):
        return True
    group_texts = [m.group() for m in _all(_GROUP_RE, window)]
    groups = [len(g) for g in group_texts]
    if sum(1 for g in groups if g == 1) > 1:
        return False  # "0 1 2 3 4 5 6": a row of numbers, not a phone
    if sum(1 for g in group_texts if not g.strip("0")) > 1:
        return False  # "00 01 00 00": bytes of a hex dump
    if "." in window and (digits[0] != "0" or "/" in window or max(groups) > 4):
        # Dotted digit groups are versions, addresses and CIDR blocks, except a national
        # number in dotted pairs (01.42.68.53.00) or NANP shape (handled above).
        return False
    if _phone_valid(window, "US"):
        return True
    if digits[0] == "0" and len(digits) >= 9:
        return any(_phone_valid(window, r) for r in TRUNK_REGIONS)
    return False


def _phone(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Valid numbers among the whitespace-separated chunks of a candidate, longest first."""
    start, end = span
    # The run must end a token: "555-0132x" and "12:30" (a time) are not phones.
    while end > start and text[end - 1] not in "0123456789)":
        end -= 1
    if end < len(text) and (
        text[end].isalnum() or text[end] == "_" or (text[end] == ":" and text[end + 1 : end + 2].isdigit())
    ):
        return
    if sum(1 for ch in text[start:end] if ch in _DIGIT_SET) < 7:
        return
    has_context = _search(_PHONE_CONTEXT, text, max(0, start - 40), start) is not None
    for rel_start, rel_end in _phone_spans(text[start:end], has_context):
        yield (start + rel_start, start + rel_end)


@functools.lru_cache(maxsize=16384)
def _phone_spans(text: str, has_context: bool) -> tuple[Span, ...]:
    """The phone numbers in one candidate (offsets in it). Pure, so cached: a conversation
    resends its history every turn and the same numbers come back."""
    found: list[Span] = []
    chunks = [c.span() for c in _all(_WS_RUN, text)]
    k = len(chunks)
    # A run of 1-2 digit groups ("05 00 01 02 03 04") is a byte or number listing, unless it is
    # exactly five pairs (01 42 68 53 00, the French way of writing a number).
    listing = k > 1 and all(c1 - c0 <= 2 for c0, c1 in chunks)
    if listing and (k != 5 or any(c1 - c0 != 2 for c0, c1 in chunks)):
        return ()
    i = 0
    while i < k:
        for j in range(min(k, i + 7), i, -1):
            start, end = chunks[i][0], chunks[j - 1][1]
            # A window starts with +, ( or a digit and ends with a digit or ): "2 -2096165693"
            # is a number and a negative number, not a phone with a dash.
            while start < end and text[start] not in "+(0123456789":
                start += 1
            while end > start and text[end - 1] not in "0123456789)":
                end -= 1
            window = text[start:end]
            # Balanced parentheses around the whole window are not part of the number.
            if window.startswith("(") and window.endswith(")") and window.count("(") == 1:
                start, end, window = start + 1, end - 1, window[1:-1]
            if _phone_ok(window, has_context):
                found.append((start, end))
                i = j
                break
        else:
            i += 1
    return tuple(found)


_AWS_CONTEXT = _c(r"(?i)aws|secret|access[_\-. ]?key")


def _aws_secret(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    token = text[span[0] : span[1]]
    has_upper = any(ch.isupper() for ch in token)
    has_lower = any(ch.islower() for ch in token)
    has_digit = any(ch.isdigit() for ch in token)
    if not (has_upper and has_lower):
        return ()  # hex digests and other single-case tokens
    line_start = text.rfind("\n", max(0, span[0] - 64), span[0]) + 1
    window_start = max(line_start, span[0] - 64)
    if _search(_AWS_CONTEXT, text, window_start, span[0]) is not None and has_digit:
        return (span,)
    if (
        has_digit
        and ("/" in token or "+" in token)
        and not _is_path(token)
        and shannon_entropy(token) >= AWS_SECRET_MIN_ENTROPY
    ):
        return (span,)
    return ()


_ENTROPY_PIECE = _c(r"[A-Za-z0-9+/_\-]{20,}+=*+")
_UUID = _c(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX = frozenset("0123456789abcdefABCDEF")


def base64_entropy_threshold(length: int) -> float:
    return min(BASE64_ENTROPY_CAP, BASE64_ENTROPY_SLOPE * math.log2(length))


def is_high_entropy(token: str) -> bool:
    """The HIGH_ENTROPY decision for one candidate token (padding included or not).

    Pure, so tokens of ordinary length are cached: conversations resend their history.
    """
    if len(token) <= 256:
        return _is_high_entropy_cached(token)
    return _is_high_entropy(token)


@functools.lru_cache(maxsize=16384)
def _is_high_entropy_cached(token: str) -> bool:
    return _is_high_entropy(token)


def _is_high_entropy(token: str) -> bool:
    token = token.rstrip("=")
    if len(token) < HIGH_ENTROPY_MIN_LENGTH:
        return False
    if not any(ch.isdigit() for ch in token) or not any(ch.isalpha() for ch in token):
        return False
    if _fullmatch(_UUID, token):
        return False
    if _sequential_share(token) >= 0.5:
        return False  # ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789
    if all(ch in _HEX for ch in token):
        return shannon_entropy(token) >= HEX_MIN_ENTROPY
    if "/" in token and not any(ch.isupper() for ch in token):
        return False  # a lower-case path, not base64
    if _word_coverage(token) >= WORD_COVERAGE_LIMIT:
        return False  # PytestRemovedIn10Warning, issuecomment-2106349096: words and numbers
    if token.startswith(PROVIDER_ID_PREFIXES):
        return False  # toolu_01…, msg_01…, chatcmpl-…: object ids the LLM APIs themselves issue
    if len(token) >= MEDIA_MIN_LENGTH and is_media_base64(token):
        return False  # an image or document as base64 (a tool's input): media bytes, not a key
    return shannon_entropy(token) >= base64_entropy_threshold(len(token))


def _sequential_share(token: str) -> float:
    """Share of `token` in runs of 4+ consecutive code points (abcd, 0123, ZYXW)."""
    run = 1
    total = 0
    for prev, cur in itertools.pairwise(token):
        if abs(ord(cur) - ord(prev)) == 1:
            run += 1
        else:
            if run >= 4:
                total += run
            run = 1
    if run >= 4:
        total += run
    return total / len(token)


_WORDISH = _c(r"[A-Z][a-z]{2,}|[a-z]{3,}|(?<![A-Za-z0-9])[A-Z]{3,}(?![A-Za-z0-9])")
_VOWELS = frozenset("aeiouyAEIOUY")


def _word_coverage(token: str) -> float:
    """Share of `token` in runs that read like words (a vowel, 3+ letters) or like numbers."""
    covered = 0
    for m in _all(_WORDISH, token):
        start, end = m.span()
        # A word has a vowel; a whole snake_case or kebab-case segment reads as one without
        # (grpc_status).
        whole_segment = (start == 0 or token[start - 1] in "_-") and (end == len(token) or token[end] in "_-")
        if whole_segment or any(ch in _VOWELS for ch in m.group()):
            covered += end - start
    covered += sum(m.end() - m.start() for m in _all(_NUMBER_RUN, token))
    return covered / len(token)


_NUMBER_RUN = _c(
    r"[0-9]{4,}|(?<![A-Za-z0-9])[0-9]{2,3}(?![A-Za-z0-9])|(?<=[A-Za-z])[0-9]{1,3}(?=[A-Z_\-]|\Z)"
)


def _high_entropy(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    # `=` is base64 padding at the end of a token and an assignment inside a run
    # ("access_token=eyJ…"): each piece is judged alone, with its trailing padding.
    start = span[0]
    if start > 0 and text[start - 1] == "\\":
        # "\x12grpc_status_filter": an escape sequence, then the token.
        escape = _match(_ESCAPE, text, start, span[1])
        if escape is not None:
            start = escape.end()
    for piece in _all(_ENTROPY_PIECE, text, start, span[1]):
        value = piece.group()
        if len(value) >= MEDIA_MIN_LENGTH and is_media_base64(value):
            continue  # an image or document as base64, before any `/` in it is taken for a path
        if "/" in value and _is_path(value):
            # A URL or file path: only a long segment of it can be a secret.
            for segment in _all(_PATH_SEGMENT, text, piece.start(), piece.end()):
                if is_high_entropy(segment.group()):
                    yield segment.span()
        elif is_high_entropy(value):
            yield piece.span()


_PATH_SEGMENT = _c(r"[^/]{20,}+")
_ESCAPE = _c(r"x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3}|[nrtabfv]")
_PLAIN_WORD = _c(r"[A-Za-z][a-z]{2,}|[a-z]{3,}")


def _is_path(token: str) -> bool:
    """At least two `/`-separated segments are plain words: a path, not base64 with slashes."""
    words = 0
    for segment in token.split("/"):
        if _fullmatch(_PLAIN_WORD, segment) and any(ch in _VOWELS for ch in segment):
            words += 1
    return words >= 2


# SECRET_ASSIGNMENT ----------------------------------------------------------------------------

_SECRET_WORDS = frozenset(
    {
        "password", "passwd", "passphrase", "pass", "pwd", "secret", "token",
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
    }
)  # fmt: skip
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
_SEGMENTS = _c(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z\u00f1]+|[A-Z]+|[0-9]+")


# `pass` alone is an English verb and a Python keyword: it names a secret only as the whole key,
# in an upper-case configuration name (DB_PASS), or after one of these.
_PASS_QUALIFIERS = frozenset(
    {
        "db", "database", "user", "admin", "root", "mysql", "postgres", "pg", "redis", "smtp",
        "mail", "ftp", "sftp", "ldap", "key", "api", "app", "service", "sql", "mongo", "amqp",
        "rabbit", "proxy", "wifi", "vpn", "login", "my",
    }
)  # fmt: skip
# Secret words too common in prose and code to stand behind a space or in a comparison alone.
_WEAK_WORDS = frozenset({"pass", "pwd", "auth", "authorization"})

WEAK, STRONG = 1, 2


@functools.lru_cache(maxsize=4096)
def secret_key_strength(key: str) -> int:
    """0 when `key` does not name a secret; WEAK (`db_pass`, `auth`) or STRONG (`password`, `apiKey`).

    A key names a secret when a segment is a secret noun, and no segment after it makes the key
    a property of the secret (`secret_name`, `token_url`) nor one before it a public or counted
    thing (`public_key`, `max_tokens`).
    """
    segments = [m.group().lower() for m in _all(_SEGMENTS, key)]
    hits: list[int] = []
    strength = 0
    for i, seg in enumerate(segments):
        if seg in _NOT_SECRET_WORDS:
            continue
        if seg == "pass" and not (
            len(segments) == 1 or key.isupper() or (i > 0 and segments[i - 1] in _PASS_QUALIFIERS)
        ):
            continue
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


_SCHEME = _c(r"(?i)(?:bearer|basic|token|digest|api-?token|api-?key|bot|oauth|jwt|ssws|sso-key)[ \t]+")
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
_REFERENCE = _c(
    r"\$\{[^}]*\}?|\$\([^)]*\)?|\$[A-Z_][A-Z0-9_]*|\$[a-z_][a-z0-9_]*|\{\{.*|<%.*|%\(.*|#\{.*"
    r"|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?:[(\[].*)?|[A-Za-z_][A-Za-z0-9_]*[(\[].*"
    # a multi-word identifier: a variable, not a value (user_input, getPassword, ShrinkPass)
    r"|[a-z]+(?:_[a-z]+)+|[a-z]+(?:[A-Z][a-z]+)+|(?:[A-Z][a-z]+){2,}"
)
_CONTINUATION = _c(r"[ \t]+([^\s\"'`:=#]{1,256}+)")
_TRAILING_PUNCTUATION = ".,;:!?)]}"
# Unquoted, these are variables being passed around (`password=password`, `token = value`).
_VARIABLE_NAMES = frozenset(
    {
        "value", "val", "key", "secret", "password", "passwd", "pwd", "token", "auth", "creds",
        "credentials", "credential", "self", "data", "result", "config", "settings", "env",
        "args", "kwargs", "options", "params", "apikey", "api_key",
    }
)  # fmt: skip
_COLOR = _c(r"#(?:[0-9a-fA-F]{3,4}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})")
# After `key:`, an identifier followed by `|`, `=`, `,`, `)` or `]` is a type annotation.
_ANNOTATION_TAIL = _c(r"[ \t]+[|=]|[,)\]]")


_FUNCTION_WORDS = frozenset(
    {
        "the", "a", "an", "this", "that", "these", "those", "it", "its", "to", "of", "for",
        "with", "is", "are", "was", "be", "if", "when", "which", "and", "or", "in", "on", "at",
        "by", "from", "as", "not", "all", "each", "any", "some", "see", "use", "used", "must",
        "should", "will", "can", "may", "optional", "required", "defaults", "default",
    }
)  # fmt: skip
_SETTERS = frozenset({"assign", "set", "update", "put"})
_SECRET_CALL = _c(
    r"(?:(?:api|access|private|client|secret|auth|db)_)?(?:secrete?|password|passwd|token|key|credentials?)"
)
_COMPARISONS = frozenset({"==", "===", "!=", "!=="})
_NAME_LIKE = _c(r"[a-z][a-z0-9]*+(?:[_\-.][a-z0-9]++)*+")
_CONSTANT = _c(r"[a-z]++(?:_[a-z]++)++|[a-z]++(?:[A-Z][a-z]++)++|(?:[A-Z][a-z]++){2,}+|[A-Z]++(?:_[A-Z]++)++")


def _value_ok(value: str, *, quoted: bool) -> bool:
    """The checks every form shares: something that can be a secret, not a placeholder."""
    bare = value.strip().rstrip(_TRAILING_PUNCTUATION)
    if len(bare) < 3 or not any(ch.isalnum() for ch in bare):
        return False
    if bare.lower() in _VALUE_STOPWORDS or _is_mask(bare) or _fullmatch(_COLOR, bare):
        return False
    if value[0] in "<{[" or value.startswith(("${", "$(", "{{", "<%", "%(", "#{")):
        return False
    # The name of a secret field ("refresh_token", "api-key", "ANTHROPIC_API_KEY") or another
    # identifier-shaped constant ("receive_message", "clientAuth") is not a secret.
    if secret_key_strength(bare) and _fullmatch(_NAME_LIKE, bare.lower()):
        return False
    return not _fullmatch(_CONSTANT, bare)


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
    return _fullmatch(_REFERENCE, bare) is not None


def _strong_value(value: str) -> bool:
    """For the forms that prose and code also produce (`pass "x"`, `token == "integer"`): only a
    value that reads as neither a word nor an identifier counts."""
    bare = value.rstrip(_TRAILING_PUNCTUATION)
    if len(bare) < 6 or (bare.isalpha() and (bare.islower() or bare.istitle())):
        return False
    return not _fullmatch(_REFERENCE, bare)


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


def _secret_assignment(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
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
        if any(ch.isupper() for ch in key) or not (last in _SETTERS or _fullmatch(_SECRET_CALL, last)):
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
        scheme = _match(_SCHEME, text, start, end)
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


def _bare_value(text: str, m: regex.Match[str], op: str, start: int, end: int) -> Span | None:
    """The span of an unquoted value, or None when the "value" is code, markup or prose."""
    if op in _COMPARISONS:
        return None  # comparing with a variable: code, not a value
    key_end = m.end("key")
    if op == ":":
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
        or (name.isidentifier() and _match(_ANNOTATION_TAIL, text, start + len(name), end + 4))
    ):
        return None  # a type annotation: `token: str | None`, `api_key: _KeyT,`
    # Trailing list/statement punctuation belongs to the syntax, not to the value.
    while end > start and text[end - 1] in ",;":
        end -= 1
    if op == ":" and m.group("scheme") is None:
        # YAML-style: an unquoted value runs to the end of the line.
        pos = end
        for _ in range(8):
            cont = _match(_CONTINUATION, text, pos, min(len(text), pos + 300))
            if cont is None:
                break
            pos = cont.end()
            end = cont.end(1)
            while end > start and text[end - 1] in ",;":
                end -= 1
        if _prose(text[start:end]):
            return None
    return start, end


def _secret_comparison(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
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


def _url_credentials(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    value = text[span[0] : span[1]]
    if value.startswith(("$", "{", "<", "[", "%")) or _is_mask(value):
        return ()
    return (span,)


VALIDATORS: dict[str, Validator] = {
    "token_body": _token_body,
    "openai_key": _openai_key,
    "private_key": _private_key,
    "email": _email,
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "iban": _iban,
    "card": _card,
    "ssn": _ssn,
    "ssn_plain": _ssn_plain,
    "phone": _phone,
    "aws_secret": _aws_secret,
    "high_entropy": _high_entropy,
    "secret_assignment": _secret_assignment,
    "secret_comparison": _secret_comparison,
    "url_credentials": _url_credentials,
}


# ---------------------------------------------------------------------------------------------
# Anchors: where in a long text a detector's pattern can match at all. The regex module spends
# about 100 ns on every position where a pattern's first character class matches; for patterns
# that start with a letter class that is every word of a text. Anchors find the few windows
# with C-speed `bytes` operations instead.

_TOKEN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-="
_IDENT_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"


def _class_table(chars: bytes) -> bytes:
    table = bytearray(b" " * 256)
    for ch in chars:
        table[ch] = ord("a")
    return bytes(table)


_TOKEN_TABLE = _class_table(_TOKEN_CHARS)
_IDENT_TABLE = _class_table(_IDENT_CHARS)
_SECRET_KEYWORDS = (b"pass", b"pwd", b"secret", b"token", b"key", b"auth", b"credential", b"contrase")
# The longest assignment: key and index (84), quotes and spaces around the operator (134), a
# scheme (20) and an escaped quoted value (2 + 2 x 1024 + 2).
_KEY_WINDOW = 2400


@dataclass(slots=True)
class _Scratch:
    """Per-call views of one text, computed on first use."""

    text: str
    _ascii: bytes | None = None
    _lower: bytes | None = None
    _ident: bytes | None = None
    _tokens: bytes | None = None
    cache: dict[str, list[Span]] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)

    def count(self, chars: str) -> int:
        """How many characters of the text are in `chars` (ASCII)."""
        if chars not in self._counts:
            ascii_ = self.ascii
            self._counts[chars] = len(ascii_) - len(ascii_.translate(None, chars.encode()))
        return self._counts[chars]

    def present(self, literals: Iterable[tuple[str, bytes]]) -> set[str]:
        """Which ASCII literals occur in the text."""
        text = self.text
        if len(text) <= 4096 or text.isascii():
            return {literal for literal, _ in literals if literal in text}
        # A long text with wide characters: searching its one-byte view is several times faster.
        ascii_ = self.ascii
        return {literal for literal, encoded in literals if encoded in ascii_}

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


def _token_runs_20(scratch: _Scratch) -> list[Span]:
    if "runs20" not in scratch.cache:
        scratch.cache["runs20"] = _runs(scratch.tokens, HIGH_ENTROPY_MIN_LENGTH)
    return scratch.cache["runs20"]


# What can follow an `@` in an address the EMAIL pattern accepts (labels, dots, "[dot]" forms),
# and what a local part is made of.
_DOMAIN_RUN = regex.compile(rb"[A-Za-z0-9.\-\[\](){} ]*")
_LOCAL_TABLE = _class_table(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
EMAIL_LOCAL_MAX = 64


def _at_starts(scratch: _Scratch) -> list[Span]:
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


def _token_runs_40(scratch: _Scratch) -> list[Span]:
    return [(s, e) for s, e in _token_runs_20(scratch) if e - s >= 40]


_AFTER_KEY = frozenset(b"\"'`\\] \t[")
_OPERATOR_START = frozenset(b":=(,!i\"'`@")


def _operator_follows(lower: bytes, end: int) -> bool:
    """Whether an assignment operator (or a quoted value) can follow an identifier ending at
    `end`: the pattern's own grammar, read cheaply, so most keyword hits in prose cost nothing."""
    # Only whitespace, quotes and one short index can stand between a key and its operator, so
    # this walk stays inside the gap after one identifier: linear over all identifiers.
    limit = len(lower)
    i = end
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


def _all_keyword_identifiers(scratch: _Scratch) -> list[Span]:
    """Every identifier with a secret keyword, whatever follows (`"value" == password)`)."""
    return _keyword_identifiers(scratch, any_follower=True)


def _keyword_identifiers(scratch: _Scratch, *, any_follower: bool = False) -> list[Span]:
    """Start of every identifier that contains a secret keyword and that an operator follows;
    windows for an anchored match."""
    cache_key = "identifiers" if any_follower else "keywords"
    if cache_key in scratch.cache:
        return scratch.cache[cache_key]
    lower, ident = scratch.lower, scratch.ident
    n = len(lower)
    starts: set[int] = set()
    for word in _SECRET_KEYWORDS:
        pos = lower.find(word)
        while pos >= 0:
            start = ident.rfind(b" ", max(0, pos - 64), pos) + 1
            if start == 0 and pos > 64:
                start = pos  # an identifier longer than any key: not a key
            end = ident.find(b" ", pos)
            if end < 0:
                end = n
            if start not in starts and (any_follower or _operator_follows(lower, end)):
                starts.add(start)
            if end >= n:
                break  # this identifier runs to the end of the text
            pos = lower.find(word, max(pos + 1, end))
    out = [(s, min(n, s + _KEY_WINDOW)) for s in sorted(starts)]
    scratch.cache[cache_key] = out
    return out


Anchor = Callable[[_Scratch], list[Span]]
ANCHORS: dict[str, Anchor] = {
    "token_runs_20": _token_runs_20,
    "at_starts": _at_starts,
    "token_runs_40": _token_runs_40,
    "keyword_identifiers": _keyword_identifiers,
    "all_keyword_identifiers": _all_keyword_identifiers,
}


def _merge(windows: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


# ---------------------------------------------------------------------------------------------
# The detectors

AWS_KEY_ID_PREFIXES = (
    "AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "APKA", "A3T",
)  # fmt: skip

_KEY = r"(?P<key>-{0,2}[A-Za-z_][A-Za-z0-9_.\-]{0,63})"
# Every repetition is bounded, so a match is at most _KEY_WINDOW characters long and the anchored
# windows of `_keyword_identifiers` can hold any of them.
_ASSIGNMENT = _c(
    r"(?<![A-Za-z0-9_.])" + _KEY + r"(?:\[[^\]\n]{0,16}\])?(?:\\?[\"'`])?[ \t]{0,64}"
    r"(?:(?P<op>:=|=>|===?|!==?|=|:|[ \t]is:?(?=[ \t]))[ \t]{0,64}@?"
    # "api_token", "value": a key and its value as arguments (getenv("api_token", "…"))
    r"|(?<=[\"'`][ \t]{0,64})(?P<comma>,)[ \t]{0,64}(?=\\?[\"'`])"
    r"|(?P<call>\()[ \t]{0,64}(?=\\?[\"'`])"  # secret("value")
    r"|(?<=[A-Za-z0-9_][ \t]{1,64})(?=\\?[\"'`]))"  # password "value"
    r"(?P<scheme>(?i:bearer|basic|token|digest|api-?token|api-?key|bot|oauth|jwt|ssws)[ \t]{1,8})?"
    r"(?:\\\"(?P<esc>(?:[^\"\\\n]|\\[^\"\n]){1,1024})\\\""
    r"|\"(?P<dq>(?:[^\"\\\n]|\\.){1,1024})\""
    r"|'(?P<sq>(?:[^'\\\n]|\\.){1,1024})'"
    r"|`(?P<bq>[^`\n]{1,1024})`"
    r"|(?P<bare>[^\s\"'`]{1,256}))"
)
_KEY_ONLY = _c(r"(?<![A-Za-z0-9_.])(?P<key>[A-Za-z_][A-Za-z0-9_.\-]{0,63})(?![A-Za-z0-9_.\-])")

DETECTORS: tuple[Detector, ...] = (
    Detector(
        "pem_private_key_header",
        "PRIVATE_KEY",
        _c(r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----"),
        validator="private_key",
        triggers=("-----BEGIN",),
    ),
    Detector(
        "jwt",
        "JWT",
        _c(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{7,}+\.ey[A-Za-z0-9_\-]{8,}+(?:\.[A-Za-z0-9_\-]*+)?"),
        triggers=("eyJ",),
    ),
    Detector(
        "anthropic_key",
        "ANTHROPIC_KEY",
        _c(r"(?<![A-Za-z0-9_\-])sk-ant-(?P<body>[A-Za-z0-9_\-]{20,}+)"),
        validator="token_body",
        triggers=("sk-ant-",),
    ),
    Detector(
        "openai_key",
        "OPENAI_KEY",
        _c(r"(?<![A-Za-z0-9_\-])sk-(?!ant-)(?:(?:proj|svcacct|admin|None)-)?(?P<body>[A-Za-z0-9_\-]{20,}+)"),
        validator="openai_key",
        triggers=("sk-",),
    ),
    Detector(
        "github_token",
        "GITHUB_TOKEN",
        _c(
            r"(?<![A-Za-z0-9_])(?:gh[pousr]_(?P<body>[A-Za-z0-9]{36,251})"
            r"|github_pat_(?P<pat>[A-Za-z0-9_]{36,244}))(?![A-Za-z0-9_])"
        ),
        validator="token_body",
        triggers=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    Detector(
        "slack_token",
        "SLACK_TOKEN",
        _c(
            r"(?<![A-Za-z0-9])(?:xox[a-z]\.xox[a-z]-[0-9]-[A-Za-z0-9]{60,}"
            r"|xoxe-[0-9]-[A-Za-z0-9]{60,}"
            r"|xox[a-z]-(?:[0-9]-)?[0-9]{6,}-(?:[0-9]{6,}-){0,3}[A-Za-z0-9]{8,}"
            r"|xapp-[0-9]-[A-Z0-9]{9,}-[0-9]{6,}-[A-Za-z0-9]{20,})(?![A-Za-z0-9\-])"
        ),
        triggers=("xox", "xapp-"),
    ),
    Detector(
        "slack_webhook",
        "SLACK_TOKEN",
        _c(r"https?://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/+\-]{16,}"),
        triggers=("hooks.slack.com",),
    ),
    Detector(
        "stripe_key",
        "STRIPE_KEY",
        _c(r"(?<![A-Za-z0-9_])[spr]k_(?:live|test|prod)_(?P<body>[A-Za-z0-9]{10,247})(?![A-Za-z0-9_])"),
        validator="token_body",
        triggers=("_live_", "_test_", "_prod_"),
    ),
    Detector(
        "google_api_key",
        "GOOGLE_API_KEY",
        _c(r"(?<![A-Za-z0-9_\-])AIza(?P<body>[0-9A-Za-z_\-]{35})(?![A-Za-z0-9_\-])"),
        validator="token_body",
        triggers=("AIza",),
    ),
    Detector(
        "aws_access_key_id",
        "AWS_ACCESS_KEY",
        _c(
            r"(?<![A-Za-z0-9])(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA)"
            r"(?P<body>[A-Z0-9]{16})(?![A-Za-z0-9])"
        ),
        validator="token_body",
        triggers=AWS_KEY_ID_PREFIXES,
    ),
    Detector(
        "aws_secret_access_key",
        "AWS_ACCESS_KEY",
        _c(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])"),
        validator="aws_secret",
        min_length=40,
        anchor="token_runs_40",
    ),
    Detector(
        "secret_assignment",
        "SECRET_ASSIGNMENT",
        _ASSIGNMENT,
        validator="secret_assignment",
        context=_SECRET_KEYWORDS,
        min_length=5,
        anchor="keyword_identifiers",
        anchored=True,
    ),
    Detector(
        "secret_comparison",
        "SECRET_ASSIGNMENT",
        _KEY_ONLY,
        validator="secret_comparison",
        triggers=("==", "!="),
        context=_SECRET_KEYWORDS,
        min_length=8,
        anchor="all_keyword_identifiers",
        anchored=True,
    ),
    Detector(
        "url_credentials",
        "SECRET_ASSIGNMENT",
        _c(r"(?<=[A-Za-z0-9])://[^\s:@/\"'<>]{0,128}:(?P<pw>[^\s:@/\"'<>]{1,128})@(?=[A-Za-z0-9\[])"),
        group="pw",
        validator="url_credentials",
        triggers=("://",),
    ),
    Detector(
        "email",
        "EMAIL",
        _c(
            r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]{0,63}[A-Za-z0-9_%+\-]@"
            r"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
            r"(?:\.|[ ]?[\[({][ ]?(?i:dot)[ ]?[\])}][ ]?))+"
            r"(?:[A-Za-z]{2,63}|xn--[A-Za-z0-9\-]{1,59})(?![A-Za-z0-9\-])"
        ),
        validator="email",
        triggers=("@",),
        anchor="at_starts",
        anchored=True,
    ),
    Detector(
        "iban",
        "IBAN",
        # Starts at the check digits: a digit class scans fast; the validator adds the country.
        _c(r"(?<=(?<![A-Za-z0-9])[A-Za-z]{2})[0-9]{2}(?: ?[A-Za-z0-9]){11,32}+"),
        validator="iban",
        requires=(Requirement(DIGITS, 2),),
        min_length=15,
    ),
    Detector(
        "credit_card",
        "CREDIT_CARD",
        _c(r"(?<![A-Za-z0-9_])[0-9](?:[ \-.]?[0-9]){12,}+(?![A-Za-z0-9_])"),
        validator="card",
        requires=(Requirement(DIGITS, 13),),
        min_length=13,
    ),
    Detector(
        "ssn",
        "SSN",
        _c(r"(?<![A-Za-z0-9_.\-])[0-9]{3}([\- .])[0-9]{2}\1[0-9]{4}(?![A-Za-z0-9_]|[\-.][0-9])"),
        validator="ssn",
        requires=(Requirement(DIGITS, 9),),
        min_length=11,
    ),
    Detector(
        "ssn_plain",
        "SSN",
        _c(
            r"(?<![A-Za-z0-9_.\-])[0-9]{3}(?:[0-9]{6}|-[0-9]{6}|[0-9]{2}-[0-9]{4})"
            r"(?![A-Za-z0-9_]|[\-.][0-9])"
        ),
        validator="ssn_plain",
        requires=(Requirement(DIGITS, 9),),
        context=(b"ss", b"soc", b"tax", b"tin"),
        min_length=9,
    ),
    Detector(
        "ipv4",
        "IP",
        _c(
            r"(?<![A-Za-z0-9_.])(?P<addr>(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
            r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))"
            r"(?:/(?:3[0-2]|[12]?[0-9]))?(?![0-9]|\.[0-9]|[A-Za-z_])"
        ),
        validator="ipv4",
        requires=(Requirement(DIGITS, 4), Requirement(".", 3)),
        min_length=7,
    ),
    Detector(
        "ipv6",
        "IP",
        _c(
            r"(?<![A-Za-z0-9_:.])(?P<addr>(?:[0-9A-Fa-f]{1,4}|:):[0-9A-Fa-f:]{0,38}"
            r"(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3})?(?:%[A-Za-z0-9_.\-]{1,32})?)"
            r"(?P<cidr>/[0-9]{1,3})?(?![A-Za-z0-9_:]|\.[0-9])"
        ),
        validator="ipv6",
        requires=(Requirement(":", 2),),
    ),
    Detector(
        "phone",
        "PHONE",
        # A run of digits and phone punctuation that starts a token; the validator reads the
        # numbers in it. (A first character class, not a lookbehind, lets the engine skip
        # ahead to the next digit: ten times faster on prose.)
        _c(r"[+(0-9](?<![A-Za-z0-9_+.\-/].)[0-9 ().\-/+\u00a0]{6,}+"),
        validator="phone",
        requires=(Requirement(DIGITS, 7),),
        min_length=7,
    ),
    Detector(
        "high_entropy",
        "HIGH_ENTROPY",
        _c(r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/=_\-]{20,}+"),
        validator="high_entropy",
        min_length=HIGH_ENTROPY_MIN_LENGTH,
        anchor="token_runs_20",
    ),
)

assert all(d.kind in PRIORITY for d in DETECTORS)
assert all(d.validator is None or d.validator in VALIDATORS for d in DETECTORS)
assert all(d.anchor is None or d.anchor in ANCHORS for d in DETECTORS)


# ---------------------------------------------------------------------------------------------
# Normalisation: fold what changes no offsets, strip what hides a value, map spans back.

_FOLD_PRESENT = _c(r"[\uff01-\uff5e\u3000]")
_FOLD_TABLE = {0xFF01 + i: 0x21 + i for i in range(94)} | {0x3000: 0x20}
_ZERO_WIDTH = _c(r"[\u00ad\u200b-\u200f\u2060-\u2064\ufeff]")


@dataclass(frozen=True, slots=True)
class _Prepared:
    text: str
    # For each removed character i (in order): the stripped index of the character after it.
    shifts: tuple[int, ...] = ()

    def original(self, index: int) -> int:
        return index + bisect.bisect_right(self.shifts, index)

    def span(self, start: int, end: int) -> Span:
        if not self.shifts:
            return start, end
        return self.original(start), self.original(end - 1) + 1


_ZERO_WIDTH_CHARS = "\u00ad\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff"


def _prepare(text: str) -> _Prepared:
    if text.isascii():
        return _Prepared(text)
    if _search(_FOLD_PRESENT, text) is not None:
        text = text.translate(_FOLD_TABLE)
    if not any(ch in text for ch in _ZERO_WIDTH_CHARS):
        return _Prepared(text)
    removed = [m.start() for m in _all(_ZERO_WIDTH, text)]
    if not removed:
        return _Prepared(text)
    stripped = _ZERO_WIDTH.sub("", text, timeout=_timeout(len(text)))
    return _Prepared(stripped, tuple(pos - i for i, pos in enumerate(removed)))


# ---------------------------------------------------------------------------------------------
# The catalog


class Catalog:
    """The detectors of some sets, compiled once; `detect` is safe to call from many threads."""

    def __init__(self, sets: tuple[str, ...], options: Options) -> None:
        kinds = {k for s in sets for k in SETS[s]}
        self.sets = sets
        self.options = options
        self.kinds: frozenset[str] = frozenset(kinds)
        self.detectors: tuple[Detector, ...] = tuple(d for d in DETECTORS if d.kind in kinds)
        self._triggers: tuple[tuple[str, bytes], ...] = tuple(
            (t, t.encode("ascii")) for t in sorted({t for d in self.detectors for t in d.triggers})
        )

    @classmethod
    def for_sets(cls, sets: Iterable[str], *, skip_documentation_ips: bool = False) -> Catalog:
        names = tuple(sorted(set(sets)))
        unknown = [s for s in names if s not in SETS]
        if unknown:
            raise ValueError(f"unknown catalog set(s): {', '.join(unknown)}")
        return _catalog_for(names, skip_documentation_ips)

    def __repr__(self) -> str:
        return f"Catalog(sets={self.sets!r}, options={self.options!r})"

    def detect(self, text: str) -> list[Finding]:
        """Every validated finding in `text`, sorted by start; same-kind overlaps merged."""
        if len(text) < MIN_FINDING_LENGTH or not self.detectors:
            return []
        return list(MEMO(("catalog", self.sets, self.options), text, self._detect_checked))

    def _detect_checked(self, text: str) -> tuple[Finding, ...]:
        # A regex timeout is wall-clock time: a process starved of CPU (or of the GIL) for a
        # quarter of a second times out on a few bytes. One second try tells such a stall from a
        # pattern that runs away on its input, which times out again.
        for attempt in range(2):
            try:
                return tuple(self._detect(text))
            except TimeoutError:
                if attempt:
                    raise DetectionError("catalog regex timed out") from None
        raise AssertionError("unreachable")

    def _detect(self, original: str) -> list[Finding]:
        prepared = _prepare(original)
        text = prepared.text
        length = len(text)
        scratch = _Scratch(text)
        present = scratch.present(self._triggers)
        spans: dict[str, list[Span]] = {}
        for detector in self.detectors:
            if length < detector.min_length:
                continue
            if detector.triggers and present.isdisjoint(detector.triggers):
                continue
            if detector.requires and not _requirements_met(detector.requires, scratch):
                continue
            if detector.context and not any(w in scratch.lower for w in detector.context):
                continue
            found = list(self._run(detector, text, scratch))
            if found:
                spans.setdefault(detector.kind, []).extend(found)
        findings: list[Finding] = []
        for kind, kind_spans in spans.items():
            priority = PRIORITY_BASE + PRIORITY.index(kind)
            for start, end in _merge_overlaps(kind_spans):
                start, end = prepared.span(start, end)
                findings.append(Finding(kind, start, end, priority=priority))
        findings.sort(key=lambda f: (f.start, f.end, f.priority))
        return findings

    def _run(self, detector: Detector, text: str, scratch: _Scratch) -> Iterator[Span]:
        validate = VALIDATORS[detector.validator] if detector.validator else _accept
        if detector.anchor is None:
            matches: Iterable[regex.Match[str]] = _all(detector.pattern, text)
        elif detector.anchored:
            matches = _anchored(detector.pattern, text, ANCHORS[detector.anchor](scratch))
        else:
            matches = _windowed(detector.pattern, text, ANCHORS[detector.anchor](scratch))
        for m in matches:
            span = m.span(detector.group)
            for start, end in validate(text, m, span, self.options):
                if end > start:
                    yield (start, end)


def _requirements_met(requires: tuple[Requirement, ...], scratch: _Scratch) -> bool:
    return all(scratch.count(r.chars) >= r.at_least for r in requires)


def _anchored(pattern: regex.Pattern[str], text: str, windows: list[Span]) -> Iterator[regex.Match[str]]:
    for start, end in windows:
        m = _match(pattern, text, start, end)
        if m is not None:
            yield m


def _windowed(pattern: regex.Pattern[str], text: str, windows: list[Span]) -> Iterator[regex.Match[str]]:
    for start, end in _merge(windows):
        yield from _all(pattern, text, start, end)


def _merge_overlaps(spans: list[Span]) -> list[Span]:
    """Union of overlapping spans of one kind: the longest sensible span, nothing left out."""
    merged: list[Span] = []
    for start, end in sorted(set(spans)):
        if merged and start < merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


@functools.lru_cache(maxsize=64)
def _catalog_for(sets: tuple[str, ...], skip_documentation_ips: bool) -> Catalog:
    return Catalog(sets, Options(skip_documentation_ips=skip_documentation_ips))
