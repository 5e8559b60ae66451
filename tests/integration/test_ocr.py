"""OCR masking with real tesseract on screenshots rendered here (ext_proc/media: mask, read, find,
image, pool)."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image, PngImagePlugin

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.media import find as ocr_find
from ext_proc.media import image as ocr_image
from ext_proc.media import mask as ocr_mask
from ext_proc.media import pool as ocr_pool
from ext_proc.media import read as ocr_read
from tests.support.e2e import PERSON
from tests.support.screenshots import (
    LINES,
    Page,
    Style,
    b64,
    data_url,
    encode,
    independent_readings,
    legible,
    pages,
    render,
    render_page,
    strong_readings,
    styles,
)

HEADER = parse_subject_header(encode_subject_header({"subjects": [PERSON]}))
SUBJECTS = compile_subjects(HEADER)
CATALOG = Catalog.for_sets(("pii", "pci", "secrets"))
DETECTORS = [CATALOG.detect, SUBJECTS.detect]
FUZZY = ocr_find.fuzzy_pattern([form.key for form in SUBJECTS.forms()])


def mask(payload: str, declared: str | None = None) -> tuple[str, ocr_mask.MaskResult]:
    return ocr_mask.mask_image(payload, DETECTORS, FUZZY, declared=declared, deadline=time.monotonic() + 60)


def read(payload: str) -> list[str]:
    """The words of the masker's own whole-image reading (the after-checks use stronger ones)."""
    data, _, _ = ocr_image.decode_payload(payload)
    image, _ = ocr_image.open_image(data, None)
    gray = ocr_image.normalize(image)
    return [word.text for word in ocr_read.read_whole(gray, time.monotonic() + 60).words]


def word(text: str, box: tuple[int, int, int, int], line: tuple[int, ...]) -> ocr_read.Word:
    """A level word read with full confidence at `box` (left, top, right, bottom)."""
    left, top, right, bottom = box
    corners = ((left, top), (right, top), (right, bottom), (left, bottom))
    quad = tuple((float(x), float(y)) for x, y in corners)
    return ocr_read.Word(text, 96.0, quad, float(bottom - top), line)


@pytest.mark.parametrize("style", styles(), ids=lambda s: s.name)
def test_identifiers_are_painted_over_and_ordinary_words_stay(style: Style) -> None:
    original = encode(render(style), style.fmt)
    mime = ocr_image.FORMATS[style.fmt]
    secrets_before, _ = legible(read(data_url(original, mime)))
    assert secrets_before, "the rendered screenshot must be legible to begin with"
    masked, result = mask(data_url(original, mime))
    assert masked.startswith(f"data:{mime};base64,")
    assert result.masked_words >= 6 and 2 <= result.passes <= 3
    data, _, _ = ocr_image.decode_payload(masked)
    secrets_after, ordinary_after = legible(strong_readings(data))  # not the masker's own reader
    assert secrets_after == []
    assert len(ordinary_after) >= 5, ordinary_after  # the rest of the screenshot is still there
    assert Image.open(io.BytesIO(data)).format == style.fmt


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_a_full_size_screenshot_with_a_coloured_banner_is_masked(page: Page) -> None:
    """Text of 14-16 px on a banner of another polarity than the page: at 1x, or read in the
    page's polarity only, tesseract does not see it at all, and nothing painted it over."""
    original = encode(render_page(page), page.fmt)
    mime = ocr_image.FORMATS[page.fmt]
    assert legible(strong_readings(original))[0], "the banner must be legible to begin with"
    masked, result = mask(data_url(original, mime))
    assert result.masked_words >= 6
    data, _, _ = ocr_image.decode_payload(masked)
    secrets_after, ordinary_after = legible(strong_readings(data))
    assert secrets_after == [], secrets_after
    assert len(ordinary_after) >= 5, ordinary_after


def test_bare_base64_with_a_declared_type_keeps_its_form() -> None:
    original = encode(render(styles()[0]), "PNG")
    masked, _ = mask(b64(original), declared="image/png")
    assert not masked.startswith("data:")
    assert legible(read(masked))[0] == []


def test_an_image_without_findings_is_read_once() -> None:
    clean = encode(render(styles()[0], ["Ticket about the delayed parcel in Denver"]), "PNG")
    masked, result = mask(data_url(clean, "image/png"))
    assert result.passes == 1 and result.masked_words == 0
    assert legible(read(masked))[1] == ["ticket", "delayed", "parcel", "denver"]


