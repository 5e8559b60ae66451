"""One worker process: the grpcio asyncio server of the ext_proc and health services.

Each gRPC stream from Envoy is one exchange (ext_proc.exchange). The worker writes
`RUN_DIR/extproc/worker-N.ready` once it answers, keeps its policies current, publishes its
metrics for the supervisor, and on SIGTERM stops accepting new streams and lets in-flight
exchanges (streams included) finish within the grace.

gRPC health has two meanings. `liveness` is SERVING while the process answers: a probe that
restarts what fails asks it. The overall service (`""`) and the ext_proc service are readiness:
SERVING only while Redis answers a PING (checked every second), NOT_SERVING while it does not,
since then every exchange that needs a receipt is refused 503; `/readyz` on Envoy's listener is
answered from the same state. A worker whose Redis is unreachable keeps running, not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ext_proc.audit.metrics import Metrics, write_snapshot
from ext_proc.audit.receipts.chain import ReceiptError
from ext_proc.audit.receipts.store import ReceiptStore
from ext_proc.errors import describe
from ext_proc.exchange.exchange import Exchange
from ext_proc.exchange.runtime import Runtime
from ext_proc.media.pool import OcrPool
from ext_proc.policy.load import PolicyCheck, deployment_check
from ext_proc.policy.model import PolicySet
from ext_proc.policy.reload import PolicySource
from ext_proc.runtime.config import Settings
from ext_proc.service.contract import DRAIN_SECONDS, LIVENESS_SERVICE, PORT_TAKEN, ready_file
from ext_proc.storage.vault import Vault

log = logging.getLogger("cordon.server")

LARGE_BODY_BYTES = 256 * 1024
SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
READINESS_SERVICES = ("", SERVICE_NAME)
METRICS_SECONDS = 1.0
READY_SECONDS = 1.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]  # generated, untyped
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


def policy_check(settings: Settings) -> PolicyCheck:
    """What this deployment can honour: a tenant with consistent pseudonyms needs TENANT_SECRET."""
    return deployment_check(tenant_secret=settings.tenant_secret is not None)


def policy_source(settings: Settings, metrics: Metrics) -> PolicySource:
    return PolicySource(
        directory=settings.policy_dir,
        snapshot=settings.run_dir / "extproc" / "policies.last-good.json",
        check=policy_check(settings),
        metrics=metrics,
    )


async def publish_metrics(settings: Settings, runtime: Runtime, index: int) -> None:
    """This worker's counters to RUN_DIR for the supervisor's /metrics, about once a second."""
    while True:
        try:
            write_snapshot(runtime.metrics, settings.run_dir, index)
        except OSError as exc:
            log.warning(json.dumps({"event": "metrics_write_failed", "error": type(exc).__name__}))
        await asyncio.sleep(METRICS_SECONDS)


async def watch_readiness(
    store: ReceiptStore, runtime: Runtime, health_servicer: health.aio.HealthServicer, index: int
) -> None:
    """Readiness follows Redis: a PING every READY_SECONDS (bounded by REDIS_TIMEOUT_MS); the
    first failure makes the worker not ready, the first success ready again. Logged on change."""
    ready: bool | None = None
    while True:
        now = await store.ping()
        runtime.metrics.set_gauge("cordon_ready", 1 if now else 0, worker=str(index))
        if now != ready:
            runtime.ready = now
            status = SERVING if now else NOT_SERVING
            for service in READINESS_SERVICES:
                await health_servicer.set(service, status)
            if now and ready is not None:
                log.info(json.dumps({"event": "worker_ready"}))
            elif not now:
                log.warning(json.dumps({"event": "worker_not_ready", "reason": "redis unreachable"}))
            ready = now
        await asyncio.sleep(READY_SECONDS)


async def watch_chains(
    store: ReceiptStore, metrics: Metrics, seconds: float, retention_days: float | None
) -> None:
    """Every `seconds`: retention first (when set, every chain's records older than it trimmed,
    each chain keeping the anchor of its last trimmed record), then the chains this worker
    appended to: rechecked since its checkpoint, and its last records still there as written (a
    record deleted or edited and the chain re-hashed after it is caught so, not only by the next
    admin query). A broken chain is an alarm: logged (tenant, stream id, reason) and counted; the
    admin query answers 409 for it too."""
    while True:
        await asyncio.sleep(seconds)
        if retention_days is not None:
            await _trim(store, metrics, retention_days)
        for tenant in store.anchored_tenants():
            try:
                result = await store.verify(tenant)
            except ReceiptError:
                continue  # Redis is down or slow: every append says so already
            if not result.ok:
                metrics.inc("cordon_receipt_chain_broken_total", reason=str(result.reason))
                line = {"event": "receipt_chain_broken", "tenant": tenant, "id": result.bad_id}
                log.error(json.dumps({**line, "reason": result.reason}))


async def _trim(store: ReceiptStore, metrics: Metrics, retention_days: float) -> None:
    try:
        tenants = store.anchored_tenants() or ["default"]
        now = await store.redis_now_ms(tenants[0])
        trimmed = await store.trim(now - int(retention_days * 86_400_000))
    except ReceiptError as exc:
        log.warning(json.dumps({"event": "receipt_trim_failed", "reason": str(exc)}))
        return
    for tenant, count in trimmed.items():
        metrics.inc("cordon_receipts_trimmed_total", count, tenant=tenant)
        log.info(json.dumps({"event": "receipts_trimmed", "tenant": tenant, "records": count}))


async def run_worker(settings: Settings, index: int) -> None:
    store = ReceiptStore.from_url(settings.effective_redis_url, timeout=settings.redis_timeout)
    vault = (
        Vault.from_url(
            settings.effective_redis_url, secret=settings.tenant_secret, timeout=settings.redis_timeout
        )
        if settings.tenant_secret is not None
        else None
    )
    metrics = Metrics()
    source = policy_source(settings, metrics)
    signature = source.signature()
    policies = source.initial()
    runtime = Runtime(
        policies=policies,
        admin_token=settings.admin_token,
        receipts=store,
        receipt_secret=settings.load_receipt_secret(),
        trust_tenant_header=settings.trust_tenant_header,
        metrics=metrics,
        ocr=OcrPool(settings.ocr_workers, settings.ocr_budget_seconds, settings.ocr_max_images),
        vault=vault,
        max_body_bytes=settings.max_body_bytes,
    )
    limit = settings.grpc_message_limit
    server = grpc.aio.server(
        options=[
            # grpcio shares a port with any other SO_REUSEPORT listener by default: a second
            # server on this worker's port would then take part of its connections unnoticed.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(runtime), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = settings.extproc_port + index
    host = settings.extproc_address
    try:
        server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    except RuntimeError:
        log.critical(json.dumps({"event": "worker_port_taken", "worker": index, "port": port}))
        raise SystemExit(PORT_TAKEN) from None
    await server.start()
    await health_servicer.set(LIVENESS_SERVICE, SERVING)
    readiness = asyncio.create_task(watch_readiness(store, runtime, health_servicer, index))
    marker = ready_file(settings, index)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    log.info('{"event":"worker_serving","worker":%d,"port":%d,"pid":%d}', index, port, os.getpid())

    stop = asyncio.Event()
    reload = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload.set)

    def apply(policies: PolicySet) -> None:
        runtime.policies = policies

    watcher = asyncio.create_task(source.watch(lambda: runtime.policies, apply, reload, signature))
    publisher = asyncio.create_task(publish_metrics(settings, runtime, index))
    checker = asyncio.create_task(
        watch_chains(store, metrics, settings.receipt_check_seconds, settings.receipt_retention_days)
    )
    await stop.wait()
    watcher.cancel()
    checker.cancel()
    readiness.cancel()
    runtime.ready = False
    metrics.set_gauge("cordon_ready", 0, worker=str(index))
    with contextlib.suppress(FileNotFoundError):
        marker.unlink()
    for service in (*READINESS_SERVICES, LIVENESS_SERVICE):
        await health_servicer.set(service, NOT_SERVING)
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
