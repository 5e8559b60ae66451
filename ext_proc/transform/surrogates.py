"""Realistic surrogates (`mode: surrogate`): a fictional value of the same kind and shape per value.

Where this sits: redaction writes this request's per-request placeholders first (ext_proc.transform.redact,
`PlaceholderMap`); before the body is released, the exchange claims one surrogate per distinct
value in the tenant's surrogate registry in Redis (ext_proc.storage.vault, `Vault.claim_surrogates`) and
puts the surrogates in place of the placeholders in the outgoing bytes. Restore then maps each
surrogate of this request back to its original (ext_proc.restore.restorers, `SurrogateRestorer`).

Candidates are pure functions of (tenant key, family, value, attempt): `candidate` is called with
attempt 0, 1, 2, … until the registry accepts one (the first is free, or already this value's);
so the same value gets the same surrogate in every request of the tenant, and a collision moves
to the next candidate. What each family writes (and so keeps of the original, on purpose):

    NAME      `Given Family` from the lexicon below (15,232 pairs): keeps only "a person's name".
    EMAIL     `given.familyNN@example.invalid` (RFC 2606 reserved TLD): keeps "an email".
    PHONE     NANP `AAA-555-01XX` (fictional in every area code: 68,400 numbers) for +1 and any
              other country code; UK Ofcom drama ranges (14,000 numbers: mobile 07700 900xxx and
              13 geographic ranges) for +44 and for national numbers with a trunk 0 (`07911 …`);
              written into the original's digit layout when the digit counts agree, else in a
              standard layout. Keeps whether it was NANP / UK-like / other, and the layout.
    DATE      the original shifted by one per-tenant constant (`date_shift_days`: 53 to 520
              whole weeks either way), written in the original's format (ISO, numeric D/M/Y or
              M/D/Y, spelled months, ordinals, 2- or 4-digit years): keeps every interval between
              dates, the weekday and the calendar shape (a later attempt, after a clash, moves one
              more week per attempt). Numeric dates are read day-first with dots, else
              month-first unless the first field exceeds 12 (an ambiguous `03/04/1986` meant
              day-first is shifted as 4 March: one constant shift of what is written, not of the
              date meant). An unreadable date gets a TOKEN. An age or the date's year written
              right next to it moves with it (ext_proc.transform.date_neighbours).
    SSN       TOKEN with area 9xx (never issued as an SSN).
    CREDIT_CARD  TOKEN starting with 0 (major industry identifier 0: no card network issues it),
              Luhn check digit fixed so it looks like a card.
    IBAN      TOKEN keeping the two-letter country, with a mod-97 check that fails (never an account).
    IP        IPv4 in the documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24),
              hosts .20 to .254; IPv6 in 2001:db8::/32.
    TOKEN     every other kind (ADDRESS, ID, HANDLE, OTHER, secrets, HIGH_ENTROPY, …): the same
              length, each character replaced by a random one of its class (digit, lower, upper;
              other letters by case); separators kept. Keeps the shape (length, grouping, which
              positions are digits), nothing of the characters; except that a shape carrying
              fewer than MIN_TOKEN_BITS (an id of two digits) is lengthened until it does, so the
              surrogate cannot be a number or word the model writes on its own.

Every surrogate is printable ASCII without `"`, `\\`, `<` or `>`, so it can be put in place of a
placeholder in serialised JSON at any nesting depth (tool-call arguments) without escaping, and
never equals the original it stands for (such a candidate is skipped).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import math
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import phonenumbers
import regex

from ext_proc.detect.findings import Finding
from ext_proc.transform.placeholders import normalise_value, stable_label


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


SURROGATE_DOMAIN = "example.invalid"
MAX_ATTEMPTS = 64  # candidates tried per value before the claim gives up (503, fail closed)
# A TOKEN surrogate carries at least this many random bits (8 digits, or 6 letters): shorter, the
# model could write it on its own (see `_distinct_token`).
MIN_TOKEN_BITS = 24
MIN_TOKEN_LETTERS = 6

GIVEN_NAMES: tuple[str, ...] = _words(
    """Adaeze Adrian Agnieszka Aiko Alejandro Alessia Amara Anders Anouk Anselm Arjun Astrid
    Aurelio Bartosz Beatriz Benedikt Bianca Bogdan Brielle Caetano Calla Camille Casimir Cedric
    Celeste Chidi Cosima Dagny Dario Delphine Desmond Dmitri Dorothea Eamon Edith Elio Elodie
    Emeka Enzo Esperanza Evander Fabian Farida Felix Fenna Florian Freya Gideon Giulia Gunnar
    Hamza Hannelore Harriet Hector Henrik Ilse Imogen Ingrid Isidore Ivana Jarek Jasmin Joaquin
    Jolene Jules Kalani Kasimir Katarina Kenji Kirsten Lazlo Leander Leocadia Linnea Lorcan
    Lucian Ludmila Magnus Malin Marcel Marisela Matthias Maximilian Mireille Nadia Naveen Nikolai
    Noemi Octavia Odalys Oskar Ottilie Pavel Perpetua Quentin Rafaela Ragnar Rosalind Rustam
    Saoirse Sebastian Severin Sigrid Solveig Stellan Tamsin Tobias Ulrike Valentin Vesna Viggo
    Wilhelmina Xanthe Yannick Yelena Yusuf Zdenek Zinnia Zoltan"""
)
FAMILY_NAMES: tuple[str, ...] = _words(
    """Abernathy Achterberg Adeyemi Alcantara Almqvist Amundsen Arkwright Ashdown Balogun
    Bannerjee Bellweather Bergstrom Blackwood Bramhall Brennan Castellanos Chaudhry Cheverton
    Coldwell Cortazar Dalgleish Delacroix Dimitriou Dobrowski Drummond Eckhart Ellery Esterhazy
    Fairweather Falkenrath Ferreira Fitzgerald Fonseca Galbraith Gallardo Gerritsen Glanville
    Gronberg Haldane Hargreaves Hathaway Hendricks Holloway Ibarra Ingersoll Iwasaki Jablonski
    Jaramillo Kaczmarek Kavanagh Kettleborough Kowalczyk Lachance Lindqvist Llewellyn Lockridge
    Lundgren Maclaren Magnusson Marchetti Mbeki Mendelsohn Montague Nakamura Navarrete Nightingale
    Nordstrom Oyelaran Okonkwo Ostrowski Pemberton Petrakis Quarrington Radcliffe Ravensworth
    Rautenbach Rosenthal Saltonstall Sandoval Scarborough Schellenberg Silvestri Sorensen
    Stavropoulos Strickland Szymanski Tennyson Thorvaldsen Trevelyan Underhill Urquhart Valdivia
    Vanderbilt Varga Vasquez Wainwright Waterhouse Wexford Whitcombe Winterbourne Wojcik Yardley
    Yamaguchi Zabini Zeller Zielinski Zimmerman Achebe Beaumont Carrington Desrosiers Eastwood
    Fairbanks Grimaldi Hawthorne Ishikawa Kingsley Lancaster Moreau Northcott Oduya Prendergast
    Quintanilla Rasmussen Stanislav Thackeray Uchenna Villalobos"""
)

# NANP area codes: NXX, not N11 (services), not N00 (toll-free, premium), not 37X/96X (reserved),
# second digit not 9 (reserved for expansion).
NANP_AREAS: tuple[str, ...] = tuple(
    f"{a}{b}{c}"
    for a in "23456789"
    for b in "012345678"
    for c in "0123456789"
    if not (b == "1" and c == "1") and not (b == "0" and c == "0") and f"{a}{b}" not in ("37", "96")
)
# Ofcom's numbers reserved for drama: (national significant number prefix, how many numbers).
UK_DRAMA: tuple[tuple[str, int], ...] = (
    ("7700900", 1000),
    ("2079460", 1000),
    ("1134960", 1000),
    ("1144960", 1000),
    ("1154960", 1000),
    ("1164960", 1000),
    ("1174960", 1000),
    ("1184960", 1000),
    ("1214960", 1000),
    ("1314960", 1000),
    ("1414960", 1000),
    ("1514960", 1000),
    ("1614960", 1000),
    ("1914980", 1000),
)
DOC_NETS_V4: tuple[str, ...] = ("192.0.2", "198.51.100", "203.0.113")

# Labels (as `stable_label` writes them) → the family that makes their surrogates.
FAMILIES: dict[str, str] = {
    "SUBJECT_NAME": "NAME",
    "EMAIL": "EMAIL",
    "SUBJECT_EMAIL": "EMAIL",
    "PHONE": "PHONE",
    "SUBJECT_PHONE": "PHONE",
    "SUBJECT_DOB": "DATE",
    "SSN": "SSN",
    "CREDIT_CARD": "CREDIT_CARD",
    "IBAN": "IBAN",
    "IP": "IP",
}
_UNSAFE = frozenset('"\\<>')


def is_surrogate_email(text: str) -> bool:
    """An address at the surrogate domain: nobody's (RFC 2606 reserves `.invalid`)."""
    return text.casefold().endswith("@" + SURROGATE_DOMAIN)