def test_metadata_is_stripped() -> None:
    image = render(styles()[0])
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "Marisol Quintero-Vance")
    png = encode(image, "PNG", pnginfo=info)
    exif = Image.Exif()
    exif[0x010E] = "Marisol Quintero-Vance"  # ImageDescription
    jpeg = encode(image, "JPEG", exif=exif.tobytes())
    for data, mime in ((png, "image/png"), (jpeg, "image/jpeg")):
        masked, _ = mask(data_url(data, mime))
        out = base64.b64decode(masked.split(",", 1)[1])
        assert b"Marisol" not in out and b"Quintero" not in out
        reopened = Image.open(io.BytesIO(out))
        assert not reopened.info.get("Comment") and not reopened.getexif()


@pytest.mark.parametrize(
    ("payload", "declared", "reason"),
    [
        ("data:image/png;base64,not*base64", None, "not valid base64"),
        ("data:image/png,plainbytes", None, "must be base64"),
        (b64(b"GIF89a but not really"), None, "could not be decoded"),
        (b64(encode(Image.new("RGB", (40, 20), "white"), "BMP")), None, "only PNG, JPEG, WebP and GIF"),
        (data_url(encode(Image.new("RGB", (40, 20), "white"), "PNG"), "image/jpeg"), None, "does not match"),
        (b64(encode(Image.new("RGB", (40, 20), "white"), "PNG")), "image/webp", "does not match"),
    ],
)
def test_unreadable_images_are_refused(payload: str, declared: str | None, reason: str) -> None:
    with pytest.raises(ocr_image.MaskError, match=reason):
        mask(payload, declared)


def test_a_decompression_bomb_is_refused_before_decoding() -> None:
    """A PNG whose header claims 60,000 × 60,000 pixels: refused from the header alone."""
    small = encode(Image.new("L", (1, 1), 255), "PNG")
    # Rewrite the IHDR width/height (bytes 16..24) and its CRC.
    import struct
    import zlib

    ihdr = b"IHDR" + struct.pack(">II", 60000, 60000) + small[24:29]
    bomb = small[:8] + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + small[33:]
    start = time.perf_counter()
    with pytest.raises(ocr_image.MaskError, match="pixels"):
        mask(data_url(bomb, "image/png"))
    assert time.perf_counter() - start < 2


def test_an_animated_gif_is_refused() -> None:
    frames = [render(styles()[0], [text]) for text in ("first frame", "second frame")]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(ocr_image.MaskError, match="animated"):
        mask(data_url(out.getvalue(), "image/gif"))


def test_a_single_frame_gif_is_masked() -> None:
    gif = encode(render(styles()[0]).convert("P"), "GIF")
    masked, _ = mask(data_url(gif, "image/gif"))
    assert legible(read(masked))[0] == []


def test_the_budget_bounds_a_pass() -> None:
    with pytest.raises(ocr_image.OcrTimeout):
        ocr_mask.mask_image(
            data_url(encode(render(styles()[0]), "PNG"), "image/png"),
            DETECTORS,
            FUZZY,
            deadline=time.monotonic() - 1,
        )


def test_fuzzy_marks_a_misread_identifier_but_not_its_label() -> None:
    words = [
        word("Customer:", (0, 0, 10, 10), (0, 1, 1, 1)),
        word("Marlsol", (12, 0, 20, 10), (0, 1, 1, 1)),  # one character misread
        word("Quintero-Vanee", (22, 0, 40, 10), (0, 1, 1, 1)),
        word("Denver", (0, 12, 10, 20), (0, 1, 1, 2)),
    ]
    assert ocr_find.find_words(words, [], FUZZY) == {1, 2}


def test_a_long_number_misread_past_its_pattern_is_marked() -> None:
    """A card read as "41111111111 111" fails the card checksum: runs of 12+ digits in adjacent
    numeric words on one line are painted anyway; a short number, or digits on two lines, not."""
    words = [
        word(text, (i * 10, 0, i * 10 + 8, 10), (0, 1, 1, 1))
        for i, text in enumerate(["Card", "41111111111", "111", "on", "file"])
    ] + [
        word(text, (i * 10, 12, i * 10 + 8, 20), (0, 1, 1, 2))
        for i, text in enumerate(["Order", "2026-0042", "ref", "1234567"])
    ]
    assert ocr_find.find_words(words, [], None) == {1, 2}


