"""Masking one image, start to finish: read, find, refuse what cannot be read, paint, read again.

1. Decode and normalise (media/image.py): the 8-bit grey image that is both read and sent.
2. Read the whole image at the angle its text runs (media/read.py, media/orient.py), and find the
   identifiers among the words (media/find.py: in each reading's lines, and in the one reading
   made of the best word at each place, media/rows.py).
3. Account for its text (media/textlike.py): every area that looks like text must lie under a
   confidently read word or under paint. Areas that do not are read again, cut out, levelled,
   normalised and enlarged; what is still unread after that is refused (MaskError): text that
   cannot be read cannot be masked, and is not sent on the chance it holds nothing.
4. Paint each marked word's quadrilateral (grown by a margin) in black, re-encode from the pixels
   alone, and read what would be sent again, at the same angles, with the same accounting
   (words an earlier reading confirmed away from the paint still count: their pixels have not
   changed): anything found is painted and read again, two rounds at most; still something →
   refused.
   An image where the first reading finds nothing to paint is sent as re-encoded after one
   reading (its pixels are the ones read).
5. Count what was painted: the detectors' findings, as values by label (media/find.py `Tally`).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

from ext_proc.media.find import Declared, Detector, Hit, Tally, find_values
from ext_proc.media.image import (
    PIXELS_IN_FLIGHT,
    MaskError,
    OcrTimeout,
    decode_payload,
    encode_image,
    normalize,
    open_image,
    pixels_of,
)
from ext_proc.media.read import Word, read_areas, read_whole
from ext_proc.media.textlike import MIN_CONFIDENCE, Quad, grow, meet, unread_text

MAX_ROUNDS = 2
MARGIN = 3  # px painted around each word's box at least (a fifth of its height for large text)


@dataclass(slots=True)
class MaskResult:
    """What masking one image took: words painted, the values painted by label (each once,
    however often it was read), readings, and each tesseract run's seconds."""

    masked_words: int = 0
    values: dict[str, int] = field(default_factory=dict)
    passes: int = 0
    pass_seconds: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Accounted:
    """One image's reading so far: the words, the turns it was read at, what to paint, and the
    detectors' findings among the words."""

    words: list[Word]
    turns: list[float]
    marked: set[int]
    hits: list[Hit]


def paint_quads(words: Sequence[Word], indices: set[int]) -> list[Quad]:
    """The quads to paint for the marked words: each word's own, grown by a margin."""
    return [grow(words[i].quad, max(MARGIN, 0.2 * words[i].height)) for i in sorted(indices)]


def paint(image: Image.Image, quads: Sequence[Quad]) -> Image.Image:
    """A copy of `image` (8-bit grey) with each quad filled black."""
    painted = image.copy()
    draw = ImageDraw.Draw(painted)
    for quad in quads:
        draw.polygon(list(quad), fill=0)
    return painted


def mask_image(
    payload: str,
    detectors: Sequence[Detector],
    fuzzy: Declared | None,
    *,
    declared: str | None = None,
    deadline: float,
) -> tuple[str, MaskResult]:
    """The payload string (same form: bare base64 or the same data: URL prefix) with every
    identifier painted over, after a clean re-reading; MaskError otherwise."""
    data, url_type, prefix = decode_payload(payload)
    with PIXELS_IN_FLIGHT.hold(pixels_of(data), deadline):
        return _mask_decoded(data, url_type or declared, prefix, detectors, fuzzy, deadline)


def _mask_decoded(
    data: bytes,
    declared: str | None,
    prefix: str,
    detectors: Sequence[Detector],
    fuzzy: Declared | None,
    deadline: float,
) -> tuple[str, MaskResult]:
    image, fmt = open_image(data, declared)
    gray = normalize(image)  # read and sent alike
    result = MaskResult()
    state = _account(gray, None, [], detectors, fuzzy, deadline, result)
    if not state.marked:
        encoded = encode_image(gray, fmt)
    else:
        painted: list[Quad] = []
        kept: list[Word] = []
        tally = Tally()
        rounds = 0
        while state.marked:
            if rounds == MAX_ROUNDS:
                raise MaskError(f"identifiers were still legible after {MAX_ROUNDS} rounds of masking")
            rounds += 1
            result.masked_words += len(state.marked)
            tally.add(state.hits)
            quads = paint_quads(state.words, state.marked)
            painted += quads
            kept = _unpainted([*kept, *confirmed(state.words)], painted)
            gray = paint(gray, quads)
            encoded = encode_image(gray, fmt)
            gray = normalize(open_image(encoded, None)[0])  # read exactly what would be sent
            earlier = painted + _confirmed_quads(kept, all_confirmed=True)
            state = _account(gray, state.turns, earlier, detectors, fuzzy, deadline, result)
        result.values = tally.counts()
    text = base64.b64encode(encoded).decode("ascii")
    return (prefix + text if prefix else text), result


