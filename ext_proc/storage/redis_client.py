"""REDIS_URL → a Redis client: one server, a Redis Cluster, or a master found through Sentinel.

Where this sits: beside the flow. The receipt store (and the vault) build their clients here, so
the three topologies a deployment of several replicas may use are one setting, not three code paths
(the URL forms and their checks: ext_proc.storage.redis_url). The URL's credentials authenticate to
the data nodes (the cluster's nodes, Sentinel's master).

Every client gets `socket_timeout = socket_connect_timeout = timeout` and `Retry(NoBackoff(),
retries)`: a command that fails on a lost connection or a timeout is re-sent at most `retries`
times (0 for a command that must never run twice). A cluster client still follows MOVED, ASK and
TRYAGAIN, which are answered before a command runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from ext_proc.storage.redis_url import BOOLEANS, RedisTarget, RedisUrlError, parse_url

RedisClient: TypeAlias = Redis | RedisCluster

# What a failed call through any of these clients can raise. A cluster client raises
# RedisClusterException (not a RedisError) when no node answers or a slot is not covered.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)
_T = TypeVar("_T")


async def bounded(awaitable: Awaitable[_T], timeout: float, error: Callable[[str], Exception]) -> _T:
    """`awaitable` within `timeout` seconds; a timeout or a Redis error is raised as `error(reason)`,
    the reason naming the error's type only (a Redis message can quote a key or a value)."""
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError as exc:
        raise error(f"Redis did not answer within {timeout}s") from exc
    except REDIS_ERRORS as exc:
        raise error(f"Redis failed: {type(exc).__name__}") from exc


def connect(url: str | RedisTarget, *, timeout: float, retries: int) -> RedisClient:
    """A client for REDIS_URL `url`; nothing is connected until the first command.

    `timeout` bounds each socket connect and read; `retries` is how many times a command is re-sent
    after a lost connection or a timeout (0: never, for a command that must not run twice). The
    client owns whatever it opened (a Sentinel client's Sentinel connections too): `aclose()` it.
    """
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    if retries < 0:
        raise ValueError("retries must be 0 or more")
    target = url if isinstance(url, RedisTarget) else parse_url(url)
    # A connection is ready once connected: RESP2 (no HELLO, and no CLIENT MAINT_NOTIFICATIONS,
    # which redis-py sends on RESP3 connections), no CLIENT SETINFO (driver_info None). After a
    # timeout redis-py drops the connection, and each of those would be one more round trip inside
    # the next command's budget: on a slow Redis every append timed out, for good.
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "driver_info": None,
        "protocol": 2,
    }
    if target.topology == "server":
        try:
            return Redis.from_url(target.url, retry=Retry(NoBackoff(), retries), **common)
        except ValueError:
            raise RedisUrlError("an option in the query string is unknown or has a bad value") from None
    tls = _tls_options(target) if target.tls else {}
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.topology == "cluster":
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            retry=Retry(NoBackoff(), retries),
            # A MOVED answer only patches that slot's owner. By default every 5th MOVED closes all
            # of the client's connections, and with them the commands other tasks have in flight
            # (a burst of first commands, sent before the slot map is known, is enough).
            reinitialize_steps=0,
            **auth,
            **common,
            **tls,
        )
    assert target.service is not None
    sentinels = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves Sentinel.__init__ unannotated
        list(target.nodes),
        min_other_sentinels=0,
        sentinel_kwargs={
            # Each Sentinel is asked once per discovery; the next one is the retry.
            "retry": Retry(NoBackoff(), 0),
            "username": target.options.get("sentinel_username"),
            "password": target.options.get("sentinel_password"),
            **common,
            **tls,
        },
        **common,
    )
    master: Redis = sentinels.master_for(
        target.service,
        redis_class=_SentinelMaster,
        retry=Retry(NoBackoff(), retries),
        db=target.db,
        **auth,
        **tls,
    )
    return master


class _SentinelMaster(Redis):
    """The master's client; closing it closes the Sentinel connections it was found through."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if isinstance(manager, Sentinel):
            await manager.aclose()


def _tls_options(target: RedisTarget) -> dict[str, Any]:
    out: dict[str, Any] = {"ssl": True}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
        if name in target.options:
            out[name] = target.options[name]
    if "ssl_check_hostname" in target.options:
        out["ssl_check_hostname"] = BOOLEANS[target.options["ssl_check_hostname"].lower()]
    return out
