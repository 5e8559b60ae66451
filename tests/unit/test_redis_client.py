"""REDIS_URL parsing and the clients built from it (no server needed: clients connect lazily)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from ext_proc.audit.receipts.verify import verify_cli
from ext_proc.storage.redis_client import connect
from ext_proc.storage.redis_url import RedisTarget, RedisUrlError, check_url, parse_url

PASSWORD = "pa55-W0rd!s3cret"


@pytest.mark.parametrize(
    ("url", "topology", "tls", "nodes", "service", "db"),
    [
        ("redis://127.0.0.1:6390/0", "server", False, (), None, 0),
        ("REDIS://127.0.0.1", "server", False, (), None, 0),
        ("rediss://cache.internal:6380/2", "server", True, (), None, 0),
        ("unix:///run/redis.sock?db=1", "server", False, (), None, 0),
        ("redis+cluster://127.0.0.1:7000", "cluster", False, (("127.0.0.1", 7000),), None, 0),
        (
            "redis+cluster://a:7000,b:7001,c/0",
            "cluster", False, (("a", 7000), ("b", 7001), ("c", 6379)), None, 0,
        ),
        ("rediss+cluster://[::1]:7000,node-2.internal", "cluster", True,
         (("::1", 7000), ("node-2.internal", 6379)), None, 0),
        ("redis+sentinel://127.0.0.1:26379/mymaster", "sentinel", False,
         (("127.0.0.1", 26379),), "mymaster", 0),
        ("redis+sentinel://s1,s2:26380,s3/cache/3", "sentinel", False,
         (("s1", 26379), ("s2", 26380), ("s3", 26379)), "cache", 3),
        ("rediss+sentinel://s1:26379/my-master", "sentinel", True, (("s1", 26379),), "my-master", 0),
    ],
)  # fmt: skip
def test_every_scheme_parses(
    url: str, topology: str, tls: bool, nodes: tuple[tuple[str, int], ...], service: str | None, db: int
) -> None:
    target = parse_url(url)
    assert (target.topology, target.tls, target.nodes, target.service, target.db) == (
        topology, tls, nodes, service, db,
    )  # fmt: skip
    check_url(url)


def test_credentials_are_decoded_and_never_shown() -> None:
    target = parse_url(f"redis+sentinel://cordon:{PASSWORD}%40x@s1:26379,s2:26379/mymaster")
    assert target.username == "cordon" and target.password == PASSWORD + "@x"
    assert PASSWORD not in repr(target) and "cordon" not in repr(target)
    only_password = parse_url(f"redis+cluster://:{PASSWORD}@127.0.0.1:7000")
    assert only_password.username is None and only_password.password == PASSWORD


def test_options_are_checked_and_kept_out_of_repr() -> None:
    target = parse_url(
        f"rediss+sentinel://s1/mymaster?ssl_cert_reqs=none&sentinel_password={PASSWORD}&ssl_check_hostname=no"
    )
    assert dict(target.options) == {
        "ssl_cert_reqs": "none", "sentinel_password": PASSWORD, "ssl_check_hostname": "no",
    }  # fmt: skip
    assert PASSWORD not in repr(target)


BAD: list[tuple[str, str]] = [
    ("", "empty"),
    (f"{PASSWORD}", "no scheme"),
    (f"http://u:{PASSWORD}@host:1", "scheme 'http' is not supported"),
    (f"redis+proxy://:{PASSWORD}@host:1", "scheme 'redis\\+proxy' is not supported"),
    (f"{PASSWORD}?://host", "the scheme is not supported"),
    (f"redis://:{PASSWORD}@a:1,b:2/0", "several hosts need redis\\+cluster"),
    (f"rediss://:{PASSWORD}@a:1,b:2/0", "several hosts need rediss\\+cluster"),
    (f"redis://:{PASSWORD}@host:port/0", "port that is not a number"),
    (f"redis://{PASSWORD}:6379/0", "not a host name"),  # the '@' forgotten: the password as host
    (f"redis://:{PASSWORD}@host:6379/x", "database number"),
    (f"redis+cluster://:{PASSWORD}@a:1,,b:2", "host 2 of 3 is empty"),
    (f"redis+cluster://:{PASSWORD}@a:1,b:99999", "host 2 of 2 has a port"),
    (f"redis+cluster://:{PASSWORD}@a:0", "port that is not a number"),
    (f"redis+cluster://:{PASSWORD}@a:1/1", "database 0 only"),
    (f"redis+cluster://:{PASSWORD}@a:1?ssl_cert_reqs=none", "needs a rediss"),
    (f"redis+cluster://:{PASSWORD}@a:1?sentinel_password=x", "option 'sentinel_password' is not supported"),
    (f"redis+cluster://:{PASSWORD}@a:1?{PASSWORD}=1", "an option is not supported"),
    (f"rediss+cluster://:{PASSWORD}@a:1?ssl_cert_reqs={PASSWORD}", "ssl_cert_reqs is one of"),
    (f"rediss+cluster://:{PASSWORD}@a:1?ssl_cert_reqs=none&ssl_cert_reqs=none", "given twice"),
    (f"redis+cluster://:{PASSWORD}@a:1#frag", "fragment"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379", "needs the service name"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379/", "needs the service name"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379/m/x", "service_name/db"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379/m/1/2", "service_name/db"),
    (f"redis+sentinel://:{PASSWORD}@[::1:26379/m", "malformed"),
    (f"redis+sentinel://:{PASSWORD}@s1:26379/my%20master", "white space"),
    ("unix://", "socket's path"),
]


@pytest.mark.parametrize(("url", "reason"), BAD, ids=[reason for _, reason in BAD])
def test_a_malformed_url_says_why_and_never_echoes_the_password(url: str, reason: str) -> None:
    with pytest.raises(RedisUrlError, match=reason) as raised:
        parse_url(url)
    message = str(raised.value)
    assert message.startswith("REDIS_URL: ")
    assert PASSWORD not in message and PASSWORD not in repr(raised.value)
    assert isinstance(raised.value, ValueError)
    error = raised.value  # no chained exception whose text could quote the URL
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


@pytest.mark.parametrize("query", ["socket_timeout=soon", "db=x", "max_connections=many", f"{PASSWORD}=1"])
def test_a_plain_url_redis_py_refuses_is_reported_without_its_text(query: str) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:6379/0?{query}"
    for attempt in (check_url, lambda u: connect(u, timeout=1.0, retries=0)):
        with pytest.raises(RedisUrlError, match="query string") as raised:
            attempt(url)
        assert PASSWORD not in str(raised.value) and raised.value.__suppress_context__


def _retries(client: Any) -> int:
    return int(client.connection_pool.connection_kwargs["retry"].get_retries())


def test_connect_builds_the_client_of_each_topology() -> None:
    async def scenario() -> None:
        plain = connect(f"redis://:{PASSWORD}@127.0.0.1:6390/1", timeout=0.3, retries=1)
        assert type(plain) is Redis
        kwargs = plain.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.3
        assert kwargs["password"] == PASSWORD and kwargs["db"] == 1 and _retries(plain) == 1
        await plain.aclose()

        cluster = connect(
            f"rediss+cluster://u:{PASSWORD}@127.0.0.1:7000,127.0.0.1:7001", timeout=0.3, retries=0
        )
        assert isinstance(cluster, RedisCluster)
        assert cluster.retry.get_retries() == 0
        assert cluster.reinitialize_steps == 0  # a MOVED never closes the other tasks' connections
        assert [node.name for node in cluster.startup_nodes] == ["127.0.0.1:7000", "127.0.0.1:7001"]
        kwargs = cluster.connection_kwargs
        assert kwargs["username"] == "u" and kwargs["password"] == PASSWORD
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.3
        assert kwargs["connection_class"].__name__ == "SSLConnection"
        await cluster.aclose()

        master = connect(
            f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379,127.0.0.1:26380/cache/2?sentinel_password=sp",
            timeout=0.3,
            retries=0,
        )
        assert isinstance(master, Redis)
        pool = master.connection_pool
        assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "cache"
        kwargs = pool.connection_kwargs
        assert kwargs["password"] == PASSWORD and kwargs["db"] == 2 and _retries(master) == 0
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.3
        sentinels = pool.sentinel_manager.sentinels
        assert len(sentinels) == 2
        first = sentinels[0].connection_pool.connection_kwargs
        assert first["password"] == "sp" and first["socket_timeout"] == 0.3
        await master.aclose()  # closes the Sentinel clients too

    asyncio.run(scenario())


def test_connect_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="timeout"):
        connect("redis://127.0.0.1", timeout=0, retries=0)
    with pytest.raises(ValueError, match="retries"):
        connect("redis://127.0.0.1", timeout=1, retries=-1)
    target = parse_url("redis+cluster://127.0.0.1:7000")
    assert isinstance(target, RedisTarget)
    client = connect(target, timeout=1, retries=0)
    assert isinstance(client, RedisCluster)
    asyncio.run(client.aclose())


def test_the_verify_command_reports_a_malformed_url_without_its_password() -> None:
    out = io.StringIO()
    assert verify_cli(f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379", out=out, timeout=0.5) == 2
    assert out.getvalue().startswith("receipts verify: REDIS_URL: a Sentinel URL needs the service name")
    assert PASSWORD not in out.getvalue()