def surrogates_kept(detect: Callable[[str], list[Finding]]) -> Callable[[str], list[Finding]]:
    """The catalog's detector for `mode: surrogate`: an address at the surrogate domain (a
    surrogate of an earlier turn, resent unrestored, or a test address) is no finding, so it is
    not given a surrogate of its own; a declared subject's is still redacted (other detector)."""

    def detect_kept(text: str) -> list[Finding]:
        return [
            f for f in detect(text) if not (f.label == "EMAIL" and is_surrogate_email(text[f.start : f.end]))
        ]

    return detect_kept


def family_of(label: str) -> str:
    """The generator family of a placeholder label; `TOKEN:<label>` for every kind without its own."""
    stable = stable_label(label)
    return FAMILIES.get(stable, f"TOKEN:{stable}")


def claim_form(surrogate: str) -> str:
    """What distinctness is judged on: two surrogates that differ only in case are one (restore
    matches case-insensitively)."""
    return surrogate.casefold()


# --- randomness from the tenant key ---------------------------------------------------------------


class _Stream:
    """Deterministic bytes for one (family, value, attempt): HMAC-SHA256 in counter mode."""

    def __init__(self, key: bytes, family: str, value: str, attempt: int) -> None:
        self._seed = hmac.new(
            key,
            b"cordon/surrogate/v1\x00"
            + family.encode("ascii")
            + b"\x00"
            + normalise_value(value).encode("utf-8", "surrogatepass")
            + b"\x00"
            + str(attempt).encode("ascii"),
            hashlib.sha256,
        ).digest()
        self._blocks = self._generate()
        self._buf = b""

    def _generate(self) -> Iterator[bytes]:
        counter = 0
        while True:
            yield hmac.new(self._seed, counter.to_bytes(8, "big"), hashlib.sha256).digest()
            counter += 1

    def below(self, n: int) -> int:
        """A uniform integer in [0, n) (rejection sampling over 8 bytes; the bias is negligible)."""
        if len(self._buf) < 8:
            self._buf += next(self._blocks)
        raw, self._buf = self._buf[:8], self._buf[8:]
        return int.from_bytes(raw, "big") % n

    def pick(self, choices: str | tuple[str, ...]) -> str:
        return choices[self.below(len(choices))]


