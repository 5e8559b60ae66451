"""The only builders of ext_proc `ProcessingResponse` messages: continue, replace a body, refuse.

Everything that talks back to Envoy goes through here, so the wire details (which oneof, raw_value
for headers, content-length after a body rewrite, mode overrides setting both body modes) live in
one file. A `Refusal` becomes an `ImmediateResponse` in `refuse()` and nowhere else; its body is
the provider's error shape (ext_proc.dialects.providers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import duration_pb2

from ext_proc.dialects.providers import Provider
from ext_proc.errors import Refusal

# The generated protobuf module carries no types: to the checker its message class is opaque.
ProcessingMode: TypeAlias = processing_mode_pb2.ProcessingMode
NONE = ProcessingMode.BodySendMode.NONE
BUFFERED = ProcessingMode.BodySendMode.BUFFERED
STREAMED = ProcessingMode.BodySendMode.STREAMED
SKIP = ProcessingMode.HeaderSendMode.SKIP
SEND = ProcessingMode.HeaderSendMode.SEND

Headers = Iterable[tuple[str, str]]


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


def refuse(refusal: Refusal, provider: Provider, extra_headers: Headers = ()) -> pb.ProcessingResponse:
    """The refusal as Envoy's immediate answer, its body in the provider's error shape."""
    body = provider.error_body(refusal)
    headers = [
        ("content-type", "application/json"),
        ("x-cordon-stage", refusal.stage),
        *extra_headers,
    ]
    immediate = pb.ImmediateResponse(body=body, details=f"cordon_refused_{refusal.stage}")
    immediate.status.code = refusal.status
    immediate.headers.CopyFrom(_mutation(headers))
    return pb.ProcessingResponse(immediate_response=immediate)


def answer(status: int, body: bytes, headers: Headers = ()) -> pb.ProcessingResponse:
    """A local answer that is not a refusal (the admin API)."""
    immediate = pb.ImmediateResponse(body=body, details="cordon_local")
    immediate.status.code = status
    immediate.headers.CopyFrom(_mutation([("content-type", "application/json"), *headers]))
    return pb.ProcessingResponse(immediate_response=immediate)


def add_answer_header(response: pb.ProcessingResponse, name: str, value: str) -> None:
    """Add a header to a local answer already built (the receipt hash, known only after it)."""
    response.immediate_response.headers.set_headers.append(_header(name, value))
