"""An age, or the date's own year, written right next to a declared date moves with its surrogate.

Where it sits: under `mode: surrogate` a declared date leaves shifted by the tenant's constant
(ext_proc.transform.surrogates, `date_shift_days`). An age beside it ("born 1986-07-14, aged 38")
would then contradict the shifted date, and the difference is the tenant's shift, which would
undo every date the tenant sends. So, before the surrogates are put in (ext_proc.exchange.commit),
each age and each bare year equal to the date's year written right before or after one of the
request's date placeholders is moved as the date moved: an age by the change of the age the date
gives today, a year by the change of the date's year. The date and its neighbour are one unit for
restore too: the reply's "1979-07-21, aged 45" comes back as "1986-07-14, aged 38".

"Right next to" is a short gap (blanks, one of `, ; : | ( [ / -`, and "born", "b.", "DOB", "date
of birth"); the words read are English ("aged 38", "age: 38", "38 years old", "38 yrs", "38 y/o",
"(38)"). An age written elsewhere in the text is not linked to a date and stays as written.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import regex

from ext_proc.transform.surrogates import read_date

_GAP = r"[ ]{0,3}(?:[,;:|(\[/-][ ]{0,3})?"
_BORN = r"(?:(?:born|b\.|dob|d\.o\.b\.|date of birth)(?:[ ]+on)?[ ]*:?[ ]*)?"
# The neighbour's own text: the number is group `age` (in one of four places) or `year`.
_AGE = (
    r"(?:(?:aged?|age)[ ]*:?[ ]*(?P<age>[0-9]{1,3})(?![0-9])"
    r"|(?P<age2>[0-9]{1,3})[ ]*-?[ ]*(?:years?|yrs?)(?:[ -]+old|[ ]+of[ ]+age)?(?![A-Za-z0-9])"
    r"|(?P<age3>[0-9]{1,3})[ ]*(?:y/o|y\.o\.|yo)(?![A-Za-z0-9])"
    r"|\((?P<age4>[0-9]{1,3})\)"
    r"|(?P<year>(?:1[6-9]|2[0-9])[0-9]{2})(?![0-9]))"
)
_AFTER = regex.compile(_GAP + _AGE, regex.IGNORECASE)
_BEFORE = regex.compile(r"(?<![A-Za-z0-9])" + _AGE + _GAP + _BORN + r"\Z", regex.IGNORECASE)
_WINDOW = 48  # how far back a neighbour before a date may start
_AGE_GROUPS = ("age", "age2", "age3", "age4")


def full_years(born: dt.date, on: dt.date) -> int:
    """The age someone born on `born` has on `on`."""
    return on.year - born.year - ((on.month, on.day) < (born.month, born.day))


class _Move:
    """How one date moved: its year and the age it gives today."""

    __slots__ = ("age", "original", "surrogate", "year", "years")

    def __init__(self, original: str, surrogate: str, today: dt.date) -> None:
        self.original, self.surrogate = original, surrogate
        before = read_date(original, today.year)
        after = read_date(surrogate, today.year, day_first=before.day_first) if before else None
        self.year = before.date.year if before is not None else None
        if before is None or after is None:
            self.years = self.age = None
            return
        self.years = after.date.year - before.date.year
        self.age = full_years(after.date, today) - full_years(before.date, today)

    def moved(self, m: regex.Match[str]) -> str | None:
        """The neighbour `m` rewritten as the date moved; None when it is not one to move (a year
        other than the date's own)."""
        text = m.group(0)
        if m.group("year") is not None:
            if self.years is None or int(m.group("year")) != self.year:
                return None
            group, value = "year", int(m.group("year")) + self.years
        else:
            if self.age is None:
                return None
            group = next(g for g in _AGE_GROUPS if m.group(g) is not None)
            value = max(0, int(m.group(group)) + self.age)
        start, end = m.start(group) - m.start(), m.end(group) - m.start()
        return text[:start] + str(value) + text[end:]


def move_neighbours(
    text: str, dates: Mapping[str, tuple[str, str]], today: dt.date
) -> tuple[str, dict[str, str]]:
    """`text` (a redacted body) with every neighbour of a date placeholder moved as its date.

    `dates`: placeholder → (original, surrogate) of this request's dates. Returns the new text
    and, for restore, surrogate → original of each date written together with a moved neighbour
    (the date alone is restored through its own surrogate).
    """
    moves = {
        placeholder: _Move(original, surrogate, today) for placeholder, (original, surrogate) in dates.items()
    }
    moves = {p: move for p, move in moves.items() if move.age is not None}
    if not moves:
        return text, {}
    pattern = regex.compile("|".join(regex.escape(p) for p in sorted(moves, key=len, reverse=True)))
    out: list[str] = []
    units: dict[str, str] = {}
    done = 0  # everything before this is written (a neighbour is never moved twice)
    for m in pattern.finditer(text):
        move = moves[m.group(0)]
        start, end = m.start(), m.end()
        window_start = max(done, start - _WINDOW)
        before = _BEFORE.search(text, window_start, start)
        new_before = move.moved(before) if before is not None else None
        after = _AFTER.match(text, end)
        new_after = move.moved(after) if after is not None else None
        lead = before.start() if before is not None and new_before is not None else start
        tail = after.end() if after is not None and new_after is not None else end
        out.append(text[done:lead])
        out.append(new_before if new_before is not None else "")
        out.append(m.group(0))
        out.append(new_after if new_after is not None else "")
        done = tail
        if new_before is not None or new_after is not None:
            written = (new_before or "") + move.surrogate + (new_after or "")
            meant = (before.group(0) if new_before and before else "") + move.original
            meant += after.group(0) if new_after and after else ""
            # Two ages that moved to one (clamped at 0) would make the unit ambiguous: not restored.
            units[written] = meant if units.get(written, meant) == meant else ""
    out.append(text[done:])
    return "".join(out), {written: meant for written, meant in units.items() if meant}
