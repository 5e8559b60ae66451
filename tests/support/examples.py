"""How many hypothesis examples a property runs: its count for `make test` (what CI runs),
scaled by `CORDON_EXAMPLES` (a fraction; `make test-fast`, the inner loop, runs a quarter). The
`slow`-marked variants (`make test-slow`) keep their large counts whatever the scale."""

from __future__ import annotations

import os

SCALE = float(os.environ.get("CORDON_EXAMPLES", "1"))
FLOOR = 10  # fewer examples than this say little


def example_count(count: int) -> int:
    """`count` for this run: as written at scale 1, never fewer than FLOOR (or `count`)."""
    if SCALE >= 1:
        return count
    return max(min(count, FLOOR), round(count * SCALE))
