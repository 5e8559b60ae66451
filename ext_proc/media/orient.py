"""Which way the text of an image runs: the turn that makes its lines level and upright, and the
geometry that maps a word found in a turned view back onto the image.

tesseract reads level text only (a few degrees of skew; its orientation detector needs an `osd`
model the wheel here does not ship), and a screenshot arrives turned 90° or 180°, photographed at
an angle, or pasted at 45°. This finds the angle without tesseract, from the image's edges:

- **the line angle**, by projection profiles: the edge map is turned through every angle and its
  rows summed; text lines give the most concentrated rows (the largest sum of squares) when they
  are level. A coarse pass every 2° on a small copy, then a fine one every 0.25° near the best.
  That fixes the angle modulo 180°.
- **up or down**: in Latin text, ascenders (b d f h k l t, capitals, digits) stand above the
  x-height band far more often than descenders (g j p q y) hang below it. Per text line (in
  vertical strips, so that columns need not align), the edge mass above the line's dense core is
  compared with the mass below. When the two are too close to call (numbers, capitals only),
  both ways are read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PIL import Image, ImageChops, ImageFilter

EDGE_DELTA = 16  # grey levels across 3 px: dim text (a contrast of ~35 levels) still has edges
COARSE_SIDE = 240  # px: the longest side of the copy searched every COARSE_STEP degrees
FINE_SIDE = 560
COARSE_STEP = 2.0
FINE_STEP = 0.25
SNAP = 1.5  # degrees: within this of a right angle, the exact right angle (tesseract copes)
UPRIGHT_MARGIN = 0.15  # |asymmetry| below this: up and down both read
STRIP = 240  # px: vertical strips in which line profiles are taken for up/down
RULE_RUN = 16  # px: an unbroken straight run of edges this long is a rule, not text
MIN_EDGE_FRACTION = 0.0005  # an image with fewer edge pixels than this has no text to orient


@dataclass(frozen=True, slots=True)
class Turn:
    """A rotation of an image about its centre by `degrees` counter-clockwise (Pillow's sense), on
    a canvas grown to hold the whole turned image."""

    degrees: float
    source: tuple[int, int]  # the image's (width, height)
    size: tuple[int, int]  # the turned view's (width, height)

    @classmethod
    def of(cls, degrees: float, source: tuple[int, int]) -> Turn:
        degrees %= 360.0
        width, height = source
        if degrees in (90.0, 270.0):
            return cls(degrees, source, (height, width))
        if degrees in (0.0, 180.0):
            return cls(degrees, source, source)
        rad = math.radians(degrees)
        cos, sin = abs(math.cos(rad)), abs(math.sin(rad))
        size = (math.ceil(width * cos + height * sin - 1e-6), math.ceil(width * sin + height * cos - 1e-6))
        return cls(degrees, source, size)

    @property
    def right_angle(self) -> bool:
        return self.degrees % 90.0 == 0.0

    def apply(
        self,
        image: Image.Image,
        fill: int = 255,
        resample: Image.Resampling = Image.Resampling.BICUBIC,
    ) -> Image.Image:
        """The turned view of `image` (exact for right angles, resampled otherwise, the uncovered
        corners in `fill`)."""
        if self.degrees == 0.0:
            return image
        if self.right_angle:
            method = {
                90.0: Image.Transpose.ROTATE_90,
                180.0: Image.Transpose.ROTATE_180,
                270.0: Image.Transpose.ROTATE_270,
            }[self.degrees]
            return image.transpose(method)
        return image.transform(
            self.size,
            Image.Transform.AFFINE,
            self._affine(),
            resample=resample,
            fillcolor=fill,
        )

    def _affine(self) -> tuple[float, float, float, float, float, float]:
        """Pillow's affine data: a view pixel (x, y) takes the image's value at
        (a x + b y + c, d x + e y + f)."""
        rad = math.radians(self.degrees)
        cos, sin = math.cos(rad), math.sin(rad)
        cx, cy = self.source[0] / 2, self.source[1] / 2
        vx, vy = self.size[0] / 2, self.size[1] / 2
        return (cos, -sin, cx - cos * vx + sin * vy, sin, cos, cy - sin * vx - cos * vy)

    def back(self, x: float, y: float) -> tuple[float, float]:
        """A point of the view, in the image's coordinates."""
        a, b, c, d, e, f = self._affine()
        return a * x + b * y + c, d * x + e * y + f

    def quad(self, box: tuple[float, float, float, float]) -> tuple[tuple[float, float], ...]:
        """The corners of a view box (left, top, right, bottom), in the image's coordinates."""
        left, top, right, bottom = box
        return tuple(self.back(x, y) for x, y in ((left, top), (right, top), (right, bottom), (left, bottom)))


# Sobel kernels scaled so that a sharp step of D grey levels gives D (offset 128: both signs).
_SOBEL_X = ImageFilter.Kernel((3, 3), [-1, 0, 1, -2, 0, 2, -1, 0, 1], scale=4, offset=128)
_SOBEL_Y = ImageFilter.Kernel((3, 3), [-1, -2, -1, 0, 0, 0, 1, 2, 1], scale=4, offset=128)


def edge_map(gray: Image.Image, delta: int = EDGE_DELTA) -> Image.Image:
    """255 where the grey level steps by `delta` or more (either polarity, either direction),
    else 0."""
    lut = [255 if abs(v - 128) >= delta else 0 for v in range(256)]
    return ImageChops.lighter(gray.filter(_SOBEL_X).point(lut), gray.filter(_SOBEL_Y).point(lut))


def _shrink(image: Image.Image, side: int) -> Image.Image:
    scale = max(image.size) / side
    if scale <= 1:
        return image
    size = (max(1, round(image.width / scale)), max(1, round(image.height / scale)))
    return image.resize(size, Image.Resampling.BOX)


def _concentration(image: Image.Image, degrees: float) -> float:
    """How concentrated the row sums of `image` turned by `degrees` are (sum of squares over the
    square of the sum: large when the ink gathers in few rows, as level text lines do)."""
    turned = image.rotate(degrees, resample=Image.Resampling.NEAREST, expand=True)
    rows = turned.resize((1, turned.height), Image.Resampling.BOX).tobytes()
    total = sum(rows)
    return sum(v * v for v in rows) / (total * total) if total else 0.0


def line_angle(edges: Image.Image) -> float:
    """The counter-clockwise turn in [0, 180) that makes the text lines of an edge map level."""
    coarse = _shrink(edges, COARSE_SIDE)
    best = max(
        (_concentration(coarse, a * COARSE_STEP), a * COARSE_STEP) for a in range(int(180 / COARSE_STEP))
    )[1]
    fine = _shrink(edges, FINE_SIDE)
    span = int(COARSE_STEP / FINE_STEP)
    angle = max(
        (_concentration(fine, best + k * FINE_STEP), best + k * FINE_STEP) for k in range(-span, span + 1)
    )[1]
    return angle % 180.0


def without_rules(edges: Image.Image, run: int = RULE_RUN) -> Image.Image:
    """The edge map less its long straight horizontal and vertical runs (rules, borders, the edge of
    a panel): `run` edge pixels in a row (or column) aligned on a multiple of `run`."""
    width, height = edges.size
    if width < run or height < run:
        return edges
    full = [255 if v >= 250 else 0 for v in range(256)]
    rows = edges.resize((width // run, height), Image.Resampling.BOX).point(full)
    cols = edges.resize((width, height // run), Image.Resampling.BOX).point(full)
    rules = ImageChops.lighter(
        rows.resize((width // run * run, height), Image.Resampling.NEAREST).crop((0, 0, width, height)),
        cols.resize((width, height // run * run), Image.Resampling.NEAREST).crop((0, 0, width, height)),
    )
    return ImageChops.subtract(edges, rules)


def asymmetry(edges: Image.Image) -> float:
    """In (-1, 1): positive when the level text lines of an edge map stand upright (more edge mass
    above each line's dense core than below it), negative when they are upside down."""
    edges = without_rules(edges)
    above = below = 0.0
    starts = list(range(0, max(1, edges.width - STRIP // 2), STRIP))  # the last strip takes the rest
    for x0, x1 in zip(starts, [*starts[1:], edges.width], strict=True):
        strip = edges.crop((x0, 0, x1, edges.height))
        rows = strip.resize((1, strip.height), Image.Resampling.BOX).tobytes()
        # A row belongs to a line when it holds an eighth of the strip's densest row: a diagonal
        # stroke crossing the strip (a tilted frame) does not join the lines into one.
        floor = max(3, max(rows, default=0) // 8)
        r, n = 0, len(rows)
        while r < n:
            if rows[r] < floor:
                r += 1
                continue
            start = r
            while r < n and rows[r] >= floor:
                r += 1
            run = rows[start:r]
            if not 6 <= len(run) <= 120:  # a rule or a border; a block of graphics
                continue
            peak = max(run)
            core = [i for i, v in enumerate(run) if 2 * v >= peak]
            above += sum(run[: core[0]])
            below += sum(run[core[-1] + 1 :])
    total = above + below
    return (above - below) / total if total else 0.0


def orientations(gray: Image.Image) -> list[float]:
    """The turns (counter-clockwise degrees) to read `gray` at, most likely first: one when the
    text's direction is clear, two (up and down) when it is not; [0] for an image without text."""
    edges = edge_map(_shrink(gray, 2000))
    if edges.histogram()[255] < MIN_EDGE_FRACTION * edges.width * edges.height:
        return [0.0]
    angle = line_angle(edges)
    for right in (0.0, 90.0, 180.0):
        if abs(angle - right) <= SNAP:
            angle = right % 180.0
    level = Turn.of(angle, edges.size).apply(edges, fill=0, resample=Image.Resampling.NEAREST)
    lean = asymmetry(level)
    if lean >= UPRIGHT_MARGIN:
        return [angle]
    if lean <= -UPRIGHT_MARGIN:
        return [(angle + 180.0) % 360.0]
    return [angle, (angle + 180.0) % 360.0]
