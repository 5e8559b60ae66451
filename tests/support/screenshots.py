"""Screenshots rendered with Pillow for the OCR tests: an invented person's details among ordinary
words, in several fonts, sizes, colours and formats. Never a real person's data."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
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
    from ext_proc.media.find import fuzzy_pattern
    from ext_proc.media.mask import mask_image

    subjects = compile_subjects(parse_subject_header(encode_subject_header({"subjects": [PERSON]})))
    detectors = [Catalog.for_sets(("pii", "pci", "secrets")).detect, subjects.detect]
    fuzzy = fuzzy_pattern([form.key for form in subjects.forms()])
    before = encode(render(styles()[0]), "PNG")
    masked, _ = mask_image(data_url(before, "image/png"), detectors, fuzzy, deadline=time.monotonic() + 60)
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

    from ext_proc.media.tesseract import command

    pytesseract.pytesseract.tesseract_cmd = command()
    image: Image.Image = Image.open(io.BytesIO(data))
    image = ImageOps.exif_transpose(image) or image
    if image.mode.startswith("I"):
        image = image.point(lambda v: v * (255 / 65535)).convert("L")
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

    from ext_proc.media.image import normalize
    from ext_proc.media.tesseract import command

    pytesseract.pytesseract.tesseract_cmd = command()
    gray = normalize(Image.open(io.BytesIO(data)))
    words: list[str] = []
    for scale in (1, 2, 3):
        if gray.width * gray.height * scale * scale > 40_000_000:
            continue
        view = gray.resize((gray.width * scale, gray.height * scale), Image.Resampling.LANCZOS)
        for polarity in (view, ImageOps.invert(view)):
            words += pytesseract.image_to_string(polarity, timeout=120).split()
    return words


# --- the screenshot set: turned, skewed, dark, faint ------------------------------------------

# An invented person of the screenshot set, declared in X-Cordon-Subject (the card as an id).
SHOT_PERSON: dict[str, list[str]] = {
    "names": ["Tobiah Wrenfield-Ostrova"],
    "emails": ["t.wrenfield@example.net"],
    "phones": ["+1 503-555-0162"],
    "ids": ["4539 1488 0343 6467"],
}
# Label → the line that shows it, and the pieces that must not be legible afterwards (letters and
# digits, folded; a piece of six or more is also matched with one misread character).
IDENTIFIERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "name": ("Customer: Tobiah Wrenfield-Ostrova", ("tobiah", "wrenfield", "ostrova")),
    "email": ("Email: t.wrenfield@example.net", ("twrenfield", "wrenfield")),
    "phone": ("Phone: +1 503-555-0162", ("5035550162", "0162")),
    "card": ("Card 4539 1488 0343 6467 on file", ("4539", "1488", "0343", "6467")),
}
SHOT_HEAD = "Support ticket 2291"
SHOT_PLAIN = "Ticket about the delayed parcel in Denver"
SHOT_ORDINARY = ("ticket", "delayed", "parcel", "denver")

# Theme → page, main ink, the identifier's ink (secondary text), the desk around a turned shot.
THEMES: dict[str, tuple[str, str, str, str]] = {
    "light": ("#ffffff", "#111111", "#333333", "#d0d4da"),
    "dark": ("#1e1e1e", "#e8e8e8", "#c8c8c8", "#000000"),
    "dark-dim": ("#121212", "#e0e0e0", "#4a4a4a", "#000000"),  # dark grey on near-black
    "light-faint": ("#ffffff", "#202020", "#c4c4c4", "#ffffff"),  # very light grey on white
    "grey-mid": ("#8a8a8a", "#101010", "#5e5e5e", "#ffffff"),
    "blue": ("#eef3fb", "#1a2b4c", "#3a5a8c", "#1a73e8"),
}
SHOT_FONTS: dict[str, str | None] = {
    "bundled": None,
    "sans": str(DEJAVU / "DejaVuSans.ttf"),
    "serif": str(DEJAVU / "DejaVuSerif.ttf"),
    "mono": str(DEJAVU / "DejaVuSansMono.ttf"),
    "condensed": str(CONDENSED),
    "bold": str(DEJAVU / "DejaVuSans-Bold.ttf"),
}


@dataclass(frozen=True)
class Shot:
    """One screenshot of the set: its class (what it tests), the identifier it shows (None: no
    identifier at all), theme, font, text size, the angle it is turned by (counter-clockwise
    degrees) and its format."""

    kind: str
    identifier: str | None
    theme: str
    font: str
    size: int
    angle: float
    fmt: str = "PNG"

    @property
    def name(self) -> str:
        what = self.identifier or "none"
        return f"{self.kind}-{what}-{self.theme}-{self.font}{self.size}-{self.angle:g}deg-{self.fmt.lower()}"


def shot_fonts() -> list[str]:
    """The set's fonts present on this machine (Pillow's bundled one always is)."""
    return [name for name, path in SHOT_FONTS.items() if path is None or Path(path).exists()]


def shot_set(large: bool = False) -> list[Shot]:
    """The screenshot set, the same on every run: upright light, dark and blue (must be masked,
    not refused), upright low-contrast, turned by right angles, by 45° and 135°, skewed 2-20°,
    and shots holding no identifier (must be forwarded). Within a class the themes and angles
    take turns; identifier, font, size and format are drawn from a generator seeded with the
    class's name. `large`: three times as many, for the slow run."""
    import random

    fonts = shot_fonts()
    classes: list[tuple[str, list[str], list[float], int]] = [
        ("upright", ["light", "dark", "blue"], [0.0], 12),
        ("low-contrast", ["dark-dim", "light-faint", "grey-mid"], [0.0], 12),
        ("right-angle", ["light", "dark", "dark-dim", "light-faint"], [90.0, 180.0, 270.0], 12),
        ("diagonal", ["light", "dark", "light-faint", "dark-dim"], [45.0, -45.0, 135.0], 10),
        ("skewed", ["light", "dark", "dark-dim", "light-faint", "blue"], [2, -3, 5, -8, 12, -15, 20], 16),
        ("no-identifier", ["light", "dark", "dark-dim", "light-faint"], [0.0, 0.0, 90.0, 180.0, 7.0], 6),
    ]
    shots: list[Shot] = []
    for kind, themes, angles, count in classes:
        rng = random.Random(kind)
        for i in range(count * (3 if large else 1)):
            shots.append(
                Shot(
                    kind,
                    None if kind == "no-identifier" else rng.choice(list(IDENTIFIERS)),
                    themes[i % len(themes)],
                    rng.choice(fonts),
                    rng.choice((14, 16, 18, 20, 22, 24, 28)),
                    float(angles[(i + i // len(themes)) % len(angles)]),
                    "JPEG" if rng.random() < 0.25 else "PNG",
                )
            )
    return shots


def render_shot(shot: Shot) -> Image.Image:
    """A small ticket view: a heading, the identifier's line in the secondary ink (or a second
    ordinary line), an ordinary line; turned by the shot's angle on a desk of the theme's tone."""
    page, ink, secondary, desk = THEMES[shot.theme]
    path = SHOT_FONTS[shot.font]
    font: ImageFont.FreeTypeFont | ImageFont.ImageFont = (
        ImageFont.load_default(size=shot.size) if path is None else ImageFont.truetype(path, shot.size)
    )
    middle = IDENTIFIERS[shot.identifier][0] if shot.identifier else "Please answer before Friday"
    lines = [(SHOT_HEAD, ink), (middle, secondary), (SHOT_PLAIN, ink)]
    step = int(shot.size * 1.8)
    width = 40 + max(int(font.getlength(text)) for text, _ in lines)
    image = Image.new("RGB", (width, 30 + step * len(lines)), page)
    draw = ImageDraw.Draw(image)
    for i, (text, fill) in enumerate(lines):
        draw.text((20, 15 + i * step), text, font=font, fill=fill)
    if shot.angle:
        image = image.rotate(shot.angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=desk)
    return image


def oracle_words(data: bytes, angle: float, enough: Callable[[list[str]], bool] | None = None) -> list[str]:
    """An independent reading stronger than the masker's: the image as a viewer sees it, turned
    back by the angle the test knows, at 2x and 3x, as it is, in a band of tones about its
    background, in the band of dark tones and in the band of light tones (each stretched to the
    full range: mid-grey text on grey, dim text on a dark theme, faint text on a light one),
    each in both polarities, read by tesseract directly.

    `enough`: the views are read as it is at 2x first, and the rest only when `enough` says the
    words so far are not (a check that the original is legible stops at the first reading that
    shows it; a check that nothing is legible reads every view)."""
    from PIL import ImageOps

    from ext_proc.media.image import normalize

    gray = normalize(Image.open(io.BytesIO(data)))
    histogram = gray.histogram()
    ground = histogram.index(max(histogram))
    if angle:
        gray = gray.rotate(-angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=ground)
    low, high = max(0, ground - 48), min(255, ground + 48)
    bands = [
        gray,
        gray.point(lambda v: min(255, max(0, (v - low) * 255 // (high - low)))),  # about the ground
        gray.point(lambda v: min(255, v * 255 // 96)),  # the dark tones
        gray.point(lambda v: max(0, (v - 160) * 255 // 95)),  # the light tones
    ]
    views = []
    for scale in (2, 3):
        for band in bands:
            big = band.resize((band.width * scale, band.height * scale), Image.Resampling.LANCZOS)
            views += [big, ImageOps.invert(big)]
    words = _tesseract_words(views[:2])
    if enough is not None and enough(words):
        return words
    return words + _tesseract_words(views[2:])


def _tesseract_words(views: list[Image.Image]) -> list[str]:
    """The words tesseract reads on `views`, in one process (its default settings)."""
    import os
    import subprocess
    import tempfile

    from ext_proc.media.tesseract import BINARY, ENV

    with tempfile.TemporaryDirectory(prefix="oracle-") as directory:
        names = []
        for i, view in enumerate(views):
            name = os.path.join(directory, f"{i}.pgm")
            view.save(name, "PPM")
            names.append(name)
        listing = os.path.join(directory, "pages.txt")
        Path(listing).write_text("\n".join(names) + "\n", encoding="ascii")
        ran = subprocess.run(
            [BINARY, listing, "stdout"], capture_output=True, env=ENV, timeout=600, check=True
        )
    return ran.stdout.decode("utf-8", "replace").split()


def shot_leaks(words: list[str], identifier: str) -> bool:
    """Whether a piece of the identifier is legible in `words` (joined, letters and digits only);
    a piece of six or more characters also with one character misread."""
    import regex

    text = cores_of(words)
    for piece in IDENTIFIERS[identifier][1]:
        if piece in text:
            return True
        if len(piece) >= 6 and regex.search(f"(?:{piece}){{e<=1}}", text):
            return True
    return False
