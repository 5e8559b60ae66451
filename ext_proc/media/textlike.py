"""Text the reading did not account for: areas of an image that look like lines of text, found from
its pixels alone (not from tesseract), less what was read with confidence or painted over.

This is the independent half of masking: tesseract's blind spots (an odd angle, a faint colour,
a font it does not know) are not this detector's, so text that tesseract could not read is still
seen here, and the image is refused rather than sent with it.

1. **Where there may be text**: the edge map (a step of EDGE_DELTA grey levels or more, either
   polarity), less long straight rules and borders, summed in cells of CELL px; a cell dense
   enough in edges is a candidate.
2. **Accounted for**: the cells under a word read with confidence (MIN_CONFIDENCE) or under paint,
   each box grown by a margin, are removed; what is left is grouped into connected areas.
3. **Is it text?** Each area large enough to hold a few characters is cut out, turned level
   (projection profiles, as for the whole image), binarised against its own background (either
   polarity), and its ink split into connected components: glyphs are components of about the
   same height, not solid (a filled circle or a bar is not a letter), standing in a row with the
   small gaps of letter spacing. MIN_GLYPHS of them in a row is a line of text: an identifier
   has more characters than that, and three window buttons or a row of icons spaced like icons
   do not make one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from PIL import Image, ImageChops, ImageDraw

from ext_proc.media.orient import Turn, edge_map, line_angle, without_rules

Quad = tuple[tuple[float, float], ...]

CELL = 4  # px: cell side at 1x (larger for large images, see _cell)
MAX_CELLS = 160_000
CELL_DENSITY = 0.12  # fraction of a cell's pixels on an edge
MIN_CONFIDENCE = 60.0  # tesseract's word confidence (0-100) from which a word counts as read
MIN_EXTENT = 14  # px: an area shorter than this on its longest side cannot hold a few letters
MIN_GLYPHS = 4
MAX_AREA_PIXELS = 60_000  # an area is analysed at most this large (shrunk beyond)
DEVIATION_FLOOR = 12  # grey levels: the least difference from the background that counts as ink
SNAP_TO_TURN = 6.0  # degrees: an area's own angle this close to the whole image's is the image's
SOLID = 0.72  # a shape filling more of its box than this is not a letter
# px: letters shorter than this are legible to no reader; a row of such "glyphs" is the rim of
# letters whose word was read, left outside its box by a turn or by JPEG ringing.
MIN_TEXT_HEIGHT = 4.0


@dataclass(frozen=True, slots=True)
class Region:
    """An area that holds a line of text nobody read: its box in the image and its lines' angle."""

    box: tuple[int, int, int, int]
    angle: float  # the counter-clockwise turn in [0, 360) that makes its lines level
    glyphs: int
    height: float  # its letters' height in the image's pixels
    # Its rows of glyphs (left, top, right, bottom), in the image's pixels once `box` is cut out
    # and turned by `angle` (Turn.of(angle, size of box)).
    rows: tuple[tuple[int, int, int, int], ...] = ()


