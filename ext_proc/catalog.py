"""The pattern catalog (SPEC §4): what has the shape of personal data or a secret.

Where it sits: the dialect walk hands every string leaf of a request (and the output gate every
piece of model output) to `Catalog.detect`; the findings it returns, together with the declared
subjects' findings, go to redaction, which resolves overlaps (subjects first, then longer spans,
then `Finding.priority`) and writes placeholders right to left. The catalog never returns text,
only kinds and spans, so nothing downstream can log a value by accident.

Detectors are data: a frozen `Detector` per pattern (kind, compiled `regex` pattern, the capture
group that is the value, an optional validator named in the explicit `VALIDATORS` registry, the
literals without which it cannot match, and an optional anchor from `ANCHORS` that finds the few
windows worth scanning). `Catalog.for_sets` picks the detectors of the policy's sets once and
caches the result.

Rules and decisions
-------------------
* Every regex call passes `timeout=REGEX_TIMEOUT`; a timeout raises `DetectionError` (SPEC §11),
  never a silent skip.
* Cost is linear in the text: patterns have bounded or possessive repetition, windows found by the
  anchors are merged, and per-candidate work in validators is bounded.
* Before matching, full-width ASCII forms (U+FF01–FF5E) and the ideographic space are folded to
  ASCII one for one, and zero-width characters (U+00AD, U+200B–U+200F, U+2060–U+2064, U+FEFF)
  are removed; spans are mapped back to the caller's offsets, so `jo\u200bhn@acme.com` and a card
  typed in full-width digits are found and redacted whole.
* Overlapping findings of one kind are merged into their union (fail closed: no part of either
  span is left out). Findings of different kinds may overlap; the caller resolves them with
  `Finding.priority`, the index of the kind in `PRIORITY` (lower is more important):

  PRIVATE_KEY, JWT, ANTHROPIC_KEY, OPENAI_KEY, GITHUB_TOKEN, SLACK_TOKEN, STRIPE_KEY,
  GOOGLE_API_KEY, AWS_ACCESS_KEY, SECRET_ASSIGNMENT, EMAIL, IBAN, CREDIT_CARD, SSN, IP, PHONE,
  HIGH_ENTROPY.

  Specific credentials come before the generic assignment and the entropy heuristic; a card
  number wins over a phone reading of the same digits.

Per kind
--------
* EMAIL: ASCII local part and domain (IDN domains in punycode); `[dot]`/`(dot)` obfuscation in
  the domain is read as a dot.
* PHONE: candidates are digit groups with separators; phonenumbers decides. A number with an
  explicit `+` country code is valid in its own region; a number without one must be a valid US
  number, or a formatted NANP number (`(415) 555-0132`, `555-123-4567`: the shape alone is
  enough, fictional 555 numbers included), or start with a national trunk `0` and be valid in one
  of `TRUNK_REGIONS`. A bare digit run (no separators) counts only after a phone word (phone, tel,
  mobile, call, …) and never as a US fallback alone, so order ids, years, dates (`2024-01-15`,
  `12/05/2023`), year ranges, IPv4 and SSN shapes and card numbers are not phones.
* SSN: `AAA-GG-SSSS` with one consistent separator (dash, space or dot); area not 000, 666 or
  9xx, group not 00, serial not 0000. Nine plain digits (or partial dashes `078-051121`) count
  only after an SSN word (ssn, social security, ss#, …) within 48 characters before.
* IP: IPv4 with octet validation (no leading zeros, no 5th dotted group: `1.2.3.4.5` is a version
  or OID), optional CIDR; IPv6 in every form `ipaddress` accepts, compressed, embedded IPv4, zone
  ids and CIDR. The unspecified address `::` (alone or `::/n`) is not reported: it identifies no
  host and `::` is a token in C++, Rust, Ruby and Haskell. Documentation ranges (192.0.2.0/24,
  198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, and IPv4-mapped forms of the first three)
  are skipped only with `skip_documentation_ips=True`.
* IBAN: country code, check digits and BBAN, with or without single spaces; the length must match
  the country (`IBAN_LENGTHS`) and the mod-97 checksum must hold.
* CREDIT_CARD: 13–19 digits with spaces, dashes or (4-digit groups only) dots; the major
  industry digit must be 2–6 (or 1 for 15-digit UATP) and the Luhn check digit must be valid.
  A longer digit run is split at its separators and every Luhn-valid 13–19 digit window is found.
* AWS_ACCESS_KEY: key ids (AKIA, ASIA, ABIA, ACCA, AGPA, AIDA, AROA, AIPA, ANPA, ANVA, APKA,
  A3T…) and 40-character secret access keys. A 40-character `[A-Za-z0-9/+]` token counts when an
  aws/secret word stands within 64 characters before it on the same line and it mixes case and
  digits, or, with no context, when it mixes upper case, lower case, digits and `/` or `+` and
  its entropy is at least `AWS_SECRET_MIN_ENTROPY`. Documentation keys such as
  AKIAIOSFODNN7EXAMPLE are redacted (fail closed: the catalog cannot know a key is only an
  example); bodies made only of the mask characters x, X, *, # (`AKIAXXXXXXXXXXXXXXXX`) are
  placeholders and are not.
* PRIVATE_KEY: the PEM header line `-----BEGIN … PRIVATE KEY( BLOCK)-----` only, never the body
  (which HIGH_ENTROPY sees line by line); a header directly followed by its END line carries no
  key and is not reported.
* JWT: `eyJ…` header, `ey…` payload, optional signature (empty for alg none); shape only, so a
  truncated or damaged token is still redacted.
* OPENAI_KEY (`sk-`, `sk-proj-`, `sk-svcacct-`, `sk-admin-`; any `sk-` token of 20+ characters
  with a digit or capital, the shape used by many OpenAI-compatible providers), ANTHROPIC_KEY
  (`sk-ant-`), GITHUB_TOKEN (`ghp_ gho_ ghu_ ghs_ ghr_ github_pat_`), SLACK_TOKEN (`xox?-`,
  `xoxe.xox?-`, `xapp-` and hooks.slack.com webhook URLs), STRIPE_KEY (`sk_ rk_ pk_` with
  `live/test/prod`), GOOGLE_API_KEY (`AIza` + 35). Prefixes must start a token, so `sk-` inside
  "task-force" or "risk-assessment" does not match.
* SECRET_ASSIGNMENT: `key: value`, `key = value`, `key := value`, `key => value`, `"key":
  "value"`, comparisons (`key == "value"`, `"value" == key`), `key("value")`, `key "value"`,
  `key is value` (value with a digit or symbol), and `scheme://user:password@host`. The key must
  name a secret (password, passwd, pass, pwd, secret, token, credential(s), auth, authorization,
  an api/access/private/client/… key), not a property of one (`secret_name`, `token_url`,
  `max_tokens`, `public_key`, `csrf_token`). The finding covers the value only (an auth scheme
  such as `Bearer` is kept with the key); after `:` an unquoted value runs to the end of the
  line, as in YAML. Empty values, booleans and null, values with no letter or digit,
  mask-character placeholders and references (`${X}`, `$(cmd)`, `{{x}}`, `<your key>`, `$VAR`,
  `os.environ.x`) are not secrets.
* HIGH_ENTROPY: tokens of 20+ characters over `[A-Za-z0-9+/_-]` (`=` padding allowed) with at
  least one letter and one digit. Hex tokens (only 0-9a-f) count at Shannon entropy >=
  `HEX_MIN_ENTROPY` = 3.0 bits/char (so 20+ character hex digests and git object ids are
  redacted: they cannot be told from hex keys). Other tokens count at entropy >=
  min(`BASE64_ENTROPY_CAP` = 4.3, `BASE64_ENTROPY_SLOPE` = 0.88 × log2(length)): 3.80 at 20
  characters, 4.03 at 24, 4.23 at 28, 4.3 from 30 on (random base62 tokens of 32 characters
  score 4.3–4.8; identifiers and slugs 3.5–4.2). UUIDs (at most 4.09 bits) and lowercase paths
  are never flagged; ordinary words have no digit.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import phonenumbers
import regex

from ext_proc.errors import DetectionError
from ext_proc.findings import CATALOG_KINDS, SETS, Finding

# Per regex call. Read at call time so tests (and operators under load) can change it.
REGEX_TIMEOUT = 0.25

# Nothing in the catalog is shorter than this ("::1").
MIN_FINDING_LENGTH = 3

# Finding.priority = PRIORITY_BASE + index in PRIORITY. Values below PRIORITY_BASE belong to
# declared-subject matchers, which win over every catalog kind (ext_proc.redact).
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
class Detector:
    """One pattern of the catalog.

    `triggers`: literals of which at least one occurs in every match (a cheap `in` test skips
    the pattern otherwise); `digits` means a match contains an ASCII digit. `anchor` names an
    entry of `ANCHORS` that returns the windows of the text worth scanning, proven to contain
    every match (`anchored`: each window starts exactly where a match would start).
    """

    name: str
    kind: str
    pattern: regex.Pattern[str]
    group: int | str = 0
    validator: str | None = None
    triggers: tuple[str, ...] = ()
    digits: bool = False
    min_length: int = MIN_FINDING_LENGTH
    anchor: str | None = None
    anchored: bool = False


def _c(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    return regex.compile(pattern, flags | regex.VERSION0)


# ---------------------------------------------------------------------------------------------
# Shared helpers


def _finditer(pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None):
    return pattern.finditer(
        text, pos, len(text) if endpos is None else endpos, timeout=REGEX_TIMEOUT
    )


def _search(pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None):
    return pattern.search(text, pos, len(text) if endpos is None else endpos, timeout=REGEX_TIMEOUT)


def _match(pattern: regex.Pattern[str], text: str, pos: int = 0, endpos: int | None = None):
    return pattern.match(text, pos, len(text) if endpos is None else endpos, timeout=REGEX_TIMEOUT)


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


_DIGITS = frozenset("0123456789")


def _digits_of(value: str) -> str:
    return "".join(ch for ch in value if ch in _DIGITS)


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
    ipaddress.ip_network(n)
    for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
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
    n = len(digits)
    if not 13 <= n <= 19:
        return False
    first = digits[0]
    # Major industry identifier: payment cards start with 2-6; 1 is UATP (15 digits).
    if first == "1":
        return n == 15
    return first in "23456"


_GROUP_RE = _c(r"[0-9]+")


def _card(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Luhn-valid windows of whole digit groups inside a run of digits and separators."""
    groups = [g.span() for g in _finditer(_GROUP_RE, text, span[0], span[1])]
    k = len(groups)
    i = 0
    while i < k:
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
            i = found
        else:
            i += 1


