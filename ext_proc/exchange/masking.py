"""The media policy of a request, and its images masked by OCR.

A request that declares subjects gets the stricter of the tenant's `subjectMedia` and the
header's `media`; one without gets the tenant's `media`. It applies to every media part the
dialect finds (images, audio, video, files, embeddings, and references to files, containers and
vector stores): `block` refuses (422 `media`); `mask` needs each part to be an image whose bytes
are in the body (real image bytes) and, with declared subjects, in a script the OCR can read, and
hands them to the worker's OCR pool (off the event loop, within its budget) before the body is
redacted (and checked); `allow` forwards.

The OCR looks for the tenant's catalog (its own kinds and deny terms, its allow list honoured)
with the policy's `actions` applied: a kind under `allow` is not painted, one under `block` found
in an image refuses the request (422 `policy`); and for the declared subjects, when there are any.
What it painted is counted in the exchange's counts, by label, like text findings.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.catalog.extensions import Extensions
from ext_proc.detect.findings import Finding
from ext_proc.errors import Refusal, describe
from ext_proc.exchange.context import RequestContext
from ext_proc.exchange.record import ExchangeRecord
from ext_proc.exchange.refusals import refusal_for
from ext_proc.exchange.results import MaskJob, Refuse
from ext_proc.exchange.runtime import Runtime
from ext_proc.media.find import Detector, fuzzy_pattern, ocr_can_read
from ext_proc.media.image import MaskError, OcrTimeout
from ext_proc.media.parts import MediaPart
from ext_proc.media.pool import OcrPool
from ext_proc.policy.model import MEDIA_STRICTNESS
from ext_proc.transform.actions import KindBlocked, apply_actions

log = logging.getLogger("cordon.exchange")


def media_policy(parts: list[MediaPart], context: RequestContext, pool: OcrPool | None) -> list[MediaPart]:
    """The parts to mask (none under `allow`); raises the refusal under `block`, or when `mask`
    cannot be honoured."""
    header = context.header
    if not parts:
        return []
    if header is None:
        effective, request = context.policy.media, "a request without declared subjects"
    else:
        choices = [context.policy.subject_media, header.media or "allow"]
        effective = max(choices, key=MEDIA_STRICTNESS.__getitem__)
        request = "a request that declares subjects"
    if effective == "block":
        raise Refusal(422, "media", f"{len(parts)} media part(s) in {request} (media: block)")
    if effective != "mask":
        return []
    if pool is None:
        raise Refusal(422, "media", "media masking by OCR is not configured; the request was refused")
    for part in parts:
        if part.media != "image":
            article = "an" if part.media[0] in "aeiou" else "a"
            raise Refusal(
                422,
                "media",
                f"{article} {part.media} part cannot be masked (only images can be read); media: mask",
            )
        if part.payload is not None and not part.is_bytes:
            raise Refusal(
                422, "media", "an image could not be decoded (its payload is no image); media: mask"
            )
        if not part.is_bytes:
            raise Refusal(
                422,
                "media",
                f"an image given by {part.source.replace('_', ' ')} cannot be read here; media: mask",
            )
    if len(parts) > pool.max_images:
        raise Refusal(422, "media", f"more than {pool.max_images} images to mask in one request")
    if header is not None and not ocr_can_read(header):
        raise Refusal(
            422,
            "media",
            "a declared identifier is written in a script the OCR here cannot read; media: mask",
        )
    return parts


def _declared_type(part: MediaPart) -> str | None:
    """The media type a base64 part declares beside it (Anthropic `media_type`), if any."""
    value: Any = part.container.get("media_type") if isinstance(part.container, dict) else None
    return value.strip().lower() if isinstance(value, str) else None


async def mask_images(
    runtime: Runtime, context: RequestContext, record: ExchangeRecord, job: MaskJob
) -> MaskJob | Refuse:
    """Every image of `job` masked in place in its body (the pool bounded by the budget); the
    job back, ready for redaction, or the refusal."""
    pool, subjects = runtime.ocr, context.subjects
    assert pool is not None, "media_policy only asks for masking with a pool"
    detectors = [with_actions(context.catalog(), context.policy.extensions)]
    fuzzy = None
    if subjects is not None:
        detectors.append(subjects.detect)
        fuzzy = fuzzy_pattern(form.key for form in subjects.forms())
    start = time.perf_counter()
    try:
        results = await pool.mask_all(
            [(str(part.container[part.key]), _declared_type(part)) for part in job.masked],
            detectors,
            fuzzy,
        )
    except OcrTimeout as exc:
        message = f"OCR did not finish within its budget ({pool.budget:g}s); try again later"
        return Refuse(refusal_for(exc, message))
    except KindBlocked as exc:
        message = f"an image carries {exc.kind}, which the policy blocks; the request was not forwarded"
        return Refuse(refusal_for(exc, message))
    except MaskError as exc:
        return Refuse(refusal_for(exc))
    except Exception as exc:
        log.error(json.dumps({"event": "ocr_failed", **describe(exc)}))
        return Refuse(Refusal(422, "media", "OCR failed; the request was refused"))
    finally:
        record.timings["ocr_ms"] = round((time.perf_counter() - start) * 1000, 3)
    for part, (payload, result) in zip(job.masked, results, strict=True):
        part.container[part.key] = payload
        record.timings["media_words_masked"] = (
            record.timings.get("media_words_masked", 0) + result.masked_words
        )
        record.counts.update(result.values)  # values painted, by label, as text findings are
        for seconds in result.pass_seconds:
            runtime.metrics.observe("cordon_ocr_pass_seconds", seconds)
    return job


def with_actions(catalog: Catalog, extensions: Extensions) -> Detector:
    """The catalog's detection with the policy's `actions` applied, for the OCR: a kind under
    `allow` is left unpainted, one under `block` raises KindBlocked (from the OCR thread)."""
    if not extensions.actions:
        return catalog.detect

    def detect(text: str) -> Sequence[Finding]:
        # Allowed kinds are not counted here: an image is read many times, and what is painted
        # is counted once per value by the OCR's own tally.
        return apply_actions(catalog.detect(text), extensions, Counter())

    return detect
