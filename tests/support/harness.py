"""Start the real stack for end-to-end tests: Redis, the fake upstream, ext_proc workers, Envoy.

Everything listens on free loopback ports and lives under a temporary RUN_DIR, so tests never
collide with a `make run` on the same machine. The fake upstream runs in the test process, so tests
read what it received directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ext_proc.policy.model import hash_api_key
from ext_proc.runtime.config import Settings
from ext_proc.runtime.stack import Stack, envoy_binary, port_free, redis_binary, wait_port
from tests.support.fake_upstream import FakeUpstream

# API keys of the test tenants (invented; the policy files store only their digests).
KEYS = {
    "strip": "sk-test-tenant-strip",
    "mode-off": "sk-test-tenant-off",
    "nosystem": "sk-test-tenant-nosystem",
    "openai-only": "sk-test-tenant-openai-only",
    "open": "sk-test-tenant-failopen",
    "require": "sk-test-tenant-require-subject",
    "allow-media": "sk-test-tenant-allow-media",
    "report": "sk-test-tenant-report-only",
    "override": "sk-test-tenant-header-override",
    "chain": "sk-test-tenant-chain",
    "mask-media": "sk-test-tenant-mask-media",
    "secrets-only": "sk-test-tenant-secrets-only",
    "doc-ips": "sk-test-tenant-doc-ips",
    # Tenants only the stacks that ask for them get (`running_stack(tenants=...)`).
    "pseudonyms": "sk-test-tenant-pseudonyms",
    "pseudonyms-b": "sk-test-tenant-pseudonyms-b",
    "gate-deny": "sk-test-tenant-gate-deny",
    "gate-off": "sk-test-tenant-gate-off",
    "gate-pii": "sk-test-tenant-gate-pii",
    "surrogate": "sk-test-tenant-surrogate",
    "surrogate-b": "sk-test-tenant-surrogate-b",
    "surrogate-deny": "sk-test-tenant-surrogate-deny",
    "extend": "sk-test-tenant-extend",
    "extend-surrogate": "sk-test-tenant-extend-surrogate",
    "media-mask": "sk-test-tenant-media-mask",
    "media-block": "sk-test-tenant-media-block",
    "media-mask-cards": "sk-test-tenant-media-mask-cards",
}
# Test-only secrets (the stack reads them from the environment like a deployment would).
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
RECEIPT_SECRET = "test-receipt-secret-0123456789abcdefghijkl"
TENANT_SECRET = "test-tenant-secret-0123456789abcdefghijklmn"  # set by the stacks that ask for it


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range.

    A port the kernel hands out for `bind(0)` comes from the range it also draws outgoing
    connections' source ports from: between the test picking it and Envoy binding it seconds later,
    one of the suite's own client connections could take it (a clean-clone run lost its whole
    session stack that way). Below that range only listeners compete, and each port is handed out
    once per session."""
    return free_ports(1)


def free_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports (the ext_proc workers' EXTPROC_PORT +
    i), picked as free_port picks one; every port of the run is handed out once per session."""
    low, _ = _ephemeral_range()
    first = 20000 if low > 21000 else 1024
    if low - first < 1000:  # no room below the range: let the kernel choose
        if count != 1:
            raise RuntimeError(f"no room below the ephemeral range ({low}) for {count} consecutive ports")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    for _ in range(200):
        base = random.randrange(first, low - count + 1)
        run = range(base, base + count)
        if any(port in _HANDED_OUT or not port_free("127.0.0.1", port) for port in run):
            continue
        _HANDED_OUT.update(run)
        return base
    raise RuntimeError(f"no {count} free consecutive ports found between {first} and {low}")


def write_policies(directory: Path, extra: Mapping[str, str] | None = None) -> None:
    """The test tenants' policy files, plus `extra` ones (tenant name in KEYS → its knobs)."""
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
        "report": "reportOnly: true",
        "override": "allowHeaderOverride: true",
        "chain": "mode: reversible",
        "mask-media": "subjectMedia: mask",
        "secrets-only": "sets: [secrets]",
        "doc-ips": "skipDocumentationIps: true",
    }
    for name, knob in {**tenants, **(extra or {})}.items():
        digest = hash_api_key(KEYS[name])
        (directory / f"{name}.yaml").write_text(f'tenant: {name}\napiKeys: ["sha256:{digest}"]\n{knob}\n')


@contextlib.contextmanager
def two_stacks(
    tmp: Path, *, tenants: Mapping[str, str] | None = None, **extra: str
) -> Iterator[tuple[RunningStack, RunningStack]]:
    """Two independent stacks (each its own supervisor, workers and Envoy) on one Redis and one
    fake upstream, as two replicas of a deployment would be."""
    with (
        redis_server(tmp / "shared") as server,
        FakeUpstream() as upstream,
        running_stack(tmp / "a", redis=server, upstream=upstream, tenants=tenants, **extra) as a,
        running_stack(tmp / "b", redis=server, upstream=upstream, tenants=tenants, **extra) as b,
    ):
        yield a, b


class RedisProcess:
    """A real redis-server on a free loopback port that a test may kill and start again.

    `persistent` turns on the append-only file with an fsync per write, so a kill -9 loses
    nothing that was acknowledged (what production should run for the receipt chains).
    """

    def __init__(
        self, data_dir: Path, *, persistent: bool = False, extra_args: list[str] | None = None
    ) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.persistent = persistent
        self.extra_args = extra_args or []
        self.process: subprocess.Popen[bytes] | None = None
        data_dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [redis_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        command += ["--dir", str(self.data_dir)]
        if self.persistent:
            command += ["--appendonly", "yes", "--appendfsync", "always"]
        command += self.extra_args
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_port("127.0.0.1", self.port, time.monotonic() + 10):
            raise RuntimeError("test Redis did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None


@contextlib.contextmanager
def redis_server(run_dir: Path, *, persistent: bool = False) -> Iterator[RedisProcess]:
    server = RedisProcess(run_dir / "redis", persistent=persistent)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class RunningStack:
    settings: Settings
    upstream: FakeUpstream
    env: dict[str, str]
    stack: Stack
    ca_file: Path = field(default_factory=Path)
    redis: RedisProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.listen_port}"

    @property
    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.settings.tls_port}"