def test_a_card_wrapped_onto_the_next_line_is_marked() -> None:
    words = [
        word("Card", (0, 0, 8, 10), (0, 1, 1, 1)),
        word("4111", (10, 0, 18, 10), (0, 1, 1, 1)),
        word("1111", (20, 0, 28, 10), (0, 1, 1, 1)),
        word("1111", (0, 12, 8, 20), (0, 1, 1, 2)),
        word("1111", (10, 12, 18, 20), (0, 1, 1, 2)),
        word("thanks", (20, 12, 28, 20), (0, 1, 1, 2)),
    ]
    assert ocr_find.find_words(words, [CATALOG.detect], None) == {1, 2, 3, 4}


def test_an_identifier_split_across_words_is_found() -> None:
    words = [
        word(text, (i * 10, 0, i * 10 + 8, 10), (0, 1, 1, 1))
        for i, text in enumerate(["call", "404", "555-", "0187", "now"])
    ]
    assert ocr_find.find_words(words, DETECTORS, None) == {1, 2, 3}


def test_an_identifier_read_in_parts_by_several_readings_is_found() -> None:
    """The whole-image reading has the first half of a card, a closer reading of one area the
    second half (and a stroke read as "|"): neither alone holds the card; the best word at each
    place, in a row, does. A duplicate of a marked word in another reading is marked too."""
    words = [
        word("Card", (0, 0, 40, 20), (0, 1, 1, 1)),
        word("4111", (50, 0, 90, 20), (0, 1, 1, 1)),
        word("1111", (100, 0, 140, 20), (0, 1, 1, 1)),
        word("Card", (1, 1, 40, 20), (1, 1, 1, 1)),  # the same word in the inverted page
        word("|", (148, 2, 150, 18), (100, 1, 1, 1)),
        word("1111", (150, 0, 190, 20), (101, 1, 1, 1)),
        word("1111", (200, 1, 240, 20), (102, 1, 1, 1)),
        word("Denver", (0, 40, 60, 60), (0, 1, 1, 2)),
    ]
    assert not ocr_find.find_words(words[:4], [CATALOG.detect], None) & {1, 2}
    marked = ocr_find.find_words(words, [CATALOG.detect], None)
    assert {1, 2, 5, 6} <= marked and 7 not in marked


def test_the_groups_around_a_piece_of_a_declared_number_are_marked() -> None:
    """A faint card read "4539 1466 UV 6467": no pattern matches it, but its first and last
    groups are pieces of the declared number, and the words where the rest of it stands go
    with them; the label before it and the words after it stay."""
    declared = ocr_find.fuzzy_pattern(["4539148803436467"])
    texts = ["Card", "4539", "1466", "UV", "6467", "on", "file"]
    words = [word(text, (i * 50, 0, i * 50 + 40, 20), (0, 1, 1, 1)) for i, text in enumerate(texts)]
    marked = ocr_find.find_words(words, [CATALOG.detect], declared)
    assert {1, 2, 3, 4} <= marked and not marked & {0, 6}


def test_a_word_box_is_shrunk_to_its_own_ink() -> None:
    """tesseract's box of a word in an inverted page can span the ground between lines and take
    in the neighbouring lines' edges: the box is cut to the band of rows with most of the ink."""
    from PIL import ImageDraw

    page = Image.new("L", (200, 120), 255)
    draw = ImageDraw.Draw(page)
    draw.rectangle((10, 2, 150, 4), fill=0)  # the descenders of the line above
    draw.rectangle((10, 50, 150, 70), fill=40)  # the word's own ink
    draw.rectangle((10, 112, 150, 115), fill=0)  # the tops of the line below
    assert ocr_read.ink_box(page, (0, 0, 200, 120)) == (10, 50, 151, 71)
    assert ocr_read.ink_box(page, (160, 10, 190, 40)) == (160, 10, 190, 40)  # no ink: unchanged


# --- what a viewer sees, read independently ------------------------------------------------


def masked_bytes(payload: str) -> bytes:
    masked, _ = mask(payload)
    return base64.b64decode(masked.split(",", 1)[1] if masked.startswith("data:") else masked)


