"""One ext_proc stream = one HTTP exchange: its state across the phases, and the request pipeline.

Envoy sends, in order and only as far as the exchange needs: request headers, the buffered
request body, response headers, the response body (buffered for JSON, streamed for SSE). Each
phase is one method here; each returns the `ProcessingResponse` for its message. Anything that
goes wrong before the request is released becomes a `Refusal`, answered by `envoy.refuse`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.audit.metrics import Metrics
from ext_proc.audit.receipts.store import (
    Decision,
    Egress,
    ReceiptError,
    ReceiptFields,
    ReceiptStore,
    ref_digest,
)
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import SubjectHeader, SubjectHeaderError, parse_subject_header
from ext_proc.detect.subjects.matcher import CompiledSubjects, compile_subjects
from ext_proc.dialects import RouteInfo, classify
from ext_proc.errors import DetectionError, Refusal, describe
from ext_proc.media.ocr import MaskError, OcrPool, OcrTimeout, fuzzy_pattern, ocr_can_read
from ext_proc.media.parts import MediaPart
from ext_proc.policy.model import (
    MEDIA_STRICTNESS,
    MODE_STRICTNESS,
    MODES,
    Policy,
    PolicySet,
    less_strict_knobs,
)
from ext_proc.restore.output_gate import OutputGate
from ext_proc.restore.restorers import (
    PseudonymRestorer,
    Restorer,
    SseRestorer,
    SurrogateRestorer,
    restore_json_body,
    restorer_for,
)
from ext_proc.runtime.bootstrap import ADMIN_ROUTE, FILTER_HEADERS
from ext_proc.service import admin
from ext_proc.service import wire as envoy
from ext_proc.storage.vault import SurrogateExhausted, SurrogateWanted, Vault, VaultError
from ext_proc.transform.egress import check_body, neutralise_own_markers
from ext_proc.transform.placeholders import PlaceholderMap, PseudonymMap
from ext_proc.transform.redact import Replacement, resolve_overlaps, reversible, rewrite, strip
from ext_proc.transform.surrogates import family_of, surrogates_kept
from ext_proc.transform.walk import LeafWalker, dump_json, parse_json

log = logging.getLogger("cordon.exchange")
_T = TypeVar("_T")
MAX_MESSAGE_TIMEOUT = 300  # the bootstrap's max_message_timeout: Envoy ignores longer overrides

# A placeholder of this request as redaction writes it (placeholders.format_placeholder).
_OWN_PLACEHOLDER = re.compile(r"<([A-Z0-9_]+)_[0-9a-f]+_[0-9]+>")
ROUTE_ATTRIBUTE = "xds.route_name"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
SUBJECT_HEADER = "x-cordon-subject"
TENANT_HEADER = "x-tenant"
MODE_HEADER = "x-redact-mode"
RECEIPT_HEADER = "x-cordon-receipt"
# Never forwarded: the filter's own headers, and accept-encoding so replies arrive readable.
REMOVED_REQUEST_HEADERS = (*FILTER_HEADERS, "accept-encoding")
TEXT_TYPES = ("application/json", "text/", "application/problem+json")
# Headers a subject request's identifiers are not looked for in: credentials (random strings that
# could spell a short id by chance), the header itself (removed) and framing.
# Headers that select a tenant, a mode or subjects: a request must send each at most once.
SINGLE_HEADERS = frozenset({"authorization", "x-api-key", SUBJECT_HEADER, TENANT_HEADER, MODE_HEADER})
COMMA_FREE_HEADERS = SINGLE_HEADERS - {SUBJECT_HEADER}
UNREAD_HEADERS = frozenset({"authorization", "x-api-key", SUBJECT_HEADER, "content-length", "content-type"})


@dataclass(slots=True)
class Runtime:
    """What every exchange of one worker shares: read-only after start (reload swaps `policies`).

    `receipts` None means no receipt store: every append fails, as if Redis were down. `vault`
    None means no TENANT_SECRET: policies with consistent pseudonyms were refused at load.
    """

    policies: PolicySet
    admin_token: str | None = None
    receipts: ReceiptStore | None = None
    receipt_secret: bytes = b""
    trust_tenant_header: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    ocr: OcrPool | None = None  # None: media masking refuses (422)
    vault: Vault | None = None
    # Large bodies are read here, one at a time: several at once in one process only fight over
    # the GIL (slower each, and each holding its parsed copies in memory at the same time).
    large_bodies: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="body")
    )

    async def offload(self, call: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.large_bodies, call, *args)


@dataclass(slots=True)
class Headers:
    values: dict[str, str]  # a header sent more than once: its values joined with ","
    end_of_stream: bool
    route_name: str
    repeated: frozenset[str] = frozenset()  # the names sent more than once

    @classmethod
    def from_message(cls, message: pb.HttpHeaders, request: pb.ProcessingRequest | None = None) -> Headers:
        values: dict[str, str] = {}
        repeated: set[str] = set()
        for header in message.headers.headers:
            value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
            name = header.key.lower()
            if name in values:
                repeated.add(name)
                values[name] = f"{values[name]},{value}"
            else:
                values[name] = value
        route = ""
        # Envoy 1.40 sends attributes on the ProcessingRequest itself, keyed by the filter's name.
        for source in (request.attributes if request is not None else {}, message.attributes):
            attributes = source.get(EXT_PROC_FILTER)
            if attributes is not None and ROUTE_ATTRIBUTE in attributes.fields:
                route = attributes.fields[ROUTE_ATTRIBUTE].string_value
                break
        return cls(values, message.end_of_stream, route, frozenset(repeated))

    def get(self, name: str) -> str | None:
        return self.values.get(name)


def sent_twice(headers: Headers) -> list[str]:
    """The SINGLE_HEADERS a request sent more than once. Envoy joins repeats of some headers
    (`authorization` among them) into one value with ","; a key, a tenant name or a mode never
    holds a comma, so one there is a repeat too."""
    joined = {name for name in COMMA_FREE_HEADERS if "," in (headers.get(name) or "")}
    return sorted((headers.repeated & SINGLE_HEADERS) | joined)


def bearer_token(headers: Headers) -> str | None:
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


def api_keys(headers: Headers) -> list[str]:
    """The credentials a request carries: the bearer token and `x-api-key` (either, both)."""
    keys = [bearer_token(headers), (headers.get("x-api-key") or "").strip() or None]
    return [key for key in keys if key]


def _declared_type(part: MediaPart) -> str | None:
    """The media type a base64 part declares beside it (Anthropic `media_type`), if any."""
    value = part.container.get("media_type")
    return value.strip().lower() if isinstance(value, str) else None


def build_output_gate(catalog: Catalog, restorer: Restorer, *, deny: bool) -> OutputGate:
    """An output gate that reads this request's placeholders (every form its restorer takes, and
    strip markers) as separators, and leaves a placeholder still being streamed for later."""
    nonce = restorer.nonce

    def neutralise(text: str) -> str:
        if "<" in text or "[" in text:
            text = neutralise_own_markers(text, nonce)
        return restorer.neutralise(text)

    return OutputGate(catalog, neutralise, deny=deny, open_tail=restorer.open_tail)


@dataclass(slots=True)
class Exchange:
    runtime: Runtime
    route: RouteInfo | None = None
    policy: Policy | None = None
    provider: str = "openai"
    pmap: PlaceholderMap | PseudonymMap = field(default_factory=PlaceholderMap)
    counts: Counter[str] = field(default_factory=Counter)
    decision: Decision | None = None  # set once the request is released or refused
    stage: str | None = None
    egress: Egress = "skipped"
    media: int | None = None
    gap: str | None = None  # a failure forwarded under failMode: open (detection, audit)
    header: SubjectHeader | None = None
    subjects: CompiledSubjects | None = None
    status: int | None = None
    receipt_hash: str | None = None
    sealed: bool = False
    admin_request: Headers | None = None
    mask_parts: list[MediaPart] = field(default_factory=list)
    _media_parts: list[MediaPart] | None = None
    pending_mask: tuple[bytes, Any] | None = None  # (raw body, parsed doc) waiting for OCR
    response_kind: str = "none"  # none | buffered | sse
    restorer: Restorer | None = None
    sse: SseRestorer | None = None
    gate: OutputGate | None = None
    gate_done: bool = False  # the whole reply has been read (or refused) by the gate
    output_denied: bool = False
    output_sealed: bool = False
    vault_down: bool = False  # a vault read failed: later placeholders are not looked up
    # mode: surrogate: this request's surrogate → original, once claimed (never logged)
    surrogates: dict[str, str] = field(default_factory=dict, repr=False)
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    logged: bool = False

    # --- phases -------------------------------------------------------------------------------

    async def process(
        self, request: pb.ProcessingRequest, *, offload: bool = False
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """One message from Envoy → its answer (preceded, while OCR runs, by a longer timeout).

        The receipt is written here, before the request's last message is answered: nothing is
        released upstream without its record in Redis; nor, with consistent pseudonyms, without its
        placeholders in the vault. Reply chunks that name placeholders of earlier requests wait here
        for the vault, too.
        """
        if isinstance(self.restorer, PseudonymRestorer) and request.HasField("response_body"):
            response = await self.restore_with_vault(request, self.restorer, offload)
        else:
            response = await self.run(request, offload)
        if self.admin_request is not None:
            headers, self.admin_request = self.admin_request, None
            yield await admin.answer(
                headers.get(":method") or "GET",
                headers.get(":path") or "/",
                bearer_token(headers),
                token=self.runtime.admin_token,
                store=self.runtime.receipts,
                secret=self.runtime.receipt_secret,
            )
            return
        if self.pending_mask is not None:
            assert self.runtime.ocr is not None
            # Envoy would fail the request after EXTPROC_MESSAGE_TIMEOUT: tell it to wait for
            # the OCR budget (the pool's queue included) and a margin.
            yield envoy.extend_timeout(min(MAX_MESSAGE_TIMEOUT, self.runtime.ocr.budget + 10))
            response = await self.finish_masked(offload)
        if self.decision is not None and not self.sealed and response is not None:
            if isinstance(self.pmap, PseudonymMap) and self.pmap and self.decision == "forwarded":
                response = await self.store_pseudonyms(response)
            elif self.uses_surrogates and self.pmap and self.decision == "forwarded":
                response = await self.claim_surrogates(response, offload)
            response = await self.seal(response)
            if self.decision == "refused":
                self.finish_log()
        if self.gate is not None and self.gate_done and not self.output_sealed:
            await self.seal_output()
        if response is not None:
            yield response

    async def run(self, request: pb.ProcessingRequest, offload: bool) -> pb.ProcessingResponse | None:
        if offload:
            # Reading a large body takes long enough to starve the health checks and the other
            # exchanges of this worker; a thread keeps the event loop answering.
            return await self.runtime.offload(self.handle, request)
        return self.handle(request)

    def handle(self, request: pb.ProcessingRequest) -> pb.ProcessingResponse | None:
        phase = request.WhichOneof("request")
        try:
            if phase == "request_headers":
                return self.on_request_headers(Headers.from_message(request.request_headers, request))
            if phase == "request_body":
                return self.on_request_body(request.request_body)
        except Refusal as refusal:
            return self.refuse(refusal)
        if phase == "response_headers":
            return self.on_response_headers(Headers.from_message(request.response_headers))
        if phase == "response_body":
            return self.on_response_body(request.response_body)
        if phase == "request_trailers":
            return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
        if phase == "response_trailers":
            return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
        return None

    def on_request_headers(self, headers: Headers) -> pb.ProcessingResponse | None:
        path = headers.get(":path") or "/"
        if headers.route_name == ADMIN_ROUTE:
            self.admin_request = headers  # answered in `process`: it reads Redis
            return None
        self.select_policy(headers)
        assert self.policy is not None
        self.choose_placeholders()
        self.route = classify(headers.route_name, path)
        if self.route is None:
            raise Refusal(404, "routing", "no upstream is configured for this path", code="not_found")
        self.provider = self.route.provider
        if self.route.provider not in self.policy.upstreams:
            raise Refusal(403, "policy", f"this tenant may not reach the {self.route.provider} upstream")
        raw_subject = headers.get(SUBJECT_HEADER)
        if raw_subject is not None:
            self.read_subjects(raw_subject, path)
            self.check_headers(headers)
        elif self.policy.require_subject:
            raise Refusal(
                400, "request", "this tenant requires an X-Cordon-Subject header", code="subject_required"
            )
        encoding = (headers.get("content-encoding") or "identity").strip().lower()
        if encoding != "identity" and not headers.end_of_stream:
            refusal = Refusal(
                415, "request", "compressed request bodies cannot be read; send them uncompressed"
            )
            if not self.policy.report_only:
                raise refusal
            self.stage = refusal.stage  # report-only: forwarded as it is, the refusal recorded
            return self.release_headers()
        if self.policy.mode == "off" or headers.end_of_stream:
            # Nothing to redact: forwarded as it is. (A subject request never gets here with mode
            # off; without a body, its path and headers were checked above.)
            return self.release_headers()
        return envoy.request_headers(remove=REMOVED_REQUEST_HEADERS)

    def release_headers(self) -> pb.ProcessingResponse:
        """Forward without reading the body; the reply is neither read nor restored, but its headers
        still pass here for the receipt header."""
        assert self.policy is not None
        self.decision = "reported" if self.policy.report_only else "forwarded"
        mode = envoy.body_modes(envoy.NONE, envoy.NONE)
        return envoy.request_headers(remove=REMOVED_REQUEST_HEADERS, mode=mode)

    def select_policy(self, headers: Headers) -> None:
        """The key's tenant; then `X-Tenant` (when trusted, towards a tenant at least as strict);
        then `X-Redact-Mode` (when the tenant allows it, only tighter)."""
        policies = self.runtime.policies
        repeated = sent_twice(headers)
        if repeated:
            # Joined, two keys would select no tenant (so the default policy) while the provider
            # may authenticate one of them; two subject or tenant headers are just as ambiguous.
            raise Refusal(400, "request", f"send each of these headers once: {', '.join(repeated)}")
        selected = [policies.for_api_key(key) for key in api_keys(headers)]
        if len({policy.tenant for policy in selected}) > 1:
            # Which one the provider authenticates with is its business; which tenant's policy
            # applies is ours, and a junk token beside a real key must not pick the lenient one.
            raise Refusal(
                400, "request", "Authorization and x-api-key select different tenants; send one key"
            )
        base = selected[0] if selected else policies.default
        self.policy = base
        wanted = headers.get(TENANT_HEADER)
        if wanted is not None and self.runtime.trust_tenant_header:
            target = policies.tenants.get(wanted.strip())
            if target is None:
                raise Refusal(403, "policy", "X-Tenant names no configured tenant", code="tenant_forbidden")
            looser = less_strict_knobs(target, base)
            if looser:
                raise Refusal(
                    403,
                    "policy",
                    "X-Tenant may only select a tenant at least as strict as the API key's tenant; "
                    f"the one named is less strict on: {', '.join(looser)}",
                    code="tenant_forbidden",
                )
            self.policy = target
        raw_mode = headers.get(MODE_HEADER)
        if raw_mode is not None:
            self.policy = self.override_mode(self.policy, raw_mode.strip().lower())

    def choose_placeholders(self) -> None:
        """Consistent pseudonyms for a tenant that restores and wants them; per-request otherwise
        (strip writes markers, and under reportOnly nothing leaves redacted to be restored).
        `mode: surrogate` writes per-request placeholders first: `claim_surrogates` replaces them."""
        policy = self.policy
        assert policy is not None
        if self.uses_surrogates and self.runtime.vault is None:
            # Refused at load without TENANT_SECRET; X-Redact-Mode cannot ask for it (it only
            # tightens, and surrogate is looser than every mode but off).
            raise Refusal(503, "vault", "surrogates are not configured (TENANT_SECRET)")
        if not policy.consistent_pseudonyms or policy.mode != "reversible" or policy.report_only:
            return
        if self.runtime.vault is None:
            # Policies that need TENANT_SECRET are refused at load without it: not reached.
            raise Refusal(503, "vault", "consistent pseudonyms are not configured (TENANT_SECRET)")
        self.pmap = PseudonymMap(self.runtime.vault.pseudonym_key(policy.tenant))

    @property
    def uses_surrogates(self) -> bool:
        """`mode: surrogate`, and the body leaves redacted (not reportOnly)."""
        return self.policy is not None and self.policy.mode == "surrogate" and not self.policy.report_only

    @staticmethod
    def override_mode(policy: Policy, wanted: str) -> Policy:
        if wanted not in MODES:
            raise Refusal(400, "request", "X-Redact-Mode must be one of " + ", ".join(MODES))
        if wanted == policy.mode:
            return policy
        if MODE_STRICTNESS[wanted] < MODE_STRICTNESS[policy.mode]:
            raise Refusal(
                403,
                "policy",
                f"X-Redact-Mode may only tighten the tenant's mode ({policy.mode}), never loosen it",
            )
        if not policy.allow_header_override:
            raise Refusal(
                403, "policy", "this tenant does not let X-Redact-Mode change its mode (allowHeaderOverride)"
            )
        return replace(policy, mode=wanted)  # type: ignore[arg-type]

    def read_subjects(self, raw: str, path: str) -> None:
        """Parse and compile the declared subjects; anything unreadable is a 400, never a fallback."""
        assert self.policy is not None
        try:
            self.header = parse_subject_header(raw)
            self.subjects = compile_subjects(self.header)
        except SubjectHeaderError as exc:
            raise Refusal(400, "request", f"X-Cordon-Subject: {exc}", code="invalid_subject_header") from None
        except Exception as exc:
            log.error(json.dumps({"event": "subject_compile_failed", **describe(exc)}))
            raise Refusal(422, "detection", "the declared subjects could not be compiled") from None
        if self.policy.mode == "off":
            raise Refusal(
                422,
                "policy",
                "this tenant does not redact (mode: off); a request declaring subjects is refused",
            )
        if self.policy.report_only:
            raise Refusal(
                422,
                "policy",
                "this tenant only reports (reportOnly: true) and would forward the body unchanged; "
                "a request declaring subjects is refused",
            )
        # The path leaves too (first_survivor also reads it percent-decoded: `mq%40example.com`).
        survivor = self.subjects.first_survivor(path)
        if survivor is not None:
            self.egress = "refused"
            raise Refusal(
                422, "egress", f"a declared identifier ({survivor}) is in the request path", kind=survivor
            )

    def check_headers(self, headers: Headers) -> None:
        """Header values leave too: a subject request whose headers carry an identifier is refused."""
        assert self.subjects is not None
        for name, value in headers.values.items():
            if name in UNREAD_HEADERS or name.startswith(":"):
                continue
            survivor = self.subjects.first_survivor(f"{name} {value}")
            if survivor is not None:
                self.egress = "refused"
                raise Refusal(
                    422, "egress", f"a declared identifier ({survivor}) is in a request header", kind=survivor
                )

    def on_request_body(self, body: pb.HttpBody) -> pb.ProcessingResponse | None:
        assert self.route is not None and self.policy is not None
        start = time.perf_counter()
        try:
            if self.policy.report_only:
                return self.report_body(bytes(body.body))
            response = self.request_body(bytes(body.body))
            if self.pending_mask is None:
                self.decision = "forwarded"
            return response
        finally:
            self.timings["redact_ms"] = round((time.perf_counter() - start) * 1000, 3)

    def request_body(self, raw: bytes) -> pb.ProcessingResponse | None:
        if not raw.strip():
            return envoy.request_body()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Refusal(
                400, "request", "the request body is not valid UTF-8", code="invalid_json"
            ) from None
        doc = parse_json(text)
        if self.subjects is not None:
            return self.subject_body(raw, doc)
        return self.catalog_body(doc)

    def report_body(self, raw: bytes) -> pb.ProcessingResponse:
        """reportOnly: run the pipeline for its record, forward the original body unchanged."""
        try:
            self.request_body(raw)
        except Refusal as refusal:
            self.stage = refusal.stage
        self.decision = "reported"
        return envoy.request_body()

    def catalog_body(self, doc: Any) -> pb.ProcessingResponse:
        """A request without declared subjects: redact; a detection failure follows failMode."""
        assert self.policy is not None
        try:
            new_doc, changed = self.redact_document(doc)
        except DetectionError as exc:
            # failMode applies to requests without declared subjects (all of them, in this version).
            if self.policy.fail_mode == "closed" and not self.policy.report_only:
                raise Refusal(503, "detection", f"detection failed ({exc}); failMode is closed") from None
            self.record_gap("detection", str(exc))
            return envoy.request_body()
        if not changed:
            return envoy.request_body()
        return envoy.request_body(dump_json(new_doc))

    def subject_body(self, raw: bytes, doc: Any) -> pb.ProcessingResponse | None:
        """A request that declares subjects: media policy, redaction, then the egress check.

        Any failure refuses the request whatever failMode says (SPEC §11). Images to mask leave
        this phase pending (None): `process` runs the OCR off the event loop, then finishes.
        """
        self.guarded(self.apply_media_policy, doc)
        if self.mask_parts:
            self.pending_mask = (raw, doc)
            return None
        return self.subject_finish(raw, doc)

    def subject_finish(self, raw: bytes, doc: Any) -> pb.ProcessingResponse:
        assert self.route is not None and self.subjects is not None

        def redact_and_check() -> tuple[bytes, bool, object]:
            new_doc, changed = self.redact_document(doc)
            changed = changed or bool(self.mask_parts)
            body = dump_json(new_doc) if changed else raw
            check_start = time.perf_counter()
            assert self.route is not None and self.subjects is not None
            hit = check_body(body, self.route.dialect, self.subjects, nonce=self.pmap.nonce)
            self.timings["egress_ms"] = round((time.perf_counter() - check_start) * 1000, 3)
            return body, changed, hit

        body, changed, hit = self.guarded(redact_and_check)
        if hit is not None:
            self.egress = "refused"
            label = hit.label  # type: ignore[attr-defined]
            raise Refusal(
                422,
                "egress",
                f"a declared identifier ({label}) would still have left in the request body",
                kind=label,
            )
        self.egress = "verified"
        return envoy.request_body(body if changed else None)

    @staticmethod
    def guarded(step: Callable[..., _T], *args: Any) -> _T:
        """Run a step of a subject request: anything but a Refusal becomes a 422 `detection`."""
        try:
            return step(*args)
        except Refusal:
            raise
        except DetectionError as exc:
            raise Refusal(422, "detection", f"detection failed ({exc}); the request was refused") from None
        except Exception as exc:
            log.error(json.dumps({"event": "subject_pipeline_failed", **describe(exc)}))
            raise Refusal(422, "detection", "detection failed; the request was refused") from None

    def apply_media_policy(self, doc: Any) -> None:
        assert self.policy is not None and self.header is not None
        parts = self.media_parts(doc)
        if not parts:
            return
        choices = [self.policy.subject_media, self.header.media or "allow"]
        effective = max(choices, key=MEDIA_STRICTNESS.__getitem__)
        if effective == "block":
            raise Refusal(
                422, "media", f"{len(parts)} media part(s) in a request that declares subjects (media: block)"
            )
        if effective == "mask":
            self.mask_parts = self.maskable(parts)

    def maskable(self, parts: list[MediaPart]) -> list[MediaPart]:
        """Under `mask`, every part must be an image whose bytes are in the body, else 422."""
        pool = self.runtime.ocr
        if pool is None:
            raise Refusal(422, "media", "media masking by OCR is not configured; the request was refused")
        for part in parts:
            if part.media != "image":
                raise Refusal(
                    422,
                    "media",
                    f"a {part.media} part cannot be masked (only images can be read); media: mask",
                )
            if not part.is_bytes:
                raise Refusal(
                    422,
                    "media",
                    f"an image given by {part.source.replace('_', ' ')} cannot be read here; media: mask",
                )
        if len(parts) > pool.max_images:
            raise Refusal(422, "media", f"more than {pool.max_images} images to mask in one request")
        assert self.header is not None
        if not ocr_can_read(self.header):
            raise Refusal(
                422,
                "media",
                "a declared identifier is written in a script the OCR here cannot read; media: mask",
            )
        return parts

    async def finish_masked(self, offload: bool) -> pb.ProcessingResponse:
        """Mask every image (OCR pool, bounded by the budget), then redact and check the rest."""
        assert self.pending_mask is not None and self.runtime.ocr is not None
        assert self.subjects is not None and self.policy is not None
        raw, doc = self.pending_mask
        self.pending_mask = None
        pool = self.runtime.ocr
        catalog = self.catalog()
        start = time.perf_counter()
        subjects = self.subjects
        fuzzy = fuzzy_pattern(form.key for form in subjects.forms())
        try:
            results = await pool.mask_all(
                [(str(part.container[part.key]), _declared_type(part)) for part in self.mask_parts],
                [catalog.detect, subjects.detect],
                fuzzy,
            )
        except OcrTimeout:
            return self.refuse(
                Refusal(
                    503, "media", f"OCR did not finish within its budget ({pool.budget:g}s); try again later"
                )
            )
        except MaskError as exc:
            return self.refuse(Refusal(422, "media", f"media: mask refused an image: {exc}"))
        except Exception as exc:
            log.error(json.dumps({"event": "ocr_failed", **describe(exc)}))
            return self.refuse(Refusal(422, "media", "OCR failed; the request was refused"))
        finally:
            self.timings["ocr_ms"] = round((time.perf_counter() - start) * 1000, 3)
        for part, (payload, result) in zip(self.mask_parts, results, strict=True):
            part.container[part.key] = payload
            self.timings["media_words_masked"] = (
                self.timings.get("media_words_masked", 0) + result.masked_words
            )
            for seconds in result.pass_seconds:
                self.runtime.metrics.observe("cordon_ocr_pass_seconds", seconds)
        try:
            if offload:
                response = await self.runtime.offload(self.subject_finish, raw, doc)
            else:
                response = self.subject_finish(raw, doc)
        except Refusal as refusal:
            return self.refuse(refusal)
        self.decision = "forwarded"
        return response

    def catalog(self) -> Catalog:
        assert self.policy is not None
        return Catalog.for_sets(self.policy.sets, skip_documentation_ips=self.policy.skip_documentation_ips)

    def media_parts(self, doc: Any) -> list[MediaPart]:
        """The body's media parts, found once per exchange (each at most once) and shared by the
        media policy, masking, the walk and the receipt's count."""
        if self._media_parts is None:
            assert self.route is not None
            found: dict[tuple[int, str], MediaPart] = {}
            for part in self.route.dialect.media(doc):
                found.setdefault((id(part.container), part.key), part)  # the first, most specific
            self._media_parts = list(found.values())
            self.media = len(self._media_parts)
        return self._media_parts

    def redact_document(self, doc: Any) -> tuple[Any, bool]:
        assert self.route is not None and self.policy is not None
        policy = self.policy
        catalog = self.catalog()
        # Surrogate mode writes placeholders first; claim_surrogates swaps them before release.
        restores = policy.mode in ("reversible", "surrogate")
        replacement: Replacement = reversible(self.pmap) if restores else strip
        counts = self.counts
        detect = catalog.detect
        subject_detect = self.subjects.detect if self.subjects is not None else None
        if policy.mode == "surrogate":
            detect = surrogates_kept(detect)

        def visit(text: str) -> str:
            findings = detect(text)
            if subject_detect is not None:
                findings = [*findings, *subject_detect(text)]
            if not findings:
                return text
            return rewrite(text, resolve_overlaps(findings), replacement, counts)

        dialect = self.route.dialect
        media = {(id(part.container), part.key) for part in self.media_parts(doc) if part.is_bytes}
        system: set[tuple[int, object]] = set()
        if not policy.redact_system:
            system = {(id(container), key) for container, key in dialect.system_positions(doc)}
        walker = LeafWalker(visit, media_positions=media, system_positions=system)
        new_doc = walker.walk(doc)
        return new_doc, walker.stats.changed

    def on_response_headers(self, headers: Headers) -> pb.ProcessingResponse:
        content_type = (headers.get("content-type") or "").lower()
        encoding = (headers.get("content-encoding") or "identity").lower()
        receipt = self.receipt_headers()
        needs_restore = (
            self.route is not None
            and self.policy is not None
            and self.policy.mode in ("reversible", "surrogate")
            and not self.policy.report_only  # the upstream saw the original: nothing to restore
            # Consistent pseudonyms: the reply may name those of earlier requests, in the vault.
            and (bool(self.pmap) or isinstance(self.pmap, PseudonymMap))
            and encoding == "identity"
        )
        gated = (
            self.route is not None
            and self.policy is not None
            and self.policy.output_gate != "off"
            and encoding == "identity"
        )
        if needs_restore or gated:
            if self.policy is not None and self.policy.mode == "surrogate":
                # Its gate reads this request's surrogates as separators, restored or not.
                self.restorer = SurrogateRestorer(self.surrogates, self.pmap.nonce)
            else:
                self.restorer = restorer_for(self.pmap) if needs_restore else Restorer(PlaceholderMap())
            self.gate = self.output_gate() if gated else None
        if (needs_restore or gated) and content_type.startswith("text/event-stream"):
            self.response_kind = "sse"
            assert self.route is not None and self.restorer is not None
            self.sse = SseRestorer(self.restorer, self.route.dialect.name, self.gate)
            mode = envoy.body_modes(envoy.NONE, envoy.STREAMED)
            return envoy.response_headers(remove=("content-length",), set_headers=receipt, mode=mode)
        if (needs_restore or gated) and content_type.startswith(TEXT_TYPES):
            self.response_kind = "buffered"
            mode = envoy.body_modes(envoy.NONE, envoy.BUFFERED)
            return envoy.response_headers(set_headers=receipt, mode=mode)
        self.gate = None
        self.finish_log()
        return envoy.response_headers(set_headers=receipt, mode=envoy.body_modes(envoy.NONE, envoy.NONE))

    def on_response_body(self, body: pb.HttpBody) -> pb.ProcessingResponse:
        assert self.route is not None
        chunk = bytes(body.body)
        gate = self.gate
        if self.response_kind == "sse" and self.sse is not None:
            if self.output_denied:
                return envoy.response_body(b"", set_length=False)  # the stream ended with the error
            out = self.sse.feed(chunk)
            if gate is not None and gate.deny and (gate.check_windows() or gate.tripped):
                # Nothing of this chunk goes out: the client gets the dialect's error event, and
                # what the upstream still sends is dropped.
                self.gate_done = True
                refusal = self.deny_output()
                if body.end_of_stream:
                    self.finish_log()
                return envoy.response_body(envoy.error_event(refusal, self.route.dialect.name))
            if body.end_of_stream:
                out += self.sse.finish()
                if gate is not None:
                    gate.finish_windows()
                    self.gate_done = True
                self.finish_log()
            if out == chunk:
                return envoy.response_body()
            return envoy.response_body(out, set_length=False)
        if self.response_kind == "buffered":
            assert self.restorer is not None
            restored = restore_json_body(chunk, self.route.dialect.name, self.restorer, gate)
            if gate is not None and body.end_of_stream:
                self.gate_done = True
            if gate is not None and gate.deny and gate.tripped:
                refusal = self.deny_output()
                self.finish_log()
                return envoy.refuse(refusal, self.provider, self.receipt_headers())
            if body.end_of_stream:
                self.finish_log()
            if restored == chunk:
                return envoy.response_body()
            return envoy.response_body(restored)
        return envoy.response_body()

    # --- the output gate ----------------------------------------------------------------------

    def output_gate(self) -> OutputGate:
        """This exchange's gate: the policy's output sets; this request's placeholders, in every
        form restore takes (and strip markers), read as separators. Under reportOnly it only
        reports: the reply is never changed."""
        assert self.policy is not None and self.restorer is not None
        policy = self.policy
        catalog = Catalog.for_sets(policy.output_sets, skip_documentation_ips=policy.skip_documentation_ips)
        deny = policy.output_gate == "deny" and not policy.report_only
        return build_output_gate(catalog, self.restorer, deny=deny)

    def receipt_headers(self) -> list[tuple[str, str]]:
        """`X-Cordon-Receipt` for an answer of this exchange, once its record is written."""
        return [(RECEIPT_HEADER, self.receipt_hash)] if self.receipt_hash else []

    def deny_output(self) -> Refusal:
        """The reply is refused (outputGate: deny): marked, counted, and the refusal naming kinds."""
        assert self.gate is not None and self.route is not None
        self.output_denied = True
        self.runtime.metrics.inc("cordon_output_denied_total", dialect=self.route.dialect.name)
        kinds = ", ".join(sorted(self.gate.kinds)) or "a catalog kind"
        return Refusal(
            422,
            "output",
            f"the model's reply carried {kinds}; this tenant's output gate refuses it",
            code="output_blocked",
        )

    async def seal_output(self) -> None:
        """The gate's record, after the exchange's own: distinct findings per kind, and whether the
        reply was refused. Written when there is something to say; a failure is a counted gap (the
        reply has gone, or goes, as the gate decided)."""
        assert self.gate is not None and self.policy is not None
        self.output_sealed = True
        counts = self.gate.counts()
        for kind, n in counts.items():
            self.runtime.metrics.inc("cordon_output_findings_total", n, kind=kind)
        if not counts and not self.output_denied:
            return
        store = self.runtime.receipts
        try:
            if store is None:
                raise ReceiptError("no receipt store is configured")
            await store.append(
                ReceiptFields(
                    tenant=self.policy.tenant,
                    dialect=self.route.dialect.name if self.route is not None else "none",
                    mode=self.policy.mode,
                    decision="output",
                    stage="output" if self.output_denied else None,
                    counts=counts,
                    exchange=self.receipt_hash,
                )
            )
        except ReceiptError as exc:
            self.runtime.metrics.inc("cordon_redis_errors_total")
            self.record_gap("output_audit", str(exc))
            return
        self.runtime.metrics.inc("cordon_receipts_total")

    # --- the vault (consistent pseudonyms) ------------------------------------------------------

    async def store_pseudonyms(self, response: pb.ProcessingResponse) -> pb.ProcessingResponse:
        """Write this request's pseudonyms to the vault before its body is released: a later reply
        that names one must find it. A failure refuses the request (503 `vault`), whatever failMode
        says: forwarded, its placeholders could come back where nothing can restore them.
        """
        assert isinstance(self.pmap, PseudonymMap) and self.policy is not None
        if response.HasField("immediate_response"):
            return response
        vault = self.runtime.vault
        start = time.perf_counter()
        try:
            if vault is None:
                raise VaultError("no vault is configured")
            await vault.put(self.policy.tenant, self.pmap.originals, self.policy.vault_ttl_seconds)
        except VaultError as exc:
            self.runtime.metrics.inc("cordon_vault_errors_total", op="write")
            self.vault_log(logging.ERROR, "vault_write_failed", placeholders=len(self.pmap), reason=str(exc))
            message = "the pseudonym vault could not be written; the request was not forwarded"
            return self.refuse(Refusal(503, "vault", message))
        finally:
            self.timings["vault_write_ms"] = round((time.perf_counter() - start) * 1000, 3)
        self.runtime.metrics.inc("cordon_vault_writes_total", len(self.pmap))
        return response

    async def claim_surrogates(self, response: pb.ProcessingResponse, offload: bool) -> pb.ProcessingResponse:
        """`mode: surrogate`: claim a surrogate per distinct value in the tenant's registry, put the
        surrogates where redaction wrote this request's placeholders, and, for a request that
        declares subjects, check the final body again (a surrogate must not spell a declared
        identifier). Only then is the body released. Redis failing, or no free surrogate: 503
        `vault`, whatever failMode says (fail closed, as for the pseudonym vault)."""
        assert self.policy is not None and self.route is not None
        if response.HasField("immediate_response"):
            return response
        mutation = response.request_body.response.body_mutation
        if not mutation.HasField("body"):
            return response  # nothing was redacted into this body (a failMode: open gap)
        wanted: dict[str, SurrogateWanted] = {}
        for text, original in self.pmap.originals.items():
            m = _OWN_PLACEHOLDER.fullmatch(text)
            if m is None:
                raise AssertionError("the request map holds a key outside the placeholder grammar")
            wanted[text] = SurrogateWanted(family_of(m.group(1)), original)
        vault = self.runtime.vault
        start = time.perf_counter()
        try:
            if vault is None:
                raise VaultError("no surrogate registry is configured")
            claimed = await vault.claim_surrogates(
                self.policy.tenant,
                wanted.values(),
                self.policy.vault_ttl_seconds,
                avoid=self.surrogate_clash(mutation.body),
            )
        except (VaultError, SurrogateExhausted) as exc:
            self.runtime.metrics.inc("cordon_vault_errors_total", op="claim")
            self.vault_log(logging.ERROR, "surrogate_claim_failed", values=len(wanted), reason=str(exc))
            message = "surrogates could not be claimed; the request was not forwarded"
            return self.refuse(Refusal(503, "vault", message))
        finally:
            self.timings["surrogate_ms"] = round((time.perf_counter() - start) * 1000, 3)
        by_placeholder = {text: claimed[item].encode("ascii") for text, item in wanted.items()}

        def swap(m: re.Match[bytes]) -> bytes:
            return by_placeholder.get(m.group(0).decode("ascii"), m.group(0))

        # Surrogates need no escaping at any depth (ext_proc.transform.surrogates): a bytes substitution
        # is the same as writing them into the document.
        own = re.compile(rb"<[A-Z0-9_]+_" + self.pmap.nonce.encode("ascii") + rb"_[0-9]+>")
        final = own.sub(swap, mutation.body)
        self.surrogates = {claimed[item]: item.original for item in wanted.values()}
        self.runtime.metrics.inc("cordon_surrogate_claims_total", len(claimed))
        if self.subjects is not None:
            check = (self.route.dialect, self.subjects)
            try:
                if offload:
                    hit = await self.runtime.offload(self.guarded, check_body, final, *check)
                else:
                    hit = self.guarded(check_body, final, *check)
            except Refusal as refusal:
                return self.refuse(refusal)
            if hit is not None:
                self.egress = "refused"
                return self.refuse(
                    Refusal(
                        422,
                        "egress",
                        f"a declared identifier ({hit.label}) would still have left in the request body",
                        kind=hit.label,
                    )
                )
        return envoy.request_body(final)

    def surrogate_clash(self, body: bytes) -> Callable[[str], bool]:
        """Which candidates this request must not use: one that is already text of the request
        (restore would take the caller's own text for the value), equals one of its values, or
        spells a declared identifier (the egress check would refuse the body)."""
        text = body.decode("utf-8", "replace").casefold()
        originals = {original.casefold() for original in self.pmap.originals.values()}
        subjects = self.subjects

        def clash(candidate: str) -> bool:
            folded = candidate.casefold()
            if folded in originals:
                return True
            if folded in text:
                # Word-bounded, as restore would read it (`x7` inside `0x7f` is no clash).
                pattern = SurrogateRestorer({candidate: ""}, self.pmap.nonce).pattern
                if pattern is not None and pattern.search(text) is not None:
                    return True
            return subjects is not None and subjects.first_survivor(candidate) is not None

        return clash

    async def restore_with_vault(
        self, request: pb.ProcessingRequest, restorer: PseudonymRestorer, offload: bool
    ) -> pb.ProcessingResponse | None:
        """A reply chunk restored with consistent pseudonyms: when it names placeholders this
        request's map lacks, they are looked up in the vault and the chunk is restored again from
        the state before it; the first run's answer, which left them as they were, is dropped.
        (So the response-body phase may run twice for one chunk: it keeps no other state.)"""
        before = self.sse.checkpoint() if self.sse is not None else None
        response = await self.run(request, offload)
        wanted = restorer.take_unresolved()
        if restorer.skipped:
            self.runtime.metrics.inc("cordon_vault_unrestored_total", restorer.skipped, reason="limit")
            restorer.skipped = 0
        if not wanted:
            return response
        await self.look_up(restorer, wanted)
        if before is not None and self.sse is not None:
            self.sse.rollback(before)
        return await self.run(request, offload)

    async def look_up(self, restorer: PseudonymRestorer, wanted: set[str]) -> None:
        """Ask the vault for placeholders of earlier requests. Unavailable: they stay placeholders,
        counted and logged (never the placeholders or values), and this exchange stops asking."""
        assert self.policy is not None
        metrics = self.runtime.metrics
        vault = self.runtime.vault
        found: dict[str, str] = {}
        if not self.vault_down:
            start = time.perf_counter()
            try:
                if vault is None:
                    raise VaultError("no vault is configured")
                read = await vault.get(self.policy.tenant, wanted)
            except VaultError as exc:
                self.vault_down = True
                metrics.inc("cordon_vault_errors_total", op="read")
                self.vault_log(
                    logging.WARNING, "vault_read_failed", placeholders=len(wanted), reason=str(exc)
                )
            else:
                found = dict(read.found)
                metrics.inc("cordon_vault_lookups_total", len(found), result="hit")
                metrics.inc("cordon_vault_lookups_total", len(wanted) - len(found), result="miss")
                if read.invalid:
                    metrics.inc("cordon_vault_invalid_entries_total", read.invalid)
                    self.vault_log(logging.WARNING, "vault_entries_invalid", entries=read.invalid)
            finally:
                ms = round((time.perf_counter() - start) * 1000, 3)
                self.timings["vault_read_ms"] = self.timings.get("vault_read_ms", 0) + ms
        if self.vault_down:
            metrics.inc("cordon_vault_unrestored_total", len(wanted), reason="unavailable")
        restorer.learn(found, wanted)

    def vault_log(self, level: int, event: str, **fields: object) -> None:
        """A vault event for the log: counts and reasons only, never a placeholder or a value."""
        tenant = self.policy.tenant if self.policy else None
        log.log(level, json.dumps({"event": event, "tenant": tenant, **fields}))

    # --- decisions ----------------------------------------------------------------------------

    def refuse(self, refusal: Refusal) -> pb.ProcessingResponse:
        if self.policy is None:
            self.policy = self.runtime.policies.default  # refused before a tenant was chosen
        self.decision = "refused"
        self.stage = refusal.stage
        self.status = refusal.status
        return envoy.refuse(refusal, self.provider)

    def record_gap(self, what: str, reason: str) -> None:
        """A failure forwarded anyway (failMode: open, or a refusal's receipt): logged and counted."""
        self.gap = what
        self.runtime.metrics.inc("cordon_gaps_total", what=what)
        tenant = self.policy.tenant if self.policy else None
        log.warning(json.dumps({"event": f"{what}_gap", "tenant": tenant, "reason": reason}))

    def receipt_fields(self) -> ReceiptFields:
        assert self.policy is not None and self.decision is not None
        ref = self.header.ref if self.header is not None else None
        return ReceiptFields(
            tenant=self.policy.tenant,
            dialect=self.route.dialect.name if self.route is not None else "none",
            mode=self.policy.mode,
            decision=self.decision,
            stage=self.stage,  # type: ignore[arg-type]
            counts=self.counts,
            ref_digest=ref_digest(self.runtime.receipt_secret, ref) if ref else None,
            egress=self.egress,
            media=self.media,
        )

    async def seal(self, response: pb.ProcessingResponse) -> pb.ProcessingResponse:
        """Append this exchange's receipt; only then is its answer released.

        Redis down or slow: a refusal still goes out (without a receipt header); a request with
        subjects, or under `failMode: closed`, is refused 503 `audit`; under `failMode: open` it is
        forwarded and the gap logged and counted.
        """
        self.sealed = True
        store = self.runtime.receipts
        start = time.perf_counter()
        try:
            if store is None:
                raise ReceiptError("no receipt store is configured")
            receipt = await store.append(self.receipt_fields())
        except ReceiptError as exc:
            self.runtime.metrics.inc("cordon_redis_errors_total")
            return self.audit_failed(response, exc)
        finally:
            self.timings["receipt_ms"] = round((time.perf_counter() - start) * 1000, 3)
        self.runtime.metrics.inc("cordon_receipts_total")
        self.receipt_hash = receipt.hash
        if response.HasField("immediate_response"):
            envoy.add_answer_header(response, RECEIPT_HEADER, receipt.hash)
        return response

    def audit_failed(self, response: pb.ProcessingResponse, error: ReceiptError) -> pb.ProcessingResponse:
        assert self.policy is not None
        reason = str(error)
        if response.HasField("immediate_response"):
            self.record_gap("audit", reason)  # the refusal stands; only its record is missing
            return response
        if self.subjects is not None or self.policy.fail_mode == "closed":
            log.error(json.dumps({"event": "audit_failed", "tenant": self.policy.tenant, "reason": reason}))
            refused = self.refuse(
                Refusal(503, "audit", "the audit record could not be written; the request was not forwarded")
            )
            if error.uncertain and self.runtime.receipts is not None:
                self.settle(self.runtime.receipts, error.uncertain[0])
            return refused
        self.record_gap("audit", reason)
        return response

    def settle(self, store: ReceiptStore, uncertain: tuple[str, str]) -> None:
        """The append got no answer but may have reached the chain, as `forwarded`: once Redis
        answers, a record found there is followed by this refusal's (`exchange` = its hash)."""
        correction = replace(self.receipt_fields(), exchange=uncertain[1])
        metrics, tenant = self.runtime.metrics, correction.tenant

        def done(outcome: str) -> None:
            metrics.inc("cordon_receipt_settlements_total", outcome=outcome)
            level = logging.WARNING if outcome == "unknown" else logging.INFO
            log.log(level, json.dumps({"event": "audit_settled", "tenant": tenant, "outcome": outcome}))

        store.settle_later(correction, uncertain, done)

    def close(self) -> None:
        """The stream ended (the client left, or Envoy stopped calling): log what is known."""
        self.finish_log()

    def finish_log(self) -> None:
        if self.logged or self.decision is None:
            return
        self.logged = True
        record: dict[str, object] = {
            "event": "exchange",
            "tenant": self.policy.tenant if self.policy else None,
            "provider": self.provider,
            "dialect": self.route.dialect.name if self.route else None,
            "mode": self.policy.mode if self.policy else None,
            "decision": self.decision,
            "counts": dict(self.counts),
            "receipt": self.receipt_hash,
            "ms": round((time.perf_counter() - self.started) * 1000, 3),
            **self.timings,
        }
        if self.stage:
            record["stage"] = self.stage
        if self.status:
            record["status"] = self.status
        if self.gap:
            record["gap"] = self.gap
        log.info(json.dumps(record, separators=(",", ":")))
        self.count(float(record["ms"]))  # type: ignore[arg-type]

    def count(self, total_ms: float) -> None:
        metrics = self.runtime.metrics
        dialect = self.route.dialect.name if self.route else "none"
        metrics.inc("cordon_exchanges_total", dialect=dialect, decision=str(self.decision))
        if self.decision == "refused":
            metrics.inc("cordon_refusals_total", stage=str(self.stage))
        for kind, n in self.counts.items():
            metrics.inc("cordon_findings_total", n, kind=kind)
        for name, ms in self.timings.items():
            if name.endswith("_ms"):
                metrics.observe("cordon_phase_seconds", ms / 1000, phase=name.removesuffix("_ms"))
        metrics.observe("cordon_phase_seconds", total_ms / 1000, phase="exchange")
