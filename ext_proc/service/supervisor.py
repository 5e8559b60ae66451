"""The supervisor: `serve` starts WORKERS worker processes and keeps them running.

Worker i listens on EXTPROC_PORT + i, and Envoy's ext_proc cluster lists every one of those
ports, so Envoy, not the kernel, spreads the exchanges over the workers. The supervisor holds
each port for its worker (see `reserve_ports`), serves `/metrics` (the workers' counters summed),
restarts a worker that dies (backing off one that keeps dying), passes SIGHUP on (a policy
reload), and on SIGTERM or SIGINT asks every worker to drain and waits for them within the grace.

It does no exchange work, so it imports none of the workers' modules (gRPC, protobuf, the
detectors, Redis): it stays a small process. The startup policy check runs in a short-lived child
for the same reason (`ext_proc.policy.precheck`).
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import subprocess
import sys
import time

from ext_proc.audit.metrics import metrics_dir, serve_metrics
from ext_proc.policy.precheck import check_policy_dir
from ext_proc.runtime.config import Settings
from ext_proc.service.contract import DRAIN_SECONDS, PORT_TAKEN, ready_file

log = logging.getLogger("cordon.server")


def reserve_ports(settings: Settings) -> list[socket.socket]:
    """One bound, never listening socket on every worker's port, kept while the server runs.

    A worker's listener still binds beside it (both set SO_REUSEADDR and only one listens), but
    the kernel never picks a bound port as the source port of an outgoing connection: between a
    worker dying and its replacement binding, no connection of this host can take its port. A
    port something already listens on fails here, before any worker starts.
    """
    host = settings.extproc_address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held: list[socket.socket] = []
    for index, port in enumerate(settings.extproc_ports):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            for other in held:
                other.close()
            where = f"port {port} (worker {index}, EXTPROC_PORT + {index})"
            if exc.errno == errno.EADDRINUSE:
                raise SystemExit(
                    f"cannot serve ext_proc: {where} is taken; set EXTPROC_PORT or stop what holds it"
                ) from None
            raise SystemExit(f"cannot serve ext_proc on {host}, {where}: {exc.strerror}") from None
        held.append(sock)
    return held


def serve(settings: Settings) -> int:
    """Supervise WORKERS worker processes until SIGTERM/SIGINT; restart any that dies."""
    # A bad policy (or one this deployment cannot honour) is a startup error here, not in N workers.
    check_policy_dir(settings.policy_dir, tenant_secret=settings.tenant_secret is not None)
    settings.load_receipt_secret(create=True)  # made once here, read by every worker
    for stale in (settings.run_dir / "extproc").glob("worker-*.ready"):
        stale.unlink()
    for stale in metrics_dir(settings.run_dir).glob("worker-*"):
        stale.unlink()  # counters start from zero with the server
    held = reserve_ports(settings)
    try:
        metrics_server = serve_metrics(settings.run_dir, settings.extproc_address, settings.metrics_port)
    except OSError as exc:
        raise SystemExit(f"cannot serve metrics on port {settings.metrics_port}: {exc.strerror}") from None
    stopping = False
    failure = ""

    def start(index: int) -> subprocess.Popen[bytes]:
        # The port and the count travel with the command: `serve --port/--workers` override the
        # environment the workers would otherwise read.
        command = [sys.executable, "-m", "ext_proc", "serve", "--worker-index", str(index)]
        command += ["--port", str(settings.extproc_port), "--workers", str(settings.workers)]
        return subprocess.Popen(command)

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    def on_hangup(signum: int, frame: object) -> None:
        for process in workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGHUP)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Ignored until every worker exists; the workers inherit "ignored" through exec, so a SIGHUP
    # that reaches one still starting does not kill it (its event loop takes SIGHUP over later).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    workers = {index: start(index) for index in range(settings.workers)}
    signal.signal(signal.SIGHUP, on_hangup)
    restarts: dict[int, float] = {}
    while not stopping:
        time.sleep(0.2)
        for index, process in list(workers.items()):
            code = process.poll()
            if code is None or stopping:
                continue
            if code == PORT_TAKEN:
                port = settings.extproc_ports[index]
                failure = f"cannot serve ext_proc: port {port} (worker {index}) is taken by another listener"
                stopping = True
                break
            # Back off a worker that keeps dying, so a crash loop does not eat the machine.
            last = restarts.get(index, 0.0)
            if time.monotonic() - last < 1.0:
                time.sleep(1.0)
            log.warning('{"event":"worker_exited","worker":%d,"code":%d,"restarting":true}', index, code)
            ready_file(settings, index).unlink(missing_ok=True)  # ready again when the new one says so
            restarts[index] = time.monotonic()
            workers[index] = start(index)
    for process in workers.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + DRAIN_SECONDS + 5
    for process in workers.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
    metrics_server.shutdown()
    for sock in held:
        sock.close()
    if failure:
        raise SystemExit(failure)
    return 0
