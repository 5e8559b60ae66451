"""Shared fixtures: one real stack per test session (Envoy, ext_proc, Redis, fake upstream)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import RunningStack, running_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("stack")) as running:
        yield running


@pytest.fixture
def upstream(stack: RunningStack):  # type: ignore[no-untyped-def]
    stack.upstream.clear()
    stack.upstream.set_behaviour() if hasattr(stack.upstream, "set_behaviour") else None
    return stack.upstream
