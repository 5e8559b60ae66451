"""Masking identifiers in images by OCR (`media: mask`).

One image, start to finish, synchronously (the exchange runs this in a bounded thread pool, and
tesseract itself runs as a child process, so the event loop never waits on it):

1. **Decode** the payload (strict base64) and open it with Pillow: PNG, JPEG, WebP or GIF only,
   at most MAX_IMAGE_BYTES and MAX_PIXELS (checked from the header, before any pixel is
   decoded: a decompression bomb is refused, not inflated), one frame only (the other frames of
   an animation would go out unread). A declared type (data: URL, Anthropic `media_type`) must
   match what the bytes are.
2. **Normalise** it once to what a viewer sees, in 8-bit grayscale: EXIF orientation applied,
   transparency laid on white, 16-bit samples scaled down, colour folded to luminance. That image
   is both what is read and what is sent (a masked image goes out in grey): no reader can see
   what tesseract did not (text only in the alpha channel, isoluminant colours, clipped 16-bit
   values, a sideways photo).
   **Read** it with tesseract (`image_to_data`: words with boxes), inverted when it is dark
   (tesseract reads dark text on light ground best) and enlarged when small (within a pixel
   budget); boxes are mapped back to the original pixels.
3. **Find**: the recognised words are joined into lines (their offsets kept), the catalog and the
   declared-subject matchers run over the text, and every word a finding overlaps is marked. The
   subject matchers ignore separators, so an identifier split into several words by OCR still
   matches; any word within a small edit distance of a declared identifier's letters and digits
   is marked too (OCR misreads one character more often than it drops a word).
4. **Paint** each marked word's box, with a margin, in solid black; re-encode in the image's own
   format from the pixels alone (no EXIF, no text chunks, no ICC profile).
5. **Read again** what will be sent. Anything found: paint it and read again, at most two rounds
   in all; still something → refused. An image where the first reading finds nothing is sent as
   re-encoded (its pixels are the ones read) after one pass.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import functools
import io
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytesseract
import regex
from PIL import Image, ImageDraw, ImageOps, UnidentifiedImageError

from ext_proc.detect.findings import Finding
from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import SubjectHeader
from ext_proc.errors import CordonError, DetectionError

# tesseract's OpenMP threads fight each other on a small machine: one thread per pass is ~3x
# faster on a small machine; parallelism comes from the pool, one image per thread.
os.environ.setdefault("OMP_THREAD_LIMIT", "1")

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
MIME_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg"}
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 40_000_000
MAX_ROUNDS = 2
MARGIN = 3  # px painted around each word box
UPSCALE_MAX_PIXELS = 24_000_000  # images are read at 1x, and at 2x too unless larger than this
# Sauvola's adaptive threshold (tesseract >= 5.3) instead of one Otsu threshold for the whole page:
# with one threshold, white text on a coloured banner of a light screenshot binarises into a solid
# bar, and neither polarity reads it (20 of 24 such screenshots at 1x); adaptively, both do.
TESSERACT_CONFIG = "-c thresholding_method=2"
TESSERACT_MAX_SIDE = 32_000  # tesseract refuses images with a side over 32767 pixels


class MaskError(CordonError):
    """The image cannot be masked with confidence; the message names why, never a value."""


class OcrTimeout(MaskError):
    """The OCR budget ran out (a busy pool, a huge image): retryable, unlike a bad image."""


@dataclass(frozen=True, slots=True)
class Word:
    text: str
    box: tuple[int, int, int, int]  # left, top, right, bottom in the original image's pixels
    line: tuple[int, int, int, int]  # the tesseract run (polarity), its block, paragraph, line


@dataclass(slots=True)
class MaskResult:
    """What masking one image took: words painted, tesseract passes and the time of each."""

    masked_words: int = 0
    passes: int = 0
    pass_seconds: list[float] = field(default_factory=list)


Detector = Callable[[str], Sequence[Finding]]


def tesseract_command() -> str:
    """The wheel's tesseract (its wrapper sets TESSDATA_PREFIX), else one on PATH."""
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "tesseract"
    if beside.exists():
        return str(beside)
    return shutil.which("tesseract") or "tesseract"


pytesseract.pytesseract.tesseract_cmd = tesseract_command()


