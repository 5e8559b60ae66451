"""OCR masking figures; not a test.

Run: `.venv/bin/python -m tests.bench.ocr` (`--seconds S` per load phase, default 10).

1. One screenshot, in-process: each rendered style of tests/support/screenshots.py (small ones, and
   full-size pages with a coloured banner) masked by `ext_proc.media.mask.mask_image`, repeated: the
   median time of one tesseract process (a batch of pages: the whole image at 1x and 2x, both
   polarities; or the areas read closer), the readings, and the whole image (read, account,
   paint, read again).
2. Through the stack (real Envoy, two ext_proc workers, one OCR thread each, the fake upstream):
   a Chat request with 1 and with 4 screenshots under `media: mask`, end to end.
3. Text-only Chat requests (8 KB, no subjects) at concurrency 4 for S seconds, first alone, then
   while 2 clients keep sending 4-screenshot requests: req/s and latency of the text requests.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.media.find import fuzzy_pattern
from ext_proc.media.image import FORMATS
from ext_proc.media.mask import mask_image
from tests.support.e2e import PERSON, chat_body, request
from tests.support.harness import KEYS, running_stack
from tests.support.screenshots import data_url, encode, pages, render, render_page, styles

HEADERS = {
    "authorization": f"Bearer {KEYS['mask-media']}",
    "x-cordon-subject": encode_subject_header({"subjects": [PERSON]}),
}
TEXT = "routine words about parcels, schedules and invoices " * 160  # ~8 KB


def in_process(repeat: int) -> None:
    header = parse_subject_header(encode_subject_header({"subjects": [PERSON]}))
    subjects = compile_subjects(header)
    detectors = [Catalog.for_sets(("pii", "pci", "secrets")).detect, subjects.detect]
    fuzzy = fuzzy_pattern([f.key for f in subjects.forms()])
    print("1. one screenshot, in process (ms; median of", repeat, "runs)")
    print(f"   {'style':<34} {'size':>9} {'pass':>7} {'passes':>6} {'image':>7}")
    cases = [(style.name, render(style), style.fmt) for style in styles()]
    cases += [(page.name, render_page(page), page.fmt) for page in pages()]  # full-size, banner
    for name, image, fmt in cases:
        payload = data_url(encode(image, fmt), FORMATS[fmt])
        passes, totals, counts = [], [], []
        for _ in range(repeat):
            start = time.perf_counter()
            _, result = mask_image(payload, detectors, fuzzy, deadline=time.monotonic() + 60)
            totals.append((time.perf_counter() - start) * 1000)
            passes += [s * 1000 for s in result.pass_seconds]
            counts.append(result.passes)
        size = f"{image.width}x{image.height}"
        print(
            f"   {name:<34} {size:>9} {statistics.median(passes):7.0f} "
            f"{statistics.median(counts):6.0f} {statistics.median(totals):7.0f}"
        )


def chat_with_images(n: int) -> dict[str, object]:
    png = data_url(encode(render(styles()[0]), "PNG"), "image/png")
    parts = [{"type": "text", "text": "Please read the screenshots."}]
    parts += [{"type": "image_url", "image_url": {"url": png}}] * n  # type: ignore[list-item]
    return chat_body("x") | {"messages": [{"role": "user", "content": parts}]}


def through_stack(port: int, repeat: int) -> None:
    print("2. through the stack, end to end (ms; median of", repeat, "requests)")
    for n in (1, 4):
        body = chat_with_images(n)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            reply = request(port, "POST", "/v1/chat/completions", body, HEADERS, timeout=120)
            assert reply.status == 200, reply.status
            times.append((time.perf_counter() - start) * 1000)
        print(
            f"   {n} screenshot(s): {statistics.median(times):.0f}"
            f" (min {min(times):.0f}, max {max(times):.0f})"
        )


def text_load(port: int, seconds: float, concurrency: int = 4) -> tuple[float, list[float]]:
    stop = time.monotonic() + seconds
    latencies: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        body = chat_body(TEXT)
        while time.monotonic() < stop:
            start = time.perf_counter()
            reply = request(port, "POST", "/v1/chat/completions", body)
            assert reply.status == 200
            with lock:
                latencies.append((time.perf_counter() - start) * 1000)

    begin = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(client) for _ in range(concurrency)]:
            future.result()
    return len(latencies) / (time.monotonic() - begin), latencies


def under_load(port: int, seconds: float) -> None:
    print(f"3. text-only requests (8 KB) at concurrency 4 for {seconds:g} s")
    rate, lat = text_load(port, seconds)
    q = statistics.quantiles(lat, n=100)
    print(f"   alone:                 {rate:7.1f} req/s  p50 {q[49]:6.1f} ms  p99 {q[98]:6.1f} ms")
    stop = threading.Event()
    masked = []

    def ocr_client() -> None:
        body = chat_with_images(4)
        while not stop.is_set():
            start = time.perf_counter()
            reply = request(port, "POST", "/v1/chat/completions", body, HEADERS, timeout=120)
            masked.append((reply.status, (time.perf_counter() - start) * 1000))

    threads = [threading.Thread(target=ocr_client) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    rate, lat = text_load(port, seconds)
    stop.set()
    for thread in threads:
        thread.join()
    q = statistics.quantiles(lat, n=100)
    print(f"   with OCR load running: {rate:7.1f} req/s  p50 {q[49]:6.1f} ms  p99 {q[98]:6.1f} ms")
    ok = [ms for status, ms in masked if status == 200]
    print(
        f"   meanwhile: {len(ok)} of {len(masked)} 4-screenshot requests masked,"
        f" median {statistics.median(ok):.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    in_process(args.repeat)
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_stack(Path(tmp), workers=2, LOG_LEVEL="WARNING") as stack,
    ):
        port = stack.settings.listen_port
        through_stack(port, args.repeat)
        under_load(port, args.seconds)


if __name__ == "__main__":
    main()
