"""The worker's OCR pool: images masked in a bounded thread pool, within a budget per request.

Threads suffice: tesseract is a child process and Pillow releases the GIL while decoding,
resampling and encoding. The wait for a thread and for pixels counts against the request's OCR
budget (`OCR_BUDGET_SECONDS`): a busy pool refuses (503) rather than hangs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from ext_proc.media.find import Declared, Detector
from ext_proc.media.image import OcrTimeout
from ext_proc.media.mask import MaskResult, mask_image


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
        fuzzy: Declared | None,
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