def ocr_can_read(header: SubjectHeader) -> bool:
    """Whether every letter of every declared value is Latin (the tesseract model here is `eng`):
    a name in Cyrillic or Han would be painted over by no reading, so such requests are refused."""
    for subject in header.subjects:
        for values in subject.values.values():
            for value in values:
                if any(ch.isalpha() and ord(ch) > 0x24F and ch not in LATIN_EXTENDED_EXTRA for ch in value):
                    return False
    return True


LATIN_EXTENDED_EXTRA = frozenset(
    "ḀḁẞẠạẢảẤấẦầẨẩẪẫẬậẮắẰằẲẳẴẵẶặẸẹẺẻẼẽẾếỀềỂểỄễỆệỈỉỊịỌọỎỏỐốỒồỔổỖỗỘộỚớỜờỞởỠỡỢợỤụỦủỨứỪừỬửỮữỰựỲỳỴỵỶỷỸỹ"
)


# --- decode / encode --------------------------------------------------------------------------


def decode_payload(payload: str) -> tuple[bytes, str | None, str]:
    """(bytes, declared mime or None, prefix to write back) of a base64 string or data: URL."""
    prefix = ""
    declared: str | None = None
    text = payload
    if text[:5].lower() == "data:":
        head, comma, rest = text.partition(",")
        if not comma or not head.lower().endswith(";base64"):
            raise MaskError("an image data: URL must be base64")
        prefix = head + ","
        declared = head[5:].split(";", 1)[0].strip().lower()
        text = rest
    compact = "".join(text.split())
    if len(compact) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        raise MaskError(f"an image is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MB")
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise MaskError("an image is not valid base64") from None
    return data, declared, prefix


def open_image(data: bytes, declared: str | None) -> tuple[Image.Image, str]:
    """The decoded single-frame image and its format, within the size and pixel caps."""
    if len(data) > MAX_IMAGE_BYTES:
        raise MaskError(f"an image is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MB")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own cap is below
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise MaskError(f"an image has more than {MAX_PIXELS} pixels") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise MaskError("an image could not be decoded") from None
    fmt = image.format or ""
    if fmt not in FORMATS:
        raise MaskError("only PNG, JPEG, WebP and GIF images can be masked")
    if declared is not None and MIME_ALIASES.get(declared, declared) != FORMATS[fmt]:
        raise MaskError("an image's declared media type does not match its bytes")
    width, height = image.size
    if width * height > MAX_PIXELS or width <= 0 or height <= 0:
        raise MaskError(f"an image has more than {MAX_PIXELS} pixels")
    if getattr(image, "n_frames", 1) != 1:
        raise MaskError("animated images cannot be masked (only one frame would be read)")
    try:
        image.load()
    except (OSError, ValueError, Image.DecompressionBombError):
        raise MaskError("an image could not be decoded") from None
    return image, fmt


def normalize(image: Image.Image) -> Image.Image:
    """The image as it is seen, in 8-bit grayscale: EXIF orientation applied, transparency laid on
    white, 16-bit samples scaled to 8, colour folded to luminance.

    This is what is read *and* what is sent: a model is never shown pixels tesseract did not see
    (text drawn only in the alpha channel, red on green of equal luminance, a 16-bit image whose
    values a reader would clip, a sideways photo). The price: a masked image goes out in grey.

    Memory: beside the decoded image, about 6 bytes per pixel at the peak (grey and alpha, their
    split, the white ground), whatever the mode; a 40-megapixel RGBA image costs some 240 MB here,
    not 640 (tests/integration/test_ocr.py measures it).
    """
    if image.getexif().get(0x0112, 1) != 1:
        image = ImageOps.exif_transpose(image) or image  # a copy: only when it must turn
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        extrema = image.getextrema()  # one band: (min, max)
        peak = extrema[1] if image.mode == "I" and isinstance(extrema[1], (int, float)) else 65535
        factor = 255 / 65535 if peak > 255 else 1
        image = image.point(lambda v: v * factor).convert("L")
    elif image.mode == "F":
        image = image.convert("L")
    has_alpha = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        image.mode == "P" and "transparency" in image.info
    )
    if not has_alpha:
        return image if image.mode == "L" else image.convert("L")
    if image.mode not in ("RGBA", "LA"):
        image = image.convert("RGBA")  # palette and premultiplied modes: their alpha as it is meant
    grey, alpha = (image if image.mode == "LA" else image.convert("LA")).split()
    ground = Image.new("L", grey.size, 255)
    ground.paste(grey, (0, 0), alpha)  # grey where opaque, white where transparent, blended between
    return ground