_SSN_CONTEXT = _c(r"(?i)\b(?:ssn|ss\s?#|soc(?:ial)?[\s.\-]*sec(?:urity)?|taxpayer|tin)\b")


def _ssn_parts_ok(digits: str) -> bool:
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return not (
        area in ("000", "666") or area[0] == "9" or group == "00" or serial == "0000"
    )


def _ssn(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    return (span,) if _ssn_parts_ok(_digits_of(text[span[0] : span[1]])) else ()


def _ssn_plain(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    if not _ssn_parts_ok(_digits_of(text[span[0] : span[1]])):
        return ()
    if _search(_SSN_CONTEXT, text, max(0, span[0] - 48), span[0]) is None:
        return ()
    return (span,)


_PHONE_CONTEXT = _c(
    r"(?i)(?:phone|tel|telephone|mobile|cell|call|fax|sms|whatsapp|contact|ring|dial"
    r"|t[ée]l[ée]phone|telefon|tel[ée]fono|m[óo]vil|handy|num[ée]ro|电话|手机|電話)"
)
_DATE_LIKE = _c(
    r"(?:[0-9]{4}[-/.][0-9]{1,2}[-/.][0-9]{1,2}|[0-9]{1,2}[-/.][0-9]{1,2}[-/.][0-9]{2,4}"
    r"|(?:19|20)[0-9]{2}\s?[-/]\s?(?:19|20)?[0-9]{2}|[0-9]{1,3}(?:\.[0-9]{1,3}){3})"
)
_SSN_SHAPE = _c(r"[0-9]{3}([- .])[0-9]{2}\1[0-9]{4}")
_NANP_SHAPE = _c(r"(?:\+?1[ .\-]?)?(?:\([0-9]{3}\)[ ]?|[0-9]{3}([ .\-]))[0-9]{3}[ .\-][0-9]{4}")
_WS_RUN = _c(r"[^ \u00a0]+")


def _phone_valid(number: str, region: str | None) -> bool:
    try:
        parsed = phonenumbers.parse(number, region)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(parsed)


def _phone_ok(window: str, has_context: bool) -> bool:
    digits = _digits_of(window)
    if not 7 <= len(digits) <= 15:
        return False
    if window.count("(") != window.count(")"):
        return False
    if _DATE_LIKE.fullmatch(window, timeout=REGEX_TIMEOUT):
        return False
    if _SSN_SHAPE.fullmatch(window, timeout=REGEX_TIMEOUT):
        return False
    if window.startswith("+"):
        return _phone_valid(window, None)
    if window == digits:
        # A bare digit run is an id, an amount or a timestamp unless a phone word precedes it.
        return has_context and any(_phone_valid(window, r) for r in CONTEXT_REGIONS)
    if _NANP_SHAPE.fullmatch(window, timeout=REGEX_TIMEOUT):
        return True
    groups = [len(g) for g in _GROUP_RE.findall(window, timeout=REGEX_TIMEOUT)]
    if sum(1 for g in groups if g == 1) > 1:
        return False  # "0 1 2 3 4 5 6": a row of numbers, not a phone
    if "." in window and (digits[0] != "0" or "/" in window or max(groups) > 4):
        # Dotted digit groups are versions, addresses and CIDR blocks, except a national
        # number in dotted pairs (01.42.68.53.00) or NANP shape (handled above).
        return False
    if _phone_valid(window, "US"):
        return True
    if digits[0] == "0":
        return any(_phone_valid(window, r) for r in TRUNK_REGIONS)
    return False


def _phone(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Valid numbers among the whitespace-separated chunks of a candidate, longest first."""
    has_context = _search(_PHONE_CONTEXT, text, max(0, span[0] - 40), span[0]) is not None
    chunks = [c.span() for c in _finditer(_WS_RUN, text, span[0], span[1])]
    k = len(chunks)
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
                yield (start, end)
                i = j
                break
        else:
            i += 1


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
    """The HIGH_ENTROPY decision for one candidate token (padding included or not)."""
    token = token.rstrip("=")
    if len(token) < HIGH_ENTROPY_MIN_LENGTH:
        return False
    if not any(ch.isdigit() for ch in token) or not any(ch.isalpha() for ch in token):
        return False
    if _UUID.fullmatch(token, timeout=REGEX_TIMEOUT):
        return False
    if all(ch in _HEX for ch in token):
        return shannon_entropy(token) >= HEX_MIN_ENTROPY
    if "/" in token and not any(ch.isupper() for ch in token):
        return False  # a lower-case path, not base64
    if _word_coverage(token) >= WORD_COVERAGE_LIMIT:
        return False  # PytestRemovedIn10Warning, issuecomment-2106349096: words and numbers
    return shannon_entropy(token) >= base64_entropy_threshold(len(token))


_WORDISH = _c(r"[A-Z]?[a-z]{3,}|(?<![A-Za-z0-9])[A-Z]{3,}(?![A-Za-z0-9])")
_VOWELS = frozenset("aeiouyAEIOUY")


def _word_coverage(token: str) -> float:
    """Share of `token` in runs that read like words (a vowel, 3+ letters) or like numbers."""
    covered = 0
    for m in _WORDISH.finditer(token, timeout=REGEX_TIMEOUT):
        if any(ch in _VOWELS for ch in m.group()):
            covered += m.end() - m.start()
    covered += sum(len(d) for d in _NUMBER_RUN.findall(token, timeout=REGEX_TIMEOUT))
    return covered / len(token)


_NUMBER_RUN = _c(r"(?<![A-Za-z0-9])[0-9]{2,}(?![A-Za-z0-9])|(?<=[A-Za-z])[0-9]{1,3}(?=[A-Z_\-]|\Z)")


def _high_entropy(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    # `=` is base64 padding at the end of a token and an assignment inside a run
    # ("access_token=eyJ…"): each piece is judged alone, with its trailing padding.
    for piece in _finditer(_ENTROPY_PIECE, text, span[0], span[1]):
        value = piece.group()
        if "/" in value and _is_path(value):
            # A URL or file path: only a long segment of it can be a secret.
            for segment in _finditer(_PATH_SEGMENT, text, piece.start(), piece.end()):
                if is_high_entropy(segment.group()):
                    yield segment.span()
        elif is_high_entropy(value):
            yield piece.span()


_PATH_SEGMENT = _c(r"[^/]{20,}+")
_PLAIN_WORD = _c(r"[A-Za-z][a-z]{2,}|[a-z]{3,}")


def _is_path(token: str) -> bool:
    """At least two `/`-separated segments are plain words: a path, not base64 with slashes."""
    words = 0
    for segment in token.split("/"):
        if _PLAIN_WORD.fullmatch(segment, timeout=REGEX_TIMEOUT) and any(ch in _VOWELS for ch in segment):
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
        "created", "issuer", "audience", "results", "result", "strength", "rules",
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


def secret_key_strength(key: str) -> int:
    """0 when `key` does not name a secret; WEAK (`db_pass`, `auth`) or STRONG (`password`, `apiKey`).

    A key names a secret when a segment is a secret noun, and no segment after it makes the key
    a property of the secret (`secret_name`, `token_url`) nor one before it a public or counted
    thing (`public_key`, `max_tokens`).
    """
    segments = [s.lower() for s in _SEGMENTS.findall(key, timeout=REGEX_TIMEOUT)]
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
        elif not (
            seg in _SECRET_WORDS or seg.endswith(_SECRET_SUFFIXES) or seg.startswith(_SECRET_PREFIXES)
        ):
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


_SCHEME = _c(
    r"(?i)(?:bearer|basic|token|digest|api-?token|api-?key|bot|oauth|jwt|ssws|sso-key)[ \t]+"
)
_VALUE_STOPWORDS = frozenset(
    {
        "true", "false", "null", "none", "nil", "undefined", "yes", "no", "on", "off",
        "required", "optional", "string", "str", "int", "bool", "boolean", "number", "object",
        "any", "empty", "redacted", "hidden", "n/a", "na", "tbd", "todo",
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
_TRAILING_PUNCTUATION = ".,;:!?)"


def _value_ok(value: str, *, quoted: bool) -> bool:
    bare = value.rstrip(_TRAILING_PUNCTUATION)
    if len(bare) < 3 or not any(ch.isalnum() for ch in bare):
        return False
    if bare.lower() in _VALUE_STOPWORDS or _is_mask(bare):
        return False
    if value[0] in "<{[":
        return False
    if value.startswith(("${", "$(", "{{", "<%", "%(", "#{")):
        return False
    return quoted or not _REFERENCE.fullmatch(value, timeout=REGEX_TIMEOUT)


def _strong_value(value: str) -> bool:
    """For the forms that prose and code also produce (`pass "x"`, `token == "integer"`): only a
    value that does not read as a word counts."""
    bare = value.rstrip(_TRAILING_PUNCTUATION)
    return len(bare) >= 6 and not (bare.isalpha() and (bare.islower() or bare.istitle()))


_COMPARISONS = frozenset({"==", "===", "!=", "!=="})


def _secret_assignment(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    strength = secret_key_strength(m.group("key"))
    if not strength:
        return ()
    op = (m.group("op") or "").strip()
    loose = m.group("op") is None or op in _COMPARISONS or op.startswith("is")
    if loose and strength < STRONG:
        return ()  # `pass "x"`, `auth == "x"`: too common in prose and code
    for name in ("esc", "dq", "sq", "bq"):
        if m.group(name) is not None:
            start, end = m.span(name)
            quoted = True
            break
    else:
        start, end = m.span("bare")
        quoted = False
        if op in _COMPARISONS:
            return ()  # comparing with a variable: code, not a value
        if op == ":" and m.end("op") == start and "." in m.group("key"):
            return ()  # group:artifact coordinates (io.jsonwebtoken:jjwt), host:port, not YAML
        first_word = text[start:end].rstrip(_TRAILING_PUNCTUATION + "|[").lower()
        if op == ":" and first_word in _TYPE_NAMES:
            return ()  # a type annotation
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
    if quoted and m.group("scheme") is None:
        scheme = _match(_SCHEME, text, start, end)
        if scheme is not None and scheme.end() < end:
            start = scheme.end()
    value = text[start:end]
    if not _value_ok(value, quoted=quoted):
        return ()
    if loose and not _strong_value(value):
        return ()
    return ((start, end),)


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
_KEY_WINDOW = 64 + 1100  # longest key, operator and quoted value


@dataclass(slots=True)
class _Scratch:
    """Per-call views of one text, computed on first use."""

    text: str
    _ascii: bytes | None = None
    _lower: bytes | None = None
    _ident: bytes | None = None
    _tokens: bytes | None = None
    cache: dict[str, list[Span]] = field(default_factory=dict)

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


def _token_runs_40(scratch: _Scratch) -> list[Span]:
    return [(s, e) for s, e in _token_runs_20(scratch) if e - s >= 40]


def _keyword_identifiers(scratch: _Scratch) -> list[Span]:
    """Start of every identifier that contains a secret keyword; windows for an anchored match."""
    if "keywords" in scratch.cache:
        return scratch.cache["keywords"]
    lower, ident = scratch.lower, scratch.ident
    n = len(lower)
    starts: set[int] = set()
    for word in _SECRET_KEYWORDS:
        pos = lower.find(word)
        while pos >= 0:
            start = ident.rfind(b" ", max(0, pos - 64), pos) + 1
            if start == 0 and pos > 64:
                start = pos  # an identifier longer than any key: not a key
            starts.add(start)
            end = ident.find(b" ", pos)
            if end < 0:
                break  # this identifier runs to the end of the text
            pos = lower.find(word, max(pos + 1, end))
    out = [(s, min(n, s + _KEY_WINDOW)) for s in sorted(starts)]
    scratch.cache["keywords"] = out
    return out


Anchor = Callable[[_Scratch], list[Span]]
ANCHORS: dict[str, Anchor] = {
    "token_runs_20": _token_runs_20,
    "token_runs_40": _token_runs_40,
    "keyword_identifiers": _keyword_identifiers,
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

_B64URL = r"[A-Za-z0-9_\-]"

_KEY = r"(?P<key>-{0,2}[A-Za-z_][A-Za-z0-9_.\-]{0,63})"
_ASSIGNMENT = _c(
    r"(?<![A-Za-z0-9_.])" + _KEY + r"(?:\[[^\]\n]{0,16}\])?(?:\\?[\"'`])?[ \t]*"
    r"(?:(?P<op>:=|=>|===?|!==?|=|:|[ \t]is:?(?=[ \t]))[ \t]*@?"
    r"|(?<=[\"'`][ \t]*),[ \t]*(?=\\?[\"'`])"  # "api_token", "value": a key and its value as arguments
    r"|\([ \t]*(?=\\?[\"'`])"  # secret("value")
    r"|(?<=[A-Za-z0-9_][ \t]+)(?=\\?[\"'`]))"  # password "value"
    r"(?P<scheme>(?i:bearer|basic|token|digest|api-?token|api-?key|bot|oauth|jwt|ssws)[ \t]+)?"
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
            r"(?<![A-Za-z0-9])A(?:3T[A-Z0-9]|KIA|SIA|BIA|CCA|GPA|IDA|ROA|IPA|NPA|NVA|PKA)"
            r"(?P<body>[A-Z0-9]{16})(?![A-Za-z0-9])"
        ),
        validator="token_body",
        triggers=("A",),
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
        min_length=8,
        anchor="keyword_identifiers",
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
    ),
    Detector(
        "iban",
        "IBAN",
        # Starts at the check digits: a digit class scans fast; the validator adds the country.
        _c(r"(?<=(?<![A-Za-z0-9])[A-Za-z]{2})[0-9]{2}(?: ?[A-Za-z0-9]){11,32}+"),
        validator="iban",
        digits=True,
        min_length=15,
    ),
    Detector(
        "credit_card",
        "CREDIT_CARD",
        _c(r"(?<![A-Za-z0-9_])[0-9](?:[ \-.]?[0-9]){12,}+(?![A-Za-z0-9_])"),
        validator="card",
        digits=True,
        min_length=13,
    ),
    Detector(
        "ssn",
        "SSN",
        _c(r"(?<![A-Za-z0-9_.\-])[0-9]{3}([\- .])[0-9]{2}\1[0-9]{4}(?![A-Za-z0-9_]|[\-.][0-9])"),
        validator="ssn",
        digits=True,
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
        digits=True,
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
        digits=True,
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
        triggers=(":",),
    ),
    Detector(
        "phone",
        "PHONE",
        _c(
            r"(?<![A-Za-z0-9_+.\-/])(?=[+(]?[0-9][0-9 ().\-/\u00a0]{6})"
            r"(?:\+[ ]?)?\(?[0-9]{1,12}\)?"
            r"(?:(?:[ \u00a0]?[.\-/][ \u00a0]?|[ \u00a0]|(?<=\)))\(?[0-9]{1,12}\)?)*+"
            r"(?![A-Za-z0-9_]|[.\-/]?[0-9])"
        ),
        validator="phone",
        digits=True,
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


def _prepare(text: str) -> _Prepared:
    if text.isascii():
        return _Prepared(text)
    if _search(_FOLD_PRESENT, text) is not None:
        text = text.translate(_FOLD_TABLE)
    removed = [m.start() for m in _finditer(_ZERO_WIDTH, text)]
    if not removed:
        return _Prepared(text)
    stripped = _ZERO_WIDTH.sub("", text, timeout=REGEX_TIMEOUT)
    return _Prepared(stripped, tuple(pos - i for i, pos in enumerate(removed)))


# ---------------------------------------------------------------------------------------------
# The catalog


_HAS_DIGIT = _c(r"[0-9]")


class Catalog:
    """The detectors of some sets, compiled once; `detect` is safe to call from many threads."""

    def __init__(self, sets: tuple[str, ...], options: Options) -> None:
        kinds = {k for s in sets for k in SETS[s]}
        self.sets = sets
        self.options = options
        self.kinds: frozenset[str] = frozenset(kinds)
        self.detectors: tuple[Detector, ...] = tuple(d for d in DETECTORS if d.kind in kinds)

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
        try:
            return self._detect(text)
        except TimeoutError:
            raise DetectionError("catalog regex timed out") from None

    def _detect(self, original: str) -> list[Finding]:
        prepared = _prepare(original)
        text = prepared.text
        scratch = _Scratch(text)
        has_digit: bool | None = None
        spans: dict[str, list[Span]] = {}
        for detector in self.detectors:
            if len(text) < detector.min_length:
                continue
            if detector.triggers and not any(t in text for t in detector.triggers):
                continue
            if detector.digits:
                if has_digit is None:
                    has_digit = _search(_HAS_DIGIT, text) is not None
                if not has_digit:
                    continue
            found = spans.setdefault(detector.kind, [])
            found.extend(self._run(detector, text, scratch))
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
            matches: Iterable[regex.Match[str]] = _finditer(detector.pattern, text)
        elif detector.anchored:
            matches = _anchored(detector.pattern, text, ANCHORS[detector.anchor](scratch))
        else:
            matches = _windowed(detector.pattern, text, ANCHORS[detector.anchor](scratch))
        for m in matches:
            span = m.span(detector.group)
            for start, end in validate(text, m, span, self.options):
                if end > start:
                    yield (start, end)


def _anchored(
    pattern: regex.Pattern[str], text: str, windows: list[Span]
) -> Iterator[regex.Match[str]]:
    for start, end in windows:
        m = _match(pattern, text, start, end)
        if m is not None:
            yield m


def _windowed(
    pattern: regex.Pattern[str], text: str, windows: list[Span]
) -> Iterator[regex.Match[str]]:
    for start, end in _merge(windows):
        yield from _finditer(pattern, text, start, end)


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
