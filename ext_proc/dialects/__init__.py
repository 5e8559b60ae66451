"""API shapes: which route and path a request took, and where text, system prompts and media live.

Envoy tells the processor the name of the route it chose (`xds.route_name`); the path then picks
the dialect. A dialect only ever adds knowledge (which subtrees are system prompts, where media
payloads sit): the walk itself reads every string of every body whatever the dialect, so a
request classified as `generic` is still redacted in full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ext_proc.dialects import anthropic_messages, generic, openai_chat, openai_responses
from ext_proc.media.parts import MediaPart
from ext_proc.runtime.bootstrap import ROUTE_PROVIDERS

Position = tuple[int, object]  # (id(container), key or index)


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    media: Callable[[object], Iterator[MediaPart]]
    system_positions: Callable[[object], Iterator[tuple[Any, object]]]


DIALECTS: dict[str, Dialect] = {
    "chat": Dialect("chat", openai_chat.media, openai_chat.system_positions),
    "responses": Dialect("responses", openai_responses.media, openai_responses.system_positions),
    "messages": Dialect("messages", anthropic_messages.media, anthropic_messages.system_positions),
    "message_batches": Dialect(
        "message_batches", anthropic_messages.batch_media, anthropic_messages.batch_system_positions
    ),
    "generic": Dialect("generic", generic.media, generic.system_positions),
}

# Normalised path (lower case, no trailing slash, provider prefix removed) → dialect.
PATHS: dict[tuple[str, str], str] = {
    ("openai", "/v1/chat/completions"): "chat",
    ("openai", "/v1/responses"): "responses",
    ("openai", "/v1/responses/input_tokens"): "responses",
    ("anthropic", "/v1/messages"): "messages",
    ("anthropic", "/v1/messages/count_tokens"): "messages",
    ("anthropic", "/v1/messages/batches"): "message_batches",
}


@dataclass(frozen=True, slots=True)
class RouteInfo:
    provider: str  # openai | anthropic
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
    return RouteInfo(provider, DIALECTS[PATHS.get((provider, plain), "generic")], plain)
