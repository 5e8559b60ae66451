"""The benchmark's own parts (tests/bench/), cheaply: its HTTP client against the in-process fake
upstream (content-length and chunked replies, keep-alive), the requests it sends, the floors (the
pass-through server of tests/bench/floor.py, the listeners Envoy gets for it) and how the table
reads them. No timings."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from ext_proc.detect.subjects.header import parse_subject_header
from ext_proc.runtime import bootstrap
from ext_proc.runtime.config import ConfigError, Settings, parse_upstream
from ext_proc.runtime.stack import Stack, StackError
from tests.bench import bodies, client, in_process, run, stack_lines, table
from tests.bench.floor import BUFFERED, STREAMED, floor_process
from tests.support.e2e import PERSON, SAMPLES
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import assert_envoy_accepts, free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream(max_received=8) as upstream:
        yield upstream


def chat(**extra: object) -> bytes:
    return json.dumps(
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}], **extra}
    ).encode()


def test_content_length_replies_on_one_kept_alive_connection(fake: FakeUpstream) -> None:
    async def two() -> list[client.Reply]:
        connection = client.HttpConnection("127.0.0.1", fake.port)
        try:
            request = client.build_request(bodies.CHAT, chat(), {"x-fake-reply": "ok"})
            first = await connection.send(request, keep=True)
            writer = connection._writer
            second = await connection.send(request, keep=True)
            assert connection._writer is writer  # the same connection carried both
            return [first, second]
        finally:
            connection.close()

    for reply in asyncio.run(two()):
        assert reply.status == 200
        assert json.loads(reply.body)["choices"][0]["message"]["content"] == "ok"


def test_chunked_reply_is_read_whole_and_seen_as_it_arrives(fake: FakeUpstream) -> None:
    pieces: list[bytes] = []
    request = client.build_request(bodies.CHAT, chat(stream=True), {"x-fake-chunk-bytes": "7"})
    reply = asyncio.run(client.send(fake.port, request, keep=True, on_body=pieces.append))
    assert reply.status == 200
    assert len(pieces) > 10  # chunk by chunk, 7 bytes each
    assert b"".join(pieces) == reply.body
    assert reply.body.endswith(b"data: [DONE]\n\n")
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in reply.body.split(b"\n")
        if line.startswith(b"data: {")
    )
    assert text == "You said: hello"


def test_error_status_and_get(fake: FakeUpstream) -> None:
    missing = asyncio.run(client.send(fake.port, client.build_request("/v1/nowhere", b"{}"), keep=True))
    assert missing.status == 404
    assert json.loads(missing.body)["error"]
    health = asyncio.run(client.get(fake.port, "/_fake/health"))
    assert health.status == 200 and json.loads(health.body)["ok"] is True


def test_closed_loop_counts_answers(fake: FakeUpstream) -> None:
    request = client.build_request(bodies.CHAT, chat(), {"x-fake-reply": "ok"})
    load = asyncio.run(client.closed_loop(fake.port, [request], 2, 0.2))
    assert load.done > 0 and load.failed == 0
    assert load.statuses == {200: load.done} and len(load.latencies) == load.done


@pytest.mark.parametrize("head", [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n"])
def test_a_head_that_is_not_http_is_an_error(head: bytes) -> None:
    with pytest.raises(client.HttpError):
        client._parse_head(head)


def test_chunked_and_length_heads() -> None:
    assert client._parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n") == (200, 12, False, False)
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    assert client._parse_head(chunked) == (200, None, True, True)


def test_the_bench_requests() -> None:
    """About 8 KB, dense with catalog values and the declared person's; a header of 8 subjects."""
    body = bodies.chat_body(8 * bodies.KB, per_message=2 * bodies.KB, person=True)
    assert 7 * bodies.KB < len(body) < 9 * bodies.KB
    catalog, person = bodies.values_in(body)
    assert catalog >= 30 and person >= 10
    assert SAMPLES["EMAIL"] in body.decode() and PERSON["names"][0] in body.decode()
    header = parse_subject_header(bodies.subject_header())
    assert len(header.subjects) == 8
    one_field = json.loads(bodies.chat_body(bodies.MB, per_message=bodies.MB))
    assert [m["role"] for m in one_field["messages"]] == ["system", "user"]
    assert table.percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert table.percentile([float(i) for i in range(100)], 0.99) == 98.0


