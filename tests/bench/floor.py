"""The floors of `make bench`: the cheapest Python ext_proc there is, in a process of its own.

`python -m tests.bench.floor` binds a free loopback port, prints it, and answers every message
Envoy sends with an empty response of the same phase (an empty CommonResponse: continue,
unchanged) until its stdin closes; it then prints, as one JSON line, how many streams carried how
many messages, so the bench can show that its floors exchanged 2 and 4. It is built as a worker
of ours is (ext_proc/service/worker.py: grpcio's asyncio server, the xds-protos bindings, one
async generator per stream) and does nothing else, so what our processor adds over it is our
processor's own work, not the protocol's.

One thing besides: when the filter buffers reply bodies (Envoy says so on a stream's first
message), a `text/event-stream` reply is switched to STREAMED at its headers, as ours does.
Buffered, the whole stream would be held back and the floor's time to first token would be the
stream's length.

The bench runs it through `floor_process` (one process: its own core and GIL, as the bench's
fake upstream), and points the `bench_floor` cluster of its Envoy at it (BENCH_FLOOR_EXTPROC_PORT).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from tests.bench.children import port_child

ProcessingMode: TypeAlias = processing_mode_pb2.ProcessingMode
BUFFERED = ProcessingMode.BodySendMode.BUFFERED
STREAMED = ProcessingMode.BodySendMode.STREAMED
# A body travels in one gRPC message: room for the bench's megabyte bodies, should a line send one.
MESSAGE_LIMIT = 64 * 1024 * 1024

# Built once: answering costs the serialisation only.
CONTINUE = {
    "request_headers": pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse())
    ),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse())),
    "response_headers": pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(response=pb.CommonResponse())
    ),
    "response_body": pb.ProcessingResponse(response_body=pb.BodyResponse(response=pb.CommonResponse())),
}
# An override sets both body modes; the request's is past by then.
STREAM_REPLY = pb.ProcessingResponse(
    response_headers=pb.HeadersResponse(response=pb.CommonResponse()),
    mode_override=ProcessingMode(request_body_mode=BUFFERED, response_body_mode=STREAMED),
)


def _event_stream(headers: pb.HttpHeaders) -> bool:
    for header in headers.headers.headers:
        if header.key == "content-type":
            value = header.raw_value or header.value.encode()
            return bool(value.lower().startswith(b"text/event-stream"))
    return False


class Floor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(self) -> None:
        self.shapes: Counter[int] = Counter()  # messages in a stream → streams

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        messages = 0
        buffered_reply = False
        try:
            async for request in request_iterator:
                messages += 1
                if request.HasField("protocol_config"):
                    buffered_reply = request.protocol_config.response_body_mode == BUFFERED
                phase = request.WhichOneof("request")
                if phase == "response_headers" and buffered_reply and _event_stream(request.response_headers):
                    yield STREAM_REPLY
                else:
                    yield CONTINUE[phase]  # a phase the floors never ask for fails the stream: Envoy 500
        finally:
            self.shapes[messages] += 1


async def serve() -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MESSAGE_LIMIT),
            ("grpc.max_send_message_length", MESSAGE_LIMIT),
        ]
    )
    floor = Floor()
    pb_grpc.add_ExternalProcessorServicer_to_server(floor, server)
    port = server.add_insecure_port("127.0.0.1:0")  # bound here: no other process can take it first
    if port == 0:
        raise SystemExit("floor: cannot bind a loopback port")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(1.0)
    print(
        json.dumps({str(messages): streams for messages, streams in sorted(floor.shapes.items())}), flush=True
    )


@dataclass
class FloorServer:
    port: int
    pid: int
    shapes: dict[int, int] = field(default_factory=dict)  # filled once it has stopped


@contextlib.contextmanager
def floor_process() -> Iterator[FloorServer]:
    """The floor server in a child process; yields its port and pid, and its shapes after."""
    with port_child(["-m", "tests.bench.floor"], "the floor ext_proc server") as child:
        server = FloorServer(child.port, child.pid)
        yield server
    with contextlib.suppress(ValueError, IndexError):  # it died: no shapes to show
        server.shapes = {int(k): v for k, v in json.loads(child.output.strip().splitlines()[-1]).items()}


if __name__ == "__main__":
    asyncio.run(serve())
