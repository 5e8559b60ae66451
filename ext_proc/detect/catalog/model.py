"""What a detector of the catalog is: the frozen dataclasses `detectors.py` and `vendors.py` fill in.

Where it sits: the data modules (`detectors.py`, `vendors.py`) build `Detector`s from these; the
engine (`engine.py`) reads their fast path, `anchors.py` the anchors and triggers they name.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

# Nothing in the catalog is shorter than this ("::1").
MIN_FINDING_LENGTH = 3


@dataclass(frozen=True, slots=True)
class Requirement:
    """Every match contains at least `at_least` characters from `chars` (counted in the text)."""

    chars: str
    at_least: int


@dataclass(frozen=True, slots=True)
class Detector:
    """One pattern of the catalog.

    The fast path is data too, and each part is a necessary condition of a match, so skipping
    on it never loses one: `min_length` (no shorter text can hold a match), `triggers`
    (literals of which every match contains one), `requires` (character counts every match
    needs, e.g. 13 digits for a card), `context` (lower-case words one of which every match
    needs nearby), and `anchor`, an entry of `ANCHORS` that returns the windows of a long text
    that can hold a match (`anchored`: each window starts exactly where a match would). A
    `token` detector's every match is one run of `anchors.TOKEN_RUN_CHARS` at least
    `anchors.TOKEN_RUN_MIN` long, and no letter or digit comes before a trigger that begins
    with one: its triggers are then looked up among the words of such runs only
    (`anchors.Triggers`), which prose has few of.
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
    token: bool = False