def stack_env(
    run_dir: Path,
    policy_dir: Path,
    redis_url: str,
    upstream_url: str,
    workers: int = 2,
    **extra: str,
) -> dict[str, str]:
    env = {
        **os.environ,
        "RUN_DIR": str(run_dir),
        "POLICY_DIR": str(policy_dir),
        "REDIS_URL": redis_url,
        "OPENAI_UPSTREAM": upstream_url,
        "ANTHROPIC_UPSTREAM": upstream_url,
        "LISTEN_PORT": str(free_port()),
        "TLS_PORT": str(free_port()),
        "ENVOY_ADMIN_PORT": str(free_port()),
        "EXTPROC_PORT": str(free_ports(workers)),  # worker i listens on EXTPROC_PORT + i
        "METRICS_PORT": str(free_port()),
        "WORKERS": str(workers),
        "LOG_LEVEL": "INFO",
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "RECEIPT_SECRET": RECEIPT_SECRET,
        "TRUST_TENANT_HEADER": "true",
        **extra,
    }
    return {name: value for name, value in env.items() if value != ""}


@contextlib.contextmanager
def running_stack(
    tmp: Path,
    *,
    workers: int = 2,
    redis: RedisProcess | None = None,
    upstream: FakeUpstream | None = None,
    tenants: Mapping[str, str] | None = None,
    **extra: str,
) -> Iterator[RunningStack]:
    """The whole stack on free ports. `redis`/`upstream` may be shared with another stack;
    `tenants` adds policy files (see write_policies); `extra` overrides environment variables (an
    empty string removes one)."""
    run_dir = tmp / "run"
    policy_dir = tmp / "policies"
    write_policies(policy_dir, tenants)
    with contextlib.ExitStack() as resources:
        if redis is None:
            redis = resources.enter_context(redis_server(run_dir))
        if upstream is None:
            upstream = resources.enter_context(FakeUpstream())
        env = stack_env(run_dir, policy_dir, redis.url, upstream.url, workers, **extra)
        settings = Settings.from_env(env)
        saved = os.environ.copy()
        os.environ.clear()
        os.environ.update(env)  # the services the stack spawns read the same environment
        stack = Stack(settings, quiet=True)
        try:
            stack.start()
            yield RunningStack(settings, upstream, env, stack, run_dir / "tls" / "ca.pem", redis)
        finally:
            stack.stop()
            os.environ.clear()
            os.environ.update(saved)


class LateRedisReplies:
    """A TCP proxy in front of a Redis, on its own thread, that can hold back the answers of
    receipt appends (a RESP array whose first element is the integer 1: "appended") for `delay`
    seconds: the script ran in time, its answer arrives after the caller gave up.

    Use as a context manager; `url` is the proxy's REDIS_URL.
    """

    APPENDED = b"*"  # an array reply ...
    APPENDED_STATUS = b":1\r\n"  # ... whose first element is 1

    def __init__(self, port: int) -> None:
        self.port = port
        self.delay = 0.0  # how long an append's answer is held back
        self.every = 0.0  # how long every answer is held back (a slow Redis)
        self.held = 0  # answers of appends held back so far
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LateRedisReplies:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
            ready.set()
            loop.run_forever()
            server.close()
            loop.run_until_complete(server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=serve, name="late-redis", daemon=True)
        self._thread.start()
        ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        if loop is not None:

            async def shutdown() -> None:
                tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                loop.stop()

            asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread is not None:
            self._thread.join(5)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        await relay(self.port, client_r, client_w, self._on_reply)

    async def _on_reply(self, data: bytes) -> bool:
        if self.every:
            await asyncio.sleep(self.every)
        if self.delay and data.startswith(self.APPENDED):
            header_end = data.find(b"\r\n") + 2
            if data[header_end : header_end + 4] == self.APPENDED_STATUS:
                self.held += 1
                await asyncio.sleep(self.delay)
        return True


async def relay(
    port: int,
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    on_reply: Callable[[bytes], Awaitable[bool]],
) -> None:
    """Pipe one client connection to the Redis on `port` and back. `on_reply` sees each chunk of
    Redis's answers before it is passed on (it may hold it back a while) and returns False to cut
    the client off instead: an answer lost with its connection."""
    try:
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        client_w.close()
        return

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, replies: bool) -> None:
        try:
            while data := await src.read(65536):
                if replies and not await on_reply(data):
                    client_w.close()
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    await asyncio.gather(pump(client_r, redis_w, False), pump(redis_r, client_w, True))


# --- Envoy ---------------------------------------------------------------------------------------


def assert_envoy_accepts(path: Path) -> None:
    """The real Envoy accepts the bootstrap at `path` (`--mode validate`)."""
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def envoy_stats(stack: RunningStack, pattern: str) -> dict[str, int]:
    """Envoy's counters and gauges whose names match the regex `pattern`."""
    query = urllib.parse.quote(pattern)
    url = f"http://127.0.0.1:{stack.settings.envoy_admin_port}/stats?filter={query}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and value.strip().lstrip("-").isdigit():
            out[name] = int(value)
    return out
