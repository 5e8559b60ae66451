"""Offset maps: where a character of a rewritten text came from in the text it was made of.

The canonical view (ext_proc.detect.canonical) and the decoded views (ext_proc.detect.decode)
rewrite a text by a list of edits: each edit replaces a range of the source with a (possibly empty,
possibly longer) piece, and everything between edits is kept one for one. A finding made in the
rewritten text is mapped back through these edits to the exact span of the source that produced
it, so redaction replaces what was written, never a normalised copy, and restore stays exact.

A map costs nothing where nothing was rewritten (`None` stands for the identity) and a bisection
per lookup otherwise; maps chain (a decoded view of a text, then the canonical view of that).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Span = tuple[int, int]
# An edit: (source start, source end, replacement). Edits are sorted and do not overlap.
Edit = tuple[int, int, str]


@dataclass(frozen=True, slots=True)
class EditMap:
    """The positions of a text rewritten by edits, mapped back to the source text.

    For edit k: the source range [source_start[k], source_end[k]) became the target range
    [target_start[k], target_end[k]); between two edits, characters correspond one for one.
    """

    target_start: tuple[int, ...]
    target_end: tuple[int, ...]
    source_start: tuple[int, ...]
    source_end: tuple[int, ...]
    source_length: int

    def char(self, index: int) -> Span:
        """The source range that target character `index` came from."""
        k = bisect_right(self.target_start, index) - 1
        if k < 0:
            return index, index + 1
        if index < self.target_end[k]:
            return self.source_start[k], self.source_end[k]
        at = self.source_end[k] + index - self.target_end[k]
        return at, at + 1

    def span(self, start: int, end: int) -> Span:
        """The source span of target characters [start, end): from the first source character
        that made `start` to the last that made `end - 1` (removed characters between them
        included)."""
        if end <= start:
            at = self.boundary(start)
            return at, at
        return self.char(start)[0], self.char(end - 1)[1]

    def boundary(self, index: int) -> int:
        """The source position of target position `index` (a place between characters)."""
        k = bisect_right(self.target_start, index) - 1
        if k < 0:
            return index
        if index < self.target_end[k]:
            return self.source_start[k]
        return self.source_end[k] + index - self.target_end[k]

    def touches(self, start: int, end: int) -> bool:
        """Whether target span [start, end) holds a character an edit produced."""
        k = bisect_right(self.target_start, max(start, end - 1)) - 1
        while k >= 0 and self.target_end[k] > start:
            if self.target_end[k] > self.target_start[k] and self.target_start[k] < end:
                return True
            k -= 1
        return False


def apply_edits(text: str, edits: Sequence[Edit]) -> tuple[str, EditMap | None]:
    """`text` with `edits` applied, and the map back to it (None when there were none)."""
    if not edits:
        return text, None
    pieces: list[str] = []
    t_start: list[int] = []
    t_end: list[int] = []
    s_start: list[int] = []
    s_end: list[int] = []
    last = 0
    at = 0  # length of the target so far
    for start, end, replacement in edits:
        if start > last:
            pieces.append(text[last:start])
            at += start - last
        pieces.append(replacement)
        t_start.append(at)
        at += len(replacement)
        t_end.append(at)
        s_start.append(start)
        s_end.append(end)
        last = end
    pieces.append(text[last:])
    mapping = EditMap(tuple(t_start), tuple(t_end), tuple(s_start), tuple(s_end), len(text))
    return "".join(pieces), mapping


def chain_span(maps: Iterable[EditMap | None], start: int, end: int) -> Span:
    """A span mapped back through `maps`, the last rewrite first."""
    for mapping in maps:
        if mapping is not None:
            start, end = mapping.span(start, end)
    return start, end