def test_fresh_requests_differ_in_every_message_and_keep_their_size() -> None:
    """Cold lines send strings the processor has never seen; the conversation line varies only the
    last turn, as an agent resending its history does."""
    fresh = bodies.Fresh(bodies.chat_body(8 * bodies.KB, per_message=2 * bodies.KB, person=True))
    first, second = fresh(), fresh()
    assert len(first) == len(second) and bodies.MARK not in first
    one, two = (json.loads(raw)["messages"] for raw in (first, second))
    assert all(a["content"] != b["content"] for a, b in zip(one[1:], two[1:], strict=True))
    assert one[0] == two[0]  # the system prompt carries no mark
    history = bodies.Fresh(
        bodies.chat_body(8 * bodies.KB, per_message=2 * bodies.KB, person=True, marked="last")
    )
    one, two = (json.loads(history())["messages"] for _ in range(2))
    assert one[:-1] == two[:-1] and one[-1] != two[-1]
    with pytest.raises(ValueError):
        bodies.Fresh(b"no mark here")


def test_the_in_process_measurements_run() -> None:
    """The pipeline and SSE lines call the processor's own functions: they still fit (no timings)."""
    once = in_process.pipeline_timer()
    pieces = once(bodies.chat_body(8 * bodies.KB, per_message=2 * bodies.KB, person=True))
    assert len(pieces) == 4 and all(seconds >= 0 for seconds in pieces)
    rows = in_process.sse_restore(table.Plan.for_run(quick=True))  # checks the restored text itself
    assert len(rows) == 3 and all(row.samples and row.target is not None for row in rows)


# --- the floors -----------------------------------------------------------------------------------


def headers(content_type: bytes | None = None) -> pb.HttpHeaders:
    message = pb.HttpHeaders()
    if content_type is not None:
        message.headers.headers.append(base_pb2.HeaderValue(key="content-type", raw_value=content_type))
    return message


def test_the_floor_server_continues_every_phase_and_counts_streams() -> None:
    """Each message is answered in its own phase, unchanged; a streamed reply is switched to
    STREAMED only where the filter buffers reply bodies; the streams' lengths come back at the end."""
    first = pb.ProcessingRequest(request_headers=headers())
    first.protocol_config.response_body_mode = BUFFERED
    json_reply = [
        first,
        pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True)),
        pb.ProcessingRequest(response_headers=headers(b"application/json")),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"{}", end_of_stream=True)),
    ]
    sse = pb.ProcessingRequest(response_headers=headers(b"text/event-stream; charset=utf-8"))
    with floor_process() as server, grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        replies = list(stub.Process(iter(json_reply)))
        assert [r.WhichOneof("response") for r in replies] == [m.WhichOneof("request") for m in json_reply]
        for reply in replies:
            assert not reply.HasField("mode_override")
            phase = getattr(reply, reply.WhichOneof("response"))
            assert phase.response == pb.CommonResponse()  # nothing changed, nothing refused
        (*_, switched) = stub.Process(iter([first, json_reply[1], sse]))
        assert switched.mode_override.response_body_mode == STREAMED
        (*_, kept) = stub.Process(iter([pb.ProcessingRequest(request_headers=headers()), sse]))
        assert not kept.HasField("mode_override")  # a floor-2 stream: its filter sends no bodies
    assert server.shapes == {4: 1, 3: 1, 2: 1}


FLOOR_ENV = {
    "OPENAI_UPSTREAM": "http://127.0.0.1:18080",
    "ANTHROPIC_UPSTREAM": "http://127.0.0.1:18080",
    "BENCH_FLOOR2_PORT": "18112",
    "BENCH_FLOOR4_PORT": "18113",
    "BENCH_FLOOR_EXTPROC_PORT": "18114",
}


