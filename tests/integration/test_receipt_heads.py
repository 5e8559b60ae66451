"""Head hints: a writer hears the other writers' appends, so taking turns on one chain costs one
round trip per append instead of a lost race and a second one (real redis-server)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from ext_proc.audit.receipts.record import ReceiptFields
from ext_proc.audit.receipts.store import ReceiptStore
from tests.support.harness import redis_server


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("heads")) as server:
        yield server.url


def fields(n: int) -> ReceiptFields:
    return ReceiptFields(
        tenant="turns", dialect="chat", mode="reversible", decision="forwarded", counts={"EMAIL": n}
    )


async def settle(store: ReceiptStore) -> None:
    """Until the store's listener is subscribed (its first append started it)."""
    for _ in range(200):
        if store._writer.hints._task is not None:
            await asyncio.sleep(0.05)
            return
        await asyncio.sleep(0.01)


def test_two_writers_taking_turns_lose_no_race(redis_url: str) -> None:
    async def scenario() -> tuple[int, bool]:
        first, second = (ReceiptStore.from_url(redis_url, timeout=2.0) for _ in range(2))
        try:
            await first.append(fields(0))
            await second.append(fields(1))  # may lose one race: it never heard of the chain
            await settle(first)
            await settle(second)
            lost = first.races_lost + second.races_lost
            for n in range(2, 42):
                await (first if n % 2 == 0 else second).append(fields(n))
                await asyncio.sleep(0.02)  # the gap between two requests, when the hint arrives
            result = await first.verify("turns", since_checkpoint=False)
            return first.races_lost + second.races_lost - lost, result.ok
        finally:
            await first.aclose()
            await second.aclose()

    races, ok = asyncio.run(scenario())
    assert ok
    assert races == 0


def test_a_hint_never_moves_the_guess_back(redis_url: str) -> None:
    """A late message about an older record does not replace the head of a newer one."""

    async def scenario() -> None:
        store = ReceiptStore.from_url(redis_url, timeout=2.0)
        try:
            writer = store._writer
            writer.heard("late", "200-0", "b" * 64)
            writer.heard("late", "100-0", "a" * 64)
            writer.heard("late", "not an id", "c" * 64)
            assert writer._heads["late"] == "b" * 64
            writer.heard("late", "200-1", "d" * 64)
            assert writer._heads["late"] == "d" * 64
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_a_publish_the_user_may_not_make_still_appends(redis_url: str) -> None:
    """The hint is advisory: a Redis user without pub/sub rights appends as before."""

    async def scenario() -> bool:
        admin = Redis.from_url(redis_url)
        await admin.execute_command("ACL", "SETUSER", "nopub", "on", "nopass", "~*", "+@all", "resetchannels")
        url = redis_url.replace("redis://", "redis://nopub:x@")
        store = ReceiptStore.from_url(url, timeout=2.0)
        try:
            for n in range(3):
                await store.append(fields(n))
            return (await store.verify("turns", since_checkpoint=False)).ok
        finally:
            await store.aclose()
            await admin.aclose()

    assert asyncio.run(scenario())
