"""The load generator: a small asyncio HTTP/1.1 client (raw streams, keep-alive connections, request
bytes built once) and its two loops, closed-loop load at a fixed concurrency and sequential requests
for latency at concurrency 1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.bench.bodies import Fresh, next_request


class HttpError(Exception):
    """The server answered something this client does not read (or closed mid-reply)."""


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes


def build_request(
    path: str, body: bytes, headers: dict[str, str] | None = None, *, method: str = "POST"
) -> bytes:
    """Request bytes for any listener: the Host header names no port, so Envoy picks the `*` host."""
    lines = [f"{method} {path} HTTP/1.1", "host: localhost", f"content-length: {len(body)}"]
    lines += [
        f"{name}: {value}" for name, value in {"content-type": "application/json", **(headers or {})}.items()
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class HttpConnection:
    """One keep-alive HTTP/1.1 connection; `send` writes a whole request and reads its reply.

    `on_body` sees the body as it arrives (chunk by chunk for a chunked reply), for time to first
    token; without it the body is kept only when `keep` is set.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        return self._reader, self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def send(
        self, request: bytes, *, keep: bool = False, on_body: Callable[[bytes], None] | None = None
    ) -> Reply:
        reader, writer = await self._open()
        writer.write(request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            status, length, chunked, close = _parse_head(head)
            body = bytearray()

            def take(data: bytes) -> None:
                if on_body is not None:
                    on_body(data)
                if keep:
                    body.extend(data)

            if chunked:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":
                            pass  # trailers
                        break
                    take(await reader.readexactly(size))
                    await reader.readexactly(2)
            elif length is not None:
                take(await reader.readexactly(length))
            elif status not in (204, 304):
                take(await reader.read())  # delimited by close
                close = True
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
            self.close()
            raise HttpError(f"connection to port {self.port} failed mid-reply: {exc!r}") from None
        if close:
            self.close()
        return Reply(status, bytes(body))


def _parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """(status, content-length, chunked, connection: close) of a response head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    length: int | None = None
    chunked = close = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding":
            chunked = "chunked" in value
        elif name == "connection":
            close = "close" in value
    return int(parts[1]), length, chunked, close


@dataclass(slots=True)
class Load:
    done: int
    failed: int
    seconds: float
    latencies: list[float]
    statuses: dict[int, int]

    @property
    def rate(self) -> float:
        return self.done / self.seconds


async def closed_loop(port: int, requests: list[bytes | Fresh], concurrency: int, seconds: float) -> Load:
    """`concurrency` connections, each sending the next request as soon as its reply is in."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    failed = 0
    end = time.perf_counter() + seconds

    async def one(index: int) -> None:
        nonlocal failed
        connection = HttpConnection("127.0.0.1", port)
        n = index
        try:
            while time.perf_counter() < end:
                start = time.perf_counter()
                try:
                    reply = await connection.send(next_request(requests[n % len(requests)]))
                except HttpError:
                    failed += 1
                    continue
                latencies.append(time.perf_counter() - start)
                statuses[reply.status] = statuses.get(reply.status, 0) + 1
                n += 1
        finally:
            connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    ok = statuses.get(200, 0)
    return Load(ok, failed + sum(statuses.values()) - ok, elapsed, latencies, statuses)


# Non-200 answers seen by `sequential`, by (port, status, stage): reported under the table. A
# benchmark keeps going past one; a line whose requests all failed still stops it.
SEQUENTIAL_ERRORS: dict[tuple[int, int, str], int] = {}


async def sequential(port: int, request: bytes | Fresh, n: int) -> list[float]:
    """`n` requests one after another on one keep-alive connection: latency at concurrency 1.

    A non-200 answer is counted in SEQUENTIAL_ERRORS (with the refusal's stage, when it has one)
    and left out of the samples; the connection is opened again after it."""
    connection = HttpConnection("127.0.0.1", port)
    samples = []
    try:
        for _ in range(n):
            raw = next_request(request)
            start = time.perf_counter()
            reply = await connection.send(raw)
            if reply.status == 200:
                samples.append(time.perf_counter() - start)
                continue
            try:
                stage = str(json.loads(reply.body)["error"].get("stage", "-"))
            except (ValueError, KeyError, TypeError, AttributeError):
                stage = "-"
            key = (port, reply.status, stage)
            SEQUENTIAL_ERRORS[key] = SEQUENTIAL_ERRORS.get(key, 0) + 1
            connection.close()
            connection = HttpConnection("127.0.0.1", port)
        if not samples:
            raise HttpError(f"port {port}: every request failed")
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    return samples


async def send(port: int, request: bytes, **kw: Any) -> Reply:
    """One request on a connection of its own, closed after the reply."""
    connection = HttpConnection("127.0.0.1", port)
    try:
        return await connection.send(request, **kw)
    finally:
        connection.close()


async def get(port: int, path: str) -> Reply:
    return await send(port, build_request(path, b"", method="GET"), keep=True)


async def post(port: int, path: str) -> Reply:
    return await send(port, build_request(path, b""), keep=True)