def date_shift_days(key: bytes) -> int:
    """The tenant's one date shift: ±(53 to 520 weeks) in days, never less than a year either way.

    Whole weeks, so a shifted date falls on the weekday the original did: a weekday written next
    to a date ("Monday, 14 July 1986"), or one the model works out, tells nothing of the shift.
    """
    raw = int.from_bytes(hmac.new(key, b"cordon/surrogate/date-shift/v2", hashlib.sha256).digest()[:8], "big")
    days = 7 * (53 + raw % (521 - 53))
    return days if raw >> 63 else -days


# --- per family -----------------------------------------------------------------------------------

_DIGITS = "0123456789"
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_UPPER = _LOWER.upper()
_DIGIT_BITS = math.log2(10)
_LETTER_BITS = math.log2(26)


def _token(stream: _Stream, original: str) -> str:
    if not any(ch.isalnum() for ch in original):
        # Nothing to keep the shape of (only punctuation): a short random word instead.
        return "".join(stream.pick(_LOWER) for _ in range(max(MIN_TOKEN_LETTERS, min(len(original), 16))))
    out = []
    for ch in original:
        if ch.isdigit():
            out.append(stream.pick(_DIGITS))
        elif ch.isalpha():
            out.append(stream.pick(_UPPER if ch.isupper() else _LOWER))
        elif ch.isascii() and ch.isprintable() and ch not in _UNSAFE:
            out.append(ch)
        else:
            out.append("-" if not ch.isspace() else " ")
    return "".join(out)