def encode_image(image: Image.Image, fmt: str) -> bytes:
    """The pixels alone, in `fmt`: no EXIF, no text chunks, no ICC profile, no comments."""
    out = io.BytesIO()
    if fmt == "JPEG":
        clean = image.convert("RGB") if image.mode not in ("RGB", "L") else image.copy()
        clean.info = {}
        clean.save(out, "JPEG", quality=92, exif=b"", icc_profile=None)
    elif fmt == "PNG":
        clean = image.copy()
        clean.info = {}
        clean.save(out, "PNG", optimize=False)
    elif fmt == "WEBP":
        clean = image.convert("RGB") if image.mode not in ("RGB", "RGBA") else image.copy()
        clean.info = {}
        # Lossy at high quality: lossless WebP of a photo can be five times the input, past the
        # providers' per-image limits. What is sent is read again when anything was painted.
        clean.save(out, "WEBP", quality=90, exif=b"", icc_profile=None)
    else:  # GIF
        clean = image.copy()
        clean.info = {}
        clean.save(out, "GIF")
    return out.getvalue()


# --- read -------------------------------------------------------------------------------------


def read_words(image: Image.Image, *, timeout: float) -> list[Word]:
    """One reading: the recognised words with their boxes in `image`'s pixels.

    tesseract reads dark text on a light ground; a screenshot has both kinds (white text on a
    coloured banner, a dark sidebar), so the image is read as it is and inverted, each time
    binarised adaptively (TESSERACT_CONFIG). And at two scales, 1x and 2x (within
    UPSCALE_MAX_PIXELS): each reads what the other mangles (13-14 px text on a mid-tone table
    row comes out in fragments at 1x; at 2x a line can vanish that 1x reads). The words of every
    run are kept, their lines apart.
    """
    gray = image if image.mode == "L" else normalize(image)
    if max(gray.size) > TESSERACT_MAX_SIDE:
        raise MaskError(f"an image side is longer than {TESSERACT_MAX_SIDE} pixels; OCR cannot read it")
    fits = gray.width * gray.height * 4 <= UPSCALE_MAX_PIXELS and max(gray.size) * 2 <= TESSERACT_MAX_SIDE
    deadline = time.monotonic() + timeout
    words: list[Word] = []
    run = 0
    for scale in (1, 2) if fits else (1,):
        scaled = (
            gray if scale == 1 else gray.resize((gray.width * 2, gray.height * 2), Image.Resampling.LANCZOS)
        )
        for view in (scaled, ImageOps.invert(scaled)):
            data = _tesseract(view, deadline - time.monotonic())
            for i, text in enumerate(data["text"]):
                if not text or not text.strip():
                    continue
                left, top = data["left"][i] // scale, data["top"][i] // scale
                right = (data["left"][i] + data["width"][i] + scale - 1) // scale
                bottom = (data["top"][i] + data["height"][i] + scale - 1) // scale
                line = (run, data["block_num"][i], data["par_num"][i], data["line_num"][i])
                words.append(Word(text.strip(), (left, top, right, bottom), line))
            run += 1
    return words


def _tesseract(image: Image.Image, timeout: float) -> dict[str, list[Any]]:
    """One tesseract run (`image_to_data`: words with boxes) within `timeout` seconds."""
    if timeout <= 0:
        raise OcrTimeout("OCR did not finish within the budget")
    try:
        data: dict[str, list[Any]] = pytesseract.image_to_data(
            image,
            config=TESSERACT_CONFIG,
            output_type=pytesseract.Output.DICT,
            timeout=max(1.0, timeout),
            nice=5,
        )
    except pytesseract.TesseractError:  # a RuntimeError too: caught first
        raise MaskError("OCR failed on an image") from None
    except RuntimeError as exc:
        if "timeout" in str(exc).lower():  # pytesseract's own timeout
            raise OcrTimeout("OCR did not finish within the budget") from None
        raise MaskError("OCR failed on an image") from None
    return data


# --- find -------------------------------------------------------------------------------------


def lines_text(words: Sequence[Word]) -> tuple[str, list[tuple[int, int, int]]]:
    """The words as text, one OCR line per text line, and each word's (start, end, index)."""
    pieces: list[str] = []
    spans: list[tuple[int, int, int]] = []
    position = 0
    previous: tuple[int, int, int, int] | None = None
    for index, word in enumerate(words):
        if previous is not None:
            sep = " " if word.line == previous else "\n"
            pieces.append(sep)
            position += 1
        pieces.append(word.text)
        spans.append((position, position + len(word.text), index))
        position += len(word.text)
        previous = word.line
    return "".join(pieces), spans


