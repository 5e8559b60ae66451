"""ADDRESS forms: every spelling of a declared street line, and the unit redaction takes after it.

Called by ext_proc.detect.subjects.values for each declared address, and by the matcher's `detect`
(ext_proc.detect.subjects.matcher) to extend an address match over a unit written right after it.
The street line is the identifier: its suffix, directions, ordinals and Saint/Mount/Fort prefix in
long and short spellings, without a direction, and without the suffix where a house number anchors
it; a unit is split off; the city alone is never a form.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import regex

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.dates import ordinal_suffix
from ext_proc.detect.subjects.forms import APOSTROPHES, REGEX_TIMEOUT, Case, FormList, FormSet, unique
from ext_proc.detect.subjects.reading import key_of
from ext_proc.detect.subjects.words import is_significant, word_list

_SUFFIX_GROUPS: tuple[tuple[str, ...], ...] = (
    ("street", "st", "str"),
    ("avenue", "ave", "av"),
    ("road", "rd"),
    ("boulevard", "blvd"),
    ("drive", "dr"),
    ("lane", "ln"),
    ("court", "ct"),
    ("place", "pl"),
    ("square", "sq"),
    ("terrace", "ter", "terr"),
    ("highway", "hwy"),
    ("parkway", "pkwy"),
    ("circle", "cir"),
    ("trail", "trl"),
    ("crescent", "cres"),
    ("alley", "aly"),
    ("expressway", "expy"),
    ("freeway", "fwy"),
    ("turnpike", "tpke"),
    ("plaza", "plz"),
    ("point", "pt"),
    ("heights", "hts"),
    ("grove", "grv"),
    ("gardens", "gdns"),
    ("park", "pk"),
    ("way", "wy"),
    ("close", "cl"),
    ("crossing", "xing"),
    ("center", "ctr", "centre"),
    ("junction", "jct"),
    ("harbor", "hbr"),
    ("route", "rte"),
    ("mews",),
    ("row",),
    ("walk",),
)
_DIRECTION_GROUPS: tuple[tuple[str, ...], ...] = (
    ("north", "n"),
    ("south", "s"),
    ("east", "e"),
    ("west", "w"),
    ("northeast", "ne"),
    ("northwest", "nw"),
    ("southeast", "se"),
    ("southwest", "sw"),
)
_PREFIX_GROUPS: tuple[tuple[str, ...], ...] = (("saint", "st"), ("mount", "mt"), ("fort", "ft"))
_UNIT_GROUPS: tuple[tuple[str, ...], ...] = (
    ("apt", "apartment", "unit", "no", "number", ""),
    ("suite", "ste", "unit", ""),
    ("fl", "floor", "flr", ""),
    ("rm", "room", ""),
    ("bldg", "building", "bld", ""),
    ("lot", ""),
    ("dept", "department", ""),
)
_ORDINAL_WORDS = word_list(
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
    "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth"
)


def _group_index(groups: tuple[tuple[str, ...], ...]) -> dict[str, tuple[str, ...]]:
    index: dict[str, tuple[str, ...]] = {}
    for group in groups:
        for spelling in group:
            if spelling:
                index.setdefault(spelling, group)
    return index


_SUFFIXES = _group_index(_SUFFIX_GROUPS)
_DIRECTIONS = _group_index(_DIRECTION_GROUPS)
_PREFIXES = _group_index(_PREFIX_GROUPS)
_UNITS = _group_index(_UNIT_GROUPS)
_UNITS["#"] = _UNIT_GROUPS[0]
MAX_DESIGNATOR = max(map(len, _UNITS))
_ADDRESS_TOKENS = regex.compile(r"#|[\p{L}\p{N}]+")
_ADDRESS_PARTS = regex.compile(r"[,;\n]+")
MAX_STREET_VARIANTS = 32


def _ordinal_variants(token: str) -> list[str]:
    if token in _ORDINAL_WORDS:
        n = _ORDINAL_WORDS.index(token) + 1
        return [token, f"{n}{ordinal_suffix(n)}"]
    for n, word in enumerate(_ORDINAL_WORDS, start=1):
        if token == f"{n}{ordinal_suffix(n)}":
            return [token, word]
    return [token]


def _street_variants(street: list[str]) -> list[tuple[list[str], Case]]:
    """Every spelling of the street line, the declared one first: each token in its long and short
    spellings, with and without each direction, and without the suffix (`_suffix_case`)."""
    suffix_at = -1
    for i in range(len(street) - 1, 0, -1):
        if street[i] in _SUFFIXES:
            suffix_at = i
            break
        if street[i] not in _DIRECTIONS:
            break
    options: list[list[str]] = []
    directions: list[int] = []
    for i, token in enumerate(street):
        if i == suffix_at:
            group = list(_SUFFIXES[token])
        elif token in _DIRECTIONS and len(street) > 2:
            group = list(_DIRECTIONS[token])
            directions.append(i)
        elif token in _PREFIXES and 0 < i < max(suffix_at, 1):
            group = list(_PREFIXES[token])
        elif token.endswith("strasse") and len(token) > 7:
            group = [token, token[:-7] + "str"]
        else:
            group = _ordinal_variants(token)
        options.append(unique([token, *group]))
    numbered = any(c.isdigit() for c in street[0])
    name = [i for i in range(1 if numbered else 0, len(street)) if i != suffix_at and i not in directions]
    # A direction may be left out where a name remains ("221B Quillon St" for "221B North Quillon
    # Street"); the suffix as _suffix_case says.
    droppable = directions if name else []
    suffix_case = _suffix_case(street, suffix_at, name) if numbered and name else None
    variants: list[tuple[list[str], Case]] = []
    for dropped in _subsets(droppable):
        for without_suffix in (False, True):
            if without_suffix and suffix_case is None:
                continue
            left_out = {*dropped, suffix_at} if without_suffix else set(dropped)
            kept = [options[i] for i in range(len(street)) if i not in left_out]
            case = suffix_case if without_suffix and suffix_case is not None else Case.ANY
            spellings = itertools.islice(itertools.product(*kept), MAX_STREET_VARIANTS)
            variants.extend((list(v), case) for v in spellings)
    return variants


def _subsets(items: list[int]) -> list[tuple[int, ...]]:
    """Every subset of a few items, the empty one first."""
    return [c for size in range(len(items) + 1) for c in itertools.combinations(items, size)]


def _suffix_case(street: list[str], suffix_at: int, name: list[int]) -> Case | None:
    """Whether the street line counts without its suffix: a house number anchors it, and either the
    name is not a common word or the house number is not a bare one- or two-digit number ("1428
    Quintana", "1428 Elm" and "221B Oak" count in any case). "12 Oak" for "12 Oak Rd" counts only
    where written with a capital letter, for redaction: "12 oak trees" is ordinary text."""
    if suffix_at < 2:
        return None
    house = street[0]
    if any(is_significant(street[i]) for i in name) or len(house) > 2 or not house.isdigit():
        return Case.ANY
    return Case.CAPITALISED_ONLY


def _address_tokens(text: str) -> list[str]:
    # Each token through key_of, so that it is spelled exactly as the text's segments are.
    found = _ADDRESS_TOKENS.findall(text, timeout=REGEX_TIMEOUT)
    return [t if t == "#" else key_of(t) for t in found if t == "#" or key_of(t)]


def _unit_value(token: str) -> bool:
    # "Apt 4", "Suite 200", "Apt B", "#4b"; not "No Name Road".
    return token != "#" and (any(c.isdigit() for c in token) or len(token) <= 2)


def _street_line(tokens: list[str], more_parts: bool) -> list[str]:
    """The street line of the first comma-separated part: up to a unit designator, or (when the
    declaration has no comma) up to the street suffix and a direction after it."""
    for i in range(2, len(tokens)):
        if tokens[i] in _UNITS:
            j = i + 1
            while j < len(tokens) and tokens[j] == "#":
                j += 1
            if j < len(tokens) and _unit_value(tokens[j]):
                return tokens[:i]
    if not more_parts:
        for i in range(len(tokens) - 1, 0, -1):
            if tokens[i] in _SUFFIXES:
                end = i + 1
                if end < len(tokens) and tokens[end] in _DIRECTIONS:
                    end += 1
                return tokens[:end]
    return tokens


def address_forms(value: str) -> FormList:
    """The forms of one declared address.

    The street line is the identifier: a unit after it is taken by detect (unit_end), the city and
    what follows are ordinary text on their own.
    """
    folded = APOSTROPHES.sub("", fold(value), timeout=REGEX_TIMEOUT)
    parts = [p for p in _ADDRESS_PARTS.split(folded, timeout=REGEX_TIMEOUT) if key_of(p)]
    forms = FormSet()
    forms.add(key_of(folded))
    if not parts:
        return forms.result()
    street = [t for t in _street_line(_address_tokens(parts[0]), len(parts) > 1) if t != "#"]
    for variant, case in _street_variants(street):
        forms.add("".join(variant), case)
    return forms.result()


def unit_end(segments: list[str], last: int, text: str, span: Callable[[int, int], tuple[int, int]]) -> int:
    """The last segment of a unit written right after a street line ending at segment `last`, or
    `last`. A unit alone is not an identifier, but redaction takes it with its street line.

    Read like everything else, separator-blind: a designator of the `_UNIT_GROUPS` (spelled with
    any separators: "Apt", "A.P.T.", "Suite") or a number sign before the value, then the value:
    digit runs and single letters, up to 8 characters ("4", "200", "4b", "2 0 0"), or one or two
    letters alone ("Apt B"). So "1428 Elm St 4 others" keeps its "4" and "... Apt 4 in" its "in".
    """
    count = len(segments)
    start = last + 1
    designator = ""
    at = start
    while at < count and len(designator) <= MAX_DESIGNATOR:
        designator += segments[at]
        if designator in _UNITS:
            break
        at += 1
    if designator in _UNITS and at < count:
        first = at + 1
    elif start < count and "#" in fold(text[span(last, last)[1] : span(start, start)[0]]):
        first = start
    else:
        return last
    if first >= count:
        return last
    head = segments[first]
    if not (head[0].isdigit() or len(head) <= 2):
        return last
    end, length = first, len(head)
    while end + 1 < count:
        following = segments[end + 1]
        if not (following[0].isdigit() or len(following) == 1) or length + len(following) > 8:
            break
        end += 1
        length += len(following)
    return end if head[0].isdigit() or end == first else first
