"""Images in and out of OCR masking: strict decoding within the caps, the one normalised view that
is both read and sent, re-encoding from the pixels alone, and the per-process budget of decoded
pixels that bounds the OCR pool's memory.

The errors of masking live here too: `MaskError` (the image cannot be masked with confidence; a
422 `media` refusal) and `OcrTimeout` (the budget ran out; a 503). Their messages name a reason,
never a value.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import io
import threading
import time
import warnings
from collections.abc import Iterator

from PIL import Image, ImageOps, UnidentifiedImageError

from ext_proc.errors import CordonError

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
MIME_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg"}
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 40_000_000


class MaskError(CordonError):
    """The image cannot be masked with confidence; the message names why, never a value."""


class OcrTimeout(MaskError):
    """The OCR budget ran out (a busy pool, a huge image): retryable, unlike a bad image."""


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