def _core(text: str) -> str:
    return "".join(c for c in fold(text) if c.isalnum())


def fuzzy_pattern(keys: Iterable[str]) -> regex.Pattern[str] | None:
    """One fuzzy pattern over the letters-and-digits cores of declared identifiers (6+ chars):
    one edit allowed, two from 12 characters on. Compiled once per set of keys (the same header
    comes with every turn of a conversation)."""
    usable = tuple(sorted({k for k in keys if len(k) >= 6}, key=lambda k: (-len(k), k)))
    return _fuzzy_compiled(usable) if usable else None


@functools.lru_cache(maxsize=256)
def _fuzzy_compiled(keys: tuple[str, ...]) -> regex.Pattern[str]:
    parts = [f"(?:{regex.escape(k)}){{e<={2 if len(k) >= 12 else 1}}}" for k in keys]
    return regex.compile("(?:" + "|".join(parts) + ")")


def find_words(
    words: Sequence[Word], detectors: Sequence[Detector], fuzzy: regex.Pattern[str] | None
) -> set[int]:
    """Indices of the words that are (part of) an identifier or a catalog entity."""
    if not words:
        return set()
    text, spans = lines_text(words)
    marked: set[int] = set()
    # The lines as they are, and joined into one (same offsets): a card or an email wrapped onto
    # the next line of a screenshot is one value to a reader.
    for reading in dict.fromkeys((text, text.replace("\n", " "))):
        for detect in detectors:
            try:
                findings = detect(reading)
            except (TimeoutError, DetectionError):
                raise MaskError("detection on the recognised text did not finish") from None
            for finding in findings:
                marked.update(i for start, end, i in spans if start < finding.end and finding.start < end)
    marked.update(_long_numbers(words))
    if fuzzy is not None:
        # Per line, on the letters and digits only, so a misread inside a split identifier is
        # still near the declared form; each hit marks every word it touches.
        by_line: dict[tuple[int, int, int, int], list[int]] = {}
        for index, word in enumerate(words):
            by_line.setdefault(word.line, []).append(index)
        for indices in by_line.values():
            cores = [_core(words[i].text) for i in indices]
            joined = "".join(cores)
            owner: list[int] = [i for i, core in zip(indices, cores, strict=True) for _ in core]
            for match in fuzzy.finditer(joined, timeout=1.0):
                # A word counts when the match covers at least half of its letters and digits:
                # an edit at the match's edge must not take the neighbouring label with it.
                covered: dict[int, int] = {}
                for i in owner[match.start() : match.end()]:
                    covered[i] = covered.get(i, 0) + 1
                marked.update(i for i, n in covered.items() if 2 * n >= len(_core(words[i].text)))
    return marked


def _long_numbers(words: Sequence[Word]) -> set[int]:
    """Runs of adjacent words on one line made of digits and separators only, holding
    LONG_NUMBER_DIGITS digits or more: a card or account number OCR misread past its pattern
    ("41111111111 111" fails the checksum). Painting an order number too costs little."""
    marked: set[int] = set()
    run: list[int] = []
    digits = 0

    def close() -> None:
        if digits >= LONG_NUMBER_DIGITS:
            marked.update(run)

    for index, word in enumerate(words):
        numeric = bool(_NUMERIC_WORD.fullmatch(word.text))
        if run and (not numeric or words[run[-1]].line != word.line):
            close()
            run, digits = [], 0
        if numeric:
            run.append(index)
            digits += sum(c.isdigit() for c in word.text)
    close()
    return marked


LONG_NUMBER_DIGITS = 12
_NUMERIC_WORD = regex.compile(r"[\d\-.·/()+]*\d[\d\-.·/()+]*")


# --- mask -------------------------------------------------------------------------------------


def paint(image: Image.Image, words: Sequence[Word], indices: set[int]) -> Image.Image:
    """A copy of `image` with each marked word's box (plus a margin) in solid black."""
    painted = image.convert("RGBA") if image.mode in ("P", "PA", "LA", "1") else image.copy()
    bands = len(painted.getbands())
    fill: int | tuple[int, ...] = 0 if bands == 1 else (0, 0, 0, 255)[:bands]
    draw = ImageDraw.Draw(painted)
    for i in indices:
        left, top, right, bottom = words[i].box
        draw.rectangle(
            (max(0, left - MARGIN), max(0, top - MARGIN), right + MARGIN, bottom + MARGIN), fill=fill
        )
    return painted


