"""The pseudonym vault (ext_proc/vault.py): per-tenant keys from TENANT_SECRET, AES-GCM entries
bound to tenant and placeholder, and the Redis store (a real redis-server): layout, TTL, what a
second write does, entries that do not decrypt, and Redis down or slow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from redis.crc import key_slot

from ext_proc.storage.vault import Vault, VaultError, derive_keys, seal, unseal
from ext_proc.transform.placeholders import PseudonymMap
from tests.integration.test_redis_topologies import Topology, cluster  # noqa: F401  (a fixture: a real Redis Cluster)
from tests.support.harness import RedisProcess, free_port

T = TypeVar("T")
SECRET = "vault-test-secret-0123456789abcdefghijkl"
VALUES = {
    "EMAIL": "jane.roe@example.com",
    "PHONE": "+1 212-555-0143",
    "SUBJECT1_NAME": 'Zoë "Z" Łukasiewicz\nsecond line 🙂',
}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def pseudonyms(tenant: str, secret: str = SECRET) -> dict[str, str]:
    """placeholder → value for VALUES, as a request of `tenant` would write them."""
    pmap = PseudonymMap(derive_keys(secret, tenant).pseudonym)
    for label, value in VALUES.items():
        pmap.placeholder_for(label, value)
    return dict(pmap.originals)


# --- keys and entries ---------------------------------------------------------------------------


def test_keys_are_per_tenant_per_purpose_and_deterministic() -> None:
    acme, beta = derive_keys(SECRET, "acme"), derive_keys(SECRET, "beta")
    assert acme == derive_keys(SECRET, "acme")
    assert len({acme.pseudonym, acme.vault, beta.pseudonym, beta.vault}) == 4
    assert all(len(k) == 32 for k in (acme.pseudonym, acme.vault))
    other_secret = derive_keys(SECRET + "x", "acme")
    assert other_secret.pseudonym != acme.pseudonym and other_secret.vault != acme.vault
    assert "acme" not in repr(acme) and acme.vault.hex() not in repr(acme)
    with pytest.raises(ValueError):
        derive_keys(SECRET, "no such:tenant")


def test_same_value_two_tenants_two_placeholders() -> None:
    acme, beta = pseudonyms("acme"), pseudonyms("beta")
    assert sorted(acme.values()) == sorted(beta.values()) and not set(acme) & set(beta)


def test_an_entry_opens_only_for_its_tenant_and_placeholder() -> None:
    key = derive_keys(SECRET, "acme").vault
    blob = seal(key, "acme", "<EMAIL_0123456789abcdef0123>", "jane.roe@example.com")
    assert unseal(key, "acme", "<EMAIL_0123456789abcdef0123>", blob) == "jane.roe@example.com"
    assert b"jane" not in blob and blob[:1] == b"\x01"
    assert unseal(key, "acme", "<EMAIL_0123456789abcdef0124>", blob) is None  # moved to another key
    assert unseal(key, "beta", "<EMAIL_0123456789abcdef0123>", blob) is None  # another tenant's AAD
    assert unseal(derive_keys(SECRET, "beta").vault, "acme", "<EMAIL_0123456789abcdef0123>", blob) is None
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    assert unseal(key, "acme", "<EMAIL_0123456789abcdef0123>", flipped) is None
    assert unseal(key, "acme", "<EMAIL_0123456789abcdef0123>", b"\x02" + blob[1:]) is None
    assert unseal(key, "acme", "<EMAIL_0123456789abcdef0123>", b"junk") is None
    # A fresh random nonce per entry: the same value never gives the same bytes twice.
    assert seal(key, "acme", "<EMAIL_0123456789abcdef0123>", "x") != seal(
        key, "acme", "<EMAIL_0123456789abcdef0123>", "x"
    )


# --- the Redis store ----------------------------------------------------------------------------


async def put_then_get(
    url: str, tenant: str, entries: dict[str, str], ttl: int, ask: list[str]
) -> dict[str, str]:
    vault = Vault.from_url(url, secret=SECRET, timeout=2.0)
    try:
        await vault.put(tenant, entries, ttl)
        return dict((await vault.get(tenant, ask)).found)
    finally:
        await vault.aclose()


def test_put_then_get_round_trip_with_hash_tagged_keys_and_ttl(
    server: RedisProcess, client: redis.Redis
) -> None:
    entries = pseudonyms("acme")
    unknown = "<EMAIL_" + "0" * 20 + ">"
    found = run(put_then_get(server.url, "acme", entries, 3600, [*entries, unknown]))
    assert found == entries
    keys = sorted(k.decode() for k in client.scan_iter("*"))
    assert keys == sorted(f"cordon:{{acme}}:vault:{p[1:-1]}" for p in entries)
    assert all(0 < client.ttl(k) <= 3600 for k in keys)
    blob = b"".join(client.get(k) or b"" for k in keys)
    for value in VALUES.values():
        assert value.encode() not in blob and value.encode("utf-16-le") not in blob


def test_another_tenant_reads_nothing(server: RedisProcess, client: redis.Redis) -> None:
    acme = pseudonyms("acme")
    assert run(put_then_get(server.url, "acme", acme, 3600, [])) == {}
    assert run(put_then_get(server.url, "beta", {}, 3600, list(acme))) == {}


def test_a_second_write_extends_the_entry_and_keeps_its_bytes(
    server: RedisProcess, client: redis.Redis
) -> None:
    entries = pseudonyms("acme")
    name = f"cordon:{{acme}}:vault:{next(iter(entries))[1:-1]}"
    run(put_then_get(server.url, "acme", entries, 100, []))
    first = client.get(name)
    client.expire(name, 5)
    run(put_then_get(server.url, "acme", entries, 100, []))
    assert client.get(name) == first  # encrypted once, not once per request
    assert client.ttl(name) > 5


def test_an_entry_that_does_not_decrypt_reads_as_absent(server: RedisProcess, client: redis.Redis) -> None:
    entries = pseudonyms("acme")
    first, second = list(entries)[:2]
    run(put_then_get(server.url, "acme", entries, 3600, []))
    # An entry copied over another placeholder's key (someone with write access to Redis).
    client.set(
        f"cordon:{{acme}}:vault:{second[1:-1]}", client.get(f"cordon:{{acme}}:vault:{first[1:-1]}") or b""
    )

    async def read() -> Any:
        vault = Vault.from_url(server.url, secret=SECRET, timeout=2.0)
        try:
            return await vault.get("acme", [first, second])
        finally:
            await vault.aclose()

    result = run(read())
    assert dict(result.found) == {first: entries[first]} and result.invalid == 1


def test_another_secret_reads_nothing(server: RedisProcess, client: redis.Redis) -> None:
    entries = pseudonyms("acme")
    run(put_then_get(server.url, "acme", entries, 3600, []))

    async def read() -> Any:
        vault = Vault.from_url(server.url, secret=SECRET[::-1], timeout=2.0)
        try:
            return await vault.get("acme", list(entries))
        finally:
            await vault.aclose()

    result = run(read())
    assert result.found == {} and result.invalid == len(entries)


def test_redis_down_is_a_vault_error_naming_no_value(tmp_path: Path) -> None:
    async def attempt() -> None:
        vault = Vault.from_url(f"redis://127.0.0.1:{free_port()}/0", secret=SECRET, timeout=0.5)
        try:
            with pytest.raises(VaultError) as write:
                await vault.put("acme", pseudonyms("acme"), 60)
            with pytest.raises(VaultError) as read:
                await vault.get("acme", list(pseudonyms("acme")))
            for error in (write.value, read.value):
                assert not any(v in str(error) for v in VALUES.values()) and "EMAIL" not in str(error)
        finally:
            await vault.aclose()

    run(attempt())


def test_redis_slow_is_a_vault_error(server: RedisProcess, client: redis.Redis) -> None:
    """Writes held by CLIENT PAUSE: the write fails on its own timeout (had it waited for Redis, it
    would have succeeded once the pause ended, and the assertion would fail)."""
    client.execute_command("CLIENT", "PAUSE", "30000", "WRITE")
    try:

        async def attempt() -> None:
            vault = Vault.from_url(server.url, secret=SECRET, timeout=0.3)
            try:
                with pytest.raises(VaultError, match="did not answer"):
                    await vault.put("acme", pseudonyms("acme"), 60)
            finally:
                await vault.aclose()

        run(attempt())
    finally:
        client.execute_command("CLIENT", "UNPAUSE")


def test_a_redis_cluster_holds_each_tenants_vault_in_one_slot(cluster: Topology) -> None:  # noqa: F811
    """With REDIS_URL naming a cluster, tenants on different primaries write and read their vaults:
    every key of a tenant carries its hash tag, so one MGET and one pipeline each reach one node."""

    async def scenario() -> dict[str, dict[str, str]]:
        vault = Vault.from_url(cluster.url, secret=SECRET, timeout=2.0)
        try:
            out = {}
            for tenant in cluster.tenants:
                entries = pseudonyms(tenant)
                await vault.put(tenant, entries, 600)
                out[tenant] = dict((await vault.get(tenant, [*entries, "<EMAIL_" + "1" * 20 + ">"])).found)
            return out
        finally:
            await vault.aclose()

    found = run(scenario())
    assert found == {tenant: pseudonyms(tenant) for tenant in cluster.tenants}
    vault = Vault(redis.asyncio.Redis(), secret=SECRET)
    for tenant in cluster.tenants:
        slots = {key_slot(vault.entry_key(tenant, p).encode()) for p in pseudonyms(tenant)}
        assert slots == {key_slot(tenant.encode())}


def test_bad_arguments_are_refused() -> None:
    vault = Vault(redis.asyncio.Redis(), secret=SECRET)
    with pytest.raises(ValueError):
        vault.entry_key("acme", "<EMAIL_ab12cd34_1>")  # a per-request placeholder
    with pytest.raises(ValueError):
        vault.entry_key("a{b}", "<EMAIL_" + "0" * 20 + ">")
    with pytest.raises(ValueError):
        Vault(redis.asyncio.Redis(), secret="")
    assert SECRET not in repr(vault)
