"""The only builders of ext_proc `ProcessingResponse` messages: continue, replace a body, refuse.

Everything that talks back to Envoy goes through here, so the wire details (which oneof, raw_value
for headers, content-length after a body rewrite, mode overrides setting both body modes) live in
one file. A `Refusal` becomes an `ImmediateResponse` in `refuse()` and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import duration_pb2

from ext_proc.errors import Refusal

ProcessingMode = processing_mode_pb2.ProcessingMode
NONE = ProcessingMode.BodySendMode.NONE
BUFFERED = ProcessingMode.BodySendMode.BUFFERED
STREAMED = ProcessingMode.BodySendMode.STREAMED
SKIP = ProcessingMode.HeaderSendMode.SKIP
SEND = ProcessingMode.HeaderSendMode.SEND

Headers = Iterable[tuple[str, str]]

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def _header(name: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode("utf-8")),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _mutation(set_headers: Headers = (), remove: Iterable[str] = ()) -> pb.HeaderMutation:
    mutation = pb.HeaderMutation(remove_headers=list(remove))
    mutation.set_headers.extend(_header(name, value) for name, value in set_headers)
    return mutation


def _common(
    set_headers: Headers = (), remove: Iterable[str] = (), body: bytes | None = None
) -> pb.CommonResponse:
    common = pb.CommonResponse()
    set_list = list(set_headers)
    remove_list = list(remove)
    if set_list or remove_list:
        common.header_mutation.CopyFrom(_mutation(set_list, remove_list))
    if body is not None:
        if body:
            common.body_mutation.body = body
        else:
            common.body_mutation.clear_body = True
    return common


def request_headers(
    *, remove: Iterable[str] = (), set_headers: Headers = (), mode: ProcessingMode | None = None
) -> pb.ProcessingResponse:
    response = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=_common(set_headers, remove))
    )
    if mode is not None:
        response.mode_override.CopyFrom(mode)
    return response


def response_headers(
    *, remove: Iterable[str] = (), set_headers: Headers = (), mode: ProcessingMode | None = None
) -> pb.ProcessingResponse:
    response = pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(response=_common(set_headers, remove))
    )
    if mode is not None:
        response.mode_override.CopyFrom(mode)
    return response


def body_modes(request: int, response: int, *, skip_response_headers: bool = False) -> ProcessingMode:
    """A mode override. Envoy applies both body modes of an override (one left out becomes NONE)."""
    return ProcessingMode(
        request_body_mode=request,
        response_body_mode=response,
        response_header_mode=SKIP if skip_response_headers else SEND,
    )


def request_body(body: bytes | None = None) -> pb.ProcessingResponse:
    """Continue the request body, replaced by `body` when given (content-length set to match)."""
    if body is None:
        return pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse()))
    common = _common([("content-length", str(len(body)))], body=body)
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))


def response_body(body: bytes | None = None, *, set_length: bool = True) -> pb.ProcessingResponse:
    """Continue a reply body chunk, replaced by `body` when given.

    Buffered replies get a matching content-length; streamed chunks do not (Envoy sends chunked).
    """
    if body is None:
        return pb.ProcessingResponse(response_body=pb.BodyResponse(response=pb.CommonResponse()))
    headers = [("content-length", str(len(body)))] if set_length else []
    return pb.ProcessingResponse(response_body=pb.BodyResponse(response=_common(headers, body=body)))


def extend_timeout(seconds: float) -> pb.ProcessingResponse:
    whole = int(seconds)
    return pb.ProcessingResponse(
        override_message_timeout=duration_pb2.Duration(seconds=whole, nanos=int((seconds - whole) * 1e9))
    )


def error_body(refusal: Refusal, provider: str) -> bytes:
    """The refusal in the dialect's own error shape; names stage and kind, never a value."""
    detail: dict[str, object] = {"message": refusal.message, "stage": refusal.stage}
    if refusal.kind:
        detail["kind"] = refusal.kind
    if provider == "anthropic":
        error_type = _ANTHROPIC_ERROR_TYPES.get(refusal.status, "api_error")
        payload: dict[str, object] = {"type": "error", "error": {"type": error_type, **detail}}
    else:
        error_type = "invalid_request_error" if refusal.status < 500 else "server_error"
        payload = {"error": {**detail, "type": error_type, "param": None, "code": refusal.code}}
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def error_event(refusal: Refusal, dialect: str) -> bytes:
    """The refusal as the dialect's own stream error event (how each API ends a stream that
    failed): Chat a `data:` error object, Responses an `error` event, Messages an `error` event."""
    if dialect == "messages":
        payload = error_body(refusal, "anthropic")
        return b"event: error\ndata: " + payload + b"\n\n"
    detail = json.loads(error_body(refusal, "openai"))["error"]
    if dialect == "responses":
        event = {"type": "error", "code": refusal.code, "message": refusal.message, "param": None}
        event["error"] = detail  # the error object too: what the SDKs look for in a data payload
        return b"event: error\ndata: " + json.dumps(event, separators=(",", ":")).encode("utf-8") + b"\n\n"
    return b"data: " + json.dumps({"error": detail}, separators=(",", ":")).encode("utf-8") + b"\n\n"


def refuse(refusal: Refusal, provider: str, extra_headers: Headers = ()) -> pb.ProcessingResponse:
    body = error_body(refusal, provider)
    headers = [
        ("content-type", "application/json"),
        ("x-cordon-stage", refusal.stage),
        *extra_headers,
    ]
    immediate = pb.ImmediateResponse(body=body, details=f"cordon_refused_{refusal.stage}")
    immediate.status.code = refusal.status  # type: ignore[assignment]
    immediate.headers.CopyFrom(_mutation(headers))
    return pb.ProcessingResponse(immediate_response=immediate)


def answer(status: int, body: bytes, headers: Headers = ()) -> pb.ProcessingResponse:
    """A local answer that is not a refusal (the admin API)."""
    immediate = pb.ImmediateResponse(body=body, details="cordon_local")
    immediate.status.code = status  # type: ignore[assignment]
    immediate.headers.CopyFrom(_mutation([("content-type", "application/json"), *headers]))
    return pb.ProcessingResponse(immediate_response=immediate)


def add_answer_header(response: pb.ProcessingResponse, name: str, value: str) -> None:
    """Add a header to a local answer already built (the receipt hash, known only after it)."""
    response.immediate_response.headers.set_headers.append(_header(name, value))
