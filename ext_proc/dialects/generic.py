"""Any other JSON body (completions, embeddings, endpoints added later): no system text, no media.

Everything in it is read as text by the walk.
"""

from __future__ import annotations

from collections.abc import Iterator

from ext_proc.media import no_media as media

__all__ = ["media", "system_positions"]


def system_positions(doc: object) -> Iterator[tuple[object, object]]:
    return iter(())
