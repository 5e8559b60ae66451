"""The grpcio asyncio server: the only module that touches gRPC.

`serve()` is a supervisor: it starts WORKERS processes that all bind the same port
(SO_REUSEPORT; the kernel spreads Envoy's connections over them), restarts one that dies, and on
SIGTERM/SIGINT asks every worker to drain. A worker serves the ext_proc service and the gRPC
health service, writes `RUN_DIR/extproc/worker-N.ready` once it is SERVING, and on SIGTERM stops
accepting new streams and lets in-flight exchanges (streams included) finish within the grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ext_proc.audit.metrics import metrics_dir, serve_metrics, write_snapshot
from ext_proc.audit.receipts.store import ReceiptStore
from ext_proc.errors import describe
from ext_proc.exchange.exchange import Exchange
from ext_proc.exchange.runtime import Runtime
from ext_proc.media.ocr import OcrPool
from ext_proc.policy.load import (
    PolicyCheck,
    deployment_check,
    load_policy_dir,
    policy_signature,
    reload_policy_dir,
)
from ext_proc.policy.model import PolicyError, PolicySet
from ext_proc.policy.snapshot import dump_policy_set, load_policy_snapshot
from ext_proc.runtime.config import Settings
from ext_proc.runtime.files import write_atomically
from ext_proc.storage.vault import Vault

log = logging.getLogger("cordon.server")

DRAIN_SECONDS = 20.0
LARGE_BODY_BYTES = 256 * 1024
SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
POLICY_POLL_SECONDS = 1.0
METRICS_SECONDS = 1.0


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        exchange = Exchange(self.runtime)
        try:
            async for request in request_iterator:
                try:
                    async for response in exchange.process(
                        request, offload=_body_size(request) > LARGE_BODY_BYTES
                    ):
                        yield response
                except Exception as exc:
                    # The stream ends with a gRPC error; Envoy, with failure_mode_allow false,
                    # answers 500 (or resets a reply stream): nothing unprocessed goes through. The
                    # log names the error's type and place only: a message can quote the body.
                    log.error(json.dumps({"event": "exchange_failed", **describe(exc)}))
                    await context.abort(grpc.StatusCode.INTERNAL, "processing failed")
        finally:
            exchange.close()


def _body_size(request: pb.ProcessingRequest) -> int:
    phase = request.WhichOneof("request")
    if phase == "request_body":
        return len(request.request_body.body)
    if phase == "response_body":
        return len(request.response_body.body)
    return 0


def ready_file(settings: Settings, index: int) -> Path:
    return settings.run_dir / "extproc" / f"worker-{index}.ready"


def snapshot_file(settings: Settings) -> Path:
    return settings.run_dir / "extproc" / "policies.last-good.json"


def save_snapshot(settings: Settings, policies: PolicySet) -> None:
    """The set this worker now serves, for a worker restarted while a file is broken."""
    write_atomically(snapshot_file(settings), dump_policy_set(policies))


def log_policy_errors(runtime: Runtime, errors: list[PolicyError]) -> None:
    for error in errors:
        runtime.metrics.inc("cordon_policy_reload_errors_total")
        where = {"file": error.source, "key": error.key}
        log.error(json.dumps({"event": "policy_reload_error", **where, "reason": error.reason}))


def policy_check(settings: Settings) -> PolicyCheck:
    """What this deployment can honour: a tenant with consistent pseudonyms needs TENANT_SECRET."""
    return deployment_check(tenant_secret=settings.tenant_secret is not None)


def initial_policies(settings: Settings) -> tuple[PolicySet, list[PolicyError]]:
    """The strict load; if a file broke since the server started (this is a restarted worker),
    the last good set the other workers serve, with every file that still loads applied, and
    the errors of those that do not."""
    check = policy_check(settings)
    try:
        policies = load_policy_dir(settings.policy_dir, check=check)
    except PolicyError as first:
        try:
            previous = load_policy_snapshot(snapshot_file(settings).read_text())
        except (OSError, ValueError, TypeError, KeyError):
            raise first from None
        policies, errors = reload_policy_dir(settings.policy_dir, previous, check=check)
        log.warning(json.dumps({"event": "policy_last_good_kept", "tenants": sorted(policies.tenants)}))
        return policies, errors
    save_snapshot(settings, policies)
    return policies, []


async def watch_policies(
    settings: Settings, runtime: Runtime, wake: asyncio.Event, signature: tuple[tuple[str, int, int], ...]
) -> None:
    """Reload the policy directory when a file changes (polled) or on SIGHUP (`wake`).

    `signature` is the directory as it was just before this worker loaded it, so an edit made while
    the worker started is seen. A file that no longer loads keeps its last good version; the reason
    is logged (file, key, reason: never a value). So is one this deployment cannot honour
    (`consistentPseudonyms: true` without TENANT_SECRET).
    """
    check = policy_check(settings)
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(POLICY_POLL_SECONDS):
                await wake.wait()
        forced = wake.is_set()
        wake.clear()
        current = policy_signature(settings.policy_dir)
        if current == signature and not forced:
            continue
        signature = current
        try:
            policies, errors = reload_policy_dir(settings.policy_dir, runtime.policies, check=check)
        except Exception as exc:  # a bug here must not end reloading for good: keep the set, say so
            runtime.metrics.inc("cordon_policy_reload_errors_total")
            log.error(json.dumps({"event": "policy_reload_failed", "error": type(exc).__name__}))
            signature = ()  # and try again at the next poll
            continue
        log_policy_errors(runtime, errors)
        if policies != runtime.policies:
            runtime.policies = policies
            runtime.metrics.inc("cordon_policy_reloads_total")
            log.info(json.dumps({"event": "policy_reloaded", "tenants": sorted(policies.tenants)}))
            try:
                save_snapshot(settings, policies)
            except OSError as exc:
                log.warning(json.dumps({"event": "policy_snapshot_failed", "error": type(exc).__name__}))


async def publish_metrics(settings: Settings, runtime: Runtime, index: int) -> None:
    """This worker's counters to RUN_DIR for the supervisor's /metrics, about once a second."""
    while True:
        try:
            write_snapshot(runtime.metrics, settings.run_dir, index)
        except OSError as exc:
            log.warning(json.dumps({"event": "metrics_write_failed", "error": type(exc).__name__}))
        await asyncio.sleep(METRICS_SECONDS)


async def run_worker(settings: Settings, index: int) -> None:
    store = ReceiptStore.from_url(settings.effective_redis_url, timeout=settings.redis_timeout)
    vault = (
        Vault.from_url(
            settings.effective_redis_url, secret=settings.tenant_secret, timeout=settings.redis_timeout
        )
        if settings.tenant_secret is not None
        else None
    )
    signature = policy_signature(settings.policy_dir)
    policies, errors = initial_policies(settings)
    runtime = Runtime(
        policies=policies,
        admin_token=settings.admin_token,
        receipts=store,
        receipt_secret=settings.load_receipt_secret(),
        trust_tenant_header=settings.trust_tenant_header,
        ocr=OcrPool(settings.ocr_workers, settings.ocr_budget_seconds, settings.ocr_max_images),
        vault=vault,
    )
    log_policy_errors(runtime, errors)
    limit = settings.grpc_message_limit
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(runtime), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{settings.extproc_address}:{settings.extproc_port}"
    if server.add_insecure_port(address) == 0:
        raise SystemExit(f"worker {index}: cannot bind {address}")
    await server.start()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    marker = ready_file(settings, index)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    log.info('{"event":"worker_serving","worker":%d,"pid":%d}', index, os.getpid())

    stop = asyncio.Event()
    reload = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload.set)
    watcher = asyncio.create_task(watch_policies(settings, runtime, reload, signature))
    publisher = asyncio.create_task(publish_metrics(settings, runtime, index))
    await stop.wait()
    watcher.cancel()
    with contextlib.suppress(FileNotFoundError):
        marker.unlink()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(DRAIN_SECONDS)
    publisher.cancel()
    write_snapshot(runtime.metrics, settings.run_dir, index)
    await store.aclose()
    if vault is not None:
        await vault.aclose()
    if runtime.ocr is not None:
        runtime.ocr.shutdown()
    log.info('{"event":"worker_stopped","worker":%d}', index)


def worker_main(settings: Settings, index: int) -> int:
    asyncio.run(run_worker(settings, index))
    return 0


def serve(settings: Settings) -> int:
    """Supervise WORKERS worker processes until SIGTERM/SIGINT; restart any that dies."""
    # A bad policy (or one this deployment cannot honour) is a startup error here, not in N workers.
    load_policy_dir(settings.policy_dir, check=policy_check(settings))
    settings.load_receipt_secret(create=True)  # made once here, read by every worker
    for stale in (settings.run_dir / "extproc").glob("worker-*.ready"):
        stale.unlink()
    for stale in metrics_dir(settings.run_dir).glob("worker-*"):
        stale.unlink()  # counters start from zero with the server
    try:
        metrics_server = serve_metrics(settings.run_dir, settings.extproc_address, settings.metrics_port)
    except OSError as exc:
        raise SystemExit(f"cannot serve metrics on port {settings.metrics_port}: {exc.strerror}") from None
    stopping = False

    def start(index: int) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "ext_proc", "serve", "--worker-index", str(index)]
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
    return 0
