"""The reply phases: restore this request's placeholders and read the model's output (the gate).

At the reply's headers the exchange decides whether its body needs reading at all: restore where
the request left redacted with placeholders, the output gate where the tenant has one, and only
for bodies that can be read (uncompressed JSON or text, or an SSE stream). A reply the gate cannot
read (compressed, or of a type it does not know) is refused at once under `outputGate: deny` and
counted as `UNREAD` under `report`. A `ReplyReader` then takes the body: buffered JSON in one
piece, SSE chunk by chunk. Under `outputGate: deny` a reply that carries a catalog value is
refused: JSON becomes the dialect's error, a stream ends with the dialect's error event and
nothing more of it is sent (what the gate has not decided yet never left: ext_proc.restore.sse).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.errors import Refusal
from ext_proc.exchange.context import RequestContext
from ext_proc.exchange.headers import RECEIPT_HEADER, Headers
from ext_proc.exchange.record import ExchangeRecord
from ext_proc.exchange.runtime import Runtime
from ext_proc.restore.json_body import restore_json_body
from ext_proc.restore.output_gate import OutputGate
from ext_proc.restore.restorers import PseudonymRestorer, Restorer, SurrogateRestorer, restorer_for
from ext_proc.restore.sse import SseRestorer
from ext_proc.service import wire
from ext_proc.storage.vault import VaultError
from ext_proc.transform.egress import neutralise_own_markers
from ext_proc.transform.placeholders import PlaceholderMap, PseudonymMap

log = logging.getLogger("cordon.exchange")

TEXT_TYPES = ("application/json", "text/", "application/problem+json")


def build_output_gate(catalog: Catalog, restorer: Restorer, *, deny: bool) -> OutputGate:
    """An output gate that reads this request's placeholders (every form its restorer takes, and
    strip markers) as separators, and leaves a placeholder still being streamed for later."""
    nonce = restorer.nonce

    def neutralise(text: str) -> str:
        if "<" in text or "[" in text:
            text = neutralise_own_markers(text, nonce)
        return restorer.neutralise(text)

    return OutputGate(
        catalog,
        neutralise,
        deny=deny,
        open_tail=restorer.open_tail,
        whole_at=restorer.whole_at,
        owns=restorer.owns,
    )


def receipt_headers(record: ExchangeRecord) -> list[tuple[str, str]]:
    """`X-Cordon-Receipt` for an answer of this exchange, once its record is written."""
    return [(RECEIPT_HEADER, record.receipt_hash)] if record.receipt_hash else []


def open_reply(
    context: RequestContext | None, record: ExchangeRecord, surrogates: dict[str, str], headers: Headers
) -> tuple[pb.ProcessingResponse, ReplyReader | None]:
    """The answer to the reply's headers, and the reader of its body (None: not read)."""
    content_type = (headers.get("content-type") or "").strip().lower()
    encoding = (headers.get("content-encoding") or "identity").strip().lower()
    receipt = receipt_headers(record)
    if context is not None:
        policy, pmap = context.policy, context.placeholders
        needs_restore = (
            context.restores
            and not policy.report_only  # the upstream saw the original: nothing to restore
            # Consistent pseudonyms: the reply may name those of earlier requests, in the vault.
            and (bool(pmap) or isinstance(pmap, PseudonymMap))
        )
        gated = policy.output_gate != "off"
        streamed = content_type.startswith("text/event-stream")
        readable = encoding in ("identity", "") and (streamed or _reads_as_text(content_type))
        if (needs_restore or gated) and readable:
            if policy.mode == "surrogate":
                # Its gate reads this request's surrogates as separators, restored or not.
                restorer: Restorer = SurrogateRestorer(surrogates, pmap.nonce)
            else:
                restorer = restorer_for(pmap) if needs_restore else Restorer(PlaceholderMap())
            gate = None
            if gated:
                deny = policy.output_gate == "deny" and not policy.report_only
                gate = build_output_gate(context.output_catalog(), restorer, deny=deny)
            reader = ReplyReader(context, record, restorer, gate, streamed=streamed)
            if streamed:
                mode = wire.body_modes(wire.NONE, wire.STREAMED)
                answer = wire.response_headers(remove=("content-length",), set_headers=receipt, mode=mode)
            else:
                answer = wire.response_headers(
                    set_headers=receipt, mode=wire.body_modes(wire.NONE, wire.BUFFERED)
                )
            return answer, reader
        if gated and _has_body(headers):
            return _unread(context, record, receipt)
    record.finish()
    return wire.response_headers(set_headers=receipt, mode=wire.body_modes(wire.NONE, wire.NONE)), None


