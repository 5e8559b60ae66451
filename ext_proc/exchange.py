"""One ext_proc stream = one HTTP exchange: its state across the phases, and the request pipeline.

Envoy sends, in order and only as far as the exchange needs: request headers, the buffered
request body, response headers, the response body (buffered for JSON, streamed for SSE). Each
phase is one method here; each returns the `ProcessingResponse` for its message. Anything that
goes wrong before the request is released becomes a `Refusal`, answered by `envoy.refuse`.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc import envoy
from ext_proc.bootstrap import ADMIN_ROUTE
from ext_proc.catalog import Catalog
from ext_proc.dialects import RouteInfo, classify
from ext_proc.egress import check_body
from ext_proc.errors import DetectionError, Refusal, describe
from ext_proc.placeholders import PlaceholderMap
from ext_proc.policy import Policy, PolicySet
from ext_proc.redact import Replacement, resolve_overlaps, reversible, rewrite, strip
from ext_proc.restore import Restorer, SseRestorer, restore_json_body
from ext_proc.subject_header import SubjectHeader, SubjectHeaderError, parse_subject_header
from ext_proc.subjects import CompiledSubjects, compile_subjects
from ext_proc.walk import LeafWalker, dump_json, parse_json

log = logging.getLogger("cordon.exchange")

ROUTE_ATTRIBUTE = "xds.route_name"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
SUBJECT_HEADER = "x-cordon-subject"
# Never forwarded: the filter's own headers, and accept-encoding so replies arrive readable.
REMOVED_REQUEST_HEADERS = ("x-cordon-subject", "x-tenant", "x-redact-mode", "accept-encoding")
TEXT_TYPES = ("application/json", "text/", "application/problem+json")
MEDIA_STRICTNESS = {"allow": 0, "mask": 1, "block": 2}
# Headers a subject request's identifiers are not looked for in: credentials (random strings that
# could spell a short id by chance), the header itself (removed) and framing.
UNREAD_HEADERS = frozenset({"authorization", "x-api-key", SUBJECT_HEADER, "content-length", "content-type"})


@dataclass(slots=True)
class Runtime:
    """What every exchange of one worker shares: read-only after start (reload swaps `policies`)."""

    policies: PolicySet
    admin_token: str | None = None


@dataclass(slots=True)
class Headers:
    values: dict[str, str]
    end_of_stream: bool
    route_name: str

    @classmethod
    def from_message(cls, message: pb.HttpHeaders, request: pb.ProcessingRequest | None = None) -> Headers:
        values: dict[str, str] = {}
        for header in message.headers.headers:
            value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
            name = header.key.lower()
            values[name] = f"{values[name]},{value}" if name in values else value
        route = ""
        # Envoy 1.40 sends attributes on the ProcessingRequest itself, keyed by the filter's name.
        for source in (request.attributes if request is not None else {}, message.attributes):
            attributes = source.get(EXT_PROC_FILTER)
            if attributes is not None and ROUTE_ATTRIBUTE in attributes.fields:
                route = attributes.fields[ROUTE_ATTRIBUTE].string_value
                break
        return cls(values, message.end_of_stream, route)

    def get(self, name: str) -> str | None:
        return self.values.get(name)


def bearer_token(headers: Headers) -> str | None:
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


def api_key(headers: Headers) -> str | None:
    return bearer_token(headers) or headers.get("x-api-key") or None


@dataclass(slots=True)
class Exchange:
    runtime: Runtime
    route: RouteInfo | None = None
    policy: Policy | None = None
    provider: str = "openai"
    pmap: PlaceholderMap = field(default_factory=PlaceholderMap)
    counts: Counter[str] = field(default_factory=Counter)
    decision: str = "forwarded"
    stage: str | None = None
    gap: str | None = None  # a detection failure forwarded under failMode: open
    header: SubjectHeader | None = None
    subjects: CompiledSubjects | None = None
    response_kind: str = "none"  # none | buffered | sse
    sse: SseRestorer | None = None
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    logged: bool = False

    # --- phases -------------------------------------------------------------------------------

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

    def on_request_headers(self, headers: Headers) -> pb.ProcessingResponse:
        path = headers.get(":path") or "/"
        if headers.route_name == ADMIN_ROUTE:
            self.decision = "admin"
            return self.admin(headers, path)
        self.route = classify(headers.route_name, path)
        if self.route is None:
            raise Refusal(404, "routing", "no upstream is configured for this path", code="not_found")
        self.provider = self.route.provider
        self.policy = self.runtime.policies.for_api_key(api_key(headers))
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
        if encoding != "identity":
            raise Refusal(415, "request", "compressed request bodies cannot be read; send them uncompressed")
        if self.policy.mode == "off" or headers.end_of_stream:
            # Nothing to redact, so nothing to restore: Envoy need not call again for this exchange.
            # (A subject request never gets here with mode off; without a body, its path and
            # headers were checked above.)
            mode = envoy.body_modes(envoy.NONE, envoy.NONE, skip_response_headers=True)
            self.finish_log()
            return envoy.request_headers(remove=REMOVED_REQUEST_HEADERS, mode=mode)
        return envoy.request_headers(remove=REMOVED_REQUEST_HEADERS)

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
        # The path leaves too (first_survivor also reads it percent-decoded: `mq%40example.com`).
        survivor = self.subjects.first_survivor(path)
        if survivor is not None:
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
                raise Refusal(
                    422, "egress", f"a declared identifier ({survivor}) is in a request header", kind=survivor
                )

    def on_request_body(self, body: pb.HttpBody) -> pb.ProcessingResponse:
        assert self.route is not None and self.policy is not None
        start = time.perf_counter()
        raw = bytes(body.body)
        if not raw.strip():
            return envoy.request_body()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Refusal(
                400, "request", "the request body is not valid UTF-8", code="invalid_json"
            ) from None
        doc = parse_json(text)
        try:
            if self.subjects is not None:
                return self.subject_body(raw, doc)
            return self.catalog_body(doc)
        finally:
            self.timings["redact_ms"] = round((time.perf_counter() - start) * 1000, 3)

    def catalog_body(self, doc: Any) -> pb.ProcessingResponse:
        """A request without declared subjects: redact; a detection failure follows failMode."""
        assert self.policy is not None
        try:
            new_doc, changed = self.redact_document(doc)
        except DetectionError as exc:
            # failMode applies to requests without declared subjects (all of them, in this version).
            if self.policy.fail_mode == "closed":
                raise Refusal(503, "detection", f"detection failed ({exc}); failMode is closed") from None
            self.gap = str(exc)
            log.warning(
                json.dumps({"event": "detection_gap", "tenant": self.policy.tenant, "reason": str(exc)})
            )
            return envoy.request_body()
        if not changed:
            return envoy.request_body()
        return envoy.request_body(dump_json(new_doc))

    def subject_body(self, raw: bytes, doc: Any) -> pb.ProcessingResponse:
        """A request that declares subjects: redact, apply the media policy, then the egress check.

        Any failure refuses the request whatever failMode says (SPEC §11).
        """
        assert self.route is not None and self.policy is not None and self.subjects is not None
        try:
            self.apply_media_policy(doc)
            new_doc, changed = self.redact_document(doc)
            body = dump_json(new_doc) if changed else raw
            check_start = time.perf_counter()
            hit = check_body(body, self.route.dialect, self.subjects, nonce=self.pmap.nonce)
            self.timings["egress_ms"] = round((time.perf_counter() - check_start) * 1000, 3)
        except Refusal:
            raise
        except DetectionError as exc:
            raise Refusal(422, "detection", f"detection failed ({exc}); the request was refused") from None
        except Exception as exc:
            log.error(json.dumps({"event": "subject_pipeline_failed", **describe(exc)}))
            raise Refusal(422, "detection", "detection failed; the request was refused") from None
        if hit is not None:
            raise Refusal(
                422,
                "egress",
                f"a declared identifier ({hit.label}) would still have left in the request body",
                kind=hit.label,
            )
        return envoy.request_body(body if changed else None)

    def apply_media_policy(self, doc: Any) -> None:
        assert self.route is not None and self.policy is not None and self.header is not None
        parts = list(
            {(id(part.container), part.key): part for part in self.route.dialect.media(doc)}.values()
        )
        if not parts:
            return
        choices = [self.policy.subject_media, self.header.media or "allow"]
        effective = max(choices, key=MEDIA_STRICTNESS.__getitem__)
        if effective == "block":
            raise Refusal(
                422, "media", f"{len(parts)} media part(s) in a request that declares subjects (media: block)"
            )
        if effective == "mask":
            raise Refusal(
                422, "media", "media masking by OCR is not available in this version; the request was refused"
            )

    def redact_document(self, doc: Any) -> tuple[Any, bool]:
        assert self.route is not None and self.policy is not None
        policy = self.policy
        catalog = Catalog.for_sets(policy.sets, skip_documentation_ips=policy.skip_documentation_ips)
        replacement: Replacement = reversible(self.pmap) if policy.mode == "reversible" else strip
        counts = self.counts
        detect = catalog.detect
        subject_detect = self.subjects.detect if self.subjects is not None else None

        def visit(text: str) -> str:
            findings = detect(text)
            if subject_detect is not None:
                findings = [*findings, *subject_detect(text)]
            if not findings:
                return text
            return rewrite(text, resolve_overlaps(findings), replacement, counts)

        dialect = self.route.dialect
        media = {(id(part.container), part.key) for part in dialect.media(doc) if part.is_bytes}
        system: set[tuple[int, object]] = set()
        if not policy.redact_system:
            system = {(id(container), key) for container, key in dialect.system_positions(doc)}
        walker = LeafWalker(visit, media_positions=media, system_positions=system)
        new_doc = walker.walk(doc)
        return new_doc, walker.stats.changed

    def on_response_headers(self, headers: Headers) -> pb.ProcessingResponse:
        content_type = (headers.get("content-type") or "").lower()
        encoding = (headers.get("content-encoding") or "identity").lower()
        needs_restore = (
            self.route is not None
            and self.policy is not None
            and self.policy.mode == "reversible"
            and bool(self.pmap)
            and encoding == "identity"
        )
        if needs_restore and content_type.startswith("text/event-stream"):
            self.response_kind = "sse"
            assert self.route is not None
            self.sse = SseRestorer(Restorer(self.pmap), self.route.dialect.name)
            mode = envoy.body_modes(envoy.NONE, envoy.STREAMED)
            return envoy.response_headers(remove=("content-length",), mode=mode)
        if needs_restore and content_type.startswith(TEXT_TYPES):
            self.response_kind = "buffered"
            return envoy.response_headers(mode=envoy.body_modes(envoy.NONE, envoy.BUFFERED))
        self.finish_log()
        return envoy.response_headers(mode=envoy.body_modes(envoy.NONE, envoy.NONE))

    def on_response_body(self, body: pb.HttpBody) -> pb.ProcessingResponse:
        assert self.route is not None
        chunk = bytes(body.body)
        if self.response_kind == "sse" and self.sse is not None:
            out = self.sse.feed(chunk)
            if body.end_of_stream:
                out += self.sse.finish()
                self.finish_log()
            if out == chunk:
                return envoy.response_body()
            return envoy.response_body(out, set_length=False)
        if self.response_kind == "buffered":
            restored = restore_json_body(chunk, self.route.dialect.name, Restorer(self.pmap))
            if body.end_of_stream:
                self.finish_log()
            if restored == chunk:
                return envoy.response_body()
            return envoy.response_body(restored)
        return envoy.response_body()

    # --- answers ------------------------------------------------------------------------------

    def refuse(self, refusal: Refusal) -> pb.ProcessingResponse:
        self.decision = "refused"
        self.stage = refusal.stage
        self.finish_log(status=refusal.status)
        return envoy.refuse(refusal, self.provider)

    def admin(self, headers: Headers, path: str) -> pb.ProcessingResponse:
        token = self.runtime.admin_token
        if not token:
            return envoy.refuse(
                Refusal(404, "admin", "the admin API is closed (ADMIN_TOKEN is unset)"), "openai"
            )
        given = bearer_token(headers) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            return envoy.refuse(Refusal(401, "admin", "a valid admin bearer token is required"), "openai")
        return envoy.refuse(Refusal(404, "admin", "no such admin endpoint"), "openai")

    def finish_log(self, status: int | None = None) -> None:
        if self.logged:
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
            "ms": round((time.perf_counter() - self.started) * 1000, 3),
            **self.timings,
        }
        if self.stage:
            record["stage"] = self.stage
        if status:
            record["status"] = status
        if self.gap:
            record["gap"] = self.gap
        log.info(json.dumps(record, separators=(",", ":")))
