"""One reading of an image: every word tesseract finds in it, at the angle its text runs, at two
scales and both polarities, then again, closer, wherever text was left unread.

1. **The whole image**, turned so that its text is level and upright (`orient.orientations`: one
   turn, or two when up and down are too close to call), each turn read at 1x and 2x (2x within
   UPSCALE_MAX_PIXELS), as it is and inverted (tesseract reads dark text on a light ground; a
   screenshot has both), all pages in one tesseract process. An image whose tones span less
   than half the range is stretched first (a dim screenshot).
2. **What is left**: the areas that look like text and are not under a confidently read word
   (`textlike.unread_text`) are cut out one by one, turned level by their own angle (a label at
   45° in an upright page), normalised to dark ink on white by how far each pixel departs from
   the area's own background (a faint grey, either polarity: dark-theme secondary text, a light
   grey caption), and read at 2x and 3x, upright and upside down.
3. Words come back as quadrilaterals in the image's own pixels (a word read in a turned view is a
   turned box in the image), each shrunk to its own ink (`ink_box`), with their confidence;
   what is still unread after step 2 is part of the reading, and masking refuses an image that
   holds any.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image, ImageChops, ImageFilter, ImageOps

from ext_proc.media.image import OcrTimeout
from ext_proc.media.orient import UPRIGHT_MARGIN, Turn, asymmetry, edge_map, orientations
from ext_proc.media.tesseract import Recognised, read_pages
from ext_proc.media.textlike import Quad, Region

UPSCALE_MAX_PIXELS = 24_000_000  # a view is also read at 2x unless that is larger than this
REGION_SCALES = (2, 3)
REGION_MAX_PIXELS = 4_000_000  # a cut-out area is read at a scale only within this
MAX_REGIONS = 24  # cut-out areas read closer per reading; more than this is refused as unread
LOW_RANGE = 128  # an image whose tones (1st to 99th percentile) span less than this is stretched
INK_FLOOR = 12  # grey levels: the least departure from a word box's ground that counts as ink


@dataclass(frozen=True, slots=True)
class Word:
    """A recognised word: its text, confidence (0-100), corners in the image's pixels, its height
    there, and the line it was read in (pass, page, block, paragraph, line)."""

    text: str
    conf: float
    quad: Quad
    height: float
    line: tuple[int, ...]

    @property
    def box(self) -> tuple[int, int, int, int]:
        xs = [x for x, _ in self.quad]
        ys = [y for _, y in self.quad]
        return math.floor(min(xs)), math.floor(min(ys)), math.ceil(max(xs)), math.ceil(max(ys))


@dataclass(slots=True)
class Pass:
    """What one pass found: the words, the turns the image was read at, the tesseract runs'
    seconds."""

    words: list[Word] = field(default_factory=list)
    turns: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Page:
    """How a page maps back: its scale over the view, the view's turn, the view's offset in the
    image (for a cut-out area), the line key's prefix, and the page's offset in the view (a row
    cut out of a turned area)."""

    scale: int
    turn: Turn
    offset: tuple[int, int]
    key: tuple[int, ...]
    inner: tuple[int, int] = (0, 0)


def background(gray: Image.Image) -> int:
    """The most common tone: the ground turned views are filled with."""
    histogram = gray.histogram()
    return max(range(256), key=histogram.__getitem__)


def stretched(gray: Image.Image) -> Image.Image:
    """`gray` with its tones stretched to the full range when they span less than LOW_RANGE."""
    histogram = gray.histogram()
    total = sum(histogram)
    low = high = running = 0
    for value, count in enumerate(histogram):
        running += count
        if running <= 0.01 * total:
            low = value
        if running < 0.99 * total:
            high = value + 1
    if high - low >= LOW_RANGE:
        return gray
    return ImageOps.autocontrast(gray, cutoff=1)


def read_whole(gray: Image.Image, deadline: float, turns: Sequence[float] | None = None) -> Pass:
    """The whole of `gray` (8-bit) read at each of `turns` (default: the angles its text runs at),
    1x and 2x, both polarities, in one tesseract process."""
    found = Pass(turns=list(turns) if turns is not None else orientations(gray))
    ground = background(gray)
    source = stretched(gray)
    pages: list[Image.Image] = []
    plans: list[_Page] = []
    for index, degrees in enumerate(found.turns):
        turn = Turn.of(degrees, gray.size)
        view = turn.apply(source, fill=ground)
        fits = view.width * view.height * 4 <= UPSCALE_MAX_PIXELS
        for scale in (1, 2) if fits else (1,):
            if scale == 1:
                scaled = view
            else:
                scaled = view.resize((view.width * 2, view.height * 2), Image.Resampling.LANCZOS)
            for polarity, page in enumerate((scaled, ImageOps.invert(scaled))):
                pages.append(page)
                plans.append(_Page(scale, turn, (0, 0), (index, scale, polarity)))
    found.words = _run(pages, plans, deadline, found)
    return found


def read_areas(
    gray: Image.Image, regions: Sequence[Region], deadline: float, turns: Sequence[float] = (0.0,)
) -> Pass:
    """Each area of `gray` cut out, turned level by its own angle (upright, or both ways when that
    is unclear), each of its rows of letters cut out again on its own (a row inside a button is
    read without the button's frame), and read at REGION_SCALES as it is, inverted, and
    normalised to dark ink on white (`ink_view`), all in one process. `turns` are the angles the
    whole image was read at: an area running along one of them is read the same ways."""
    found = Pass()
    pages: list[Image.Image] = []
    plans: list[_Page] = []
    for index, region in enumerate(regions[:MAX_REGIONS]):
        crop = gray.crop(region.box)
        ground = background(crop)
        if region.angle in turns:
            ways = list(turns)
        else:
            level = Turn.of(region.angle, crop.size)
            lean = asymmetry(level.apply(edge_map(crop), fill=0, resample=Image.Resampling.NEAREST))
            ways = [region.angle % 360.0, (region.angle + 180.0) % 360.0]
            if lean >= UPRIGHT_MARGIN:
                ways = ways[:1]
            elif lean <= -UPRIGHT_MARGIN:
                ways = ways[1:]
        inked = ink_view(crop, region.height)
        for way in ways:
            turn = Turn.of(way, crop.size)
            views = (turn.apply(crop, fill=ground), turn.apply(inked, fill=255))
            for piece in _pieces(region, way, turn.size):
                for scale in REGION_SCALES:
                    width, height = piece[2] - piece[0], piece[3] - piece[1]
                    if width * height * scale * scale > REGION_MAX_PIXELS:
                        continue
                    raw, ink = (
                        view.crop(piece).resize((width * scale, height * scale), Image.Resampling.LANCZOS)
                        for view in views
                    )
                    key = (100 + index, round(way * 4), piece[0], piece[1], scale)
                    for kind, variant in enumerate((raw, ImageOps.invert(raw), ink)):
                        pages.append(variant)
                        plans.append(_Page(scale, turn, region.box[:2], (*key, kind), piece[:2]))
    if pages:
        found.words = _run(pages, plans, deadline, found, block=True)
    return found


def _pieces(region: Region, way: float, size: tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """What to cut out of an area's turned view: each row of letters with a margin (a row found
    turned by the area's angle is mirrored in the view turned the other way up), or the whole
    view when no row was measured."""
    width, height = size
    if not region.rows:
        return [(0, 0, width, height)]
    flip = abs(((way - region.angle) % 360.0) - 180.0) < 1e-6
    across = max(3, round(0.6 * region.height))
    along = max(4, round(1.2 * region.height))
    out = []
    for left, top, right, bottom in region.rows:
        if flip:
            left, top, right, bottom = width - right, height - bottom, width - left, height - top
        out.append(
            (
                max(0, left - along),
                max(0, top - across),
                min(width, right + along),
                min(height, bottom + across),
            )
        )
    return out


def ink_view(crop: Image.Image, text_height: float) -> Image.Image:
    """Dark ink on white: each pixel darkened by how far it departs from its local background
    (the median of a window about twice the text's height: the ground the text stands on, be it
    the page, a button or a badge), the strongest departures (98th percentile) black. A faint
    grey on black, a light grey on white and white on a blue button all come out black on white,
    and a filled button becomes an outline (tesseract reads text inside a filled shape poorly)."""
    size = max(9, min(31, 2 * round(text_height) + 1))
    local = crop.filter(ImageFilter.MedianFilter(size | 1))
    deviation = ImageChops.difference(crop, local)
    histogram = deviation.histogram()
    total = sum(histogram)
    running, strong = 0, 1
    for value, count in enumerate(histogram):
        running += count
        if running >= 0.98 * total:
            strong = max(1, value)
            break
    return deviation.point(lambda v: 255 - min(255, v * 255 // strong))


def _run(
    pages: list[Image.Image], plans: list[_Page], deadline: float, found: Pass, *, block: bool = False
) -> list[Word]:
    if time.monotonic() >= deadline:
        raise OcrTimeout("OCR did not finish within the budget")
    start = time.perf_counter()
    recognised = read_pages(pages, deadline, block=block)
    found.seconds.append(time.perf_counter() - start)
    return [_word(item, plans[item.page], ink_box(pages[item.page], item.box)) for item in recognised]


# Lookup tables: how far each tone is from a ground tone; 255 from a threshold on, else 0.
_DEPARTURE = [[abs(v - ground) for v in range(256)] for ground in range(256)]
_AT_LEAST = [[255 if v >= threshold else 0 for v in range(256)] for threshold in range(256)]


def ink_box(page: Image.Image, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """`box` (a word's box in `page`) shrunk to the word's own ink: the band of rows holding most
    of the ink that departs from the box's dominant tone (either polarity), and its columns.

    tesseract's box of a word read in the inverted view of a page can span the dark ground
    between lines and take in the neighbouring lines' edges. Such a box, painted, blots out the
    lines around an identifier (which are then unreadable, and the image refused); trusted as
    read, it would hide text of those lines that nobody read. Only ever shrinks; a box without
    clear ink is kept as it is."""
    left, top, right, bottom = box
    width, height = right - left, bottom - top
    if width < 2 or height < 4:
        return box
    crop = page.crop(box)
    histogram = crop.histogram()
    deviation = crop.point(_DEPARTURE[histogram.index(max(histogram))])
    spread = deviation.histogram()
    running, strong = 0, 0
    for value, count in enumerate(spread):
        running += count
        if running >= 0.98 * width * height:
            strong = value
            break
    if strong < INK_FLOOR:
        return box
    ink = deviation.point(_AT_LEAST[max(INK_FLOOR, strong // 2)])
    rows = ink.resize((1, height), Image.Resampling.BOX).tobytes()
    # Bands of inked rows; a gap of a twelfth of the box (the dot of an i, an accent) stays inside
    # a band, the space between two lines does not.
    gap = max(2, height // 12)
    bands: list[list[int]] = []  # first row, last row, ink
    for y, value in enumerate(rows):
        if not value:
            continue
        if bands and y - bands[-1][1] <= gap:
            bands[-1][1] = y
            bands[-1][2] += value
        else:
            bands.append([y, y, value])
    if not bands:
        return box
    first, last, _ = max(bands, key=lambda band: band[2])
    # Sparse rows at the band's edges (averaged away above) within the gap belong to it too.
    found = ink.crop((0, max(0, first - gap), width, min(height, last + gap + 1))).getbbox()
    if found is None:
        return box
    x0, y0, x1, y1 = found
    y0 += max(0, first - gap)
    y1 += max(0, first - gap)
    return left + x0, top + y0, left + x1, top + y1


def _word(item: Recognised, plan: _Page, box: tuple[int, int, int, int]) -> Word:
    ix, iy = plan.inner
    left, top, right, bottom = (v / plan.scale for v in box)
    quad = plan.turn.quad((left + ix, top + iy, right + ix, bottom + iy))
    ox, oy = plan.offset
    return Word(
        item.text,
        item.conf,
        tuple((x + ox, y + oy) for x, y in quad),
        bottom - top,
        (*plan.key, *item.line),
    )
