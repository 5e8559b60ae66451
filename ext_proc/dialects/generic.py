"""Any other JSON body (completions, embeddings, endpoints added later): no system text.

Everything in it is read as text by the walk, except what looks like media: without a schema,
every media-shaped part and binary data: URL counts as media (ext_proc.media.parts.any_media).
"""

from __future__ import annotations

from collections.abc import Iterator

from ext_proc.media.parts import any_media as media

__all__ = ["media", "system_positions"]


def system_positions(doc: object) -> Iterator[tuple[object, object]]:
    return iter(())
