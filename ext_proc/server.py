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

from ext_proc.config import Settings
from ext_proc.errors import describe
from ext_proc.exchange import Exchange, Runtime
from ext_proc.policy import load_policy_dir

log = logging.getLogger("cordon.server")

DRAIN_SECONDS = 20.0
LARGE_BODY_BYTES = 256 * 1024
SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        exchange = Exchange(self.runtime)
        async for request in request_iterator:
            try:
                if _body_size(request) > LARGE_BODY_BYTES:
                    # Reading a large body takes long enough to starve the health checks and the
                    # other exchanges of this worker; a thread keeps the event loop answering.
                    response = await asyncio.to_thread(exchange.handle, request)
                else:
                    response = exchange.handle(request)
            except Exception as exc:
                # The stream ends with a gRPC error; Envoy, with failure_mode_allow false, answers
                # 500 (or resets a reply stream): nothing unprocessed goes through. The log names
                # the error's type and place only: an exception's message can quote the body.
                log.error(json.dumps({"event": "exchange_failed", **describe(exc)}))
                await context.abort(grpc.StatusCode.INTERNAL, "processing failed")
            if response is not None:
                yield response


def _body_size(request: pb.ProcessingRequest) -> int:
    phase = request.WhichOneof("request")
    if phase == "request_body":
        return len(request.request_body.body)
    if phase == "response_body":
        return len(request.response_body.body)
    return 0


def ready_file(settings: Settings, index: int) -> Path:
    return settings.run_dir / "extproc" / f"worker-{index}.ready"


async def run_worker(settings: Settings, index: int) -> None:
    runtime = Runtime(policies=load_policy_dir(settings.policy_dir), admin_token=settings.admin_token)
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
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    with contextlib.suppress(FileNotFoundError):
        marker.unlink()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(DRAIN_SECONDS)
    log.info('{"event":"worker_stopped","worker":%d}', index)


def worker_main(settings: Settings, index: int) -> int:
    asyncio.run(run_worker(settings, index))
    return 0


def serve(settings: Settings) -> int:
    """Supervise WORKERS worker processes until SIGTERM/SIGINT; restart any that dies."""
    load_policy_dir(settings.policy_dir)  # a bad policy is a startup error here, not in N workers
    for stale in (settings.run_dir / "extproc").glob("worker-*.ready"):
        stale.unlink()
    stopping = False

    def start(index: int) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "ext_proc", "serve", "--worker-index", str(index)]
        return subprocess.Popen(command)

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workers = {index: start(index) for index in range(settings.workers)}
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
    return 0
