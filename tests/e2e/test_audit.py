"""The fail-closed matrix with Redis as a real dependency (SPEC §11), on stacks of their own:
Redis killed and restarted, Redis slow, two independent servers on one Redis, a tampered chain,
the admin API closed and X-Tenant untrusted by default.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import (
    PERSON,
    SAMPLES,
    SENTENCE,
    chat_body,
    log_events,
    metric,
    request,
    wait_for,
)
from tests.support.harness import (
    ADMIN_TOKEN,
    KEYS,
    LateRedisReplies,
    RunningStack,
    redis_server,
    running_stack,
    two_stacks,
)
from tests.support.receipts import delete_and_rechain, record_for, records, stream_key, verify

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
SUBJECT = {"x-cordon-subject": encode_subject_header({"ref": "audit-1", "subjects": [PERSON]})}
OPEN = {"authorization": f"Bearer {KEYS['open']}"}


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """A stack whose Redis persists every write (AOF, fsync always) and may be killed."""
    tmp = tmp_path_factory.mktemp("audit")
    with redis_server(tmp / "run", persistent=True) as server, running_stack(tmp, redis=server) as stack:
        yield stack


def test_redis_killed_and_restarted_matrix(audited: RunningStack) -> None:
    stack, upstream = audited, audited.upstream
    assert stack.redis is not None
    port = stack.settings.listen_port
    upstream.clear()
    before = [request(port, "POST", CHAT, chat_body(SENTENCE)) for _ in range(3)]
    assert all(r.status == 200 and "x-cordon-receipt" in r.headers for r in before)

    stack.redis.kill()
    try:
        upstream.clear()
        # A subject request: refused, whatever failMode says (the open tenant included).
        for headers in (SUBJECT, {**SUBJECT, **OPEN}):
            reply = request(port, "POST", CHAT, chat_body("Call Marisol."), headers)
            assert reply.status == 503 and reply.json()["error"]["stage"] == "audit"
            assert "x-cordon-receipt" not in reply.headers
        # No subjects, failMode closed (the default tenant): refused.
        closed = request(port, "POST", CHAT, chat_body(SENTENCE))
        assert closed.status == 503 and closed.json()["error"]["stage"] == "audit"
        assert upstream.received == []
        # No subjects, failMode open: forwarded (redacted), the gap logged and counted.
        opened = request(port, "POST", CHAT, chat_body(SENTENCE), OPEN)
        assert opened.status == 200 and "x-cordon-receipt" not in opened.headers
        assert len(upstream.received) == 1 and SAMPLES["EMAIL"] not in upstream.received[0].text()
        # A refusal on content still goes out (its record is the gap).
        refused = request(port, "POST", CHAT, "not json")
        assert refused.status == 400 and "x-cordon-receipt" not in refused.headers
        wait_for(lambda: len(log_events(stack, "audit_gap")) >= 2)
        assert all(event["tenant"] in ("open", "default") for event in log_events(stack, "audit_gap"))
        # Counted too: the supervisor's /metrics sums the workers' counters. Each worker
        # publishes its own snapshot on its own beat, so wait for both series.
        wait_for(lambda: metric(stack, 'cordon_gaps_total{what="audit"}') >= 2)
        wait_for(lambda: metric(stack, "cordon_redis_errors_total") >= 5)
    finally:
        stack.redis.start()

    # Redis back (same data, same port): the chain continues from its head, no fork.
    def back() -> bool:
        return request(port, "POST", CHAT, chat_body(SENTENCE)).status == 200

    wait_for(back)
    after = [request(port, "POST", CHAT, chat_body(SENTENCE, stream=True)) for _ in range(3)]
    assert all(r.status == 200 for r in after)
    chain = records(stack, "default")
    hashes = [digest for _, _, digest in chain]
    for reply in before + after:
        assert reply.headers["x-cordon-receipt"] in hashes
    result = verify(stack, "default")
    assert result.ok and result.hashed == len(chain)
    assert all(record["prev"] == hashes[i - 1] for i, (_, record, _) in enumerate(chain) if i)


def test_redis_slow_refuses_within_the_timeout(audited: RunningStack) -> None:
    """CLIENT PAUSE holds every write: the append times out (REDIS_TIMEOUT_MS) and fails closed."""
    stack, upstream = audited, audited.upstream
    assert stack.redis is not None
    port = stack.settings.listen_port
    wait_for(lambda: request(port, "POST", CHAT, chat_body("warm up")).status == 200)
    upstream.clear()
    with redis.Redis.from_url(stack.redis.url) as r:
        r.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
        try:
            start = time.monotonic()
            reply = request(port, "POST", CHAT, chat_body(SENTENCE), SUBJECT)
            elapsed = time.monotonic() - start
            assert reply.status == 503 and reply.json()["error"]["stage"] == "audit"
            assert elapsed < 2.5, "the request waited for Redis instead of timing out"
            assert upstream.received == []
        finally:
            r.execute_command("CLIENT", "UNPAUSE")
    wait_for(lambda: request(port, "POST", CHAT, chat_body("after")).status == 200)
    assert verify(stack, "default").ok


def test_tampered_chain_is_a_409_naming_the_record(audited: RunningStack) -> None:
    stack = audited
    assert stack.redis is not None
    port = stack.settings.listen_port
    for i in range(4):
        assert (
            request(
                port, "POST", CHAT, chat_body(f"n{i}"), {"authorization": f"Bearer {KEYS['chain']}"}
            ).status
            == 200
        )
    chain = records(stack, "chain")
    assert len(chain) >= 4
    env = {**os.environ, "REDIS_URL": stack.redis.url}
    cli = [sys.executable, "-m", "ext_proc", "receipts", "verify", "--tenant", "chain"]
    ok = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and f"chain: ok, {len(chain)} records" in ok.stdout
    # Query first: every worker that answers keeps a checkpoint at the chain's end, so the deletion
    # below sits before the checkpoint and only the link check of the query pass can see it.
    admin_headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    for _ in range(4):
        assert request(port, "GET", "/admin/receipts?ref=anything", None, admin_headers).status == 200
    removed = chain[1][0]
    with redis.Redis.from_url(stack.redis.url) as r:
        assert r.xdel(stream_key("chain"), removed) == 1
    reply = request(port, "GET", "/admin/receipts?ref=anything", None, admin_headers)
    assert reply.status == 409
    error = reply.json()["error"]
    # The worker that answers names the first record whose link broke, or (when it appended the
    # deleted record itself, which it keeps as an anchor) the deleted record.
    assert error["tenant"] == "chain"
    assert (error["reason"], error["id"]) in {("prev", chain[2][0]), ("anchor", removed)}
    assert "records" not in reply.json()
    broken = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert broken.returncode == 1 and f"BROKEN at {chain[2][0]}" in broken.stdout


def test_records_deleted_and_rechained_after_the_last_query_are_caught(tmp_path: Path) -> None:
    """Someone with write access to Redis deletes a record appended after the last admin query and
    re-chains the later ones: every link checks, and a fresh `receipts verify` passes. The worker
    that appended them still knows their hashes: the admin query answers 409 `anchor`, and its
    periodic check logs the alarm and counts it."""
    with running_stack(tmp_path, workers=1, RECEIPT_CHECK_SECONDS="1") as stack:
        assert stack.redis is not None
        port = stack.settings.listen_port
        chain = {"authorization": f"Bearer {KEYS['chain']}"}
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        for i in range(2):
            assert request(port, "POST", CHAT, chat_body(f"before {i}"), chain).status == 200
        assert request(port, "GET", "/admin/receipts?ref=anything", None, admin).status == 200
        for i in range(3):
            assert request(port, "POST", CHAT, chat_body(f"after {i}"), chain).status == 200
        later = records(stack, "chain")[2][0]
        with redis.Redis.from_url(stack.redis.url) as r:
            delete_and_rechain(r, "chain", later)
        assert verify(stack, "chain").ok  # a fresh full walk cannot tell
        reply = request(port, "GET", "/admin/receipts?ref=anything", None, admin)
        assert reply.status == 409
        error = reply.json()["error"]
        assert (error["tenant"], error["reason"], error["id"]) == ("chain", "anchor", later)
        wait_for(lambda: any(e["reason"] == "anchor" for e in log_events(stack, "receipt_chain_broken")))
        wait_for(lambda: metric(stack, 'cordon_receipt_chain_broken_total{reason="anchor"}') >= 1)


def test_retention_trims_the_oldest_records_and_the_chain_still_verifies(tmp_path: Path) -> None:
    """RECEIPT_RETENTION_DAYS (here two seconds' worth): the workers trim older records, each chain
    keeps the anchor of its last trimmed record; the admin query, `receipts verify` and an export
    checked offline all pass; an unknown tenant is a 404 and exit 2, never an empty pass."""
    retention = str(2 / 86_400)
    with running_stack(tmp_path, RECEIPT_RETENTION_DAYS=retention, RECEIPT_CHECK_SECONDS="1") as stack:
        assert stack.redis is not None
        port = stack.settings.listen_port
        auth = {"authorization": f"Bearer {KEYS['chain']}"}
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        for i in range(5):
            assert request(port, "POST", CHAT, chat_body(f"old {i}"), auth).status == 200
        wait_for(lambda: len(records(stack, "chain")) == 0, timeout=15)
        # The worker logs a trim once Redis has answered it: the line may follow the trim itself.
        wait_for(lambda: bool(log_events(stack, "receipts_trimmed")), timeout=5)
        for i in range(2):
            assert request(port, "POST", CHAT, chat_body(f"new {i}"), auth).status == 200
        assert request(port, "GET", "/admin/receipts?ref=x&tenant=chain", None, admin).status == 200
        missing = request(port, "GET", "/admin/receipts?ref=x&tenant=nosuch", None, admin)
        assert missing.status == 404 and "no receipt chain" in missing.json()["error"]["message"]
        env = {**os.environ, "REDIS_URL": stack.redis.url}
        cli = [sys.executable, "-m", "ext_proc", "receipts"]
        ok = subprocess.run([*cli, "verify", "--tenant", "chain"], env=env, capture_output=True, text=True)
        assert ok.returncode == 0 and "chain: ok" in ok.stdout
        unknown = subprocess.run(
            [*cli, "verify", "--tenant", "nosuch"], env=env, capture_output=True, text=True
        )
        assert unknown.returncode == 2
        exported = subprocess.run([*cli, "export"], env=env, capture_output=True, text=True, check=True)
        dump = tmp_path / "receipts.jsonl"
        dump.write_text(exported.stdout)
        offline = subprocess.run(
            [*cli, "verify", "--file", str(dump)], env=env, capture_output=True, text=True
        )
        assert offline.returncode == 0 and "chain: ok" in offline.stdout


def test_two_servers_on_one_redis_make_one_chain(tmp_path: Path) -> None:
    """Two independent stacks (two supervisors, two workers each) append to one chain at once.

    Four workers, two Envoys, Redis, the upstream and 16 clients share two cores here: a receipt
    append can wait past the default 250 ms for the CPU alone, which the stack rightly refuses
    (503 audit). This test is about the chain under concurrency, so its stacks wait longer."""
    patient = {"REDIS_TIMEOUT_MS": "3000"}
    with two_stacks(tmp_path, **patient) as (a, b):
        ports = [a.settings.listen_port, b.settings.listen_port]

        def one(i: int) -> str:
            reply = request(ports[i % 2], "POST", CHAT, chat_body(f"mail {SAMPLES['EMAIL']} #{i}"))
            assert reply.status == 200
            return reply.headers["x-cordon-receipt"]

        with ThreadPoolExecutor(16) as pool:
            hashes = list(pool.map(one, range(200)))
        chain = records(a, "default")
        assert len(chain) == 200 and {d for _, _, d in chain} == set(hashes)
        result = verify(a, "default")
        assert result.ok and result.hashed == 200


def test_defaults_admin_closed_and_x_tenant_ignored(tmp_path: Path) -> None:
    with running_stack(tmp_path, ADMIN_TOKEN="", TRUST_TENANT_HEADER="", RECEIPT_SECRET="") as stack:
        port = stack.settings.listen_port
        closed = request(port, "GET", "/admin/receipts?ref=x", None, {"authorization": "Bearer anything"})
        assert closed.status == 404 and closed.json()["error"]["stage"] == "admin"
        # X-Tenant names a looser tenant (mode off): ignored, the default tenant's redaction applies.
        reply = request(port, "POST", CHAT, chat_body(SENTENCE), {"x-tenant": "mode-off"})
        assert reply.status == 200
        received = stack.upstream.received[-1]
        assert SAMPLES["EMAIL"] not in received.text() and "x-tenant" not in received.headers
        assert record_for(stack, "default", reply.headers["x-cordon-receipt"])["mode"] == "reversible"
        # With RECEIPT_SECRET unset, the secret was generated once in RUN_DIR, readable by its owner only.
        secret_file = stack.settings.run_dir / "receipt.secret"
        assert secret_file.stat().st_mode & 0o777 == 0o600


def test_policy_reload_on_change_and_sighup(tmp_path: Path) -> None:
    with running_stack(tmp_path, workers=1) as stack:
        port = stack.settings.listen_port
        strip_file = tmp_path / "policies" / "strip.yaml"
        original = strip_file.read_text()
        headers = {"authorization": f"Bearer {KEYS['strip']}"}

        def mode_now() -> str:
            reply = request(port, "POST", CHAT, chat_body("hi"), headers)
            return str(record_for(stack, "strip", reply.headers["x-cordon-receipt"])["mode"])

        assert mode_now() == "strip"
        strip_file.write_text(original.replace("mode: strip", "mode: reversible"))
        wait_for(lambda: mode_now() == "reversible")
        # An invalid edit keeps the last good version, and the log says why (file and key).
        strip_file.write_text(original.replace("mode: strip", "mode: shred"))
        wait_for(lambda: any(e["key"] == "mode" for e in log_events(stack, "policy_reload_error")))
        assert mode_now() == "reversible"
        # SIGHUP reloads even when the poll cannot see a change (same size, mtime put back).
        stat = strip_file.stat()
        strip_file.write_text(original)
        os.utime(strip_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert strip_file.stat().st_size == stat.st_size  # "shred" and "strip": same length
        time.sleep(2.5)  # two polls: they see the same signature and reload nothing
        assert mode_now() == "reversible"
        extproc = next(s for s in stack.stack.services if s.name == "ext_proc")
        extproc.process.send_signal(signal.SIGHUP)
        wait_for(lambda: mode_now() == "strip")

        # A worker restarted while a file is broken serves the last good set, not a crash loop.
        strip_file.write_text(original.replace("mode: strip", "mode: shred"))
        wait_for(lambda: len(log_events(stack, "policy_reload_error")) >= 2)
        ready = stack.settings.run_dir / "extproc" / "worker-0.ready"
        old_pid = int(ready.read_text())
        os.kill(old_pid, signal.SIGKILL)
        wait_for(lambda: ready.exists() and ready.read_text() != str(old_pid), timeout=20)
        assert log_events(stack, "policy_last_good_kept")
        assert mode_now() == "strip"
        # A lock file an editor leaves beside the policies is not a policy file.
        (tmp_path / "policies" / ".#strip.yaml").write_text("not: [valid")
        strip_file.write_text(original)
        time.sleep(1.5)
        errors = log_events(stack, "policy_reload_error")
        assert not any(".#strip.yaml" in str(e["file"]) for e in errors)


def test_an_append_answered_too_late_is_corrected_in_the_chain(tmp_path: Path) -> None:
    """The append script runs in time but its answer reaches the worker after REDIS_TIMEOUT_MS:
    the request is refused (503 audit, upstream never called), yet its `forwarded` record is in
    the chain. Once Redis answers in time again, the worker finds that record and appends the
    refusal after it (`exchange` = its hash), so the chain says what happened."""
    with (
        redis_server(tmp_path / "redis") as server,
        LateRedisReplies(server.port) as late,
        running_stack(tmp_path, redis=server, workers=1, REDIS_URL=late.url, REDIS_TIMEOUT_MS="250") as stack,
    ):
        assert request(stack.settings.listen_port, "POST", CHAT, chat_body("warm up")).status == 200
        stack.upstream.clear()
        late.delay = 0.6
        reply = request(stack.settings.listen_port, "POST", CHAT, chat_body(SENTENCE))
        late.delay = 0.0
        assert reply.status == 503 and reply.json()["error"]["stage"] == "audit"
        assert stack.upstream.received == [] and late.held == 1
        wait_for(lambda: len(records(stack, "default")) == 3, timeout=15)
        _, forwarded, forwarded_hash = records(stack, "default")[1]
        _, correction, _ = records(stack, "default")[2]
        assert forwarded["decision"] == "forwarded" and forwarded["counts"]["EMAIL"] == 1
        assert correction["decision"] == "refused" and correction["stage"] == "audit"
        assert correction["exchange"] == forwarded_hash and correction["counts"] == forwarded["counts"]
        assert [event["outcome"] for event in log_events(stack, "audit_settled")] == ["corrected"]
        assert verify(stack, "default").ok