def _set_digit(text: str, nth: int, digit: str) -> str:
    """`text` with its `nth` digit (negative: from the end) replaced."""
    positions = [i for i, ch in enumerate(text) if ch.isdigit()]
    if not positions:
        return text
    i = positions[nth]
    return text[:i] + digit + text[i + 1 :]


def _luhn_check_digit(payload: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(payload)):
        d = int(ch)
        if i % 2 == 0:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return str((10 - total % 10) % 10)


def _bits(text: str) -> float:
    """How many random bits a token's letters and digits carry (a digit ~3.3, a letter ~4.7)."""
    return sum(_DIGIT_BITS if ch.isdigit() else _LETTER_BITS for ch in text if ch.isalnum())


def _distinct_token(stream: _Stream, original: str) -> str:
    """A TOKEN surrogate: the original's shape (`_token`), lengthened when that shape is too short
    to be told from the model's own text. Restore reads a surrogate wherever it stands alone, so
    a two-digit id with a two-digit surrogate would turn every such number of the reply (a count,
    a list's numbering) into the id; below MIN_TOKEN_BITS the last letter-or-digit run is
    extended with characters of its own class until the surrogate carries that many."""
    text = _token(stream, original)
    if _bits(text) >= MIN_TOKEN_BITS:
        return text
    # After the last letter or digit (the end when there is none: `¼` writes as `-`).
    end = next((i + 1 for i in range(len(text) - 1, -1, -1) if text[i].isalnum()), len(text))
    last = text[end - 1] if end else ""
    alphabet, bits = (
        (_DIGITS, _DIGIT_BITS) if last.isdigit() else (_UPPER if last.isupper() else _LOWER, _LETTER_BITS)
    )
    extra = math.ceil((MIN_TOKEN_BITS - _bits(text)) / bits)
    return text[:end] + "".join(stream.pick(alphabet) for _ in range(extra)) + text[end:]


def _card(stream: _Stream, original: str) -> str:
    text = _set_digit(_token(stream, original), 0, "0")
    digits = "".join(ch for ch in text if ch.isdigit())
    if len(digits) < 2:
        return text
    return _set_digit(text, -1, _luhn_check_digit(digits[:-1]))


def _ssn(stream: _Stream, original: str) -> str:
    return _set_digit(_token(stream, original), 0, "9")


def _iban_valid(text: str) -> bool:
    compact = "".join(ch for ch in text if ch.isalnum()).upper()
    if len(compact) < 5:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in moved)) % 97 == 1


def _iban(stream: _Stream, original: str) -> str:
    text = _token(stream, original)
    letters = [i for i, ch in enumerate(original) if ch.isalpha()][:2]
    chars = list(text)
    for i in letters:
        chars[i] = original[i].upper() if original[i].isascii() else chars[i]
    text = "".join(chars)
    if _iban_valid(text):  # one in 97: never write a checksum-valid (possibly real) account
        digit = next((ch for ch in text if ch.isdigit()), "0")
        text = _set_digit(text, 0, str((int(digit) + 1) % 10))
    return text


def _ip(stream: _Stream, original: str) -> str:
    if ":" in original:
        groups = ":".join(f"{stream.below(0x10000):x}" for _ in range(6))
        return f"2001:db8:{groups}"
    # Hosts from 20: the low ones (.1, .5, .10) are what a model writes in its own examples.
    return f"{stream.pick(DOC_NETS_V4)}.{20 + stream.below(235)}"


def _name(stream: _Stream, original: str) -> str:
    return f"{stream.pick(GIVEN_NAMES)} {stream.pick(FAMILY_NAMES)}"


