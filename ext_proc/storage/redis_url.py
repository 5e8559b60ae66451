"""REDIS_URL: validated and split into what a client needs, without importing redis-py.

Every command checks REDIS_URL when it reads its settings, so a URL no client can use stops it at
once; the processes that never talk to Redis themselves (the supervisors) must not load the Redis
client library for that. The forms::

    redis://[[user]:password@]host[:port][/db]        one server (redis-py's own URL rules,
    rediss://…   unix://[[user]:password@]/path?db=N   query options included)
    redis+cluster://[[user]:password@]host:port[,host:port…][/0]
    rediss+cluster://…                                 seed nodes of a Redis Cluster (db 0 only)
    redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db]
    rediss+sentinel://…                                Sentinels, and the master they name

A port left out is 6379 (26379 for a Sentinel). Sentinels that require their own password take
`?sentinel_password=…` (and `sentinel_username=…`). The `rediss` forms take `ssl_ca_certs`,
`ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs` (none | optional | required) and
`ssl_check_hostname` (true | false); nothing else is accepted, so a typo is an error, not a
silently ignored option. A malformed URL is a `RedisUrlError` naming what is wrong with it: never
the URL, so never a password.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from ext_proc.errors import CordonError

Topology = Literal["server", "cluster", "sentinel"]

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
BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
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


def _server(url: str, parts: SplitResult, tls: bool) -> RedisTarget:
    if parts.scheme == "unix":
        if not parts.path:
            raise RedisUrlError("a unix:// URL needs the socket's path")
    elif parts.path not in ("", "/") and not parts.path[1:].isdigit():
        raise RedisUrlError("the path of a redis:// URL is the database number")
    if parts.query:
        # What `connect` will build, without connecting: redis-py checks the query options' values
        # here and the connection class refuses a name it does not know. Without a query there is
        # nothing it reads that the checks above have not (scheme, host, port, database), so a
        # process that only checks its settings does not load redis-py.
        from redis.asyncio import ConnectionPool

        try:
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
        if name == "ssl_check_hostname" and value.lower() not in BOOLEANS:
            raise RedisUrlError("ssl_check_hostname is true or false")
        options[name] = value
    return options
