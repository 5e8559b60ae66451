"""The benchmark's own parts (tests/bench/run.py), cheaply: its HTTP client against the in-process fake
upstream (content-length and chunked replies, keep-alive), and the requests it sends. No timings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from ext_proc.detect.subjects.header import parse_subject_header
from tests.bench import run as bench
from tests.support.e2e import PERSON, SAMPLES
from tests.support.fake_upstream import FakeUpstream

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
    async def two() -> list[bench.Reply]:
        connection = bench.HttpConnection("127.0.0.1", fake.port)
        try:
            request = bench.build_request(bench.CHAT, chat(), {"x-fake-reply": "ok"})
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
    request = bench.build_request(bench.CHAT, chat(stream=True), {"x-fake-chunk-bytes": "7"})
    reply = asyncio.run(bench._send(fake.port, request, keep=True, on_body=pieces.append))
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
    missing = asyncio.run(bench._send(fake.port, bench.build_request("/v1/nowhere", b"{}"), keep=True))
    assert missing.status == 404
    assert json.loads(missing.body)["error"]
    health = asyncio.run(bench._get(fake.port, "/_fake/health"))
    assert health.status == 200 and json.loads(health.body)["ok"] is True


def test_closed_loop_counts_answers(fake: FakeUpstream) -> None:
    request = bench.build_request(bench.CHAT, chat(), {"x-fake-reply": "ok"})
    load = asyncio.run(bench.closed_loop(fake.port, [request], 2, 0.2))
    assert load.done > 0 and load.failed == 0
    assert load.statuses == {200: load.done} and len(load.latencies) == load.done


@pytest.mark.parametrize("head", [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n"])
def test_a_head_that_is_not_http_is_an_error(head: bytes) -> None:
    with pytest.raises(bench.HttpError):
        bench._parse_head(head)


def test_chunked_and_length_heads() -> None:
    assert bench._parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n") == (200, 12, False, False)
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    assert bench._parse_head(chunked) == (200, None, True, True)


def test_the_bench_requests() -> None:
    """About 8 KB, dense with catalog values and the declared person's; a header of 8 subjects."""
    body = bench.chat_body(8 * bench.KB, per_message=2 * bench.KB, person=True)
    assert 7 * bench.KB < len(body) < 9 * bench.KB
    catalog, person = bench.values_in(body)
    assert catalog >= 30 and person >= 10
    assert SAMPLES["EMAIL"] in body.decode() and PERSON["names"][0] in body.decode()
    header = parse_subject_header(bench.subject_header())
    assert len(header.subjects) == 8
    one_field = json.loads(bench.chat_body(bench.MB, per_message=bench.MB))
    assert [m["role"] for m in one_field["messages"]] == ["system", "user"]
    assert bench.percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert bench.percentile([float(i) for i in range(100)], 0.99) == 98.0


def test_fresh_requests_differ_in_every_message_and_keep_their_size() -> None:
    """Cold lines send strings the processor has never seen; the conversation line varies only the
    last turn, as an agent resending its history does."""
    fresh = bench.Fresh(bench.chat_body(8 * bench.KB, per_message=2 * bench.KB, person=True))
    first, second = fresh(), fresh()
    assert len(first) == len(second) and bench.MARK not in first
    one, two = (json.loads(raw)["messages"] for raw in (first, second))
    assert all(a["content"] != b["content"] for a, b in zip(one[1:], two[1:], strict=True))
    assert one[0] == two[0]  # the system prompt carries no mark
    history = bench.Fresh(bench.chat_body(8 * bench.KB, per_message=2 * bench.KB, person=True, marked="last"))
    one, two = (json.loads(history())["messages"] for _ in range(2))
    assert one[:-1] == two[:-1] and one[-1] != two[-1]
    with pytest.raises(ValueError):
        bench.Fresh(b"no mark here")


def test_the_in_process_measurements_run() -> None:
    """The pipeline and SSE lines call the processor's own functions: they still fit (no timings)."""
    once = bench.pipeline_timer()
    pieces = once(bench.chat_body(8 * bench.KB, per_message=2 * bench.KB, person=True))
    assert len(pieces) == 4 and all(seconds >= 0 for seconds in pieces)
    rows = bench.sse_restore(bench.Plan.for_run(quick=True))  # checks the restored text itself
    assert len(rows) == 3 and all(row.samples and row.target is not None for row in rows)