def _cell(size: tuple[int, int]) -> int:
    cell = CELL
    while (size[0] // cell) * (size[1] // cell) > MAX_CELLS:
        cell += 2
    return cell


def grow(quad: Quad, margin: float) -> Quad:
    """A quadrilateral pushed out from its centre by `margin` px along both of its axes."""
    cx = sum(x for x, _ in quad) / len(quad)
    cy = sum(y for _, y in quad) / len(quad)
    out = []
    for x, y in quad:
        dx, dy = x - cx, y - cy
        norm = math.hypot(dx, dy) or 1.0
        out.append((x + dx / norm * margin * math.sqrt(2), y + dy / norm * margin * math.sqrt(2)))
    return tuple(out)


def meet(a: Quad, b: Quad) -> bool:
    """Whether two convex quadrilaterals overlap (by separating axes: they do not when the
    projections on some edge's normal are apart). A touch along an edge is not an overlap."""
    for quad in (a, b):
        for (x0, y0), (x1, y1) in zip(quad, quad[1:] + quad[:1], strict=True):
            nx, ny = y0 - y1, x1 - x0
            a_span = [x * nx + y * ny for x, y in a]
            b_span = [x * nx + y * ny for x, y in b]
            if max(a_span) <= min(b_span) or max(b_span) <= min(a_span):
                return False
    return True


def unread_text(
    gray: Image.Image, accounted: Iterable[Quad], turns: Sequence[float] = (0.0,)
) -> list[Region]:
    """The areas of `gray` (8-bit grey) that look like text and lie outside `accounted` (the quads
    of confidently read words, and of paint). `turns` are the angles the whole image was read
    at: an area whose own lines run within SNAP_TO_TURN of one of them takes that turn (a short
    word gives a noisy angle)."""
    cell = _cell(gray.size)
    cols, rows = gray.width // cell, gray.height // cell
    if cols == 0 or rows == 0:
        return []
    edges = without_rules(edge_map(gray))
    density = edges.crop((0, 0, cols * cell, rows * cell)).resize((cols, rows), Image.Resampling.BOX)
    candidate = density.point(lambda v: 255 if v >= CELL_DENSITY * 255 else 0)
    covered = Image.new("L", gray.size, 0)
    draw = ImageDraw.Draw(covered)
    for quad in accounted:
        draw.polygon(list(quad), fill=255)
    # A cell counts as accounted for when most of it is: a box's edge crossing a cell of the next
    # word must not hide that word.
    covered_cells = (
        covered.crop((0, 0, cols * cell, rows * cell))
        .resize((cols, rows), Image.Resampling.BOX)
        .point(lambda v: 255 if v >= 128 else 0)
    )
    left = ImageChops.subtract(candidate, covered_cells).tobytes()
    regions = []
    for cells in _components(left, cols, rows):
        xs = [i % cols for i in cells]
        ys = [i // cols for i in cells]
        box = (min(xs) * cell, min(ys) * cell, (max(xs) + 1) * cell, (max(ys) + 1) * cell)
        if max(box[2] - box[0], box[3] - box[1]) < MIN_EXTENT:
            continue
        region = _analyse(gray, covered, box, cell, turns)
        if region is not None:
            regions.append(region)
    return regions


def _components(mask: bytes, cols: int, rows: int) -> list[list[int]]:
    """The 8-connected groups of non-zero cells of a `cols` x `rows` mask."""
    seen = bytearray(len(mask))
    groups = []
    for start, value in enumerate(mask):
        if not value or seen[start]:
            continue
        seen[start] = 1
        stack, group = [start], []
        while stack:
            i = stack.pop()
            group.append(i)
            x, y = i % cols, i // cols
            for ny in (y - 1, y, y + 1):
                if ny < 0 or ny >= rows:
                    continue
                for nx in (x - 1, x, x + 1):
                    if 0 <= nx < cols:
                        j = ny * cols + nx
                        if mask[j] and not seen[j]:
                            seen[j] = 1
                            stack.append(j)
        groups.append(group)
    return groups


def _analyse(
    gray: Image.Image,
    covered: Image.Image,
    box: tuple[int, int, int, int],
    cell: int,
    turns: Sequence[float],
) -> Region | None:
    """The region in `box` if its ink holds a row of MIN_GLYPHS glyph-like components."""
    pad = 2 * cell
    box = (
        max(0, box[0] - pad),
        max(0, box[1] - pad),
        min(gray.width, box[2] + pad),
        min(gray.height, box[3] + pad),
    )
    crop = gray.crop(box)
    hidden = covered.crop(box)
    background = _mode(crop, hidden)
    # What was read stays out of the analysis: it is laid in the background's tone.
    crop.paste(background, (0, 0), hidden)
    scale = min(1.0, math.sqrt(MAX_AREA_PIXELS / max(1, crop.width * crop.height)))
    if scale < 1.0:
        crop = crop.resize(
            (max(1, round(crop.width * scale)), max(1, round(crop.height * scale))), Image.Resampling.BOX
        )
    ink = _ink(crop, background)
    # Cheap first: an area without MIN_GLYPHS letter-like shapes (an icon, a rule, a filled
    # button) is not text at any angle.
    shapes = [
        b for b in _blobs(ink) if max(b.width, b.height) >= 3 and b.pixels <= SOLID * b.width * b.height
    ]
    if len(shapes) < MIN_GLYPHS:
        return None
    angle = line_angle(edge_map(crop)) if min(crop.size) >= 8 else turns[0] % 180.0
    for turn in turns:
        gap = (angle - turn) % 180.0
        if min(gap, 180.0 - gap) <= SNAP_TO_TURN:
            angle = turn
            break
    for candidate in dict.fromkeys([angle, *turns]):
        level = Turn.of(candidate, ink.size).apply(ink, fill=0, resample=Image.Resampling.NEAREST)
        rows, height = _rows(level)
        glyphs = max((count for count, _ in rows), default=0)
        if glyphs >= MIN_GLYPHS and height / scale >= MIN_TEXT_HEIGHT:
            boxes = tuple(
                (round(b[0] / scale), round(b[1] / scale), round(b[2] / scale), round(b[3] / scale))
                for count, b in rows
                if count >= MIN_GLYPHS
            )
            return Region(box, candidate, glyphs, height / scale, boxes)
    return None


def _mode(crop: Image.Image, hidden: Image.Image) -> int:
    histogram = crop.histogram(mask=hidden.point(lambda v: 0 if v else 255))
    if not any(histogram):
        histogram = crop.histogram()
    return max(range(256), key=histogram.__getitem__)


def _ink(level: Image.Image, background: int) -> Image.Image:
    """1 (as 255) where a pixel departs from the background by at least half the area's strong
    departures (its 98th percentile), in either direction; 0 elsewhere."""
    deviation = level.point(lambda v: abs(v - background))
    histogram = deviation.histogram()
    total = sum(histogram)
    if not total:
        return deviation
    rank, running, strong = 0.98 * total, 0, 0
    for value, count in enumerate(histogram):
        running += count
        if running >= rank:
            strong = value
            break
    threshold = max(DEVIATION_FLOOR, strong // 2)
    return deviation.point(lambda v: 255 if v >= threshold else 0)


@dataclass(frozen=True, slots=True)
class _Blob:
    left: int
    top: int
    right: int  # exclusive
    bottom: int  # exclusive
    pixels: int

    @property
    def width(self) -> int:
        return self.right - self.left

    @property
    def height(self) -> int:
        return self.bottom - self.top


def _blobs(ink: Image.Image) -> list[_Blob]:
    """The 8-connected components of the ink (a few thousand pixels of text at most), each as its
    box and pixel count."""
    width, height = ink.size
    blobs = []
    for group in _components(ink.tobytes(), width, height):
        xs = [i % width for i in group]
        ys = [i // width for i in group]
        blobs.append(_Blob(min(xs), min(ys), max(xs) + 1, max(ys) + 1, len(group)))
    return blobs


def _rows(ink: Image.Image) -> tuple[list[tuple[int, tuple[int, int, int, int]]], float]:
    """The rows of glyph-like components standing in line with letter spacing (each: how many
    letters, and its box), and the letters' typical height."""
    blobs = [b for b in _blobs(ink) if b.height >= 3 or b.width >= 3]
    if len(blobs) < MIN_GLYPHS:
        return [], 0.0
    height = statistics.median(b.height for b in blobs)
    glyphs = [
        b
        for b in blobs
        if 0.4 * height <= b.height <= 1.8 * height
        and b.width <= 6 * height
        and b.pixels <= SOLID * b.width * b.height  # a solid shape is not a letter
    ]
    glyphs.sort(key=lambda b: b.left)
    rows: list[list[float]] = []  # centre y, left, top, right, bottom, letters
    for blob in glyphs:
        centre = (blob.top + blob.bottom) / 2
        letters = max(1, round(blob.width / (0.75 * blob.height)))  # letters run together
        for row in rows:
            if abs(row[0] - centre) <= 0.5 * height and blob.left - row[3] <= 0.9 * height:
                row[0] = centre
                row[2], row[3], row[4] = (
                    min(row[2], blob.top),
                    max(row[3], blob.right),
                    max(row[4], blob.bottom),
                )
                row[5] += letters
                break
        else:
            rows.append([centre, blob.left, blob.top, blob.right, blob.bottom, letters])
    return [(int(r[5]), (int(r[1]), int(r[2]), int(r[3]), int(r[4]))) for r in rows], float(height)