def _email(stream: _Stream, original: str) -> str:
    given, family = stream.pick(GIVEN_NAMES).lower(), stream.pick(FAMILY_NAMES).lower()
    return f"{given}.{family}{stream.below(100):02d}@{SURROGATE_DOMAIN}"


def _fill(template: str, digits: str) -> str | None:
    """`digits` written into the original's layout, when it has exactly that many digits."""
    if sum(ch.isdecimal() for ch in template) != len(digits):
        return None
    it = iter(digits)
    return "".join(
        next(it)
        if ch.isdecimal()
        else (ch if ch.isascii() and ch.isprintable() and ch not in _UNSAFE else " ")
        for ch in template
    )


def _phone(stream: _Stream, original: str) -> str:
    ascii_digits = "".join(str(unicodedata.decimal(ch)) for ch in original if ch.isdecimal())
    international = original.lstrip().startswith("+") or ascii_digits.startswith("00")
    country = 1
    if not international and ascii_digits.startswith("0"):
        country = 44  # a national number with a trunk 0: written as a UK drama number
    else:
        with contextlib.suppress(phonenumbers.NumberParseException):
            country = phonenumbers.parse(original, "US").country_code or 1
    if country == 44:
        prefix, size = UK_DRAMA[stream.below(len(UK_DRAMA))]
        national = prefix + f"{stream.below(size):03d}"
        layouts = ["0" + national, "44" + national, "0044" + national]
        fallback = (
            f"+44 {national[:4]} {national[4:]}" if international else f"0{national[:4]} {national[4:]}"
        )
    else:
        national = f"{stream.pick(NANP_AREAS)}5550{1}{stream.below(100):02d}"
        layouts = [national, "1" + national, "001" + national]
        fallback = (
            f"+1 {national[:3]}-{national[3:6]}-{national[6:]}"
            if international or country != 1
            else f"({national[:3]}) {national[3:6]}-{national[6:]}"
        )
    if country in (1, 44):
        for digits in layouts:
            filled = _fill(original, digits)
            if filled is not None:
                return filled
    return fallback


# Dates: the written forms redaction meets for a declared date (docs/subjects.md).
_MONTHS = _words("january february march april may june july august september october november december")
_MONTH_RE = (
    r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)(?P<dot>\.)?"
)
_DATE_FORMS: tuple[tuple[str, regex.Pattern[str]], ...] = (
    ("ymd", regex.compile(r"(?P<y>\d{4})(?P<s>[-/. ])(?P<m>\d{1,2})(?P=s)(?P<d>\d{1,2})")),
    ("num", regex.compile(r"(?P<a>\d{1,2})(?P<s>[-/. ])(?P<b>\d{1,2})(?P=s)(?P<y>\d{4}|\d{2})")),
    (
        "mdy",
        regex.compile(
            _MONTH_RE + r"(?P<s1>\s+)(?P<d>\d{1,2})(?P<ord>st|nd|rd|th)?(?P<s2>,?\s+)(?P<y>\d{4}|\d{2})",
            regex.IGNORECASE,
        ),
    ),
    (
        "dmy",
        regex.compile(
            r"(?P<d>\d{1,2})(?P<ord>st|nd|rd|th)?(?P<s1>\s+(?:of\s+)?)"
            + _MONTH_RE
            + r"(?P<s2>,?\s+)(?P<y>\d{4}|\d{2})",
            regex.IGNORECASE,
        ),
    ),
)


def _year(text: str, today_year: int) -> int:
    if len(text) == 4:
        return int(text)
    y = int(text)
    return 2000 + y if 2000 + y <= today_year else 1900 + y


def _write_year(year: int, like: str) -> str:
    return f"{year:04d}" if len(like) == 4 else f"{year % 100:02d}"


def _pad(n: int, like: str, *, numeric: bool = True) -> str:
    """Two digits where the original was padded (`07`; in numeric forms also `12`), else as few
    as needed."""
    return f"{n:02d}" if like.startswith("0") or (numeric and len(like) == 2) else str(n)


def _ordinal(n: int) -> str:
    return "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _month_name(month: int, like: str) -> str:
    """Month `month` written as `like` was: full or abbreviated, in its case."""
    full = _MONTHS[month - 1]
    word = full if like.lower() in _MONTHS else full[:3]
    if like.isupper():
        return word.upper()
    if like[:1].isupper():
        return word.capitalize()
    return word


