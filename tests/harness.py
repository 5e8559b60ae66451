"""Start the real stack for end-to-end tests: Redis, the fake upstream, ext_proc workers, Envoy.

Everything listens on free loopback ports and lives under a temporary RUN_DIR, so tests never
collide with a `make run` on the same machine. The fake upstream runs in the test process, so tests
read what it received directly.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ext_proc.config import Settings
from ext_proc.policy import hash_api_key
from ext_proc.stack import Stack, redis_binary, wait_port
from tests.fake_upstream import FakeUpstream

# API keys of the test tenants (invented; the policy files store only their digests).
KEYS = {
    "strip": "sk-test-tenant-strip",
    "mode-off": "sk-test-tenant-off",
    "nosystem": "sk-test-tenant-nosystem",
    "openai-only": "sk-test-tenant-openai-only",
    "open": "sk-test-tenant-failopen",
    "require": "sk-test-tenant-require-subject",
    "allow-media": "sk-test-tenant-allow-media",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_policies(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "default.yaml").write_text(
        "tenant: default\nmode: reversible\nsets: [pii, pci, secrets]\nfailMode: closed\n"
    )
    tenants = {
        "strip": "mode: strip",
        "mode-off": "mode: off",
        "nosystem": "redactSystem: false",
        "openai-only": "upstreams: [openai]",
        "open": "failMode: open",
        "require": "requireSubject: true",
        "allow-media": "subjectMedia: allow",
    }
    for name, knob in tenants.items():
        digest = hash_api_key(KEYS[name])
        (directory / f"{name}.yaml").write_text(f'tenant: {name}\napiKeys: ["sha256:{digest}"]\n{knob}\n')


@contextlib.contextmanager
def redis_server(run_dir: Path) -> Iterator[str]:
    port = free_port()
    data = run_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [redis_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not wait_port("127.0.0.1", port, time.monotonic() + 10):
            raise RuntimeError("test Redis did not start")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass
class RunningStack:
    settings: Settings
    upstream: FakeUpstream
    env: dict[str, str]
    stack: Stack
    ca_file: Path = field(default_factory=Path)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.listen_port}"

    @property
    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.settings.tls_port}"


def stack_env(
    run_dir: Path, policy_dir: Path, redis_url: str, upstream_url: str, workers: int = 2
) -> dict[str, str]:
    return {
        **os.environ,
        "RUN_DIR": str(run_dir),
        "POLICY_DIR": str(policy_dir),
        "REDIS_URL": redis_url,
        "OPENAI_UPSTREAM": upstream_url,
        "ANTHROPIC_UPSTREAM": upstream_url,
        "LISTEN_PORT": str(free_port()),
        "TLS_PORT": str(free_port()),
        "ENVOY_ADMIN_PORT": str(free_port()),
        "EXTPROC_PORT": str(free_port()),
        "WORKERS": str(workers),
        "LOG_LEVEL": "INFO",
    }


@contextlib.contextmanager
def running_stack(tmp: Path, *, workers: int = 2) -> Iterator[RunningStack]:
    run_dir = tmp / "run"
    policy_dir = tmp / "policies"
    write_policies(policy_dir)
    with redis_server(run_dir) as redis_url, FakeUpstream() as upstream:
        env = stack_env(run_dir, policy_dir, redis_url, upstream.url, workers)
        settings = Settings.from_env(env)
        saved = os.environ.copy()
        os.environ.update(env)  # the services the stack spawns read the same environment
        stack = Stack(settings, quiet=True)
        try:
            stack.start()
            yield RunningStack(settings, upstream, env, stack, run_dir / "tls" / "ca.pem")
        finally:
            stack.stop()
            os.environ.clear()
            os.environ.update(saved)
