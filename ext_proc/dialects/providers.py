"""The upstream providers and each one's error shape: how a refusal reads to that provider's SDKs.

A refusal's body depends on the provider the route leads to, not on the dialect: a request of
the `generic` dialect on the Anthropic route gets Anthropic's shape. `DEFAULT_PROVIDER` shapes the
refusals given before a route is known, and the admin API's. The service (ext_proc.service.wire)
wraps the body into Envoy's immediate answer; a stream's error event is the dialect's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from ext_proc.errors import Refusal


@dataclass(frozen=True, slots=True)
class Provider:
    name: str  # the Envoy cluster and the `upstreams` entry of a policy: openai | anthropic
    error_body: Callable[[Refusal], bytes]  # the refusal in this provider's error JSON


def _detail(refusal: Refusal) -> dict[str, object]:
    """What every error names: the message, the stage and the kind; never a value."""
    detail: dict[str, object] = {"message": refusal.message, "stage": refusal.stage}
    if refusal.kind:
        detail["kind"] = refusal.kind
    return detail


def _dumps(payload: dict[str, object]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def openai_error(refusal: Refusal) -> dict[str, object]:
    """OpenAI's error object: what `{"error": …}` holds, in a body and in a stream's error event."""
    error_type = "invalid_request_error" if refusal.status < 500 else "server_error"
    return {**_detail(refusal), "type": error_type, "param": None, "code": refusal.code}


def _openai_body(refusal: Refusal) -> bytes:
    return _dumps({"error": openai_error(refusal)})


_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def _anthropic_body(refusal: Refusal) -> bytes:
    error_type = _ANTHROPIC_ERROR_TYPES.get(refusal.status, "api_error")
    return _dumps({"type": "error", "error": {"type": error_type, **_detail(refusal)}})


OPENAI = Provider("openai", _openai_body)
ANTHROPIC = Provider("anthropic", _anthropic_body)

PROVIDERS: dict[str, Provider] = {"openai": OPENAI, "anthropic": ANTHROPIC}
DEFAULT_PROVIDER = OPENAI