def text_layer(color: tuple[int, ...], size: tuple[int, int] = (640, 240)) -> Image.Image:
    """The screenshot's text alone, drawn in `color` on a fully transparent ground."""
    from PIL import ImageDraw, ImageFont

    image = Image.new("RGBA", size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=20)
    for i, line in enumerate(LINES):
        draw.text((20, 20 + i * 36), line, font=font, fill=color)
    return image


def sixteen_bit() -> Image.Image:
    return render(styles()[0]).convert("L").convert("I").point(lambda v: v * 257).convert("I;16")


def isoluminant() -> Image.Image:
    ground = Image.new("RGBA", (640, 240), (0, 130, 0, 255))
    return Image.alpha_composite(ground, text_layer((255, 0, 0, 255))).convert("RGB")


# (case, image, format, whether the ordinary words must still be legible afterwards: not when the
# flattened grey image is blank, as white text laid on white or colours of equal luminance are)
CASES: list[tuple[str, Callable[[], Image.Image], str, bool]] = [
    ("black text in alpha, PNG", lambda: text_layer((0, 0, 0, 255)), "PNG", True),
    ("black text in alpha, WebP", lambda: text_layer((0, 0, 0, 255)), "WEBP", True),
    ("white text in alpha, PNG", lambda: text_layer((255, 255, 255, 255)), "PNG", False),
    ("grey text in LA", lambda: text_layer((40, 40, 40, 255)).convert("LA"), "PNG", True),
    ("red on green of equal luminance", isoluminant, "PNG", False),
    ("16-bit grayscale", sixteen_bit, "PNG", True),
    ("palette with transparency", lambda: text_layer((0, 0, 0, 255)).convert("P"), "PNG", True),
]


@pytest.mark.parametrize(("name", "make", "fmt", "keeps_words"), CASES, ids=[c[0] for c in CASES])
def test_what_a_viewer_could_read_is_masked(
    name: str, make: Callable[[], Image.Image], fmt: str, keeps_words: bool
) -> None:
    image = make()
    data = encode(image, fmt)
    before = legible(independent_readings(data))[0]
    assert before, f"{name}: the test image must be legible to a viewer"
    after = masked_bytes(data_url(data, ocr_image.FORMATS[fmt]))
    secrets_after, ordinary_after = legible(independent_readings(after))
    assert secrets_after == [], name
    if keeps_words:
        assert len(ordinary_after) >= 4, (name, ordinary_after)  # masked, not blanked


def test_a_sideways_photo_is_read_upright_and_sent_upright() -> None:
    rotated = render(styles()[0]).rotate(90, expand=True)  # stored sideways ...
    exif = Image.Exif()
    exif[0x0112] = 6  # ... and tagged: turn 90° clockwise to view
    data = encode(rotated, "JPEG", exif=exif.tobytes(), quality=95)
    assert legible(independent_readings(data))[0]
    after = masked_bytes(data_url(data, "image/jpeg"))
    reopened = Image.open(io.BytesIO(after))
    assert not reopened.getexif().get(0x0112) and reopened.width > reopened.height  # upright now
    assert legible(independent_readings(after))[0] == []


def test_tesseract_failures_are_not_budget_timeouts() -> None:
    tall = Image.new("L", (200, 33000), 255)
    with pytest.raises(ocr_image.MaskError, match="longer than") as raised:
        mask(data_url(encode(tall, "PNG"), "image/png"))
    assert not isinstance(raised.value, ocr_image.OcrTimeout)


def test_our_pixel_cap_refuses_below_pillows_own() -> None:
    """64 megapixels: under Pillow's bomb limit, over ours (40): refused from the header."""
    small = encode(Image.new("L", (1, 1), 255), "PNG")
    import struct
    import zlib

    ihdr = b"IHDR" + struct.pack(">II", 8000, 8000) + small[24:29]
    bomb = small[:8] + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + small[33:]
    with pytest.raises(ocr_image.MaskError, match="pixels"):
        mask(data_url(bomb, "image/png"))


def test_the_pool_budget_ends_a_request() -> None:
    import asyncio

    pool = ocr_pool.OcrPool(workers=1, budget=0.3, max_images=16)
    payload = data_url(encode(render(styles()[0]), "PNG"), "image/png")
    try:
        with pytest.raises(ocr_image.OcrTimeout):
            asyncio.run(pool.mask_all([(payload, None)] * 3, DETECTORS, FUZZY))
    finally:
        pool.shutdown()


