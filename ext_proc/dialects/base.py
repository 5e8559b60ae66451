"""The `Dialect` record: everything the processor knows about one API shape, in one value.

Each dialect module (chat, responses, messages, generic) builds its own; the registry
(ext_proc.dialects.DIALECTS) lists them and `classify` picks one per request. The dialect then
travels with the exchange as this object: the walk asks it for system positions and media, the
reply for its stream handler and its stream error event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ext_proc.dialects.providers import Provider
from ext_proc.errors import Refusal
from ext_proc.media.parts import MediaPart
from ext_proc.restore.sse import ChannelStream

# Where a subtree sits: the container (dict or list) and its key or index.
Position = tuple[Any, object]


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    provider: Provider | None  # whose API this is (None: any endpoint of any provider)
    paths: tuple[str, ...]  # normalised (lower case, no trailing slash, route prefix removed)
    # The parts of a body that carry media, only at the positions the API's schema defines.
    media: Callable[[object], Iterator[MediaPart]]
    # The subtrees that are system text (what `redactSystem: false` leaves as it is).
    system_positions: Callable[[object], Iterator[Position]]
    # The SSE handler of a streamed reply: which texts are deltas of which channel.
    stream: type[ChannelStream]
    # How the API ends a stream that failed: the refusal as its stream error event.
    error_event: Callable[[Refusal], bytes]