@dataclass(frozen=True, slots=True)
class WrittenDate:
    """A date as `read_date` found it written: its form, the match, the date, and whether a
    numeric form was read day-first."""

    form: str
    match: regex.Match[str]
    date: dt.date
    day_first: bool


def read_date(
    text: str, today_year: int | None = None, *, day_first: bool | None = None
) -> WrittenDate | None:
    """The date `text` writes, in one of the forms above; None when it is none of them (or not a
    calendar date). `day_first` imposes a numeric form's reading (a surrogate is read as its
    original was)."""
    this_year = today_year if today_year is not None else dt.date.today().year
    for form, pattern in _DATE_FORMS:
        m = pattern.fullmatch(text.strip())
        if m is None:
            continue
        first = False
        try:
            if form == "ymd":
                date = dt.date(int(m["y"]), int(m["m"]), int(m["d"]))
            elif form == "num":
                a, b = int(m["a"]), int(m["b"])
                # Dots are day-first (14.07.1986); otherwise month-first (07/14/1986) unless the
                # first field cannot be a month.
                first = day_first if day_first is not None else a > 12 or (m["s"] == "." and b <= 12)
                month, day = (b, a) if first else (a, b)
                date = dt.date(_year(m["y"], this_year), month, day)
            else:
                month = next(
                    i for i, name in enumerate(_MONTHS, 1) if name.startswith(m["month"].lower()[:3])
                )
                date = dt.date(_year(m["y"], this_year), month, int(m["d"]))
        except ValueError:
            return None
        return WrittenDate(form, m, date, first)
    return None


def shift_date(original: str, days: int, today_year: int | None = None) -> str | None:
    """The date written in `original` moved by `days`, in the same written form; None when
    `original` is not one of the forms read here (or not a calendar date)."""
    written = read_date(original, today_year)
    if written is None:
        return None
    form, m = written.form, written.match
    try:
        new = written.date + dt.timedelta(days=days)
    except OverflowError:
        return None
    if form == "ymd":
        out = f"{new.year:04d}{m['s']}{_pad(new.month, m['m'])}{m['s']}{_pad(new.day, m['d'])}"
    elif form == "num":
        first, second = (new.day, new.month) if written.day_first else (new.month, new.day)
        y = _write_year(new.year, m["y"])
        out = f"{_pad(first, m['a'])}{m['s']}{_pad(second, m['b'])}{m['s']}{y}"
    else:
        name = _month_name(new.month, m["month"]) + (m["dot"] or "")
        written_day = _pad(new.day, m["d"], numeric=False) + (_ordinal(new.day) if m["ord"] else "")
        if m["ord"] and m["ord"].isupper():
            written_day = written_day.upper()
        y = _write_year(new.year, m["y"])
        out = (
            f"{name}{m['s1']}{written_day}{m['s2']}{y}"
            if form == "mdy"
            else f"{written_day}{m['s1']}{name}{m['s2']}{y}"
        )
    lead = original[: len(original) - len(original.lstrip())]
    return lead + out + original[len(original.rstrip()) :]


_GENERATORS: dict[str, Callable[[_Stream, str], str]] = {
    "NAME": _name,
    "EMAIL": _email,
    "PHONE": _phone,
    "SSN": _ssn,
    "CREDIT_CARD": _card,
    "IBAN": _iban,
    "IP": _ip,
}


def candidate(key: bytes, family: str, original: str, attempt: int) -> str:
    """The `attempt`-th surrogate candidate for `original` of `family` (all pure; see the module doc).

    A candidate equal to the original (a short ID can be drawn as itself) is marked by returning
    the empty string: the claim skips it.
    """
    stream = _Stream(key, family, original, attempt)
    text: str | None = None
    if family == "DATE":
        # Later attempts (only after a clash with another family's token) move one week further:
        # the weekday still holds.
        text = shift_date(original, date_shift_days(key) + 7 * attempt)
    if text is None:
        generator = _GENERATORS.get(family, _distinct_token)
        text = generator(stream, original)
    if claim_form(text) == claim_form(original) or not text.strip():
        return ""
    return text
