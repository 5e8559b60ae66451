"""One ext_proc stream = one HTTP exchange: Envoy's messages in, the phases' answers out.

Envoy sends, in order and only as far as the exchange needs: request headers, the buffered
request body, response headers, the response body (buffered for JSON, streamed for SSE). Each
message goes to its phase (admission, request, reply), whose result says what to answer; this
class only keeps what the later messages need (the request's context, its record, the reply
reader) and commits a request's answer: vault, surrogates, then the receipt, before release.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.dialects.providers import DEFAULT_PROVIDER
from ext_proc.errors import Refusal
from ext_proc.exchange import commit
from ext_proc.exchange.admission import Admitted, admit
from ext_proc.exchange.context import RequestContext
from ext_proc.exchange.headers import REMOVED_REQUEST_HEADERS, Headers, bearer_token
from ext_proc.exchange.masking import mask_images
from ext_proc.exchange.record import ExchangeRecord
from ext_proc.exchange.refusals import refusal_for
from ext_proc.exchange.reply import ReplyReader, open_reply, vault_lookup
from ext_proc.exchange.request import after_masking, request_body
from ext_proc.exchange.results import Forward, NeedsOcr, Refuse, Release
from ext_proc.exchange.runtime import BodyTooLarge, Runtime
from ext_proc.restore.restorers import PseudonymRestorer
from ext_proc.runtime.bootstrap import ADMIN_ROUTE, NOT_FOUND_ROUTE
from ext_proc.runtime.hcm import READY_ROUTE
from ext_proc.service import admin, wire
from ext_proc.transform.placeholders import PseudonymMap

NO_ROUTE = Refusal(404, "routing", "no upstream is configured for this path", code="not_found")
MAX_MESSAGE_TIMEOUT = 300  # the bootstrap's max_message_timeout: Envoy ignores longer overrides


class Exchange:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.record = ExchangeRecord(runtime.metrics)
        self.context: RequestContext | None = None
        self.reply: ReplyReader | None = None
        # mode: surrogate: this request's surrogate → original, once claimed (never logged)
        self.surrogates: dict[str, str] = {}
        # The request's header values (and `:path`) rewritten at admission, and the headers it
        # drops besides the filter's own: sent with its headers.
        self.set_headers: tuple[tuple[str, str], ...] = ()
        self.remove_headers: tuple[str, ...] = REMOVED_REQUEST_HEADERS

    async def process(
        self, request: pb.ProcessingRequest, *, offload: bool = False
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """One message from Envoy → its answer (preceded, while OCR runs, by a longer timeout)."""
        phase = request.WhichOneof("request")
        if phase == "request_headers":
            yield await self.on_request_headers(Headers.from_message(request.request_headers, request))
        elif phase == "request_body":
            async for answer in self.on_request_body(bytes(request.request_body.body), offload):
                yield answer
        elif phase == "response_headers":
            yield await self.on_response_headers(Headers.from_message(request.response_headers))
        elif phase == "response_body":
            body = request.response_body
            yield await self.on_response_body(bytes(body.body), body.end_of_stream, offload)
        elif phase == "request_trailers":
            yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
        elif phase == "response_trailers":
            yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())

    def close(self) -> None:
        """The stream ended (the client left, or Envoy stopped calling): log what is known."""
        self.record.finish()

    # --- the request ----------------------------------------------------------------------------

    async def on_request_headers(self, headers: Headers) -> pb.ProcessingResponse:
        if headers.route_name == ADMIN_ROUTE:
            runtime = self.runtime
            return await admin.answer(
                headers.get(":method") or "GET",
                headers.path,
                bearer_token(headers),
                token=runtime.admin_token,
                store=runtime.receipts,
                secret=runtime.receipt_secret,
            )
        if headers.route_name == READY_ROUTE:
            if self.runtime.ready:
                return wire.answer(200, b'{"status":"ready"}')
            return wire.answer(503, b'{"status":"not ready"}')
        if headers.route_name == NOT_FOUND_ROUTE:
            # No route knows the path: nothing is read, nothing goes upstream, no receipt is
            # written (a scan of random paths would fill the chain); counted instead.
            self.runtime.metrics.inc("cordon_unrouted_total")
            return wire.refuse(NO_ROUTE, DEFAULT_PROVIDER)
        record = self.record
        admission = admit(self.runtime, headers, record)
        if not isinstance(admission, Admitted):
            record.policy, record.route, record.ref = admission.policy, admission.route, admission.ref
            return await self.commit(Refuse(admission.refusal))
        context = self.context = admission.context
        record.policy, record.route = context.policy, context.route
        record.ref = context.header.ref if context.header is not None else None
        self.set_headers = admission.set_headers
        self.remove_headers = (*REMOVED_REQUEST_HEADERS, *admission.removed)
        if admission.read_body:
            return wire.request_headers(remove=self.remove_headers, set_headers=self.set_headers)
        if admission.reported is not None:
            record.report(admission.reported)
        elif context.subjects is not None:
            record.egress = "verified"  # no body: the path and headers, all that leaves, were read
        return await self.commit(Release("reported" if context.policy.report_only else "forwarded"))

    async def on_request_body(self, raw: bytes, offload: bool) -> AsyncIterator[pb.ProcessingResponse]:
        context = self.context
        assert context is not None, "Envoy sends a request body only after admitted headers"
        runtime, record = self.runtime, self.record
        result = await runtime.maybe_offload(offload, self._timed_body, context, raw)
        if isinstance(result, NeedsOcr):
            pool = runtime.ocr
            assert pool is not None
            # Envoy would fail the request after EXTPROC_MESSAGE_TIMEOUT: tell it to wait for the
            # OCR budget (the pool's queue included) and a margin.
            yield wire.extend_timeout(min(MAX_MESSAGE_TIMEOUT, pool.budget + 10))
            masked = await mask_images(runtime, context, record, result.job)
            yield await self.commit(
                await runtime.maybe_offload(offload, after_masking, context, record, masked)
            )
            return
        yield await self.commit(result, offload=offload)

    def _timed_body(self, context: RequestContext, raw: bytes) -> Forward | Refuse | NeedsOcr:
        start = time.perf_counter()
        try:
            return request_body(self.runtime, context, self.record, raw)
        finally:
            self.record.timings["redact_ms"] = round((time.perf_counter() - start) * 1000, 3)

    async def commit(
        self, result: Forward | Refuse | Release, *, offload: bool = False
    ) -> pb.ProcessingResponse:
        """The request's answer, released only once its vault entries, surrogates and receipt are
        written (or refused when one of them cannot be)."""
        runtime, record, context = self.runtime, self.record, self.context
        if not isinstance(result, Refuse) and result.decision == "forwarded" and context is not None:
            result = await self._commit_values(context, result, offload)
        if isinstance(result, Forward):
            result = self._within_limit(result)
        if isinstance(result, Refuse):
            answer = commit.refused(record, result.refusal)
        elif isinstance(result, Release):
            record.decision = result.decision
            mode = wire.body_modes(wire.NONE, wire.NONE)
            answer = wire.request_headers(remove=self.remove_headers, set_headers=self.set_headers, mode=mode)
        else:
            record.decision = result.decision
            answer = wire.request_body(result.body)
        declared = context is not None and context.subjects is not None
        answer = await commit.seal(runtime, record, answer, declared=declared)
        if record.decision == "refused":
            record.finish()
        return answer

    def _within_limit(self, result: Forward) -> Forward | Refuse:
        """A body that grew past what Envoy takes (placeholders and surrogates are longer than
        many values, masked images may be larger) is refused here, 413 in the provider's shape
        with its receipt: handed to Envoy it would fail there, after a `forwarded` receipt."""
        limit, body = self.runtime.max_body_bytes, result.body
        if limit is None or body is None or len(body) <= limit:
            return result
        error = BodyTooLarge(
            f"the request body would be {len(body)} bytes once redacted, more than the "
            f"{limit} bytes this deployment forwards (MAX_BODY_BYTES); it was not forwarded"
        )
        return Refuse(refusal_for(error))

    async def _commit_values(
        self, context: RequestContext, result: Forward | Release, offload: bool
    ) -> Forward | Release | Refuse:
        """Consistent pseudonyms into the vault (those of the headers too); or, under `mode:
        surrogate`, surrogates claimed in place of this request's placeholders in its body."""
        pmap = context.placeholders
        if not pmap:
            return result
        if isinstance(pmap, PseudonymMap):
            refusal = await commit.write_pseudonyms(self.runtime, context, self.record)
            return result if refusal is None else Refuse(refusal)
        if context.uses_surrogates and isinstance(result, Forward) and result.body is not None:
            claimed = await commit.claim_surrogates(
                self.runtime, context, self.record, result.body, offload=offload
            )
            if not isinstance(claimed, commit.Claimed):
                return Refuse(claimed)
            self.surrogates = claimed.surrogates
            return Forward(result.decision, claimed.body)
        return result

    # --- the reply ------------------------------------------------------------------------------

    async def on_response_headers(self, headers: Headers) -> pb.ProcessingResponse:
        answer, self.reply = open_reply(self.context, self.record, self.surrogates, headers)
        reader = self.reply
        if reader is not None and reader.gate is not None and reader.take_finished():
            # A reply the gate cannot read: refused (deny) or counted (report) already, unread.
            await commit.seal_output(self.runtime, self.record, reader.gate, denied=reader.denied)
            self.reply = None
        return answer

    async def on_response_body(
        self, chunk: bytes, end_of_stream: bool, offload: bool
    ) -> pb.ProcessingResponse:
        reader = self.reply
        if reader is None:
            return wire.response_body()
        runtime = self.runtime

        async def read(data: bytes, end: bool) -> pb.ProcessingResponse:
            # A large chunk is read in the body thread: the event loop keeps answering.
            return await runtime.maybe_offload(offload, reader.read, data, end)

        if isinstance(reader.restorer, PseudonymRestorer):

            async def look_up(wanted: set[str]) -> dict[str, str] | None:
                return await vault_lookup(runtime, self.record, wanted)

            answer = await reader.read_with_vault(chunk, end_of_stream, read, look_up)
        else:
            answer = await read(chunk, end_of_stream)
        if reader.gate is not None and reader.take_finished():
            await commit.seal_output(runtime, self.record, reader.gate, denied=reader.denied)
        return answer