def _reads_as_text(content_type: str) -> bool:
    """JSON and text the gate reads (`application/json`, `…+json`, `text/…`)."""
    media_type = content_type.split(";", 1)[0].strip()
    return media_type.startswith(TEXT_TYPES) or media_type.endswith("+json")


def _has_body(headers: Headers) -> bool:
    status = headers.get(":status") or ""
    return status not in ("204", "304") and (headers.get("content-length") or "").strip() != "0"


def _unread(
    context: RequestContext, record: ExchangeRecord, receipt: list[tuple[str, str]]
) -> tuple[pb.ProcessingResponse, ReplyReader]:
    """A reply the gate cannot read (compressed, or of an unknown type): refused under `deny`,
    counted as `UNREAD` under `report`; its output record is due at once."""
    policy = context.policy
    gate = OutputGate(context.output_catalog(), lambda text: text)
    gate.mark_unread()
    reader = ReplyReader(context, record, Restorer(PlaceholderMap()), gate, streamed=False)
    reader._finished = True
    if policy.output_gate == "deny" and not policy.report_only:
        refusal = reader._deny(
            "the model's reply could not be read (compressed, or of an unknown content type); "
            "this tenant's output gate refuses it",
            code="output_unreadable",
        )
        record.finish()
        return wire.refuse(refusal, context.provider, receipt), reader
    record.finish()
    return wire.response_headers(set_headers=receipt, mode=wire.body_modes(wire.NONE, wire.NONE)), reader


@dataclass(frozen=True, slots=True)
class Lookup:
    """Placeholders of earlier requests to look up in the vault (consistent pseudonyms)."""

    restorer: PseudonymRestorer
    wanted: set[str]


