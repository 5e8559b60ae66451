"""One reading out of many: the best-read word at each place of an image, in rows, in reading
order, for media/find.py to search beside the readings it already has.

An image is read many times (two scales, both polarities, turned views, cut-out areas read
closer), and each reading sees part of a line: the whole-image reading loses a faint group of
digits that the closer reading of that area finds, and the closer reading sees each area alone.
An identifier split over readings is in no single one of them. Here every word of every reading
is laid where it stands in the image: where words overlap, the most confident stays; the words
left are grouped into rows along their own direction and ordered along it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from ext_proc.media.read import Word
from ext_proc.media.textlike import Quad

GRID = 48  # px: the cells in which overlapping words are looked up
SAME = 0.5  # a word is at another's place when this much of its box is under the other's
ANGLE_STEP = 4.0  # degrees: words whose direction rounds to one step run the same way


def canonical(words: Sequence[Word]) -> list[tuple[int, tuple[int, ...]]]:
    """(index into `words`, line key) of the best-read word at each place, row after row, each
    row in reading order; the keys are new lines (they start with -1)."""
    chosen: list[int] = []
    cells: dict[tuple[int, int], list[int]] = {}
    for index in sorted(range(len(words)), key=lambda i: (-words[i].conf, -len(words[i].text), i)):
        box, quad = words[index].box, words[index].quad
        if not any(c.isalnum() for c in words[index].text):
            continue  # a stroke read as "|" or "—" carries nothing, and must not hide a word
        if any(_within(quad, words[other].quad) for other in _near(cells, box)):
            continue
        chosen.append(index)
        for cell in _cells(box):
            cells.setdefault(cell, []).append(index)
    by_way: dict[int, list[tuple[float, float, float, int]]] = {}
    for index in chosen:
        word = words[index]
        (x0, y0), (x1, y1) = word.quad[0], word.quad[1]
        angle = math.degrees(math.atan2(y1 - y0, x1 - x0))
        way = round(angle / ANGLE_STEP) % round(360 / ANGLE_STEP)
        rad = math.radians(way * ANGLE_STEP)
        cx = sum(x for x, _ in word.quad) / len(word.quad)
        cy = sum(y for _, y in word.quad) / len(word.quad)
        along = cx * math.cos(rad) + cy * math.sin(rad)
        across = -cx * math.sin(rad) + cy * math.cos(rad)
        by_way.setdefault(way, []).append((across, along, max(1.0, word.height), index))
    out: list[tuple[int, tuple[int, ...]]] = []
    for way, placed in sorted(by_way.items()):
        placed.sort()
        row: list[tuple[float, float, float, int]] = []
        number = 0
        for item in placed:
            if row and item[0] - row[0][0] > 0.5 * max(item[2], row[0][2]):
                out += [(index, (-1, way, number)) for _, _, _, index in sorted(row, key=lambda r: r[1])]
                row, number = [], number + 1
            row.append(item)
        out += [(index, (-1, way, number)) for _, _, _, index in sorted(row, key=lambda r: r[1])]
    return out


def same_place(words: Sequence[Word], indices: set[int]) -> set[int]:
    """The words at the same place as any of `indices` (the same word in other readings)."""
    cells: dict[tuple[int, int], list[int]] = {}
    for index in indices:
        for cell in _cells(words[index].box):
            cells.setdefault(cell, []).append(index)
    return {
        i
        for i, word in enumerate(words)
        if i not in indices and any(_same(word.quad, words[j].quad) for j in _near(cells, word.box))
    }


def _cells(box: tuple[int, int, int, int]) -> Iterator[tuple[int, int]]:
    left, top, right, bottom = box
    for gy in range(top // GRID, bottom // GRID + 1):
        for gx in range(left // GRID, right // GRID + 1):
            yield gx, gy


def _near(cells: dict[tuple[int, int], list[int]], box: tuple[int, int, int, int]) -> set[int]:
    return {other for cell in _cells(box) for other in cells.get(cell, ())}


def _within(a: Quad, b: Quad) -> bool:
    """Whether `b` covers SAME of `a` or more: `a` is (mostly) at `b`'s place. Measured along
    `a`'s own axes (a word at 45° has a bounding box that takes in the lines beside it)."""
    (x0, y0), (x1, y1) = a[0], a[1]
    length = math.hypot(x1 - x0, y1 - y0) or 1.0
    ux, uy = (x1 - x0) / length, (y1 - y0) / length
    overlap = 1.0
    for ax, ay in ((ux, uy), (-uy, ux)):
        a_low, a_high = _span(a, ax, ay)
        b_low, b_high = _span(b, ax, ay)
        width = min(a_high, b_high) - max(a_low, b_low)
        if width <= 0:
            return False
        overlap *= width / max(1.0, a_high - a_low)
    return overlap >= SAME


def _span(quad: Quad, ax: float, ay: float) -> tuple[float, float]:
    projected = [x * ax + y * ay for x, y in quad]
    return min(projected), max(projected)


def _same(a: Quad, b: Quad) -> bool:
    """Whether `a` and `b` are at one place (either covers SAME of the other)."""
    return _within(a, b) or _within(b, a)