def mask_image(
    payload: str,
    detectors: Sequence[Detector],
    fuzzy: regex.Pattern[str] | None,
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
    fuzzy: regex.Pattern[str] | None,
    deadline: float,
) -> tuple[str, MaskResult]:
    image, fmt = open_image(data, declared)
    image = normalize(image)  # read and sent alike
    result = MaskResult()

    def read(img: Image.Image) -> list[Word]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OcrTimeout("OCR did not finish within the budget")
        start = time.perf_counter()
        found = read_words(img, timeout=remaining)
        spent = time.perf_counter() - start
        result.passes += 1
        result.pass_seconds.append(spent)
        return found

    words = read(image)
    marked = find_words(words, detectors, fuzzy)
    encoded = encode_image(image, fmt) if not marked else b""
    rounds = 0
    while marked:
        if rounds == MAX_ROUNDS:
            raise MaskError(f"identifiers were still legible after {MAX_ROUNDS} rounds of masking")
        rounds += 1
        result.masked_words += len(marked)
        image = paint(image, words, marked)
        encoded = encode_image(image, fmt)
        image = normalize(open_image(encoded, None)[0])  # read exactly what would be sent
        words = read(image)
        marked = find_words(words, detectors, fuzzy)
    text = base64.b64encode(encoded).decode("ascii")
    return (prefix + text if prefix else text), result


def pixels_of(data: bytes) -> int:
    """The pixel count an image's header declares (nothing decoded); MAX_PIXELS when unreadable
    (open_image then refuses it with the precise reason)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            width, height = Image.open(io.BytesIO(data)).size
    except (Image.DecompressionBombError, UnidentifiedImageError, OSError, ValueError):
        return MAX_PIXELS
    return max(1, min(width * height, MAX_PIXELS))


class PixelBudget:
    """How many pixels this process may hold decoded at once across the OCR pool's threads: an
    image waits (its wait counting against its OCR budget) until its pixels fit. Decoding and
    reading take about 10 bytes per pixel at the peak, so the pool's memory is bounded whatever
    OCR_WORKERS says and however many large images arrive together."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self._changed = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()  # first come, first served

    @contextlib.contextmanager
    def hold(self, pixels: int, deadline: float) -> Iterator[None]:
        pixels = min(pixels, self.capacity)
        ticket = object()
        with self._changed:
            self._queue.append(ticket)
            try:
                # In arrival order: a large image is not kept waiting by a stream of small ones.
                while self._queue[0] is not ticket or self.free < pixels:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise OcrTimeout("OCR did not finish within the budget (waiting for memory)")
                    self._changed.wait(remaining)
            finally:
                self._queue.remove(ticket)
                self._changed.notify_all()
            self.free -= pixels
        try:
            yield
        finally:
            with self._changed:
                self.free += pixels
                self._changed.notify_all()


PIXELS_IN_FLIGHT = PixelBudget(MAX_PIXELS)


class OcrPool:
    """The worker's bounded OCR pool: `workers` images at a time, a budget per request.

    Threads suffice: tesseract is a child process and Pillow releases the GIL while decoding and
    encoding. A request's images wait in the pool's queue like anyone's, and the wait counts
    against its budget: a busy pool refuses (503) rather than hangs.
    """

    def __init__(self, workers: int, budget: float, max_images: int) -> None:
        self.workers = workers
        self.budget = budget
        self.max_images = max_images
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ocr")

    async def mask_all(
        self,
        items: Sequence[tuple[str, str | None]],
        detectors: Sequence[Detector],
        fuzzy: regex.Pattern[str] | None,
    ) -> list[tuple[str, MaskResult]]:
        """Mask every (payload, declared type) in the pool; raises MaskError or OcrTimeout."""
        deadline = time.monotonic() + self.budget
        loop = asyncio.get_running_loop()
        futures = [
            loop.run_in_executor(
                self.executor,
                partial(mask_image, payload, detectors, fuzzy, declared=declared, deadline=deadline),
            )
            for payload, declared in items
        ]
        try:
            async with asyncio.timeout(self.budget):
                return list(await asyncio.gather(*futures))
        except TimeoutError:
            raise OcrTimeout("OCR did not finish within the budget") from None
        finally:
            for future in futures:
                future.cancel()  # those still queued never start; running ones stop at `deadline`

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
