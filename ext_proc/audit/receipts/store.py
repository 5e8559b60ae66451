"""The receipt store: every exchange's record appended to its tenant's chain, and read back.

Where this sits: Envoy message → dialect walk → detectors → redaction → media → egress check →
**receipt** → upstream. Once an exchange knows its decision it appends its `ReceiptFields` here
before the body is released; the hash that comes back is the `X-Cordon-Receipt` header. The admin
query and the auditors' command line read the chain back through `verify`. A Redis failure is a
`ReceiptError` (`ext_proc.audit.receipts.chain`).

This module is the front: the queue and batches of each tenant's appends. The record and its hash
are in `record`, the Redis layout and scripts in `chain`, one compare-and-set append in `writer`,
settling a lost answer in `settle`, verification in `verify`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ext_proc.audit.receipts.chain import DEFAULT_KEY_PREFIX, ChainRedis, ReceiptError
from ext_proc.audit.receipts.record import Receipt, ReceiptFields
from ext_proc.audit.receipts.settle import Settler
from ext_proc.audit.receipts.verify import ChainVerifier, VerifyResult
from ext_proc.audit.receipts.writer import ChainWriter
from ext_proc.storage.redis_client import RedisClient, bounded, connect

MAX_BATCH = 64
BATCH_GRACE_SECONDS = 0.05  # how long a queued caller past its deadline waits for its batch's end

_Pending = tuple[ReceiptFields, "asyncio.Future[Receipt]", float]  # fields, result, deadline


def _fail(items: list[_Pending], error: ReceiptError) -> None:
    """Every caller of a batch gets the error, with the uncertain link of its own record."""
    own = len(error.uncertain) == len(items)
    for i, item in enumerate(items):
        if not item[1].done():
            mine = ReceiptError(str(error), error.uncertain[i : i + 1]) if own else error
            item[1].set_exception(mine)


def _consume(future: asyncio.Future[Receipt]) -> None:
    # A caller that timed out never awaits its future: read its exception so asyncio does not
    # report it as never retrieved.
    if not future.cancelled():
        future.exception()


class ReceiptStore:
    """Appends receipts to, and verifies, per-tenant chains in Redis (on a Cluster, one slot each).

    `timeout` bounds every Redis call, and a whole `append` (queueing, retries and all): a receipt
    sits on the request path. The append script carries a fence, the caller's deadline in Redis's
    clock, and does nothing once it has passed: a caller told "timed out" does not get its record
    written later by a slow Redis.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        writer: RedisClient | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        timeout: float = 0.25,
        max_attempts: int = 100,
        turn_ms: int = 50,
    ) -> None:
        self._chains = ChainRedis(client, writer=writer, key_prefix=key_prefix, timeout=timeout)
        self._timeout = timeout
        self._writer = ChainWriter(self._chains, max_attempts=max_attempts, turn_ms=turn_ms)
        self._verifier = ChainVerifier(self._chains, self._writer.vanished)
        self._settler = Settler(self._chains, self.append)
        self._queues: dict[str, list[_Pending]] = {}
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._writing: set[str] = set()  # tenants whose chain a caller or a drain is writing

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout: float = 0.25,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        max_attempts: int = 100,
        turn_ms: int = 50,
    ) -> ReceiptStore:
        """A store with its own clients for REDIS_URL `url` (one server, `redis+cluster://` or
        `redis+sentinel://`; a malformed URL is a `RedisUrlError`, a ValueError), socket timeouts =
        `timeout`: both clients reconnect once at once (a restarted Redis). Sending the append
        script again is safe: a second run of a call that already appended finds its own call key
        and appends nothing."""
        client = connect(url, timeout=timeout, retries=1)
        writer = connect(url, timeout=timeout, retries=1)
        return cls(
            client,
            writer=writer,
            key_prefix=key_prefix,
            timeout=timeout,
            max_attempts=max_attempts,
            turn_ms=turn_ms,
        )

    async def ping(self) -> bool:
        """Whether Redis answers a PING within the timeout (a worker's readiness)."""
        try:
            await bounded(self._chains.reader.ping(), self._timeout, ReceiptError)
        except ReceiptError:
            return False
        return True

    async def aclose(self) -> None:
        for task in [*self._drains.values()]:
            task.cancel()
        self._writer.clocks.cancel()
        await self._writer.hints.aclose()
        self._settler.cancel()
        await self._settler.aclose()
        await self._chains.aclose()

    @property
    def races_lost(self) -> int:
        """Compare-and-set conflicts seen, for a metric."""
        return self._writer.races_lost

    def stream_key(self, tenant: str) -> str:
        return self._chains.stream_key(tenant)

    def head_key(self, tenant: str) -> str:
        return self._chains.head_key(tenant)

    def turn_key(self, tenant: str) -> str:
        return self._chains.turn_key(tenant)

    def call_key(self, tenant: str, token: str) -> str:
        return self._chains.call_key(tenant, token)

    # ---- append -------------------------------------------------------------------------------

    async def append(self, receipt_fields: ReceiptFields) -> Receipt:
        """Chain one record onto its tenant's chain; returns it with `prev` and `hash`.

        Appends of one tenant queue in this process and one writer at a time sends them:
        everything queued so far (up to MAX_BATCH), chained locally, in one script call. Under load
        N waiting exchanges cost one round trip instead of N; alone, an append costs one (the
        caller writes its own record). A caller that gives up while its record is still queued
        takes it out; a batch in flight is fenced by the earliest deadline in it.
        """
        tenant = receipt_fields.tenant
        self.stream_key(tenant)  # validates the tenant before anything is queued
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        queue = self._queues.setdefault(tenant, [])
        if tenant not in self._writing:
            # Nobody is writing this chain: this caller writes its own record now, and whatever
            # queued meanwhile is handed to a drain task afterwards.
            self._writing.add(tenant)
            try:
                return (await self._writer.write(tenant, [receipt_fields], deadline))[0]
            finally:
                self._writing.discard(tenant)
                if queue:
                    self._start_drain(tenant)
        item: _Pending = (receipt_fields, loop.create_future(), deadline)
        item[1].add_done_callback(_consume)
        queue.append(item)
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(item[1])
        except TimeoutError as exc:
            if item in queue:
                queue.remove(item)
                raise self._chains.timed_out() from exc
        # Taken into a batch, which is fenced at its earliest deadline, so it is ending now: its
        # answer says whether this record may have been appended.
        try:
            async with asyncio.timeout(BATCH_GRACE_SECONDS):
                return await asyncio.shield(item[1])
        except TimeoutError as exc:
            raise self._chains.timed_out() from exc

    def _start_drain(self, tenant: str) -> None:
        self._writing.add(tenant)
        self._drains[tenant] = asyncio.create_task(self._drain(tenant))

    async def _drain(self, tenant: str) -> None:
        """Write the tenant's queue, batch after batch, until it is empty."""
        queue = self._queues[tenant]
        try:
            while queue:
                batch = [item for item in queue[:MAX_BATCH] if not item[1].done()]
                del queue[:MAX_BATCH]
                if batch:
                    await self._append_batch(tenant, batch)
        except BaseException:
            # Cancelled (the store is closing): nobody queued may wait for a writer that is gone.
            _fail([*queue], ReceiptError("the receipt store is closing"))
            queue.clear()
            raise
        finally:
            self._writing.discard(tenant)
            self._drains.pop(tenant, None)

    async def _append_batch(self, tenant: str, batch: list[_Pending]) -> None:
        """Write `batch` in order; every future gets its Receipt or the same ReceiptError."""
        deadline = min(item[2] for item in batch)
        try:
            receipts = await self._writer.write(tenant, [item[0] for item in batch], deadline)
        except ReceiptError as exc:
            _fail(batch, exc)
        except BaseException:
            _fail(batch, ReceiptError("receipt append interrupted"))
            raise
        else:
            for item, receipt in zip(batch, receipts, strict=True):
                if not item[1].done():
                    item[1].set_result(receipt)

    # ---- settle, verify, query ------------------------------------------------------------------

    def settle_later(
        self,
        correction: ReceiptFields,
        uncertain: tuple[str, str],
        done: Callable[[str], None] | None = None,
    ) -> None:
        """Find out in the background whether the record of a refused exchange, whose append got
        no answer, is in the chain after all, and append the refusal's record as it then needs
        (`ext_proc.audit.receipts.settle`). `uncertain` is that record's (prev, hash); `done`
        gets the outcome: `corrected`, `recorded` or `unknown`."""
        self._settler.settle_later(correction, uncertain, done)

    async def verify(self, tenant: str, *, since_checkpoint: bool = True) -> VerifyResult:
        """Walk the chain (from this process's checkpoint, or from the start) and recheck it, and
        check that the last records this process appended are still there as written."""
        result = await self._verifier.verify(tenant, since_checkpoint=since_checkpoint)
        if not result.ok:
            return result
        broken = await self._verifier.check_anchors(tenant, list(self._writer.anchors.get(tenant, ())))
        return broken or result

    async def trim(self, keep_from_ms: int) -> dict[str, int]:
        """Retention: every chain's records appended before `keep_from_ms` (Redis's clock) trimmed,
        each chain keeping the anchor of its last trimmed record; how many per tenant."""
        trimmed: dict[str, int] = {}
        for tenant in sorted(await self._chains.chain_tenants()):
            count = await self._chains.trim(tenant, keep_from_ms)
            if count:
                trimmed[tenant] = count
        return trimmed

    async def redis_now_ms(self, tenant: str) -> int:
        """Redis's clock (the stream ids' clock) in milliseconds, on the node holding `tenant`."""
        seconds, micros = await self._chains.call(self._chains.redis_time(tenant))
        return seconds * 1000 + micros // 1000

    def anchored_tenants(self) -> list[str]:
        """The tenants whose chains this process appended to (and keeps anchors of)."""
        return sorted(self._writer.anchors)

    async def tenants(self) -> list[str]:
        """Every tenant with a chain (a key under this prefix: a SCAN of the server, or of every
        primary of a cluster), and every tenant this store has verified or appended a record of:
        a chain deleted whole since then is still asked about, and its verification fails."""
        found = {*self._verifier.verified_tenants(), *self._writer.vanished}
        found.update(self._writer.written_tenants())
        found.update(await self._chains.chain_tenants())
        return sorted(found)

    async def find_by_ref_digest(self, tenant: str, digest: str) -> list[Receipt]:
        """The verified records whose `refDigest` is `digest`; ChainBroken if the chain is not whole."""
        return await self._verifier.find_by_ref_digest(tenant, digest)
