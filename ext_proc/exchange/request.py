"""The request-body phase: read the body as the API's JSON, redact it, check what would leave.

Every request gets its media policy first (`exchange/masking.py`: block refuses; mask hands its
images to OCR, `NeedsOcr`). A request without declared subjects is then redacted with the
tenant's catalog; a detection failure of its text follows `failMode` (closed: 503; open:
forwarded, its images masked, the gap recorded), while a media refusal refuses it whatever
`failMode` says (masking was asked for). A request that declares subjects gets redaction and the
egress check, and any failure refuses it whatever `failMode` says. Under `reportOnly` the whole
pipeline runs (images masked too) for its record: the counts, the egress verdict and the stage it
would have refused at; the original body goes upstream unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ext_proc.errors import DetectionError, Refusal, describe
from ext_proc.exchange.context import RequestContext
from ext_proc.exchange.masking import media_policy
from ext_proc.exchange.pipeline import find_media, redact_and_check, redact_document
from ext_proc.exchange.record import ExchangeRecord
from ext_proc.exchange.refusals import FAIL_CLOSED, refusal_for
from ext_proc.exchange.results import BodyResult, Forward, MaskJob, NeedsOcr, Refuse
from ext_proc.exchange.runtime import Runtime
from ext_proc.media.parts import MediaPart
from ext_proc.transform.walk import BodyError, dump_json, parse_json

log = logging.getLogger("cordon.exchange")
_T = TypeVar("_T")


def request_body(runtime: Runtime, context: RequestContext, record: ExchangeRecord, raw: bytes) -> BodyResult:
    """The whole request body → forward (rewritten or not), refuse, or mask images first."""
    try:
        result = _read(runtime, context, record, raw)
    except Refusal as refusal:
        result = Refuse(refusal)
    except BodyError as error:
        result = Refuse(refusal_for(error))
    return result if isinstance(result, NeedsOcr) else reported(context, record, result)


def reported(context: RequestContext, record: ExchangeRecord, result: Forward | Refuse) -> Forward | Refuse:
    """Under reportOnly, the verdict recorded and the original body forwarded; else `result`."""
    if not context.policy.report_only:
        return result
    if isinstance(result, Refuse):
        record.report(result.refusal)
    return Forward("reported")


def after_masking(
    context: RequestContext, record: ExchangeRecord, masked: MaskJob | Refuse
) -> Forward | Refuse:
    """A request whose images were masked (or could not be): redacted (and checked)."""
    if isinstance(masked, Refuse):
        return reported(context, record, masked)
    try:
        if context.subjects is not None:
            result = finish_subject_body(context, record, masked)
        else:
            result = finish_catalog_body(context, record, masked)
    except Refusal as refusal:
        result = Refuse(refusal)
    except BodyError as error:
        result = Refuse(refusal_for(error))
    return reported(context, record, result)


def _read(runtime: Runtime, context: RequestContext, record: ExchangeRecord, raw: bytes) -> BodyResult:
    if not raw.strip():
        return Forward()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Refusal(400, "request", "the request body is not valid UTF-8", code="invalid_json") from None
    doc = parse_json(text)
    if context.subjects is not None:
        return _subject_body(runtime, context, record, raw, doc)
    return _catalog_body(runtime, context, record, raw, doc)


def _catalog_body(
    runtime: Runtime, context: RequestContext, record: ExchangeRecord, raw: bytes, doc: Any
) -> BodyResult:
    """A request without declared subjects: the tenant's `media` policy, then redaction."""
    try:
        parts = find_media(doc, context.dialect)
    except DetectionError as exc:
        return _detection_failed(context, record, exc, MaskJob(raw, doc))
    record.media = len(parts)
    to_mask = media_policy(parts, context, runtime.ocr)  # a refusal here ignores failMode
    if to_mask:
        return NeedsOcr(MaskJob(raw, doc, parts, to_mask))
    return finish_catalog_body(context, record, MaskJob(raw, doc, parts))


def finish_catalog_body(context: RequestContext, record: ExchangeRecord, job: MaskJob) -> Forward | Refuse:
    """Redact a request without declared subjects (its images already masked, if it had any to
    mask); a detection failure follows failMode."""
    try:
        redaction = redact_document(
            job.doc,
            policy=context.policy,
            dialect=context.dialect,
            catalog=context.catalog(),
            placeholders=context.placeholders,
            subjects=None,
            media=job.parts,
            counts=record.counts,
        )
    except DetectionError as exc:
        return _detection_failed(context, record, exc, job)
    if not redaction.changed and not job.masked:
        return Forward()
    return Forward(body=dump_json(redaction.doc))


def _detection_failed(
    context: RequestContext, record: ExchangeRecord, exc: DetectionError, job: MaskJob
) -> Forward | Refuse:
    """failMode: closed refuses (503); open forwards the text as it came and records the gap.
    Images masked already go masked: the original bytes are never what failMode forwards."""
    policy = context.policy
    if policy.fail_mode == "closed" and not policy.report_only:
        message = f"detection failed ({exc}); failMode is closed"
        return Refuse(refusal_for(exc, message, FAIL_CLOSED))
    record.record_gap("detection", str(exc))
    return Forward(body=dump_json(job.doc)) if job.masked else Forward()


def _subject_body(
    runtime: Runtime, context: RequestContext, record: ExchangeRecord, raw: bytes, doc: Any
) -> BodyResult:
    """A request that declares subjects: media policy, redaction, then the egress check."""

    def media() -> tuple[list[MediaPart], list[MediaPart]]:
        parts = find_media(doc, context.dialect)
        record.media = len(parts)
        return parts, media_policy(parts, context, runtime.ocr)

    parts, to_mask = guarded(media)
    if to_mask:
        return NeedsOcr(MaskJob(raw, doc, parts, to_mask))
    return finish_subject_body(context, record, MaskJob(raw, doc, parts))


def finish_subject_body(context: RequestContext, record: ExchangeRecord, job: MaskJob) -> Forward | Refuse:
    """Redact a subject request (its images already masked) and check the bytes that would leave."""
    subjects = context.subjects
    assert subjects is not None, "only a request that declares subjects gets here"
    checked = guarded(
        lambda: redact_and_check(
            job.raw,
            job.doc,
            policy=context.policy,
            dialect=context.dialect,
            catalog=context.catalog(),
            placeholders=context.placeholders,
            subjects=subjects,
            media=job.parts,
            counts=record.counts,
            masked=bool(job.masked),
        )
    )
    record.timings["egress_ms"] = checked.check_ms
    if checked.survivor is not None:
        return Refuse(survived(checked.survivor))
    record.egress = "verified"
    return Forward(body=checked.body if checked.changed else None)


def survived(label: str) -> Refusal:
    return Refusal(
        422,
        "egress",
        f"a declared identifier ({label}) would still have left in the request body",
        kind=label,
    )


def guarded(step: Callable[[], _T]) -> _T:
    """Run a step of a subject request: every failure is a refusal (422 `detection` unless the
    table says otherwise), never a forwarded body."""
    try:
        return step()
    except Refusal:
        raise
    except BodyError as error:
        raise refusal_for(error) from None
    except DetectionError as exc:
        raise refusal_for(exc, f"detection failed ({exc}); the request was refused") from None
    except Exception as exc:
        log.error(json.dumps({"event": "subject_pipeline_failed", **describe(exc)}))
        raise Refusal(422, "detection", "detection failed; the request was refused") from None
