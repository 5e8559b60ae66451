"""REDIS_URL → a Redis client: one server, a Redis Cluster, or a master found through Sentinel.

Where this sits: beside the flow. The receipt store (and the vault) build their clients here, so
the three topologies a deployment of several replicas may use are one setting, not three code paths::

    redis://[[user]:password@]host[:port][/db]        one server (redis-py's own URL rules,
    rediss://…   unix://[[user]:password@]/path?db=N   query options included)
    redis+cluster://[[user]:password@]host:port[,host:port…][/0]
    rediss+cluster://…                                 seed nodes of a Redis Cluster (db 0 only)
    redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db]
    rediss+sentinel://…                                Sentinels, and the master they name

A port left out is 6379 (26379 for a Sentinel). The URL's credentials authenticate to the data
nodes (the cluster's nodes, Sentinel's master); Sentinels that require their own password take
`?sentinel_password=…` (and `sentinel_username=…`). The `rediss` forms take `ssl_ca_certs`,
`ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs` (none | optional | required) and
`ssl_check_hostname` (true | false); nothing else is accepted, so a typo is an error, not a
silently ignored option.

Every client gets `socket_timeout = socket_connect_timeout = timeout` and `Retry(NoBackoff(),
retries)`: a command that fails on a lost connection or a timeout is re-sent at most `retries`
times (0 for a command that must never run twice). A cluster client still follows MOVED, ASK and
TRYAGAIN, which are answered before a command runs. A malformed URL is a `RedisUrlError` naming
what is wrong with it: never the URL, so never a password.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias, TypeVar
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from ext_proc.errors import CordonError

RedisClient: TypeAlias = Redis | RedisCluster
Topology = Literal["server", "cluster", "sentinel"]

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


SCHEMES: dict[str, tuple[Topology, bool]] = {  # scheme → (topology, TLS)
    "redis": ("server", False),
    "rediss": ("server", True),
    "unix": ("server", False),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
DEFAULT_PORT = {"server": 6379, "cluster": 6379, "sentinel": 26379}
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
_CERT_REQS = ("none", "optional", "required")
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_NAME = re.compile(r"[a-z][a-z0-9_+.-]{0,31}")  # a scheme or option name safe to repeat back
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
_SCHEME_LIST = ", ".join(f"{scheme}://" for scheme in SCHEMES)


class RedisUrlError(CordonError, ValueError):
    """REDIS_URL cannot work. The message says why and never repeats the URL (or a password)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"REDIS_URL: {reason}")


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed REDIS_URL. `repr` shows no credential and no option value."""

    topology: Topology
    tls: bool
    nodes: tuple[tuple[str, int], ...]  # cluster seeds or Sentinels; empty for one server
    service: str | None = None  # the Sentinel service (master) name
    db: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    url: str = field(default="", repr=False)  # the URL itself, for one server (redis-py parses it)


def parse_url(url: str) -> RedisTarget:
    """Validate REDIS_URL and split it into what a client needs; RedisUrlError if it cannot work."""
    if not isinstance(url, str) or not url.strip():
        raise RedisUrlError("empty")
    head, sep, _ = url.strip().partition("://")
    if not sep:
        raise RedisUrlError(f"no scheme: expected one of {_SCHEME_LIST}")
    scheme = head.lower()
    if scheme not in SCHEMES:
        named = f"scheme {scheme!r}" if _NAME.fullmatch(scheme) else "the scheme"
        raise RedisUrlError(f"{named} is not supported: use one of {_SCHEME_LIST}")
    topology, tls = SCHEMES[scheme]
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        raise RedisUrlError("the address part is malformed") from None
    if parts.fragment:
        raise RedisUrlError("a URL fragment ('#…') is not allowed (percent-encode '#' in a password)")
    if scheme == "unix":
        return _server(url, parts, tls)
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts = netloc
    username, password = _credentials(userinfo) if at else (None, None)
    options = _options(parts.query, topology, tls)
    if topology == "server":
        if "," in hosts:
            raise RedisUrlError(
                f"several hosts need {'rediss' if tls else 'redis'}+cluster:// or +sentinel://"
            )
        if hosts:  # empty: redis-py's default, localhost
            _nodes(hosts, DEFAULT_PORT["server"])  # the checks, with messages that name no value
        return _server(url, parts, tls)
    nodes = _nodes(hosts, DEFAULT_PORT[topology])
    if topology == "cluster":
        if parts.path not in ("", "/", "/0"):
            raise RedisUrlError("Redis Cluster has database 0 only: leave the path empty or '/0'")
        return RedisTarget(
            "cluster", tls, nodes, username=username, password=password, options=MappingProxyType(options)
        )
    segments = parts.path.split("/")[1:] if parts.path else []
    if not segments or not segments[0]:
        raise RedisUrlError("a Sentinel URL needs the service name as its path: …/service_name[/db]")
    if len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
        raise RedisUrlError("a Sentinel URL's path is /service_name or /service_name/db (db a number)")
    service = unquote(segments[0])
    if any(c.isspace() for c in service):
        raise RedisUrlError("the Sentinel service name contains white space")
    return RedisTarget(
        "sentinel",
        tls,
        nodes,
        service=service,
        db=int(segments[1]) if len(segments) == 2 else 0,
        username=username,
        password=password,
        options=MappingProxyType(options),
    )


def check_url(url: str) -> None:
    """Raise RedisUrlError unless `url` is a REDIS_URL this module can connect to (for startup)."""
    parse_url(url)


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


def _server(url: str, parts: SplitResult, tls: bool) -> RedisTarget:
    if parts.scheme == "unix":
        if not parts.path:
            raise RedisUrlError("a unix:// URL needs the socket's path")
    elif parts.path not in ("", "/") and not parts.path[1:].isdigit():
        raise RedisUrlError("the path of a redis:// URL is the database number")
    try:
        # What `connect` will build, without connecting: redis-py checks the query options' values
        # here and the connection class refuses a name it does not know.
        pool = ConnectionPool.from_url(url.strip())
        pool.connection_class(**pool.connection_kwargs)
    except (ValueError, TypeError):
        raise RedisUrlError("an option in the query string is unknown or has a bad value") from None
    return RedisTarget("server", tls, (), url=url.strip())


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if colon and password else None)


def _nodes(hosts: str, default_port: int) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    listed = hosts.split(",")
    for index, item in enumerate(listed, 1):
        where = f"host {index} of {len(listed)}" if len(listed) > 1 else "the host"
        if item.startswith("["):
            host, bracket, rest = item.partition("]")
            host += bracket
            if rest and not rest.startswith(":"):
                raise RedisUrlError(f"{where} is malformed")
            port_text = rest[1:] if rest else ""
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise RedisUrlError(f"{where} is empty")
        if not _HOST.fullmatch(host):
            raise RedisUrlError(f"{where} is not a host name or address (is a password missing its '@'?)")
        if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
            raise RedisUrlError(f"{where} has a port that is not a number in 1..65535")
        out.append((host.strip("[]"), int(port_text) if port_text else default_port))
    return tuple(out)


def _options(query: str, topology: Topology, tls: bool) -> dict[str, str]:
    if topology == "server":
        return {}  # redis-py reads a plain URL's query itself
    allowed = (*TLS_OPTIONS, *SENTINEL_OPTIONS) if topology == "sentinel" else TLS_OPTIONS
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise RedisUrlError("the query string is malformed") from None
    options: dict[str, str] = {}
    for name, value in pairs:
        named = f"option {name!r}" if _NAME.fullmatch(name) else "an option"
        if name not in allowed:
            raise RedisUrlError(f"{named} is not supported here (allowed: {', '.join(allowed)})")
        if name in options:
            raise RedisUrlError(f"{named} is given twice")
        if name in TLS_OPTIONS and not tls:
            raise RedisUrlError(f"{named} needs a rediss+… scheme")
        if name == "ssl_cert_reqs" and value not in _CERT_REQS:
            raise RedisUrlError(f"ssl_cert_reqs is one of {', '.join(_CERT_REQS)}")
        if name == "ssl_check_hostname" and value.lower() not in _BOOLEANS:
            raise RedisUrlError("ssl_check_hostname is true or false")
        options[name] = value
    return options


def _tls_options(target: RedisTarget) -> dict[str, Any]:
    out: dict[str, Any] = {"ssl": True}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
        if name in target.options:
            out[name] = target.options[name]
    if "ssl_check_hostname" in target.options:
        out["ssl_check_hostname"] = _BOOLEANS[target.options["ssl_check_hostname"].lower()]
    return out
