"""The validators: the checks a pattern's match must pass before it is a finding.

`Catalog.detect` runs a detector's pattern, then the validator that `Detector.validator` names in
`VALIDATORS`, which returns the spans of the match that are values (none, one or several); those
become findings for redaction. This module checks provider and vendor tokens (placeholders,
random-looking bodies, the checksums and encodings some formats carry), PEM headers, EMAIL, IP,
IBAN, CREDIT_CARD and SSN, and holds the registry of every validator; PHONE, HIGH_ENTROPY with
AWS secret keys, and SECRET_ASSIGNMENT have modules of their own.
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import zlib
from collections import Counter
from collections.abc import Callable, Iterable

import regex

from ext_proc.detect.catalog.assignments import (
    validate_curl_credentials,
    validate_secret_assignment,
    validate_secret_comparison,
    validate_url_credentials,
)
from ext_proc.detect.catalog.entropy import (
    HEX_MIN_ENTROPY,
    shannon_entropy,
    validate_aws_secret,
    validate_high_entropy,
)
from ext_proc.detect.catalog.options import Options
from ext_proc.detect.catalog.phones import validate_phone
from ext_proc.detect.catalog.regexes import (
    DIGIT_GROUP,
    Span,
    compile_pattern,
    digits_of,
    is_mask,
    timed_all,
    timed_match,
    timed_search,
)

# (text, match, span of the detector's group, options) -> accepted spans of the value.
Validator = Callable[[str, "regex.Match[str]", Span, Options], Iterable[Span]]

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


def _token_body(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Provider tokens: reject a body made only of mask characters (`ghp_xxxx…`)."""
    body = next(
        (m.group(g) for g in ("body", "pat") if g in m.re.groupindex and m.group(g) is not None),
        text[span[0] : span[1]],
    )
    return () if is_mask(body) else (span,)