def rendered(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    settings = Settings.from_env(
        {"RUN_DIR": str(tmp / "run"), "ENVOY_ACCESS_LOG": str(tmp / "access.log"), **env}
    )
    cert, key, _ = bootstrap.ensure_tls_material(settings)
    openai, anthropic = (parse_upstream(name, "http://127.0.0.1:18080") for name in ("openai", "anthropic"))
    text = bootstrap.render(
        settings, openai=openai, anthropic=anthropic, cert=cert.resolve(), key=key.resolve()
    )
    (tmp / "envoy.yaml").write_text(text)
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def test_floor_listeners_and_their_cluster(tmp_path: Path) -> None:
    """BENCH_FLOOR2_PORT / BENCH_FLOOR4_PORT: one listener each, the plain listener's routes, an
    ext_proc filter with fixed body modes to the `bench_floor` cluster (HTTP/2, loopback); the real
    Envoy accepts it. Without them nothing of it is rendered."""
    without = rendered(tmp_path, {k: v for k, v in FLOOR_ENV.items() if "FLOOR" not in k})
    assert "bench_floor" not in json.dumps(without)
    doc = rendered(tmp_path, FLOOR_ENV)
    listeners = {listener["name"]: listener for listener in doc["static_resources"]["listeners"]}
    assert set(listeners) == {"plain", "tls", "bench_floor2", "bench_floor4"}

    def manager(name: str) -> dict[str, Any]:
        config: dict[str, Any] = listeners[name]["filter_chains"][0]["filters"][0]["typed_config"]
        return config

    for name, port, body in (("bench_floor2", 18112, "NONE"), ("bench_floor4", 18113, "BUFFERED")):
        assert listeners[name]["address"]["socket_address"]["port_value"] == port
        assert manager(name)["route_config"] == manager("plain")["route_config"]
        ext_proc, router = manager(name)["http_filters"]
        assert router["name"] == "envoy.filters.http.router"
        config = ext_proc["typed_config"]
        assert config["grpc_service"]["envoy_grpc"]["cluster_name"] == "bench_floor"
        assert config["failure_mode_allow"] is False
        modes = config["processing_mode"]
        assert (modes["request_header_mode"], modes["response_header_mode"]) == ("SEND", "SEND")
        assert (modes["request_body_mode"], modes["response_body_mode"]) == (body, body)
    clusters = {cluster["name"]: cluster for cluster in doc["static_resources"]["clusters"]}
    floor = clusters["bench_floor"]
    endpoint = floor["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 18114}
    options = floor["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2_protocol_options" in options["explicit_http_config"]
    assert_envoy_accepts(tmp_path / "envoy.yaml")


def test_a_floor_listener_needs_its_server_and_a_free_port(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="BENCH_FLOOR_EXTPROC_PORT"):
        Settings.from_env({"BENCH_FLOOR4_PORT": "18113"})
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        env = {name: str(free_port()) for name in ("LISTEN_PORT", "TLS_PORT", "ENVOY_ADMIN_PORT")}
        env |= {"EXTPROC_PORT": str(free_port()), "WORKERS": "1", "METRICS_PORT": str(free_port())}
        env["RUN_DIR"] = str(tmp_path)
        env |= {**FLOOR_ENV, "REDIS_URL": "redis://127.0.0.1:1/0", "BENCH_FLOOR2_PORT": str(taken)}
        with pytest.raises(StackError, match="BENCH_FLOOR2_PORT"):
            Stack(Settings.from_env(env), quiet=True)._check_ports()


def test_the_floors_in_the_table() -> None:
    """A line's details: filtered against Envoy alone, then its added time in floors' added times."""
    at = {
        "filtered": [9.0, 9.2],
        "unfiltered": [2.0, 2.0],
        "floor-4": [4.3, 4.3],
        "floor-2": [3.6, 3.6],
    }
    assert stack_lines.added(at["filtered"], at["unfiltered"]) == pytest.approx([7.0, 7.2])
    assert stack_lines.against_floors(at) == (
        "filtered 9.10 / Envoy alone 2.00 ms (×4.5); ×3.1 of floor-4 (+2.30 ms), ×4.4 of floor-2 (+1.60 ms)"
    )
    note = run.floor_note({2: 10, 4: 12, 9: 1})
    assert "10 of 2, 12 of 4, 1 of 9" in note
    before = stack_lines.cpu_seconds([os.getpid()])
    sum(i * i for i in range(3_000_000))  # a little CPU time, enough for a clock tick or more
    assert stack_lines.cpu_seconds([os.getpid()]) > before
    assert stack_lines.cpu_seconds([2**22 + 1]) == 0  # a process that is gone counts nothing
