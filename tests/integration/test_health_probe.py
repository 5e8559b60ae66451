"""The gRPC health probe without grpcio (ext_proc.service.health_probe) against grpcio's own health
servers, the asyncio one the workers run and the synchronous one: it answers what grpcio's client
answers, and a port that does not speak gRPC health is never serving."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ext_proc.runtime.stack import grpc_serving
from ext_proc.service.health_probe import SERVING, health_status, request, serving, status_of

STATUSES = {
    "": health_pb2.HealthCheckResponse.SERVING,
    "liveness": health_pb2.HealthCheckResponse.NOT_SERVING,
    "envoy.service.ext_proc.v3.ExternalProcessor": health_pb2.HealthCheckResponse.SERVING,
    "s" * 300: health_pb2.HealthCheckResponse.SERVING,  # a name longer than one HPACK length byte
    "gone": health_pb2.HealthCheckResponse.SERVICE_UNKNOWN,
    "unset": health_pb2.HealthCheckResponse.UNKNOWN,
}


def grpcio_status(port: int, service: str) -> int | None:
    """What grpcio's client says: the reply's status, None when the call fails."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2
            )
        except grpc.RpcError:
            return None
    return int(reply.status)


@contextlib.contextmanager
def sync_server() -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    for service, status in STATUSES.items():
        servicer.set(service, status)
    try:
        yield port
    finally:
        server.stop(0)


@contextlib.contextmanager
def aio_server() -> Iterator[int]:
    """grpcio's asyncio server and health servicer, as a worker runs them, on a thread's loop."""
    loop = asyncio.new_event_loop()
    started: list[int] = []
    stop = asyncio.Event()

    async def serve() -> None:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        for service, status in STATUSES.items():
            await servicer.set(service, status)
        started.append(port)
        await stop.wait()
        await server.stop(0)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started, "the asyncio health server did not start"
    try:
        yield started[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


@pytest.mark.parametrize("server", [sync_server, aio_server], ids=["sync", "aio"])
def test_serving_agrees_with_grpcio_for_every_status(
    server: Callable[[], contextlib.AbstractContextManager[int]],
) -> None:
    with server() as port:
        for service in [*STATUSES, "never-registered"]:
            expected = grpcio_status(port, service)
            assert serving("127.0.0.1", port, service) == (expected == SERVING), service
            if expected is not None:
                assert health_status("127.0.0.1", port, service) == expected, service
        assert grpc_serving("0.0.0.0", port)  # a wildcard address is asked on loopback
        assert not grpc_serving("127.0.0.1", port, "liveness")


def test_an_unknown_service_on_the_workers_servicer_is_no_answer() -> None:
    """The asyncio servicer aborts the call (NOT_FOUND): no message, no status."""
    with aio_server() as port:
        assert health_status("127.0.0.1", port, "never-registered") is None


def test_nothing_listening_is_not_serving() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        assert health_status("127.0.0.1", port) is None


@contextlib.contextmanager
def raw_server(answer: bytes | None) -> Iterator[int]:
    """A listener that reads what comes and sends `answer` (None: nothing, the connection open)."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def run() -> None:
        listener.settimeout(5)
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                if answer is not None:
                    conn.sendall(answer)
                done.wait(5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        listener.close()


def test_a_silent_server_is_not_serving_within_the_timeout() -> None:
    with raw_server(None) as port:
        start = time.monotonic()
        assert health_status("127.0.0.1", port, timeout=0.3) is None
        assert time.monotonic() - start < 2


def test_a_server_that_does_not_speak_http2_is_not_serving() -> None:
    with raw_server(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n") as port:
        assert health_status("127.0.0.1", port, timeout=0.5) is None


def test_the_request_and_reply_encodings() -> None:
    sent = request("127.0.0.1:50051", "liveness")
    assert sent.startswith(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert sent.endswith(b"\x00\x00\x00\x00\x0a\x0a\x08liveness")  # gRPC prefix, field 1, "liveness"
    assert status_of(b"\x00\x00\x00\x00\x02\x08\x01") == 1
    assert status_of(b"\x00\x00\x00\x00\x00") == 0  # the default status is left out
    assert status_of(b"\x00\x00\x00\x00\x05\x12\x01x\x08\x02") == 2  # an unknown field skipped
    assert status_of(b"") is None
    assert status_of(b"\x01\x00\x00\x00\x02\x08\x01") is None  # compressed: never asked for
    assert status_of(b"\x00\x00\x00\x00\x05\x08\x01") is None  # shorter than it says
