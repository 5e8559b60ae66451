"""DOB forms: every notation of a declared date.

Called by ext_proc.detect.subjects.values for each declared date (read by python-dateutil; an
all-numeric date whose day and month could be swapped yields both). The forms are numeric Y-M-D,
D-M-Y and M-D-Y, padded or not, with a 4- or 2-digit year, and the month spelled out.
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
    names = unique([name, name[:3], "sept" if day.month == 9 else ""])
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
