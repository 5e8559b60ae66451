"""Shared fixtures: one real stack per test session (Envoy, ext_proc, Redis, fake upstream)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from hypothesis import settings

from ext_proc.detect.memo import MEMO
from ext_proc.exchange.envelope import HEADER_MEMO
from tests.support.examples import SCALE, example_count
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import RedisProcess, RunningStack, redis_server, running_stack

# The properties that name no count run hypothesis's 100 examples, scaled like the others.
settings.register_profile("cordon", max_examples=example_count(100))
settings.load_profile("cordon" if SCALE < 1 else "default")


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    """Each test starts with an empty detection memo: a test that changes a detector's limits
    (a timeout, a work bound) must not be answered from an earlier test's scan."""
    MEMO.clear()
    HEADER_MEMO.clear()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("stack")) as running:
        yield running


@pytest.fixture
def upstream(stack: RunningStack) -> FakeUpstream:
    """The session's fake upstream, emptied and back to its default behaviour for each test."""
    stack.upstream.reset()
    return stack.upstream


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """A real redis-server of the module's own (the vault and registry unit tests)."""
    with redis_server(tmp_path_factory.mktemp("redis")) as process:
        yield process


@pytest.fixture
def client(server: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the module's `server`, which it empties first."""
    with redis.Redis.from_url(server.url) as r:
        r.flushall()
        yield r


@pytest.fixture
def acl(fresh: RunningStack) -> Iterator[redis.Redis]:
    """The Redis of the module's `fresh` stack, with the default user's rights put back after the
    test (a test narrows them to make the vault or the registry fail)."""
    assert fresh.redis is not None
    with redis.Redis.from_url(fresh.redis.url) as r:
        try:
            yield r
        finally:
            r.execute_command("ACL", "SETUSER", "default", "on", "nopass", "resetkeys", "~*", "+@all")
