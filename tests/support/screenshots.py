"""Screenshots rendered with Pillow for the OCR tests: an invented person's details among ordinary
words, in several fonts, sizes, colours and formats. Never a real person's data."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from ext_proc.detect.normalize import fold
from tests.support.e2e import PERSON, SAMPLES

# What must not be legible after masking (cores: letters and digits, folded) and what must be.
LINES = [
    f"Customer: {PERSON['names'][0]}",
    f"Email: {PERSON['emails'][0]}  Phone: {PERSON['phones'][0]}",
    f"Card {SAMPLES['CREDIT_CARD']} on file",
    "Ticket about the delayed parcel in Denver",
    "Please answer before Friday",
]
# Label → core (letters and digits, folded). Tests report the labels, never the values.
SECRET_CORES = {
    "given name": "marisol",
    "surname, first part": "quintero",
    "surname, second part": "vance",
    "email": "mqexample",
    "phone": "4045550187",
    "card": "4111111111111111",
}
ORDINARY = ["ticket", "delayed", "parcel", "denver", "please", "answer", "friday"]

DEJAVU = Path("/usr/share/fonts/truetype/dejavu")
CONDENSED = DEJAVU / "DejaVuSansCondensed.ttf"


@dataclass(frozen=True)
class Style:
    name: str
    font: str | None  # a TrueType file, or None for Pillow's bundled font
    size: int
    background: str
    foreground: str
    fmt: str = "PNG"


def styles() -> list[Style]:
    """Pillow's bundled font at three sizes, light and dark, PNG/JPEG/WebP; DejaVu when present."""
    out = [
        Style("bundled-20-light-png", None, 20, "white", "black"),
        Style("bundled-28-grey-jpeg", None, 28, "#f4f4f4", "#303030", "JPEG"),
        Style("bundled-18-dark-png", None, 18, "#1e1e1e", "#e0e0e0"),
        Style("bundled-24-blue-webp", None, 24, "#eef3fb", "#1a2b4c", "WEBP"),
    ]
    for file, name in (("DejaVuSans.ttf", "dejavu-sans"), ("DejaVuSerif.ttf", "dejavu-serif")):
        if (DEJAVU / file).exists():
            out.append(Style(f"{name}-22-light-png", str(DEJAVU / file), 22, "white", "#111"))
    return out


@dataclass(frozen=True)
class Page:
    """A full-size screenshot: a page of ordinary lines with a full-width coloured band whose
    text carries the person's details: a banner (an error toast, a status bar), or the selected
    row of a table, between two rows of other people."""

    name: str
    size: tuple[int, int]
    page: str
    ink: str
    band: str
    band_ink: str
    text_px: int
    fmt: str = "PNG"
    layout: str = "banner"  # or "row"
    font: str | None = None  # a TrueType file; None: Pillow's bundled font


BANNER = f"Payment failed for card {SAMPLES['CREDIT_CARD']} ({PERSON['names'][0]})"
PAGE_LINES = [
    "Ticket about the delayed parcel in Denver",
    f"Contact: {PERSON['emails'][0]}",
    "Please answer before Friday",
]


def pages() -> list[Page]:
    """Light text on a coloured band in a light page, and the reverse in a dark page."""
    return [
        Page("1440x900-white-on-red-band-png", (1440, 900), "white", "#222222", "#d93025", "white", 15),
        Page(
            "1920x1080-white-on-blue-band-jpeg",
            (1920, 1080),
            "#fafafa",
            "#202124",
            "#1a73e8",
            "white",
            14,
            "JPEG",
        ),
        Page(
            "1280x800-dark-page-light-band-png", (1280, 800), "#1e1e1e", "#e8eaed", "#e8eaed", "#202124", 16
        ),
        Page(  # at 1x alone, "Vance" stayed legible on this row
            "1920x1080-selected-table-row-png",
            (1920, 1080),
            "white",
            "#202124",
            "#5f6368",
            "white",
            14,
            layout="row",
            font=str(CONDENSED) if CONDENSED.exists() else None,
        ),
    ]


# A table's rows: the person (selected, highlighted) between two invented others.
TABLE_ROWS = [
    ("Jon Doe", "jon@example.org", "+1 212 555 0100", "5500 0000 0000 0004"),
    (PERSON["names"][0], PERSON["emails"][0], PERSON["phones"][0], SAMPLES["CREDIT_CARD"]),
    ("Ann Lee", "ann@example.org", "+1 212 555 0199", "-"),
]


