"""API shapes: which provider and dialect a request took, from the route Envoy chose and the path.

Each dialect module (chat, responses, messages, generic) owns everything about its API: its paths,
system positions, media positions, stream handler and stream error event (ext_proc.dialects.base);
each provider its error body (ext_proc.dialects.providers); the route table says which provider a
route leads to (ext_proc.dialects.routes). A dialect only ever adds knowledge: the walk reads every
string of every body whatever the dialect, so a request classified as `generic` is still redacted
in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from ext_proc.dialects.base import Dialect
from ext_proc.dialects.chat import CHAT
from ext_proc.dialects.generic import GENERIC
from ext_proc.dialects.messages import MESSAGE_BATCHES, MESSAGES
from ext_proc.dialects.providers import Provider
from ext_proc.dialects.responses import RESPONSES
from ext_proc.dialects.routes import ROUTE_PROVIDERS

__all__ = ["DIALECTS", "PATHS", "Dialect", "RouteInfo", "classify"]

DIALECTS: dict[str, Dialect] = {
    "chat": CHAT,
    "responses": RESPONSES,
    "messages": MESSAGES,
    "message_batches": MESSAGE_BATCHES,
    "generic": GENERIC,
}

# (provider name, normalised path) → dialect: each dialect's own paths; any other path is generic.
PATHS: dict[tuple[str, str], Dialect] = {
    (dialect.provider.name, path): dialect
    for dialect in DIALECTS.values()
    if dialect.provider is not None
    for path in dialect.paths
}


@dataclass(frozen=True, slots=True)
class RouteInfo:
    provider: Provider
    dialect: Dialect
    path: str  # as the upstream will see it, normalised for classification


def classify(route_name: str, path: str) -> RouteInfo | None:
    """The provider and dialect of a request, or None when Envoy routes it nowhere upstream."""
    entry = ROUTE_PROVIDERS.get(route_name)
    if entry is None:
        return None
    provider, prefix = entry
    plain = path.split("?", 1)[0].lower()
    if prefix and plain.startswith(prefix + "/"):
        plain = plain[len(prefix) :]
    plain = plain.rstrip("/") or "/"
    return RouteInfo(provider, PATHS.get((provider.name, plain), GENERIC), plain)
