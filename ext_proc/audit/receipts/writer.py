"""One compare-and-set append of a batch of records onto a tenant's chain, with its retries.

Where this sits: under the receipt store, which queues an exchange's record and hands a batch of
them to `ChainWriter.write`. The batch is chained locally against the head this process believes
in and sent in one script call, which appends it only if that head is still the chain's.

Plain optimistic retries starve under sustained contention (the last winner knows the new head
first and wins again), so the first loser of a race takes a short "turn" that only it may append
in; retries are bounded (count and the caller's deadline) with jitter. An append costs one round
trip when nothing raced it, whatever the chain's length.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import secrets

from ext_proc.audit.receipts.chain import (
    APPENDED,
    FENCED,
    HEAD_MISSING,
    RACE_LOST,
    REPEATED,
    ChainRedis,
    ReceiptError,
    ScriptArg,
    id_key,
    text,
)
from ext_proc.audit.receipts.clock import RedisClocks
from ext_proc.audit.receipts.heads import HeadHints
from ext_proc.audit.receipts.record import GENESIS, Receipt, ReceiptFields, canonical_json, record_hash
from ext_proc.storage.redis_client import REDIS_ERRORS

log = logging.getLogger("cordon.receipts")

# The last records this process appended to each chain, kept to check that they are still there:
# each one's hash commits to the whole chain before it, so a record deleted or changed and the
# chain re-hashed after it (which no link check can see) changes or removes these.
ANCHORS_PER_TENANT = 64


class ChainWriter:
    """Appends batches to the chains, remembering each chain's head as this process last saw it.

    A script whose answer was lost with its connection is sent once more by the client: a second
    run of a call that already appended finds that call's key and appends nothing (REPEATED), so
    nothing is chained twice. What remains: when the second send fails too, the record of a
    request its caller then refused may be in the chain; never a forwarded request without its
    record. Such a failure's `ReceiptError.uncertain` names the records that may be in.
    """

    def __init__(self, chains: ChainRedis, *, max_attempts: int, turn_ms: int) -> None:
        self._chains = chains
        self._max_attempts = max_attempts
        self._turn_ms = str(turn_ms)
        self._writer_id = secrets.token_hex(8)
        self.clocks = RedisClocks(chains)
        self._heads: dict[str, str] = {}  # the last head seen per tenant: a guess, the script decides
        # The newest record known per tenant, by stream id, and its hash: a hint (or an answer)
        # about an older record, arriving late, must not replace a newer guess.
        self._newest: dict[str, tuple[tuple[int, int], str]] = {}
        self.hints = HeadHints(chains, self.heard)
        self._confirmed: dict[str, str] = {}  # the last head Redis itself answered per tenant
        self._in_flight: dict[str, list[tuple[str, str]]] = {}  # links of a script sent, unanswered
        self.vanished: set[str] = set()  # chains this process appended to that were restarted
        self.anchors: dict[str, collections.deque[tuple[str, str]]] = {}  # (stream id, hash) per tenant
        self.races_lost = 0  # compare-and-set conflicts seen, for a metric

    def written_tenants(self) -> set[str]:
        """The tenants this process has appended a record of (or seen a record of) in Redis."""
        return {tenant for tenant, head in self._confirmed.items() if head != GENESIS}

    def heard(self, tenant: str, stream_id: str, head: str) -> None:
        """A record appended to `tenant`'s chain (by any writer): its hash is the next guess."""
        try:
            at = id_key(stream_id)
        except ValueError:
            return
        known = self._newest.get(tenant)
        if known is None or at > known[0]:
            self._newest[tenant] = (at, head)
            self._heads[tenant] = head

    async def write(self, tenant: str, batch: list[ReceiptFields], deadline: float) -> list[Receipt]:
        """Append `batch` in order within `deadline` (this loop's clock); every failure as a
        ReceiptError, naming the records whose script was sent but not answered."""
        self.hints.start()
        try:
            async with asyncio.timeout_at(deadline):
                return await self._append(tenant, batch, deadline)
        except TimeoutError as exc:
            self.clocks.check_later(tenant)  # Sentinel may have failed over to another clock
            raise ReceiptError(str(self._chains.timed_out()), self._unanswered(tenant)) from exc
        except REDIS_ERRORS as exc:
            self.clocks.check_later(tenant)
            raise ReceiptError(f"Redis failed: {type(exc).__name__}", self._unanswered(tenant)) from exc

    def _unanswered(self, tenant: str) -> list[tuple[str, str]]:
        """The links of a script sent but not answered. When Redis answers late, it ran: its last
        record is the likeliest head, and guessing it saves the next append a lost race (on a slow
        Redis, a race lost every time made every append time out)."""
        uncertain = self._in_flight.pop(tenant, [])
        if uncertain:
            self._heads[tenant] = uncertain[-1][1]
        return uncertain

    async def _append(self, tenant: str, batch: list[ReceiptFields], deadline: float) -> list[Receipt]:
        records = [receipt_fields.record() for receipt_fields in batch]
        prev = self._heads.get(tenant, GENESIS)
        for _ in range(self._max_attempts):
            chained: list[tuple[str, str]] = []  # (prev, hash) of each record
            fence = await self.clocks.fence(tenant, deadline)
            args: list[ScriptArg] = [prev, GENESIS, self._writer_id, self._turn_ms, fence]
            link = prev
            for record in records:
                canonical = canonical_json({**record, "prev": link})
                digest = record_hash(link, canonical)
                chained.append((link, digest))
                args += [canonical, digest]
                link = digest
            self._in_flight[tenant] = chained
            # This attempt's own call key: a re-send of it (redis-py's retry) names the same one.
            answer = await self._chains.append(tenant, secrets.token_hex(8), args)
            del self._in_flight[tenant]
            status = answer[0]
            if status in (APPENDED, REPEATED):
                self._confirmed[tenant] = link
                if status == REPEATED:  # its ids were in the answer that was lost
                    self._heads[tenant] = link
                else:
                    anchors = self.anchors.setdefault(tenant, collections.deque(maxlen=ANCHORS_PER_TENANT))
                    anchors.extend((text(i), h) for i, (_, h) in zip(answer[1:], chained, strict=True))
                    # The next guess, unless another writer's later record was heard meanwhile.
                    self.heard(tenant, text(answer[-1]), link)
                return [
                    Receipt.chained(receipt_fields, p, h)
                    for receipt_fields, (p, h) in zip(batch, chained, strict=True)
                ]
            if status == HEAD_MISSING:
                raise ReceiptError("the chain head key is missing while the stream has records")
            if status == FENCED:
                self.clocks.check_later(tenant)  # or Redis's clock moved
                raise self._chains.timed_out()  # the script ran past its fence and wrote nothing
            self.races_lost += 1
            head = text(answer[1])
            confirmed = self._confirmed.get(tenant, GENESIS)
            if head == GENESIS and confirmed != GENESIS and tenant not in self.vanished:
                # The chain this process was appending to is gone (deleted, or a Redis restarted
                # without its data): it starts again, and the loss is said, not hidden.
                self.vanished.add(tenant)
                log.error(json.dumps({"event": "receipt_chain_restarted", "tenant": tenant}))
            prev = self._heads[tenant] = self._confirmed[tenant] = head
            self._newest.pop(tenant, None)  # Redis's answer outranks whatever was heard before it
            if status == RACE_LOST:  # another writer's turn: give it about a round trip
                await asyncio.sleep(random.uniform(0.0001, 0.0006))
        raise ReceiptError(f"receipt append lost {self._max_attempts} races for the chain head in a row")
