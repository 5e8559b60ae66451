"""DOB forms: every notation of a declared date, and the date words the matcher reads in text.

Called by ext_proc.detect.subjects.values for each declared date (read by python-dateutil; an
all-numeric date whose day and month could be swapped yields both). The forms are numeric Y-M-D,
D-M-Y and M-D-Y, padded or not, with a 4- or 2-digit year, and the month spelled out in English.

Other spellings are not multiplied into forms: `DATE_WORDS` tells the matcher's scan
(ext_proc.detect.subjects.matcher) how to read a word of a written date, so that "14 de julio de
1986", "14. Juli 1986", "14.VII.1986" and "the fourteenth of July, 1986" read as the English form
"14 July 1986": a month in another language or in Roman numerals reads as its English name, an
English ordinal word as its number, and connecting words and ordinal endings are passed over.
"""

from __future__ import annotations

import itertools
from datetime import date, datetime

import regex
from dateutil import parser as date_parser

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.forms import MARK, REGEX_TIMEOUT, FormList, FormSet, UnreadableValue, unique
from ext_proc.detect.subjects.words import word_list

MONTHS = word_list("january february march april may june july august september october november december")

# What a word of a written date reads as, by kind (folded spellings: "März" is "marz").
MONTH, DAY, TENS, SKIP = 0, 1, 2, 3
# Every spelling of each month, January first: English, German (and Austrian), French, Spanish,
# Italian, Portuguese, Dutch, and their usual abbreviations; then the Roman numerals.
_MONTH_SPELLINGS = (
    "january jan januar janner jaenner janvier janv enero ene gennaio gen janeiro januari",
    "february feb febr februar feber fevrier fevr fev febrero febbraio fevereiro februari",
    "march mar mrz marz maerz mars marzo marco maart mrt",
    "april apr avril avr abril abr aprile",
    "may mai mayo maggio mag maio mei",
    "june jun juni juin junio giugno giu junho",
    "july jul juli juillet juil julio luglio lug julho",
    "august aug aout agosto ago augustus",
    "september sep sept septembre septiembre setiembre settembre set setembro",
    "october oct oktober okt octobre octubre ottobre ott outubro out",
    "november nov novembre noviembre novembro",
    "december dec dezember dez decembre diciembre dic dicembre dezembro",
)
ROMAN_MONTHS = word_list("i ii iii iv v vi vii viii ix x xi xii")
_ORDINAL_DAYS = word_list(
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
    "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth"
)
# Words passed over inside a written date: connecting words ("the 3rd of March", "14 de julio de
# 1986", "March the 3rd, in the year 1986") and ordinal endings ("1er", "1º" read as "1 o", "14de").
_DATE_FILLERS = word_list(
    "of the on in day year de del dell della den der dem im am le el la di do da du en an "
    "ano anno annee jahr jaar st nd rd th er re e eme o a ste te ten"
)


def _date_words() -> dict[str, tuple[int, str]]:
    words: dict[str, tuple[int, str]] = {w: (SKIP, "") for w in _DATE_FILLERS}
    for number, word in enumerate(_ORDINAL_DAYS, start=1):
        words[word] = (DAY, str(number))
    words["thirtieth"] = (DAY, "30")
    words.update(dict.fromkeys(("premier", "primero", "primo"), (DAY, "1")))
    words.update({"twenty": (TENS, "2"), "thirty": (TENS, "3")})  # "twenty first": 2 then 1
    for name, spellings, roman in zip(MONTHS, _MONTH_SPELLINGS, ROMAN_MONTHS, strict=True):
        for spelling in (*spellings.split(), roman):
            words[spelling] = (MONTH, name)
    return words


DATE_WORDS: dict[str, tuple[int, str]] = _date_words()
MONTH_WORDS = frozenset(w for w, (kind, _) in DATE_WORDS.items() if kind == MONTH)


def _start_words() -> dict[str, tuple[str, ...]]:
    grouped: dict[str, tuple[str, ...]] = {}
    for word, (kind, reading) in DATE_WORDS.items():
        if kind != SKIP and word not in ROMAN_MONTHS:
            grouped[reading] = (*grouped.get(reading, ()), word)
    return grouped


