"""What every listener's HTTP connection manager adds to its routes: the access log and the local
replies Envoy itself makes (a body over MAX_BODY_BYTES, a reply too large to read whole, `/readyz`
when no worker answers it).

The access log is one JSON line per request, without a header value or the query string: the
method, the route, the status and why (`details`, `flags`), the durations, the bytes and the
upstream cluster. The path is written only for a request that went upstream, where it is the
path as the processor released it (values in it redacted); a refused request could carry a value
in its path, so only its route is written.

Local replies are keyed on the route Envoy chose (`xds.route_name`, a CEL filter), so a body
refused by Envoy's buffer limit reads as the provider's own error, like every refusal of the
processor, and the processor's own answers (their details start with `cordon_`) are left alone.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable

import yaml

from ext_proc.dialects.providers import OPENAI, PROVIDERS
from ext_proc.dialects.routes import ROUTE_PROVIDERS
from ext_proc.errors import Refusal
from ext_proc.runtime.config import Settings

READY_ROUTE = "readyz"
CEL_FILTER = "envoy.access_loggers.extension_filters.cel"
CEL_FILTER_TYPE = "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter"

# Envoy's own 413, never one of the processor's answers (their details are cordon_…).
_ENVOY_413 = 'response.code == 413 && !response.code_details.startsWith("cordon_")'
# A reply the processor asked to read whole (to restore it or gate it) that is over Envoy's buffer
# limit: Envoy gives up on it with a bare 500.
_REPLY_TOO_LARGE = 'response.code_details == "response_payload_too_large"'

# The access log's fields: Envoy's format operators, typed (numbers stay numbers).
_EXT_PROC = "%%FILTER_STATE(envoy.filters.http.ext_proc:FIELD:%s)%%"
ACCESS_FIELDS: dict[str, str] = {
    "ts": "%START_TIME(%Y-%m-%dT%H:%M:%S.%3fZ)%",
    "level": "info",
    "event": "access",
    "method": "%REQ(:METHOD)%",
    "path": '%CEL(has(upstream.address) ? request.url_path : "-")%',
    "route": "%ROUTE_NAME%",
    "status": "%RESPONSE_CODE%",
    "details": "%RESPONSE_CODE_DETAILS%",
    "flags": "%RESPONSE_FLAGS%",
    "upstream_cluster": "%UPSTREAM_CLUSTER%",
    "duration_ms": "%DURATION%",
    "request_ms": "%REQUEST_DURATION%",
    "upstream_ms": "%RESPONSE_DURATION%",
    "reply_ms": "%RESPONSE_TX_DURATION%",
    # What each call to the processor took as Envoy saw it (its gRPC round trip included), in µs
    # as a string of digits (Envoy writes filter state as text); null where there was no such call.
    "ext_proc_request_headers_us": _EXT_PROC % "request_header_latency_us",
    "ext_proc_request_body_us": _EXT_PROC % "request_body_total_latency_us",
    "ext_proc_reply_headers_us": _EXT_PROC % "response_header_latency_us",
    "ext_proc_reply_body_us": _EXT_PROC % "response_body_total_latency_us",
    "ext_proc_reply_body_calls": _EXT_PROC % "response_body_call_count",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "protocol": "%PROTOCOL%",
}


def too_large_message(limit: int) -> str:
    return (
        f"the request body is larger than the {limit} bytes this deployment accepts "
        "(MAX_BODY_BYTES); it was not forwarded"
    )


def too_large_body(provider: str, limit: int) -> str:
    """The provider's error body for a request over `limit` bytes, as the processor writes one."""
    refusal = Refusal(413, "request", too_large_message(limit), code="request_too_large")
    return PROVIDERS[provider].error_body(refusal).decode("utf-8")


def reply_too_large_body(provider: str, limit: int) -> str:
    """The provider's error body for a reply over `limit` bytes that had to be read whole."""
    message = (
        f"the model's reply is larger than the {limit} bytes this deployment reads whole "
        "(MAX_BODY_BYTES) to restore or check it; it was not delivered (a streamed reply is read "
        "in pieces and has no such limit)"
    )
    refusal = Refusal(502, "output", message, code="reply_too_large")
    return PROVIDERS[provider].error_body(refusal).decode("utf-8")


def _cel(expression: str) -> dict[str, object]:
    return {
        "extension_filter": {
            "name": CEL_FILTER,
            "typed_config": {"@type": CEL_FILTER_TYPE, "expression": expression},
        }
    }


def _json_reply(body: str) -> dict[str, object]:
    # `%` starts a format operator in a text format: a literal one is doubled.
    return {
        "text_format_source": {"inline_string": body.replace("%", "%%")},
        "content_type": "application/json",
    }


def local_reply_config(settings: Settings) -> dict[str, object]:
    """The mappers, first match wins: /readyz unanswered → 503; Envoy's 413 and its 500 for a reply
    too large to read whole (→ 502) in the provider's shape (each provider's routes by name, then
    OpenAI's, the default provider's, for the rest)."""
    limit = settings.max_body_bytes
    mappers: list[dict[str, object]] = [
        {
            "filter": _cel(f'xds.route_name == "{READY_ROUTE}" && response.code != 200'),
            "status_code": 503,
            "body_format_override": _json_reply('{"status":"not ready"}'),
        }
    ]
    local: list[tuple[str, str, int | None, Callable[[str, int], str]]] = [
        (_ENVOY_413, "request", None, too_large_body),
        (_REPLY_TOO_LARGE, "output", 502, reply_too_large_body),
    ]
    for condition, stage, status, body in local:
        for provider in PROVIDERS:
            if provider == OPENAI.name:
                continue
            names = sorted(name for name, (p, _) in ROUTE_PROVIDERS.items() if p.name == provider)
            on_route = f"{condition} && xds.route_name in {json.dumps(names)}"
            mappers.append(_provider_reply(on_route, stage, status, body(provider, limit)))
        mappers.append(_provider_reply(condition, stage, status, body(OPENAI.name, limit)))
    return {"mappers": mappers}


def _provider_reply(condition: str, stage: str, status: int | None, body: str) -> dict[str, object]:
    mapper: dict[str, object] = {
        "filter": _cel(condition),
        "headers_to_add": [_stage_header(stage)],
        "body_format_override": _json_reply(body),
    }
    if status is not None:
        mapper["status_code"] = status
    return mapper


def _stage_header(stage: str) -> dict[str, object]:
    header = {"key": "x-cordon-stage", "value": stage}
    return {"header": header, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


def access_log(settings: Settings) -> list[dict[str, object]]:
    return [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": str(settings.access_log_path),
                "log_format": {
                    "json_format": ACCESS_FIELDS,
                },
            },
        }
    ]


def render(settings: Settings, indent: int) -> str:
    """The HCM's `access_log` and `local_reply_config`, as YAML at `indent`."""
    fragment = {"access_log": access_log(settings), "local_reply_config": local_reply_config(settings)}
    text = yaml.safe_dump(fragment, sort_keys=False, default_flow_style=False, width=1000)
    return textwrap.indent(text.rstrip("\n"), " " * indent)
