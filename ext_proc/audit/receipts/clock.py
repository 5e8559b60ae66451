"""Redis's clock per chain, for the append script's fence.

Where this sits: inside an append. The append script carries a fence, the caller's deadline in
Redis's clock less FENCE_MARGIN_MS, and does nothing once it has passed: a caller told "timed out"
does not get its record written later by a slow Redis. That needs the offset between Redis's clock
and ours, measured per chain because on a cluster each chain's script runs on its own node, with
its own clock.
"""

from __future__ import annotations

import asyncio
import time

from ext_proc.audit.receipts.chain import ChainRedis, ReceiptError

FENCE_MARGIN_MS = 20  # the script gives up this long before its caller does
CLOCK_CHECK_SECONDS = 60.0  # how often Redis's clock is compared with ours
CLOCK_RETRY_SECONDS = 1.0  # a clock measured again in the background: between two tries ...
CLOCK_RETRIES = 60  # ... for about a minute


class RedisClocks:
    """The offset of each chain's Redis clock from ours, measured once, then again in the background."""

    def __init__(self, chains: ChainRedis) -> None:
        self._chains = chains
        # Per tenant: (Redis's TIME minus ours in ms, when measured on this loop's clock).
        self._clocks: dict[str, tuple[float, float]] = {}
        self._checks: dict[str, asyncio.Task[None]] = {}  # background re-measurements

    async def fence(self, tenant: str, deadline: float) -> int:
        """`deadline` (this loop's clock) as TIME in ms of the node holding `tenant`'s chain, less
        FENCE_MARGIN_MS."""
        loop = asyncio.get_running_loop()
        clock = self._clocks.get(tenant)
        if clock is None:
            clock = await self._measure(tenant)
        elif loop.time() - clock[1] > CLOCK_CHECK_SECONDS:
            self.check_later(tenant)  # the last measurement serves meanwhile
        remaining_ms = (deadline - loop.time()) * 1000
        return int(time.time() * 1000 + clock[0] + remaining_ms - FENCE_MARGIN_MS)

    async def _measure(self, tenant: str) -> tuple[float, float]:
        before = time.time()
        seconds, micros = await self._chains.redis_time(tenant)
        after = time.time()
        redis_ms = seconds * 1000 + micros / 1000
        clock = (redis_ms - (before + after) * 500, asyncio.get_running_loop().time())  # midpoint
        self._clocks[tenant] = clock
        return clock

    def check_later(self, tenant: str) -> None:
        """Measure `tenant`'s Redis clock again in the background, never on a caller's time: after
        a failure (a failover may have brought another node's clock), or when it is due. Spending
        a round trip of each append's budget on it made a slow Redis refuse every append and never
        recover; the last measurement serves meanwhile."""
        if tenant in self._clocks and tenant not in self._checks:
            task = asyncio.get_running_loop().create_task(self._remeasure(tenant))
            self._checks[tenant] = task
            task.add_done_callback(lambda _: self._checks.pop(tenant, None))

    async def _remeasure(self, tenant: str) -> None:
        for _ in range(CLOCK_RETRIES):
            try:
                await self._chains.call(self._measure(tenant))
                return
            except ReceiptError:
                await asyncio.sleep(CLOCK_RETRY_SECONDS)

    def cancel(self) -> None:
        """Stop the background measurements (the store is closing)."""
        for task in list(self._checks.values()):
            task.cancel()
