"""`make up` / `make down` driven by a harness that brings its own upstream, policies and Redis.

Only the documented environment is used; the stack must come up, redact, and go away completely,
and fail with the reason (and nothing left running) on a bad policy or a taken port, a worker's
included; `serve` alone stops at once, naming the port, when a worker's port is taken.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ext_proc.runtime.stack import port_free
from ext_proc.service.contract import PORT_TAKEN
from tests.support.e2e import SENTENCE, chat_body, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import free_ports, redis_server, stack_env, write_policies

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
    """Every port the stack listens on, each worker's (EXTPROC_PORT + i) included."""
    workers = [int(env["EXTPROC_PORT"]) + i for i in range(int(env["WORKERS"]))]
    others = [int(env[name]) for name in ("LISTEN_PORT", "TLS_PORT", "ENVOY_ADMIN_PORT", "METRICS_PORT")]
    return others + workers


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


def test_up_fails_when_a_workers_port_is_taken(tmp_path: Path) -> None:
    """Worker 1's port is EXTPROC_PORT + 1: taken, the stack does not start and says which."""
    write_policies(tmp_path / "policies")
    with redis_server(tmp_path) as redis, FakeUpstream() as upstream, socket.socket() as holder:
        env = stack_env(tmp_path / "run", tmp_path / "policies", redis.url, upstream.url, workers=2)
        taken = int(env["EXTPROC_PORT"]) + 1
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        up = stack_command("up", env)
        assert up.returncode == 1
        assert f"port {taken} (EXTPROC_PORT + 1, worker 1) is taken" in up.stderr
        assert list((tmp_path / "run" / "pids").glob("*.pid")) == []


def serve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ext_proc", "serve", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def startup_failures(stderr: str) -> list[str]:
    lines = (json.loads(line) for line in stderr.splitlines() if line.startswith("{"))
    return [str(line["reason"]) for line in lines if line.get("event") == "startup_failed"]


def test_serve_stops_at_once_when_a_workers_port_is_taken(tmp_path: Path) -> None:
    """No worker starts and none is restarted in a loop: `serve` exits within seconds, naming the
    port, and leaves the other workers' ports free."""
    write_policies(tmp_path / "policies")
    env = stack_env(tmp_path / "run", tmp_path / "policies", "redis://127.0.0.1:1/0", "http://127.0.0.1:1")
    env["WORKERS"] = "3"
    env["EXTPROC_PORT"] = str(free_ports(3))
    taken = int(env["EXTPROC_PORT"]) + 2
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        start = time.monotonic()
        result = serve(env)
        elapsed = time.monotonic() - start
    assert result.returncode == 1 and elapsed < 10, (result.returncode, elapsed)
    (reason,) = startup_failures(result.stderr)
    assert f"port {taken} (worker 2, EXTPROC_PORT + 2) is taken" in reason
    assert all(port_free("127.0.0.1", int(env["EXTPROC_PORT"]) + i) for i in range(2))


def test_a_worker_whose_port_is_taken_exits_for_the_supervisor_to_stop(tmp_path: Path) -> None:
    """A worker that cannot bind its port (taken after the supervisor checked it) exits with
    PORT_TAKEN, logging the port: the supervisor stops on that code instead of restarting it."""
    write_policies(tmp_path / "policies")
    env = stack_env(tmp_path / "run", tmp_path / "policies", "redis://127.0.0.1:1/0", "http://127.0.0.1:1")
    base = free_ports(2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 1))
        holder.listen()
        result = serve(env, "--worker-index", "1", "--port", str(base), "--workers", "2")
    assert result.returncode == PORT_TAKEN
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert {"event": "worker_port_taken", "worker": 1, "port": base + 1}.items() <= next(
        line for line in lines if line.get("event") == "worker_port_taken"
    ).items()


def test_serve_stops_when_a_worker_finds_its_port_taken(tmp_path: Path) -> None:
    """A listener that appears on worker 1's port after the supervisor reserved it (the
    reservation lets a socket with SO_REUSEADDR listen beside it) makes worker 1 exit with
    PORT_TAKEN; the supervisor stops the others and exits naming the port, restarting nothing."""
    write_policies(tmp_path / "policies")
    env = stack_env(tmp_path / "run", tmp_path / "policies", "redis://127.0.0.1:1/0", "http://127.0.0.1:1")
    taken = int(env["EXTPROC_PORT"]) + 1
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", taken))
        process = subprocess.Popen(
            [sys.executable, "-m", "ext_proc", "serve"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The supervisor binds METRICS_PORT right after reserving the workers' ports and before
        # starting them; a worker needs a second or more to import before it binds.
        deadline = time.monotonic() + 30
        while port_free("127.0.0.1", int(env["METRICS_PORT"])):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        holder.listen()
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    reason = f"cannot serve ext_proc: port {taken} (worker 1) is taken by another listener"
    assert startup_failures(stderr) == [reason]
    events = [json.loads(line).get("event") for line in stderr.splitlines() if line.startswith("{")]
    assert "worker_port_taken" in events and "worker_exited" not in events
    assert all(port_free("127.0.0.1", port) for port in ports_of(env) if port != taken)


def test_serve_refuses_a_bad_policy_naming_file_key_and_reason(tmp_path: Path) -> None:
    """The supervisor checks the policies (in a child, so it never holds the detectors) before it
    reserves a port: a bad file, or one this deployment cannot honour, is a startup error that
    names the file, the key and the reason, with exit status 1 and nothing left listening."""
    policies = tmp_path / "policies"
    write_policies(policies)
    env = stack_env(tmp_path / "run", policies, "redis://127.0.0.1:1/0", "http://127.0.0.1:1")
    (policies / "broken.yaml").write_text("tenant: broken\nmode: sometimes\n")
    result = serve(env)
    assert result.returncode == 1
    reason = f"policy error: {policies}/broken.yaml: mode: must be one of reversible, surrogate, strip, off"
    assert startup_failures(result.stderr) == [reason]
    (policies / "broken.yaml").write_text("tenant: broken\nconsistentPseudonyms: true\n")
    result = serve(env)
    assert result.returncode == 1
    (reason,) = startup_failures(result.stderr)
    expected = f"policy error: {policies}/broken.yaml: consistentPseudonyms: needs TENANT_SECRET"
    assert reason.startswith(expected)
    assert all(port_free("127.0.0.1", port) for port in ports_of(env))
