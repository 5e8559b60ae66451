"""`make up` / `make down` driven by a harness that brings its own upstream, policies and Redis.

Only the environment of SPEC §3 is used; the stack must come up, redact, and go away completely,
and fail with the reason (and nothing left running) on a bad policy or a taken port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ext_proc.runtime.stack import port_free
from tests.support.e2e import SENTENCE, chat_body, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import redis_server, stack_env, write_policies

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def stack_command(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ext_proc", "stack", action],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def ports_of(env: dict[str, str]) -> list[int]:
    return [
        int(env[name])
        for name in ("LISTEN_PORT", "TLS_PORT", "ENVOY_ADMIN_PORT", "EXTPROC_PORT", "METRICS_PORT")
    ]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def test_up_redacts_and_down_stops_everything(tmp_path: Path) -> None:
    write_policies(tmp_path / "policies")
    with redis_server(tmp_path) as redis, FakeUpstream() as upstream:
        env = stack_env(tmp_path / "run", tmp_path / "policies", redis.url, upstream.url, workers=2)
        up = stack_command("up", env)
        try:
            assert up.returncode == 0, up.stderr
            assert "Cordon is running" in up.stdout
            pid_files = list((tmp_path / "run" / "pids").glob("*.pid"))
            names = {p.stem for p in pid_files}
            assert {"supervisor", "ext_proc", "envoy"} <= names
            assert "redis" not in names and "fake-upstream" not in names  # the harness brought its own
            pids = [int(p.read_text()) for p in pid_files]
            reply = request(int(env["LISTEN_PORT"]), "POST", "/v1/chat/completions", chat_body(SENTENCE))
            assert reply.status == 200
            assert leaked(upstream.received[0].body) == []
            assert SENTENCE in reply.json()["choices"][0]["message"]["content"]
        finally:
            down = stack_command("down", env)
        assert down.returncode == 0, down.stderr
        assert not any(pid_alive(pid) for pid in pids)
        assert all(port_free("127.0.0.1", p) for p in ports_of(env))


def test_up_fails_on_a_bad_policy_and_leaves_nothing(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    write_policies(policies)
    (policies / "broken.yaml").write_text("tenant: broken\nmode: sometimes\n")
    with redis_server(tmp_path) as redis, FakeUpstream() as upstream:
        env = stack_env(tmp_path / "run", policies, redis.url, upstream.url, workers=1)
        up = stack_command("up", env)
        assert up.returncode == 1
        assert "broken.yaml" in up.stderr and "mode" in up.stderr
        assert list((tmp_path / "run" / "pids").glob("*.pid")) == []
        assert all(port_free("127.0.0.1", p) for p in ports_of(env))


def test_up_fails_when_a_port_is_taken(tmp_path: Path) -> None:
    write_policies(tmp_path / "policies")
    with redis_server(tmp_path) as redis, FakeUpstream() as upstream, socket.socket() as holder:
        env = stack_env(tmp_path / "run", tmp_path / "policies", redis.url, upstream.url, workers=1)
        holder.bind(("127.0.0.1", int(env["LISTEN_PORT"])))
        holder.listen()
        up = stack_command("up", env)
        assert up.returncode == 1
        assert "LISTEN_PORT" in up.stderr and "taken" in up.stderr
        assert list((tmp_path / "run" / "pids").glob("*.pid")) == []
