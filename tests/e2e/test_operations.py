"""Operations through the real stack: /readyz following Redis, a bad REDIS_URL failing at once,
every worker getting a share of the exchanges, the JSON logs and Envoy's access log, unknown paths
without receipts, and Envoy's own 413 in the provider's error shape."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from ext_proc.audit.metrics import metrics_dir
from ext_proc.runtime.stack import grpc_serving, workers_serving
from tests.support.e2e import SENTENCE, chat_body, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import RunningStack, running_stack, stack_env, write_policies

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
LIMIT = 65536  # MAX_BODY_BYTES of the shared stack
CHAT = "/v1/chat/completions"
PROBE_HEADER_VALUE = "probe-header-value-7f3a9c"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("ops"), MAX_BODY_BYTES=str(LIMIT)) as running:
        yield running


def metric(stack: RunningStack, series: str) -> float:
    url = f"http://127.0.0.1:{stack.settings.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series + " "))


def wait_for(condition: object, seconds: float) -> float:
    """Poll `condition()` every 50 ms; the seconds it took to hold, or fail after `seconds`."""
    assert callable(condition)
    start = time.monotonic()
    while not condition():
        elapsed = time.monotonic() - start
        assert elapsed < seconds, f"not within {seconds}s"
        time.sleep(0.05)
    return time.monotonic() - start


def ready_status(stack: RunningStack) -> int:
    return request(stack.settings.listen_port, "GET", "/readyz", timeout=5).status


# --- readiness ---------------------------------------------------------------------------------


def test_readyz_follows_redis(tmp_path: Path) -> None:
    """/readyz and gRPC readiness say 503 / NOT_SERVING within 5 s of Redis stopping, while the
    workers stay alive (liveness SERVING, /healthz 200), and ready again within 5 s of its return."""
    with running_stack(tmp_path, workers=2) as running:
        s, redis_process = running.settings, running.redis
        assert redis_process is not None
        assert ready_status(running) == 200
        assert grpc_serving(s.extproc_address, s.extproc_port)
        redis_process.stop()

        def not_ready() -> bool:
            # Each worker notices on its own: the answer is read in the same request (the next
            # one may reach the worker that has not noticed yet).
            reply = request(s.listen_port, "GET", "/readyz", timeout=5)
            if reply.status != 503:
                return False
            assert reply.json() == {"status": "not ready"}
            return True

        down = wait_for(not_ready, 5)
        wait_for(lambda: not grpc_serving(s.extproc_address, s.extproc_port), 5)
        assert grpc_serving(s.extproc_address, s.extproc_port, service="liveness")
        assert request(s.listen_port, "GET", "/healthz").status == 200
        refused = request(s.listen_port, "POST", CHAT, chat_body(SENTENCE))
        assert refused.status == 503 and refused.json()["error"]["stage"] == "audit"
        wait_for(lambda: metric(running, 'cordon_ready{worker="0"}') == 0, 5)
        redis_process.start()  # the same port
        up = wait_for(lambda: ready_status(running) == 200, 5)
        wait_for(lambda: grpc_serving(s.extproc_address, s.extproc_port), 5)
        assert request(s.listen_port, "POST", CHAT, chat_body(SENTENCE)).status == 200
        print(f"\nreadyz: 503 {down:.2f}s after Redis stopped, 200 {up:.2f}s after it came back")
        log = (s.run_dir / "logs" / "ext_proc.log").read_text()
        events = [json.loads(line)["event"] for line in log.splitlines() if '"event"' in line]
        assert "worker_not_ready" in events and "worker_ready" in events


# --- balancing ----------------------------------------------------------------------------------


def exchanges_by_worker(stack: RunningStack) -> Counter[int]:
    """cordon_exchanges_total per worker index, from the snapshots the workers publish under
    RUN_DIR about once a second."""
    totals: Counter[int] = Counter()
    for path in metrics_dir(stack.settings.run_dir).glob("worker-*.json"):
        try:
            snapshot = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now
        index = int(path.name.split("-")[1])
        totals[index] += sum(v for name, _, v in snapshot["counters"] if name == "cordon_exchanges_total")
    return totals


def test_every_worker_serves_a_share(stack: RunningStack) -> None:
    """Worker i listens on EXTPROC_PORT + i and Envoy balances the ext_proc cluster by least
    request: of 40 requests sent 4 at a time, each of the 2 workers serves more than a fifth."""
    s = stack.settings
    assert s.workers == 2 and workers_serving(s)
    before = exchanges_by_worker(stack)

    def send(_: int) -> int:
        return request(s.listen_port, "POST", CHAT, chat_body("hello")).status

    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(send, range(40)))
    assert statuses == [200] * 40
    wait_for(lambda: sum((exchanges_by_worker(stack) - before).values()) >= 40, 5)
    share = exchanges_by_worker(stack) - before
    print(f"\nexchanges per worker: {dict(sorted(share.items()))}")
    assert sorted(share) == [0, 1] and all(count > 40 / 5 for count in share.values()), dict(share)


# --- configuration ------------------------------------------------------------------------------

BAD_URL = "redis://127.0.0.1:notaport/0"


@pytest.mark.parametrize("command", [["stack", "up"], ["serve"]])
def test_an_unparsable_redis_url_fails_at_once(tmp_path: Path, command: list[str]) -> None:
    """No wait for workers that cannot start, no restart loop: the command exits in under 5 s,
    naming the variable and never repeating the URL."""
    write_policies(tmp_path / "policies")
    with FakeUpstream() as upstream:
        env = stack_env(tmp_path / "run", tmp_path / "policies", BAD_URL, upstream.url, workers=2)
        start = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "ext_proc", *command],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 5, elapsed
    assert "REDIS_URL" in result.stderr and "notaport" not in result.stderr
    assert not list((tmp_path / "run").glob("pids/*.pid"))
    print(f"\n{' '.join(command)} with REDIS_URL={BAD_URL}: exit {result.returncode} in {elapsed:.2f}s")


# --- logs ---------------------------------------------------------------------------------------


def test_every_log_line_has_ts_and_level_and_the_access_log_no_values(stack: RunningStack) -> None:
    port = stack.settings.listen_port
    query = "/v1/chat/completions?probe=query-value-1b2c"
    assert request(port, "POST", query, chat_body("hello"), {"x-probe": PROBE_HEADER_VALUE}).status == 200
    assert request(port, "POST", "/nowhere/jane.doe@example.com", chat_body("hi")).status == 404
    log_dir = stack.settings.run_dir / "logs"
    access = log_dir / "envoy-access.log"

    def lines() -> list[dict[str, object]]:
        text = access.read_text() if access.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    wait_for(lambda: any(line.get("route") == "not-found" for line in lines()), 5)
    text = access.read_text()
    assert PROBE_HEADER_VALUE not in text and "query-value" not in text and "jane.doe" not in text
    forwarded = next(line for line in lines() if line["route"] == "openai")
    assert forwarded["path"] == CHAT and forwarded["method"] == "POST" and forwarded["status"] == 200
    assert forwarded["upstream_cluster"] == "openai" and forwarded["flags"] == "-"
    for field in ("duration_ms", "request_ms", "upstream_ms", "bytes_received", "bytes_sent"):
        assert isinstance(forwarded[field], int), field
    # Envoy's view of each call to the processor: a JSON exchange has all four, one reply body call.
    for field in (
        "ext_proc_request_headers_us",
        "ext_proc_request_body_us",
        "ext_proc_reply_headers_us",
        "ext_proc_reply_body_us",
    ):
        assert str(forwarded[field]).isdigit() and int(forwarded[field]) > 0, (field, forwarded[field])
    assert str(forwarded["ext_proc_reply_body_calls"]) == "1"
    unrouted = next(line for line in lines() if line["route"] == "not-found")
    # Refused at its headers: the processor's one call is there, the others null.
    assert str(unrouted["ext_proc_request_headers_us"]).isdigit()
    assert unrouted["ext_proc_request_body_us"] is None and unrouted["ext_proc_reply_body_calls"] is None
    assert unrouted["path"] == "-" and unrouted["status"] == 404 and unrouted["upstream_cluster"] is None
    for name in ("envoy-access.log", "ext_proc.log", "envoy.log", "supervisor.log"):
        path = log_dir / name
        if not path.exists():
            continue  # the harness runs no supervisor of its own
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            assert str(line["ts"]).endswith("Z") and line["level"], (name, raw)


# --- unknown paths ------------------------------------------------------------------------------


def receipt_records(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return sum(int(client.xlen(key)) for key in client.scan_iter(match="*:stream"))
    finally:
        client.close()


def test_an_unknown_path_writes_no_receipt_and_is_counted(stack: RunningStack) -> None:
    assert stack.redis is not None
    port = stack.settings.listen_port
    assert request(port, "POST", CHAT, chat_body("hello")).status == 200  # a chain exists
    before, unrouted = receipt_records(stack.redis.url), metric(stack, "cordon_unrouted_total")
    for path in ("/", "/v2/chat/completions", "/etc/passwd", "/admin2/x"):
        reply = request(port, "POST", path, chat_body(SENTENCE))
        assert reply.status == 404 and reply.json()["error"]["code"] == "not_found"
        assert "x-cordon-receipt" not in reply.headers
    assert receipt_records(stack.redis.url) == before
    wait_for(lambda: metric(stack, "cordon_unrouted_total") >= unrouted + 4, 5)


# --- Envoy's own 413 ----------------------------------------------------------------------------


def anthropic_body(size: int) -> dict[str, object]:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "x" * size}],
    }


@pytest.mark.parametrize(
    ("path", "headers", "shape"),
    [
        (CHAT, {}, "openai"),
        ("/openai/v1/chat/completions", {}, "openai"),
        ("/v1/responses", {}, "openai"),
        ("/v1/messages", {}, "anthropic"),
        ("/anthropic/v1/messages", {}, "anthropic"),
        ("/v1/messages", {"host": "api.anthropic.com"}, "anthropic"),
        ("/v1/messages", {"host": "api.openai.com"}, "openai"),
    ],
)
def test_a_body_over_the_limit_is_refused_in_the_providers_shape(
    stack: RunningStack, path: str, headers: dict[str, str], shape: str
) -> None:
    stack.upstream.clear()
    body = anthropic_body(LIMIT + 1000) if shape == "anthropic" else chat_body("x" * (LIMIT + 1000))
    reply = request(stack.settings.listen_port, "POST", path, body, headers)
    assert reply.status == 413
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-cordon-stage"] == "request"
    payload = reply.json()
    if shape == "anthropic":
        assert payload["type"] == "error"
        error = payload["error"]
        assert error["type"] == "request_too_large"
    else:
        error = payload["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
    assert str(LIMIT) in error["message"] and "MAX_BODY_BYTES" in error["message"]
    assert stack.upstream.received == []
    assert leaked(reply.body) == []
