"""Settling an append whose answer was lost: was the record written after all?

Where this sits: after a refusal. An exchange whose receipt append got no answer (a timeout or a
lost connection after the script was sent) is refused, but the record it sent, which says
`forwarded`, may be in the chain. The exchange hands that record's link and the refusal's own
record to `Settler.settle_later`, which finds out in the background and writes what the chain then
needs, so every exchange ends with one true record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from ext_proc.audit.receipts.chain import READ_BATCH, ChainRedis, ReceiptError, text
from ext_proc.audit.receipts.record import Receipt, ReceiptFields

SETTLE_INTERVAL_SECONDS = 1.0  # settle_later: between two looks at the chains
SETTLE_ATTEMPTS = 60  # ... for about a minute
SETTLE_SCAN = 10_000  # ... reading back at most this many records from a chain's tail
MAX_SETTLING = 1024  # exchanges waiting to be settled at once; more are given up (`unknown`)


@dataclass(slots=True, eq=False)
class _Settling:
    """An exchange refused after an unanswered append, waiting to be settled."""

    correction: ReceiptFields  # the refusal's record, `exchange` = the uncertain record's hash
    link: tuple[str, str]  # (prev, hash) of the uncertain record
    done: Callable[[str], None] | None
    attempts: int
    outcome: str | None = None
    written: tuple[str, str] | None = None  # (prev, hash) of our own append, itself unanswered
    written_outcome: str = "corrected"

    def finish(self, outcome: str) -> None:
        if self.done is not None:
            self.done(outcome)


class Settler:
    """The exchanges waiting to be settled, and the one task that settles them."""

    def __init__(self, chains: ChainRedis, append: Callable[[ReceiptFields], Awaitable[Receipt]]) -> None:
        self._chains = chains
        self._append = append  # the store's own append: queued and batched like any other
        self._settling: list[_Settling] = []
        self._settler: asyncio.Task[None] | None = None

    def settle_later(
        self,
        correction: ReceiptFields,
        uncertain: tuple[str, str],
        done: Callable[[str], None] | None = None,
    ) -> None:
        """An exchange refused because its append got no answer: if that record reached the chain
        after all, it says `forwarded` for a request that was not. In the background (about a
        minute, while Redis does not answer), find out. If it is there, append `correction` (the
        refusal, with `exchange` = that record's hash) after it; if it never got in, append the
        refusal without `exchange`, so the exchange has its one record. `uncertain` is (prev,
        hash). `done` gets the outcome: `corrected`, `recorded`, or `unknown` (no answer in
        time, not found among the last SETTLE_SCAN records, MAX_SETTLING already waiting, or the
        store closing). One task settles everything waiting, one tail read per chain per round."""
        item = _Settling(correction, uncertain, done, SETTLE_ATTEMPTS)
        if len(self._settling) >= MAX_SETTLING:
            item.finish("unknown")
            return
        self._settling.append(item)
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._settle_all())

    async def _settle_all(self) -> None:
        try:
            while self._settling:
                await asyncio.sleep(SETTLE_INTERVAL_SECONDS)
                for tenant in sorted({item.correction.tenant for item in self._settling}):
                    waiting = [item for item in self._settling if item.correction.tenant == tenant]
                    with contextlib.suppress(ReceiptError):  # Redis not answering: next round
                        await self._settle_tenant(tenant, waiting)
                    for item in waiting:
                        item.attempts -= 1
                        if item.outcome is None and item.attempts <= 0:
                            item.outcome = "unknown"
                        if item.outcome is not None:
                            self._settling.remove(item)
                            item.finish(item.outcome)
        finally:
            for item in self._settling:
                item.finish("unknown")
            self._settling.clear()

    async def _settle_tenant(self, tenant: str, waiting: list[_Settling]) -> None:
        """One round for one chain: read its tail once, then append what each exchange needs."""
        wanted = {h for item in waiting for h in (*item.link, *(item.written or ()))}
        seen, whole = await self._tail_hashes(tenant, wanted)
        for item in waiting:
            if item.written is not None and item.written[1] in seen:
                item.outcome = item.written_outcome  # an earlier round's append got in after all
                continue
            if item.link[1] in seen:
                record, outcome = item.correction, "corrected"
            elif item.link[0] in seen or whole:
                # Not after its prev, or not in the whole chain: it never got in. The exchange's
                # own record, the refusal, is all there is to write.
                record, outcome = replace(item.correction, exchange=None), "recorded"
            else:
                item.outcome = "unknown"  # further back than SETTLE_SCAN records
                continue
            try:
                await self._append(record)
            except ReceiptError as exc:
                if exc.uncertain:  # it may be in: the next round looks before writing again
                    item.written, item.written_outcome = exc.uncertain[0], outcome
                continue
            item.outcome = outcome

    async def _tail_hashes(self, tenant: str, wanted: set[str]) -> tuple[set[str], bool]:
        """The hashes of `wanted` found among the chain's last SETTLE_SCAN records, and whether
        the read reached the chain's first record."""
        end, read, found = "+", 0, set()
        targets = {h.encode("ascii") for h in wanted}
        while read < SETTLE_SCAN:
            batch = await self._chains.read_back(tenant, end)
            for _, entry in batch:
                read += 1
                digest = entry.get(b"h")
                if digest in targets:
                    found.add(text(digest))
            if len(batch) < READ_BATCH:
                return found, True
            end = f"({text(batch[-1][0])}"
        return found, False

    def cancel(self) -> None:
        """Stop settling (the store is closing); `aclose` then waits for the task to end."""
        if self._settler is not None:
            self._settler.cancel()

    async def aclose(self) -> None:
        """Wait for the cancelled task; every exchange still waiting stays unknown, and is told so."""
        if self._settler is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._settler
        for item in self._settling:
            item.finish("unknown")
        self._settling.clear()