def _account(
    gray: Image.Image,
    turns: Sequence[float] | None,
    earlier: Sequence[Quad],
    detectors: Sequence[Detector],
    fuzzy: Declared | None,
    deadline: float,
    result: MaskResult,
) -> _Accounted:
    """Read `gray`, find what to paint, and make sure every area of text is accounted for (read
    with confidence, painted, or about to be; `earlier`: the paint, and the words earlier
    readings confirmed away from it): areas that are not are read again closer, and refused if
    they are still not."""
    if time.monotonic() >= deadline:
        raise OcrTimeout("OCR did not finish within the budget")
    whole = read_whole(gray, deadline, turns)
    result.passes += 1
    result.pass_seconds += whole.seconds
    state = _Accounted(whole.words, whole.turns, *find_values(whole.words, detectors, fuzzy))
    unread = unread_text(gray, _accounted(state, earlier), state.turns)
    if not unread:
        return state
    closer = read_areas(gray, unread, deadline, state.turns)
    result.pass_seconds += closer.seconds
    state.words = state.words + closer.words
    state.marked, state.hits = find_values(state.words, detectors, fuzzy)
    unread = unread_text(gray, _accounted(state, earlier), state.turns)
    if unread:
        raise MaskError(
            f"an image holds text that could not be read with confidence ({len(unread)} area(s):"
            " at an angle, faint, small or in an unusual font), so it cannot be masked"
        )
    return state


def _accounted(state: _Accounted, earlier: Sequence[Quad]) -> list[Quad]:
    """What accounts for text: words read with confidence (grown a little: a box is tight around
    the letters, their edges are not), the words about to be painted, and `earlier`: the paint
    already there and what earlier readings confirmed away from it."""
    return _confirmed_quads(state.words) + paint_quads(state.words, state.marked) + list(earlier)


def _confirmed_quads(words: Sequence[Word], *, all_confirmed: bool = False) -> list[Quad]:
    """The quads of the words read with confidence (`all_confirmed`: `words` already are), grown
    a little: a box is tight around the letters, their edges are not."""
    chosen = words if all_confirmed else confirmed(words)
    return [grow(word.quad, max(2.0, 0.25 * word.height)) for word in chosen]


def _unpainted(words: Sequence[Word], painted: Sequence[Quad]) -> list[Word]:
    """The words (confirmed by an earlier reading) whose boxes touch no paint: their pixels are
    the ones that reading confirmed.

    A reading of the painted image can lose what the first one read beside the paint (faint
    grey text next to a black bar binarises poorly); those words were read with confidence, are
    not identifiers, and their pixels have not changed, so they stay accounted for. Everything
    the new reading finds is still searched and painted: this only keeps a refusal from
    resting on a word that was already read."""
    return [word for word in words if not any(meet(word.quad, quad) for quad in painted)]


def confirmed(words: Sequence[Word]) -> list[Word]:
    """The words read with confidence: tesseract's confidence at least MIN_CONFIDENCE, or the
    same letters and digits read at the same place on another page (tesseract's confidence is
    erratic on short words inside buttons and badges: "depot" read right at 0 on one page and 97
    on the next; two readings of different views agreeing is confidence too)."""
    out = [word for word in words if word.conf >= MIN_CONFIDENCE]
    by_core: dict[str, list[Word]] = {}
    for word in words:
        core = _core(word.text)
        if len(core) >= 2:
            by_core.setdefault(core, []).append(word)
    for same in by_core.values():
        for i, word in enumerate(same):
            if word.conf >= MIN_CONFIDENCE:
                continue
            if any(
                other.line[:-3] != word.line[:-3] and _overlap(word.box, other.box) >= 0.3
                for j, other in enumerate(same)
                if j != i
            ):
                out.append(word)
    return out


def _core(text: str) -> str:
    return "".join(c for c in text.casefold() if c.isalnum())


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    """Intersection over union of two boxes."""
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return 0.0
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0