# The words that may begin a date, by what they read as ("march": "mars", "marzo", "third" ...).
# Not the Roman numerals: a Roman month stands between the day and the year ("14.VII.1986",
# "1986-VII-14"), and "I", "V" and "X" begin too many sentences and lists to be looked at there.
START_WORDS = _start_words()
# The beginnings of an English month name that are not a spelling of it ("a", "ju", "novem"; not
# "feb", "febr" or "sept"): a date's key read so far never ends there, so no date word can follow.
MONTH_INSIDES = frozenset(
    name[:end] for name in MONTHS for end in range(1, len(name)) if name[:end] not in DATE_WORDS
)
# Each English month's spellings that are the first letters of its name ("feb", "febr" for february).
ABBREVIATIONS: dict[str, tuple[str, ...]] = {
    name: tuple(
        w
        for w, (kind, reading) in DATE_WORDS.items()
        if kind == MONTH and reading == name != w and name.startswith(w)
    )
    for name in MONTHS
}
UNIT_ORDINALS = frozenset(_ORDINAL_DAYS[:9])  # what may follow "twenty" or "thirty"
_ISO_DATE = regex.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}")
_YEAR_FIRST = regex.compile(r"\s*\d{4}\D")
_ALL_NUMERIC = regex.compile(r"[\d\s./\-]+")
_DEFAULTS = (datetime(2000, 1, 1), datetime(2001, 2, 2))


def _parse_dates(value: str) -> list[date]:
    """The date(s) a declaration names: one, or two for an ambiguous numeric day/month order."""
    text = value.strip()
    if _ISO_DATE.fullmatch(text, timeout=REGEX_TIMEOUT):
        try:
            return [date_parser.isoparse(text).date()]
        except (ValueError, OverflowError):
            raise UnreadableValue("is not a date python-dateutil can read") from None
    readings: list[date] = []
    year_first = bool(_YEAR_FIRST.match(text, timeout=REGEX_TIMEOUT))
    orders = [False]
    if not year_first and _ALL_NUMERIC.fullmatch(text, timeout=REGEX_TIMEOUT):
        orders.append(True)  # 07/08/1986: July 8 or 7 August; protect both
    for dayfirst in orders:
        try:
            first, second = (
                date_parser.parse(text, default=d, dayfirst=dayfirst, yearfirst=year_first) for d in _DEFAULTS
            )
        except Exception:  # ParserError, OverflowError and, on odd input, others
            raise UnreadableValue("is not a date python-dateutil can read") from None
        if first != second:
            raise UnreadableValue("is not a full date (day, month and year)")
        if first.date() not in readings:
            readings.append(first.date())
    return readings


def ordinal_suffix(day: int) -> str:
    """The English ordinal suffix of a number: "st", "nd", "rd" or "th"."""
    if 10 <= day % 100 <= 20:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def _date_units(*units: str) -> str:
    # Two numbers side by side need a separator when either is unpadded: "7/14/1986" but not
    # "7141986", which could as well be 1986-11-4 or 1986-1-14.
    out = units[0]
    for previous, unit in itertools.pairwise(units):
        joint = previous[-1].isdigit() and unit[0].isdigit() and (len(previous) == 1 or len(unit) == 1)
        out += (MARK if joint else "") + unit
    return out


def _date_forms_for(day: date) -> list[str]:
    year4 = f"{day.year:04d}"
    years = unique([year4, year4[-2:]])
    months = unique([f"{day.month:02d}", str(day.month)])
    days = unique([f"{day.day:02d}", str(day.day)])
    out: list[str] = []
    for year in years:
        for month in months:
            for d in days:
                out += [_date_units(year, month, d), _date_units(d, month, year), _date_units(month, d, year)]
    name = MONTHS[day.month - 1]
    # The English name and its abbreviations that begin it ("sep", "sept"; "feb", "febr"): read as
    # written they would stop inside the name, so they are forms of their own.
    names = unique([name, *ABBREVIATIONS[name]])
    spelled_days = unique([*days, str(day.day) + ordinal_suffix(day.day)])
    for year in years:
        for month in names:
            for d in spelled_days:
                out += [_date_units(month, d, year), _date_units(d, month, year)]
                if not d[-1].isdigit():
                    out.append(_date_units(d, "of", month, year))
                if year == year4:
                    out.append(_date_units(year, month, d))
    return out


def date_forms(value: str) -> FormList:
    """The forms of one declared date. Raises UnreadableValue unless it names day, month and year."""
    forms = FormSet()
    for day in _parse_dates(fold(value)):
        for form in _date_forms_for(day):
            forms.add(form)
    return forms.result()