def test_screenshots_in_tool_inputs_are_never_taken_for_secrets() -> None:
    """Base64 of an image whose `/` runs look like a path used to be split and redacted piecewise."""
    for i in range(40):
        lines = [f"Report {i}: parcel volumes by week", "Denver, Boulder and Aurora depots", "x" * (i % 7)]
        blob = b64(encode(render(styles()[i % 3], lines), "PNG"))
        assert not [f for f in CATALOG.detect(blob) if f.kind == "HIGH_ENTROPY"], i


def test_a_script_ocr_cannot_read_refuses_mask() -> None:
    latin = parse_subject_header(encode_subject_header({"subjects": [{"names": ["Marisol Quintero-Vance"]}]}))
    accented = parse_subject_header(encode_subject_header({"subjects": [{"names": ["Zoë Ðặng Núñez"]}]}))
    cyrillic = parse_subject_header(encode_subject_header({"subjects": [{"names": ["Марисоль Кинтеро"]}]}))
    can_read = ocr_find.ocr_can_read
    assert can_read(latin) and can_read(accented) and not can_read(cyrillic)


# --- memory -----------------------------------------------------------------------------------

NORMALIZE_MEMORY = """
import io, sys
from PIL import Image, ImageDraw
from ext_proc.media import image as ocr_image

def high_water() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM")

side = 4000
image = Image.new(sys.argv[1], (side, side), (255, 255, 255, 0) if sys.argv[1] == "RGBA" else "white")
ImageDraw.Draw(image).text((100, 100), "words", fill="black")
out = io.BytesIO()
image.save(out, "PNG")
data = out.getvalue()
del image, out
decoded, _ = ocr_image.open_image(data, None)
before = high_water()
grey = ocr_image.normalize(decoded)
print((high_water() - before) / side / side)
"""


@pytest.mark.parametrize("mode", ["RGBA", "RGB"])
def test_normalising_costs_a_few_bytes_per_pixel(mode: str) -> None:
    """Beside the decoded image, normalising takes at most 8 bytes per pixel (it took 16 for
    RGBA: three full RGBA copies), so a 40-megapixel image does not cost most of a gigabyte."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux's /proc to read the peak resident size")
    command = [sys.executable, "-c", NORMALIZE_MEMORY, mode]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert float(ran.stdout) <= 8.0, ran.stdout


def test_the_pixel_budget_serves_images_in_arrival_order() -> None:
    """A large image waiting is not overtaken by small ones that would still fit."""
    budget = ocr_image.PixelBudget(40)
    order: list[str] = []

    def take(name: str, pixels: int) -> None:
        with budget.hold(pixels, time.monotonic() + 5):
            order.append(name)

    with budget.hold(30, time.monotonic() + 1):
        large = threading.Thread(target=take, args=("large", 40))
        large.start()
        time.sleep(0.1)
        small = threading.Thread(target=take, args=("small", 5))  # would fit now, but comes second
        small.start()
        time.sleep(0.1)
        assert order == []
    large.join(5)
    small.join(5)
    assert order == ["large", "small"] and budget.free == 40


def test_the_pixel_budget_makes_large_images_wait_their_turn() -> None:
    """Two images whose pixels do not fit together: the second waits for the first, and one
    whose deadline passes while waiting is an OcrTimeout (503), never decoded."""
    budget = ocr_image.PixelBudget(40)
    order: list[str] = []

    def second() -> None:
        with budget.hold(30, time.monotonic() + 5):
            order.append("second")

    waiter = threading.Thread(target=second)
    with budget.hold(30, time.monotonic() + 1):
        with pytest.raises(ocr_image.OcrTimeout), budget.hold(30, time.monotonic() + 0.05):
            order.append("never")
        waiter.start()
        time.sleep(0.1)
        order.append("first done")
    waiter.join(5)
    assert order == ["first done", "second"] and budget.free == 40
    assert ocr_image.pixels_of(encode(Image.new("RGB", (30, 20)), "PNG")) == 600
    assert ocr_image.pixels_of(b"not an image") == ocr_image.MAX_PIXELS
