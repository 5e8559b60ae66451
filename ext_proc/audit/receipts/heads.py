"""Other writers' appends, heard as they happen: each chain's head, to chain the next record onto.

Where this sits: beside the writer (`ext_proc.audit.receipts.writer`). The append script
publishes, on a channel named after the chain's head key, the stream id and hash of the last
record it appended. A writer hashes its records against the head it believes in; when another
process moved the head since, the compare-and-set fails and the batch goes again, one more round
trip on the request path. With several workers appending to one tenant's chain (Envoy spreads
exchanges over them) that was most appends, even one request at a time. Hearing the heads keeps
the guess current.

A hint is only a guess: the script still checks `prev`, so a late, lost or missing message costs
what it cost before (one lost race), never a wrong link. Nothing here is on a request's path:
the listener is a background task that reconnects on its own, quietly (Redis being down is the
readiness check's and the appends' to report). A Redis Cluster client does not listen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from redis.asyncio import RedisCluster

from ext_proc.audit.receipts.chain import ChainRedis
from ext_proc.storage.redis_client import REDIS_ERRORS

LISTEN_SECONDS = 1.0  # one read's wait for a message (the socket timeout is the append's, short)
RETRY_SECONDS = 1.0  # between a lost subscription and the next try
CLOSE_SECONDS = 2.0  # the longest closing waits for the listener to end

_LOST: tuple[type[Exception], ...] = (*REDIS_ERRORS, TimeoutError)

Heard = Callable[[str, str, str], None]  # (tenant, stream id, head hash)


class HeadHints:
    """Listens, once started, for the heads every writer's appends leave; `heard` gets each."""

    def __init__(self, chains: ChainRedis, heard: Heard) -> None:
        self._chains = chains
        self._heard = heard
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        """Listen from now on (in the running loop); again, it does nothing."""
        if self._task is None and not isinstance(self._chains.writer, RedisCluster):
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self._stopping = True
            task.cancel()
            # redis-py may turn a cancellation inside a connection attempt into a connection error
            # (a Sentinel's master lookup does), which the loop takes for Redis being away: the
            # flag ends it at its next turn, and closing never waits longer than this.
            await asyncio.wait({task}, timeout=CLOSE_SECONDS)

    async def _listen(self) -> None:
        pattern = self._chains.head_key_pattern()
        while not self._stopping:
            pubsub = self._chains.writer.pubsub()
            try:
                await pubsub.psubscribe(pattern)
                while not self._stopping:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=LISTEN_SECONDS)
                    if message is not None and message.get("type") == "pmessage":
                        self._take(message["channel"], message["data"])
            except _LOST:
                pass  # Redis down or restarted: listen again after a pause
            finally:
                with contextlib.suppress(*_LOST):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated in redis-py
            if not self._stopping:
                await asyncio.sleep(RETRY_SECONDS)

    def _take(self, channel: bytes | str, data: bytes | str) -> None:
        tenant = self._chains.head_key_tenant(_decoded(channel))
        stream_id, _, head = _decoded(data).partition(" ")
        if tenant is not None and head:
            self._heard(tenant, stream_id, head)


def _decoded(value: bytes | str) -> str:
    # A tenant name may hold any letter (ext_proc.policy.model): UTF-8, and never an exception here.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
