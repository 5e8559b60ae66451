"""A worker's gRPC health (`grpc.health.v1.Health/Check`) asked over plain HTTP/2, without grpcio.

The processes that only wait for the workers (`stack run`, a container's health check) would load
grpcio and the protobuf runtime, more than a dozen MiB kept for their whole life, for one small
call. This speaks the part of HTTP/2 (cleartext, prior knowledge) that call needs: one stream, its
headers sent as HPACK literals, the protobuf request and response written and read by hand.

The answer is the status of the response message. Header blocks that come back are not decoded,
so the call's own status (in the trailers) is not read: a call that fails ends without a message
(an unknown service on the workers' asyncio servicer, a reset, a server going away), or, from
grpcio's synchronous servicer, with a message left at the default status UNKNOWN. Neither reads
as serving, which is all the callers ask.
"""

from __future__ import annotations

import socket
import time

SERVING = 1  # HealthCheckResponse.ServingStatus
_PATH = "/grpc.health.v1.Health/Check"
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x6, 0x9
_END_STREAM, _ACK, _END_HEADERS, _PADDED = 0x1, 0x1, 0x4, 0x8
_STREAM = 1
_MAX_FRAME = 1 << 24  # the largest length a frame header can state
_MAX_REPLY = 1 << 16  # a health reply is a few bytes: more is not a health server


class _Malformed(ValueError):
    pass


def _hpack_int(value: int, prefix_bits: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = bytearray([limit])
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A header as an HPACK literal without indexing, new name, no Huffman coding."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(raw_name), 7) + raw_name + _hpack_int(len(raw_value), 7) + raw_value


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def request(authority: str, service: str) -> bytes:
    """Everything the client sends: the preface, its settings, and the call as one stream."""
    headers = b"".join(
        _literal(name, value)
        for name, value in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", _PATH),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    name = service.encode()
    message = b"\x0a" + _varint(len(name)) + name if name else b""  # HealthCheckRequest.service = 1
    body = b"\x00" + len(message).to_bytes(4, "big") + message  # not compressed, length, message
    return (
        _PREFACE
        + _frame(_SETTINGS, 0, 0)
        + _frame(_HEADERS, _END_HEADERS, _STREAM, headers)
        + _frame(_DATA, _END_STREAM, _STREAM, body)
    )


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Malformed("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def status_of(reply: bytes) -> int | None:
    """The `status` of the gRPC message `reply` (its 5-byte prefix included); None without one."""
    if len(reply) < 5 or reply[0] != 0:  # no message, or a compressed one (never asked for)
        return None
    length = int.from_bytes(reply[1:5], "big")
    message = reply[5 : 5 + length]
    if len(message) != length:
        return None
    status, pos = 0, 0  # proto3 leaves a field at its default (UNKNOWN) out
    while pos < len(message):
        key, pos = _read_varint(message, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(message, pos)
            if field == 1:
                status = value
        elif wire == 2:
            size, pos = _read_varint(message, pos)
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise _Malformed("unknown wire type")
        if pos > len(message):
            raise _Malformed("truncated field")
    return status


def _recv(sock: socket.socket, size: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in time")
        sock.settimeout(left)
        chunk = sock.recv(size - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


def _reply(sock: socket.socket, deadline: float) -> bytes:
    """The DATA of stream 1 up to its end; settings and pings are acknowledged on the way."""
    data = bytearray()
    ending = False
    while True:
        header = _recv(sock, 9, deadline)
        length, kind, flags = int.from_bytes(header[:3], "big"), header[3], header[4]
        stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
        if length > _MAX_FRAME:
            raise _Malformed("frame too long")
        payload = _recv(sock, length, deadline)
        if kind == _SETTINGS and not flags & _ACK:
            sock.sendall(_frame(_SETTINGS, _ACK, 0))
        elif kind == _PING and not flags & _ACK:
            sock.sendall(_frame(_PING, _ACK, 0, payload))
        elif stream != _STREAM:
            continue  # window updates, the connection's GOAWAY: an end shows as a closed socket
        elif kind == _RST_STREAM:
            raise ConnectionError("stream reset")
        elif kind == _DATA:
            if flags & _PADDED:
                if not payload or payload[0] >= len(payload):
                    raise _Malformed("bad padding")
                payload = payload[1 : len(payload) - payload[0]]
            data += payload
            if len(data) > _MAX_REPLY:
                raise _Malformed("reply too long")
            if flags & _END_STREAM:
                return bytes(data)
        elif kind in (_HEADERS, _CONTINUATION):
            # Trailers end the stream; a block may continue in CONTINUATION frames.
            ending = ending or (kind == _HEADERS and bool(flags & _END_STREAM))
            if ending and flags & _END_HEADERS:
                return bytes(data)


def health_status(host: str, port: int, service: str = "", timeout: float = 1.0) -> int | None:
    """The status a worker's health service answers for `service` (1 SERVING, 2 NOT_SERVING), or
    None when it answers none within `timeout` seconds (nothing listening, an unknown service, a
    reset, a reply that is not a health reply)."""
    deadline = time.monotonic() + timeout
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(request(authority, service))
            return status_of(_reply(sock, deadline))
    except (OSError, _Malformed):
        return None


def serving(host: str, port: int, service: str = "", timeout: float = 1.0) -> bool:
    return health_status(host, port, service, timeout) == SERVING