class ReplyReader:
    """One reply's body, restored and read by the gate; what the client gets of each chunk."""

    def __init__(
        self,
        context: RequestContext,
        record: ExchangeRecord,
        restorer: Restorer,
        gate: OutputGate | None,
        *,
        streamed: bool,
    ) -> None:
        self.context = context
        self.record = record
        self.restorer = restorer
        self.gate = gate
        self.sse = SseRestorer(restorer, context.dialect, gate) if streamed else None
        self.denied = False  # the output gate refused the reply
        self._finished = False  # the gate has read the whole reply (or refused it)
        self._vault_down = False  # a vault read failed: later placeholders are not looked up

    def take_finished(self) -> bool:
        """True once, after the gate has read the whole reply: its record is due."""
        finished, self._finished = self._finished, False
        return finished

    def read(self, chunk: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
        if self.sse is not None:
            return self._stream(self.sse, chunk, end_of_stream)
        return self._buffered(chunk, end_of_stream)

    def _stream(self, sse: SseRestorer, chunk: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
        gate = self.gate
        if self.denied:
            return wire.response_body(b"", set_length=False)  # the stream ended with the error
        # Under deny, `sse` gives out only what the gate has decided, the end of the reply
        # included (a last event without its blank line, text a channel still held).
        out = sse.feed(chunk)
        if end_of_stream:
            out += sse.finish()
        if gate is not None and gate.deny and gate.tripped:
            # Nothing of this chunk goes out: the client gets the dialect's error event, and
            # what the upstream still sends is dropped.
            self._finished = True
            refusal = self._deny()
            if end_of_stream:
                self.record.finish()
            return wire.response_body(self.context.dialect.error_event(refusal), set_length=False)
        if end_of_stream:
            if gate is not None:
                self._finished = True
            self.record.finish()
        if out == chunk:
            return wire.response_body()
        return wire.response_body(out, set_length=False)

    def _buffered(self, chunk: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
        gate = self.gate
        restored = restore_json_body(chunk, self.restorer, gate)
        if gate is not None and end_of_stream:
            self._finished = True
        if gate is not None and gate.deny and gate.tripped:
            refusal = self._deny()
            self.record.finish()
            return wire.refuse(refusal, self.context.provider, receipt_headers(self.record))
        if end_of_stream:
            self.record.finish()
        if restored == chunk:
            return wire.response_body()
        return wire.response_body(restored)

    def _deny(self, message: str | None = None, *, code: str = "output_blocked") -> Refusal:
        """The reply is refused (outputGate: deny): marked, counted, and the refusal naming kinds."""
        assert self.gate is not None
        self.denied = True
        self.record.metrics.inc("cordon_output_denied_total", dialect=self.context.dialect.name)
        if message is None:
            kinds = ", ".join(sorted(self.gate.kinds)) or "a catalog kind"
            message = f"the model's reply carried {kinds}; this tenant's output gate refuses it"
        return Refusal(422, "output", message, code=code)

    # --- consistent pseudonyms: placeholders of earlier requests, from the vault ---------------

    async def read_with_vault(
        self,
        chunk: bytes,
        end_of_stream: bool,
        read: Callable[[bytes, bool], Awaitable[pb.ProcessingResponse]],
        look_up: Callable[[set[str]], Awaitable[dict[str, str] | None]],
    ) -> pb.ProcessingResponse:
        """A chunk restored with consistent pseudonyms: when it names placeholders this request's
        map lacks, they are looked up in the vault and the chunk is restored again from the state
        before it; the first run's answer, which left them as they were, is dropped. (So a chunk
        may be read twice: nothing else keeps state across the two runs.)"""
        restorer = self.restorer
        assert isinstance(restorer, PseudonymRestorer)
        before = self.sse.checkpoint() if self.sse is not None else None
        response = await read(chunk, end_of_stream)
        wanted = restorer.take_unresolved()
        if self.denied:
            return response  # refused: nothing of it is restored
        metrics = self.record.metrics
        if restorer.skipped:
            metrics.inc("cordon_vault_unrestored_total", restorer.skipped, reason="limit")
            restorer.skipped = 0
        if not wanted:
            return response
        found: dict[str, str] = {}
        if not self._vault_down:
            start = time.perf_counter()
            answer = await look_up(wanted)
            self.record.timed("vault_read_ms", start)
            if answer is None:
                self._vault_down = True
            else:
                found = answer
        if self._vault_down:
            metrics.inc("cordon_vault_unrestored_total", len(wanted), reason="unavailable")
        restorer.learn(found, wanted)
        if before is not None and self.sse is not None:
            self.sse.rollback(before)
        return await read(chunk, end_of_stream)


async def vault_lookup(runtime: Runtime, record: ExchangeRecord, wanted: set[str]) -> dict[str, str] | None:
    """Ask the vault for placeholders of earlier requests; None when it is unavailable (they stay
    placeholders, counted and logged, never the placeholders or values)."""
    metrics, tenant = runtime.metrics, record.tenant
    try:
        if runtime.vault is None or tenant is None:
            raise VaultError("no vault is configured")
        read = await runtime.vault.get(tenant, wanted)
    except VaultError as exc:
        metrics.inc("cordon_vault_errors_total", op="read")
        record.log_event(logging.WARNING, "vault_read_failed", placeholders=len(wanted), reason=str(exc))
        return None
    found = dict(read.found)
    metrics.inc("cordon_vault_lookups_total", len(found), result="hit")
    metrics.inc("cordon_vault_lookups_total", len(wanted) - len(found), result="miss")
    if read.invalid:
        metrics.inc("cordon_vault_invalid_entries_total", read.invalid)
        record.log_event(logging.WARNING, "vault_entries_invalid", entries=read.invalid)
    return found