def render_page(page: Page) -> Image.Image:
    if page.font is None:
        font: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.load_default(size=page.text_px)
    else:
        font = ImageFont.truetype(page.font, page.text_px)
    image = Image.new("RGB", page.size, page.page)
    draw = ImageDraw.Draw(image)
    step = int(page.text_px * 2.2)
    for i, line in enumerate(PAGE_LINES):
        draw.text((24, 80 + i * step), line, font=font, fill=page.ink)
    top = page.size[1] // 2
    if page.layout == "banner":
        draw.rectangle((0, top, page.size[0], top + page.text_px * 3), fill=page.band)
        draw.text((24, top + page.text_px), BANNER, font=font, fill=page.band_ink)
        return image
    height = page.text_px * 2 + 8
    for r, row in enumerate(TABLE_ROWS):
        y = top + r * height
        selected = r == 1
        if selected:
            draw.rectangle((10, y, page.size[0] - 10, y + height - 2), fill=page.band)
        for x, cell in zip((20, 260, 560, 800), row, strict=True):
            draw.text(
                (x, y + (height - page.text_px) // 2),
                cell,
                font=font,
                fill=page.band_ink if selected else page.ink,
            )
    return image


def render(style: Style, lines: list[str] | None = None) -> Image.Image:
    lines = LINES if lines is None else lines
    if style.font is None:
        font: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.load_default(size=style.size)
    else:
        font = ImageFont.truetype(style.font, style.size)
    step = int(style.size * 1.8)
    image = Image.new(
        "RGB", (40 + int(style.size * 0.62 * max(map(len, lines))), 40 + step * len(lines)), style.background
    )
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((20, 20 + i * step), line, font=font, fill=style.foreground)
    return image


def encode(image: Image.Image, fmt: str, **save: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def cores_of(words: list[str]) -> str:
    return "".join(c for c in fold(" ".join(words)) if c.isalnum())


def legible(words: list[str]) -> tuple[list[str], list[str]]:
    """(labels of the identifiers still legible, ordinary words still legible) in a reading's
    words: a failing test names what is legible, never the value."""
    text = cores_of(words)
    return [label for label, core in SECRET_CORES.items() if core in text], [w for w in ORDINARY if w in text]


def write_example(directory: Path) -> tuple[Path, Path]:
    """The README's before/after pair: a screenshot and what `media: mask` forwards for it."""
    import time

    from ext_proc.detect.catalog.engine import Catalog
    from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
    from ext_proc.detect.subjects.matcher import compile_subjects
    from ext_proc.media import ocr

    subjects = compile_subjects(parse_subject_header(encode_subject_header({"subjects": [PERSON]})))
    detectors = [Catalog.for_sets(("pii", "pci", "secrets")).detect, subjects.detect]
    fuzzy = ocr.fuzzy_pattern([form.key for form in subjects.forms()])
    before = encode(render(styles()[0]), "PNG")
    masked, _ = ocr.mask_image(
        data_url(before, "image/png"), detectors, fuzzy, deadline=time.monotonic() + 60
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = (directory / "ocr-before.png", directory / "ocr-after.png")
    paths[0].write_bytes(before)
    paths[1].write_bytes(base64.b64decode(masked.split(",", 1)[1]))
    return paths


if __name__ == "__main__":
    for path in write_example(Path(__file__).resolve().parents[1] / "data"):
        print(path)


def independent_readings(data: bytes) -> list[str]:
    """What a viewer could see in an image, read by tesseract without ext_proc's own reader: the
    image upright (EXIF applied), laid on white and on black, and each colour channel alone, with
    16-bit samples scaled. The masking tests check these, not the masker's own reading."""
    import pytesseract
    from PIL import ImageOps

    from ext_proc.media import ocr

    pytesseract.pytesseract.tesseract_cmd = ocr.tesseract_command()
    image = Image.open(io.BytesIO(data))
    image = ImageOps.exif_transpose(image) or image
    if image.mode.startswith("I"):
        image = image.point(lambda v: v * (255 / 65535)).convert("L")  # type: ignore[operator]
    views: list[Image.Image] = []
    rgba = image.convert("RGBA")
    for ground in ((255, 255, 255, 255), (0, 0, 0, 255)):
        laid = Image.new("RGBA", rgba.size, ground)
        laid.alpha_composite(rgba)
        views.append(laid.convert("RGB"))
    views += list(rgba.convert("RGB").split())
    words: list[str] = []
    for view in views:
        gray = view.convert("L")
        if sum(gray.histogram()[:96]) > gray.width * gray.height / 2:
            gray = ImageOps.invert(gray)
        words += pytesseract.image_to_string(gray, timeout=60).split()
    return words


def strong_readings(data: bytes) -> list[str]:
    """A reader stronger than ext_proc's own, for the masking tests' after-checks: the image as a
    viewer sees it (upright, laid on white, grey), at 1x, 2x and 3x (within 40 megapixels), each
    as it is and inverted."""
    import pytesseract
    from PIL import ImageOps

    from ext_proc.media import ocr

    pytesseract.pytesseract.tesseract_cmd = ocr.tesseract_command()
    gray = ocr.normalize(Image.open(io.BytesIO(data)))
    words: list[str] = []
    for scale in (1, 2, 3):
        if gray.width * gray.height * scale * scale > 40_000_000:
            continue
        view = gray.resize((gray.width * scale, gray.height * scale), Image.Resampling.LANCZOS)
        for polarity in (view, ImageOps.invert(view)):
            words += pytesseract.image_to_string(polarity, timeout=120).split()
    return words
