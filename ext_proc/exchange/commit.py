"""Before a request's answer is released: its pseudonyms in the vault, its surrogates claimed,
its receipt in the chain. And after a reply has been read: the output gate's own record.

Nothing is released upstream without its record in Redis; nor, with consistent pseudonyms,
without its placeholders in the vault; nor, under `mode: surrogate`, before its surrogates are
claimed (and, for a request that declares subjects, the final body checked again). A failure of
any of these refuses the request (503 `vault` or `audit`), except an audit failure of a request
without subjects under `failMode: open`, which is forwarded with the gap recorded.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import regex
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.audit.receipts.chain import ReceiptError
from ext_proc.audit.receipts.record import ReceiptFields
from ext_proc.errors import Refusal
from ext_proc.exchange.context import RequestContext
from ext_proc.exchange.headers import RECEIPT_HEADER
from ext_proc.exchange.record import ExchangeRecord
from ext_proc.exchange.refusals import refusal_for
from ext_proc.exchange.request import guarded, survived
from ext_proc.exchange.runtime import ReceiptStorage, Runtime
from ext_proc.restore.output_gate import OutputGate
from ext_proc.restore.restorers import SurrogateRestorer
from ext_proc.service import wire
from ext_proc.storage.vault import SurrogateExhausted, SurrogateWanted, VaultError
from ext_proc.transform.date_neighbours import move_neighbours
from ext_proc.transform.egress import check_body
from ext_proc.transform.grammar import own_placeholders_bytes, parse_placeholder
from ext_proc.transform.placeholders import PseudonymMap
from ext_proc.transform.surrogates import claim_form, family_of

log = logging.getLogger("cordon.exchange")


def refused(
    record: ExchangeRecord, refusal: Refusal, extra_headers: wire.Headers = ()
) -> pb.ProcessingResponse:
    """The refusal as Envoy's immediate answer, in the route's error shape, and recorded."""
    record.refused(refusal)
    return wire.refuse(refusal, record.provider, extra_headers)


# --- the vault and the surrogate registry -------------------------------------------------------


async def write_pseudonyms(
    runtime: Runtime, context: RequestContext, record: ExchangeRecord
) -> Refusal | None:
    """This request's pseudonyms into the vault before its body is released: a later reply that
    names one must find it. Forwarded without them, its placeholders could come back where
    nothing can restore them, so a failure refuses whatever failMode says."""
    pmap = context.placeholders
    assert isinstance(pmap, PseudonymMap)
    start = time.perf_counter()
    try:
        if runtime.vault is None:
            raise VaultError("no vault is configured")
        await runtime.vault.put(context.policy.tenant, pmap.originals, context.policy.vault_ttl_seconds)
    except VaultError as exc:
        runtime.metrics.inc("cordon_vault_errors_total", op="write")
        record.log_event(logging.ERROR, "vault_write_failed", placeholders=len(pmap), reason=str(exc))
        return refusal_for(exc, "the pseudonym vault could not be written; the request was not forwarded")
    finally:
        record.timings["vault_write_ms"] = round((time.perf_counter() - start) * 1000, 3)
    runtime.metrics.inc("cordon_vault_writes_total", len(pmap))
    return None


@dataclass(frozen=True, slots=True)
class Claimed:
    body: bytes  # the body with surrogates where redaction wrote placeholders
    surrogates: dict[str, str]  # surrogate → original (never logged)


async def claim_surrogates(
    runtime: Runtime, context: RequestContext, record: ExchangeRecord, body: bytes, *, offload: bool
) -> Claimed | Refusal:
    """`mode: surrogate`: claim a surrogate per distinct value in the tenant's registry, put the
    surrogates where redaction wrote this request's placeholders (an age or the date's year
    written next to a date moved with it: ext_proc.transform.date_neighbours), and, for a request
    that declares subjects, check the final body again (a surrogate must not spell a declared
    identifier). Redis failing, or no free surrogate: 503 `vault`, whatever failMode says."""
    pmap, policy = context.placeholders, context.policy
    wanted: dict[str, SurrogateWanted] = {}
    for text, original in pmap.originals.items():
        parts = parse_placeholder(text)
        if parts is None:
            raise AssertionError("the request map holds a key outside the placeholder grammar")
        wanted[text] = SurrogateWanted(family_of(parts.label), original)
    start = time.perf_counter()
    try:
        if runtime.vault is None:
            raise VaultError("no surrogate registry is configured")
        claimed = await runtime.vault.claim_surrogates(
            policy.tenant, wanted.values(), policy.vault_ttl_seconds, avoid=surrogate_clash(context, body)
        )
    except (VaultError, SurrogateExhausted) as exc:
        runtime.metrics.inc("cordon_vault_errors_total", op="claim")
        record.log_event(logging.ERROR, "surrogate_claim_failed", values=len(wanted), reason=str(exc))
        return refusal_for(exc, "surrogates could not be claimed; the request was not forwarded")
    finally:
        record.timings["surrogate_ms"] = round((time.perf_counter() - start) * 1000, 3)
    by_placeholder = {text: claimed[item].encode("ascii") for text, item in wanted.items()}
    surrogates = {claimed[item]: item.original for item in wanted.values()}
    dates = {text: (item.original, claimed[item]) for text, item in wanted.items() if item.family == "DATE"}
    if dates:
        # An age or the date's year written next to a date moves with it (one unit for restore).
        moved, units = move_neighbours(body.decode("utf-8", "surrogateescape"), dates, dt.date.today())
        body = moved.encode("utf-8", "surrogateescape")
        taken = {claim_form(surrogate) for surrogate in surrogates}
        surrogates.update((unit, meant) for unit, meant in units.items() if claim_form(unit) not in taken)

    def swap(m: regex.Match[bytes]) -> bytes:
        return by_placeholder.get(m.group(0).decode("ascii"), m.group(0))

    # Surrogates need no escaping at any depth (ext_proc.transform.surrogates): a bytes
    # substitution is the same as writing them into the document.
    final = own_placeholders_bytes(pmap.nonce).sub(swap, body)
    runtime.metrics.inc("cordon_surrogate_claims_total", len(claimed))
    subjects = context.subjects
    if subjects is not None:
        try:
            hit = await runtime.maybe_offload(
                offload, guarded, lambda: check_body(final, context.dialect, subjects)
            )
        except Refusal as refusal:
            return refusal
        if hit is not None:
            return survived(hit.label)
    return Claimed(final, surrogates)


def surrogate_clash(context: RequestContext, body: bytes) -> Callable[[str], bool]:
    """Which candidates this request must not use: one that is already text of the request
    (restore would take the caller's own text for the value), equals one of its values, or
    spells a declared identifier (the egress check would refuse the body)."""
    nonce = context.placeholders.nonce
    text = body.decode("utf-8", "replace").casefold()
    originals = {original.casefold() for original in context.placeholders.originals.values()}
    subjects = context.subjects

    def clash(candidate: str) -> bool:
        folded = candidate.casefold()
        if folded in originals:
            return True
        if folded in text:
            # Word-bounded, as restore would read it (`x7` inside `0x7f` is no clash).
            pattern = SurrogateRestorer({candidate: ""}, nonce).pattern
            if pattern is not None and pattern.search(text) is not None:
                return True
        return subjects is not None and subjects.first_survivor(candidate) is not None

    return clash


# --- receipts -----------------------------------------------------------------------------------


async def seal(
    runtime: Runtime, record: ExchangeRecord, response: pb.ProcessingResponse, *, declared: bool
) -> pb.ProcessingResponse:
    """Append this exchange's receipt; only then is its answer released.

    Redis down or slow: a refusal still goes out (without a receipt header); a request with
    subjects (`declared`), or under `failMode: closed`, is refused 503 `audit`; under
    `failMode: open` it is forwarded and the gap logged and counted.
    """
    store = runtime.receipts
    start = time.perf_counter()
    try:
        if store is None:
            raise ReceiptError("no receipt store is configured")
        receipt = await store.append(record.receipt_fields(runtime.receipt_secret))
    except ReceiptError as exc:
        runtime.metrics.inc("cordon_redis_errors_total")
        return _audit_failed(runtime, record, response, exc, declared=declared)
    finally:
        record.timings["receipt_ms"] = round((time.perf_counter() - start) * 1000, 3)
    runtime.metrics.inc("cordon_receipts_total")
    record.receipt_hash = receipt.hash
    if response.HasField("immediate_response"):
        wire.add_answer_header(response, RECEIPT_HEADER, receipt.hash)
    return response


def _audit_failed(
    runtime: Runtime,
    record: ExchangeRecord,
    response: pb.ProcessingResponse,
    error: ReceiptError,
    *,
    declared: bool,
) -> pb.ProcessingResponse:
    assert record.policy is not None
    reason = str(error)
    if response.HasField("immediate_response"):
        record.record_gap("audit", reason)  # the refusal stands; only its record is missing
        return response
    if not declared and record.policy.fail_mode == "open":
        record.record_gap("audit", reason)
        return response
    log.error(json.dumps({"event": "audit_failed", "tenant": record.tenant, "reason": reason}))
    message = "the audit record could not be written; the request was not forwarded"
    answer = refused(record, refusal_for(error, message))
    if error.uncertain and runtime.receipts is not None:
        _settle(runtime, runtime.receipts, record, error.uncertain[0])
    return answer


def _settle(
    runtime: Runtime, store: ReceiptStorage, record: ExchangeRecord, uncertain: tuple[str, str]
) -> None:
    """The append got no answer but may have reached the chain, as `forwarded`: once Redis
    answers, a record found there is followed by this refusal's (`exchange` = its hash)."""
    correction = replace(record.receipt_fields(runtime.receipt_secret), exchange=uncertain[1])
    metrics, tenant = runtime.metrics, correction.tenant

    def done(outcome: str) -> None:
        metrics.inc("cordon_receipt_settlements_total", outcome=outcome)
        level = logging.WARNING if outcome == "unknown" else logging.INFO
        log.log(level, json.dumps({"event": "audit_settled", "tenant": tenant, "outcome": outcome}))

    store.settle_later(correction, uncertain, done)


async def seal_output(runtime: Runtime, record: ExchangeRecord, gate: OutputGate, *, denied: bool) -> None:
    """The gate's record, after the exchange's own: distinct findings per kind, and whether the
    reply was refused. Written when there is something to say; a failure is a counted gap (the
    reply has gone, or goes, as the gate decided)."""
    assert record.policy is not None
    counts = gate.counts()
    for kind, n in counts.items():
        runtime.metrics.inc("cordon_output_findings_total", n, kind=kind)
    if not counts and not denied:
        return
    store = runtime.receipts
    try:
        if store is None:
            raise ReceiptError("no receipt store is configured")
        await store.append(
            ReceiptFields(
                tenant=record.policy.tenant,
                dialect=record.dialect,
                mode=record.policy.mode,
                decision="output",
                stage="output" if denied else None,
                counts=counts,
                exchange=record.receipt_hash,
            )
        )
    except ReceiptError as exc:
        runtime.metrics.inc("cordon_redis_errors_total")
        record.record_gap("output_audit", str(exc))
        return
    runtime.metrics.inc("cordon_receipts_total")