def _openai_key(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    body = m.group("body")
    # A hyphenated lower-case phrase ("sk-some-long-identifier-name") is not a key.
    if is_mask(body) or not any(ch.isdigit() or ch.isupper() for ch in body):
        return ()
    return (span,)


# --- vendor tokens (vendors.py) -----------------------------------------------------------------

# A token whose letters and digits are at least this much one character is a placeholder
# (`AKCpXXXX…`, `glc_1111…`, `xxxx.atlasv1.xxxx…`); random bodies stay far below it.
PLACEHOLDER_SHARE = 0.5


def is_placeholder(body: str) -> bool:
    """A documented stand-in rather than a token: a mask, or one character over and over."""
    if is_mask(body):
        return True
    alnum = [ch for ch in body if ch.isalnum()]
    if not alnum:
        return True
    return Counter(alnum).most_common(1)[0][1] >= PLACEHOLDER_SHARE * len(alnum)


def _vendor_body(text: str, m: regex.Match[str], span: Span) -> str:
    for name in ("body", "hex"):
        if name in m.re.groupindex and m.group(name) is not None:
            return m.group(name)
    return text[span[0] : span[1]]


def _vendor_structured(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """A token whose prefix and structure say what it is: only a placeholder is turned away."""
    return () if is_placeholder(_vendor_body(text, m, span)) else (span,)


def _is_token_body(body: str) -> bool:
    """Not a placeholder, and no digit-only run (`12312312…`) nor hyphenated lower-case phrase
    (`glptt-not-a-real-value-here`): a letter, and a digit or a capital."""
    return (
        not is_placeholder(body)
        and any(ch.isalpha() for ch in body)
        and any(ch.isdigit() or ch.isupper() for ch in body)
    )


def _vendor_token(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    return (span,) if _is_token_body(_vendor_body(text, m, span)) else ()


_SEGMENT_BREAKS = compile_pattern(r"[_\-.~]+")
# Random letters are about half capitals; a name in camel case (`RequiredCharacteristicTypes`)
# has one per word.
RANDOM_CAPITALS = (0.2, 0.8)
WORDS_SHARE = 0.6


def _reads_as_words(body: str) -> bool:
    """Most of `body` is plain words between separators (`XXXX_PUT_YOUR_TOKEN_HERE_XXXX`)."""
    words = 0
    for segment in _SEGMENT_BREAKS.split(body):
        if (
            len(segment) >= 3
            and segment.isalpha()
            and (segment.islower() or segment.isupper() or segment.istitle())
        ):
            words += len(segment)
    return words >= WORDS_SHARE * len(body)


def _is_random_body(body: str) -> bool:
    """A prefix that also begins identifiers (`hf_`, `sha256~`, `ico-`): the body must read as
    random, neither words nor a name in camel case."""
    if not _is_token_body(body) or _reads_as_words(body):
        return False
    if body.isalpha():
        capitals = sum(ch.isupper() for ch in body) / len(body)
        return RANDOM_CAPITALS[0] <= capitals <= RANDOM_CAPITALS[1]
    return True


def _vendor_random(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    return (span,) if _is_random_body(_vendor_body(text, m, span)) else ()


def _vendor_hex(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Hex digits: random enough (`5555555dAAAAA7777777…` is not), as HIGH_ENTROPY reads hex."""
    body = _vendor_body(text, m, span).lower()
    if is_placeholder(body) or body.isdigit() or shannon_entropy(body) < HEX_MIN_ENTROPY:
        return ()
    return (span,)


BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CHECKSUM_DIGITS = 6


def base62_crc32(data: str) -> str:
    """The CRC32 of `data` in base62, left-padded to six digits: the check at the end of GitHub's
    and npm's tokens (30 random base62 characters, then this)."""
    value = zlib.crc32(data.encode("ascii"))
    digits = ""
    while value:
        value, rest = divmod(value, 62)
        digits = BASE62[rest] + digits
    return digits.rjust(CHECKSUM_DIGITS, "0")


def token_checksum_valid(body: str) -> bool:
    """Whether a 36-character token body ends in the base62 CRC32 of its first 30 characters."""
    head, check = body[:-CHECKSUM_DIGITS], body[-CHECKSUM_DIGITS:]
    return head.isascii() and base62_crc32(head) == check


def _checksum_token(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """A valid checksum settles it; without one, a body that reads as random still counts (a token
    with a typo is still a secret)."""
    body = _vendor_body(text, m, span)
    if token_checksum_valid(body) or _is_random_body(body):
        return (span,)
    return ()


def _b64decode(body: str) -> bytes | None:
    data = body.rstrip("=").replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


# What an AWS Bedrock API key's base64 decodes to: `BedrockAPIKey-…` for a long-term key, a
# presigned URL of the service for a short-term one.
_BEDROCK_MARKERS = {"ABSK": b"BedrockAPIKey-", "bedrock-api-key-": b"bedrock.amazonaws.com"}


def _bedrock_key(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    marker = next(v for k, v in _BEDROCK_MARKERS.items() if text.startswith(k, span[0]))
    decoded = _b64decode(m.group("body"))
    return (span,) if decoded is not None and decoded.startswith(marker) else ()


def _telegram_token(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """The bot id and its secret (a `bot` before them, as in the API's URLs, stays)."""
    return ((m.start("id"), m.end("body")),) if _is_token_body(m.group("body")) else ()


def _discord_token(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """The first part of a Discord bot token is the bot's id (17 to 20 digits) in base64."""
    decoded = _b64decode(m.group("id"))
    if decoded is None or not (17 <= len(decoded) <= 20 and decoded.isdigit()):
        return ()
    return (span,) if _is_token_body(m.group("body")) else ()


_BUNDLER_VALUE = compile_pattern(
    r"[ \t]{0,8}[:=][ \t]{0,8}([\"']?)(?P<value>[^\s\"'`:;&$]{1,256}:[^\s\"'`;&]{1,256})\1"
)


def _bundler_credentials(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """`BUNDLE_GEMS__EXAMPLE__COM=user:password` (or `: "user:password"`): the value."""
    value = timed_match(_BUNDLER_VALUE, text, span[1], min(len(text), span[1] + 540))
    if value is None or is_placeholder(value.group("value")):
        return ()
    return (value.span("value"),)


# A header closed by its END line with nothing (or only a placeholder: `...`, `<your key>`, `xxxx`)
# between them wraps no key material: documentation's template of a key file. Line breaks may be
# written as `\n` escapes (a key file pasted into JSON).
_PEM_END = compile_pattern(
    r"(?:\s|\\[rn]){0,8}(?:(?:\.{3,}|\u2026+|<[^<>\n]{0,80}>|\[[^\[\]\n]{0,80}\]|\{[^{}\n]{0,80}\}|[xX*#]{3,})"
    r"(?:\s|\\[rn]){0,8})?-----END "
)


def _private_key(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    if timed_match(_PEM_END, text, span[1], min(len(text), span[1] + 128)):
        return ()
    return (span,)


def _email(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """An address whose local part starts with dots, or holds two in a row, is no valid address
    but shows one to whoever reads it (`.jane.roe@…`): the dots in front are left out of the span,
    the rest is an address."""
    local = text[span[0] : span[1]].split("@", 1)[0]
    lead = len(local) - len(local.lstrip("."))
    return ((span[0] + lead, span[1]),)


_DOC_NETS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)


def _is_documentation(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr.version == net.version and addr in net for net in _DOC_NETS)


def _ipv4(text: str, m: regex.Match[str], span: Span, options: Options) -> Iterable[Span]:
    addr = ipaddress.IPv4Address(m.group("addr"))
    if addr.is_loopback or addr.is_unspecified:
        return ()  # 127.0.0.1, 0.0.0.0: every machine's own, they identify no one
    if options.skip_documentation_ips and _is_documentation(addr):
        return ()
    return (span,)


def _ipv6(text: str, m: regex.Match[str], span: Span, options: Options) -> Iterable[Span]:
    candidate = m.group("addr")
    try:
        addr = ipaddress.IPv6Address(candidate)
    except ValueError:
        return ()
    if addr.is_unspecified or addr.is_loopback:
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


# A digit doubled, less 9 when that is over 9: the Luhn sum of the second, fourth … digit from
# the right.
_LUHN_DOUBLED = str.maketrans("0123456789", "0246813579")


def luhn_valid(digits: str) -> bool:
    backwards = digits[::-1]
    total = sum(map(int, backwards[::2])) + sum(map(int, backwards[1::2].translate(_LUHN_DOUBLED)))
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


def _word_after(text: str, end: int) -> bool:
    """A letter, digit or underscore right after `end`: the digits there are part of a word."""
    return end < len(text) and (text[end].isascii() and (text[end].isalnum() or text[end] == "_"))


def _card(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Luhn-valid windows of whole digit groups inside a run of digits and separators."""
    start, end = span
    run, word_after = text[start:end], _word_after(text, end)
    # Pure, so short runs are cached: a conversation resends its history every turn and the same
    # numbers come back. A long run (a digit dump) is read as it comes and not kept.
    windows = _card_windows(run, word_after) if end - start <= _CACHED_RUN else _cards_in(run, word_after)
    return [(start + s, start + e) for s, e in windows]


_CACHED_RUN = 64


def _cards_in(run: str, word_after: bool) -> tuple[Span, ...]:
    """The cards in one run (offsets in it; `word_after`: a word character follows the run)."""
    groups = [g.span() for g in timed_all(DIGIT_GROUP, run)]
    k = len(groups)
    found_spans: list[Span] = []
    # Every start is tried, and overlapping windows are merged later: a number that happens to
    # precede a card ("ref 123 4012 8888 8888 1881") cannot hide part of the card.
    for i in range(k):
        found = 0
        digits = ""
        for j in range(i, k):
            g0, g1 = groups[j]
            size = g1 - g0
            if j > i:
                sep = run[groups[j - 1][1] : g0]
                # Dots only in 4-digit groups (4012.8888.8888.1881), never in dotted versions.
                if "." in sep and (size > 4 or groups[j - 1][1] - groups[j - 1][0] != 4):
                    break
            digits += run[g0:g1]
            if len(digits) > 19:
                break
            # Only the last group of a card may be shorter than 3 digits.
            if j > i and groups[j - 1][1] - groups[j - 1][0] < 3:
                break
            # Inside the run a separator follows every group: only its last may touch a word.
            if _plausible_card(digits) and luhn_valid(digits) and not (g1 == len(run) and word_after):
                found = j + 1
        if found:
            found_spans.append((groups[i][0], groups[found - 1][1]))
    return tuple(found_spans)


_card_windows = functools.lru_cache(maxsize=16384)(_cards_in)


# Letters around the word end it, an underscore does not (`SSN_078051120`, `user_ssn: …`).
_SSN_CONTEXT = compile_pattern(
    r"(?i)(?<![A-Za-z])(?:ssn|ss\s?#|soc(?:ial)?[\s.\-_]*sec(?:urity)?|taxpayer|tin)(?![A-Za-z])"
)


def _ssn_parts_ok(digits: str) -> bool:
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return not (area in ("000", "666") or area[0] == "9" or group == "00" or serial == "0000")


def _ssn(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    return (span,) if _ssn_parts_ok(digits_of(text[span[0] : span[1]])) else ()


def _ssn_plain(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    if not _ssn_parts_ok(digits_of(text[span[0] : span[1]])):
        return ()
    if timed_search(_SSN_CONTEXT, text, max(0, span[0] - 48), span[0]) is None:
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
    "phone": validate_phone,
    "aws_secret": validate_aws_secret,
    "high_entropy": validate_high_entropy,
    "secret_assignment": validate_secret_assignment,
    "secret_comparison": validate_secret_comparison,
    "url_credentials": validate_url_credentials,
    "curl_credentials": validate_curl_credentials,
    "vendor_structured": _vendor_structured,
    "vendor_token": _vendor_token,
    "vendor_random": _vendor_random,
    "vendor_hex": _vendor_hex,
    "checksum_token": _checksum_token,
    "bedrock_key": _bedrock_key,
    "telegram_token": _telegram_token,
    "discord_token": _discord_token,
    "bundler_credentials": _bundler_credentials,
}
