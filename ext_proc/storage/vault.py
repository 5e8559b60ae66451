"""The pseudonym vault: placeholder → original, encrypted, per tenant, in Redis.

Where this sits: with `consistentPseudonyms: true`, redaction writes HMAC-derived placeholders
(ext_proc.transform.placeholders) and, before the request body is released upstream, the exchange stores
each one's original here; restore reads this request's map first and asks the vault for the rest,
so a reply that mentions a placeholder of an earlier turn (Responses `previous_response_id`) is
restored too. A write that fails refuses the request (503, stage `vault`); a read that fails leaves
those placeholders as they are.

Keys, all from TENANT_SECRET with HKDF-SHA256 (salt `cordon tenant keys v1`), one pair per tenant
so no tenant can compute or read another's::

    pseudonym key   info = "cordon/pseudonym/v1" NUL tenant   32 bytes, the HMAC key of digests
    vault key       info = "cordon/vault/v1" NUL tenant       32 bytes, AES-256-GCM

Redis layout (REDIS_URL: one server, Cluster or Sentinel, see ext_proc.storage.redis_client; the braces
are the Cluster hash tag: a tenant's entries live in its receipt chain's slot, so one MGET or one
pipeline reaches them all), one string per placeholder, expiring `vaultTtlSeconds` after the last
request that sent it::

    <prefix>:{<tenant>}:vault:<LABEL>_<digest>   0x01 ‖ nonce (12 random bytes) ‖ AES-GCM(value)

The AES-GCM associated data is `cordon/vault/v1 NUL tenant NUL <LABEL_digest>`: an entry copied to
another placeholder's key or another tenant's does not decrypt, and reads as absent. An entry is
encrypted once and then only has its expiry extended (EXPIRE, then SET NX EX), so a busy tenant
does not spend a random nonce per request and value: stored ciphertexts, not requests, count
towards the 2³² random nonces one key may take.

Surrogates (`mode: surrogate`, ext_proc.transform.surrogates) live beside the vault, one string per claimed
surrogate, so two values of a tenant never share one (SET NX decides, across every replica)::

    <prefix>:{<tenant>}:surrogate:<HMAC(pseudonym key, casefolded surrogate), 32 hex>
        0x01 ‖ nonce ‖ AES-GCM(family NUL value), associated data `cordon/surrogate/v1 NUL tenant NUL id`

The key names no surrogate and the entry no plaintext; the entry expires `vaultTtlSeconds` after
the last request that used it (then the surrogate may go to another value).

Neither the secret, a key, a value nor a ciphertext is ever logged; errors name the failure only.

`cryptography` is imported when a `Vault` is made (a worker's start), not with this module: a
worker without TENANT_SECRET makes none and never loads it (several MiB per worker).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from ext_proc.audit.receipts.chain import tenant_key
from ext_proc.audit.receipts.record import valid_tenant
from ext_proc.errors import CordonError
from ext_proc.storage.redis_client import RedisClient, bounded, connect
from ext_proc.transform.grammar import pseudonym_label
from ext_proc.transform.placeholders import normalise_value
from ext_proc.transform.surrogates import MAX_ATTEMPTS, candidate, claim_form

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_T = TypeVar("_T")

VERSION = b"\x01"
NONCE_BYTES = 12
HKDF_SALT = b"cordon tenant keys v1"
MAX_BATCH = 1000  # keys per MGET / pipeline: one round trip each


class VaultError(CordonError):
    """The vault could not be written or read: Redis down, slow or refusing. Names no value."""


@dataclass(frozen=True, slots=True)
class TenantKeys:
    """A tenant's two keys, derived from TENANT_SECRET. Never printed (no repr)."""

    pseudonym: bytes
    vault: bytes

    def __repr__(self) -> str:
        return "TenantKeys(…)"


@functools.cache
def _cipher() -> tuple[type[AESGCM], type[Exception]]:
    """AES-GCM and the error of a ciphertext that does not authenticate, imported once (with the
    key derivation's modules, so no request imports any)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes  # noqa: F401  # for derive_keys
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf import hkdf  # noqa: F401  # for derive_keys

    return AESGCM, InvalidTag


def _as_bytes(blob: bytes | str | None) -> bytes | None:
    """A value as Redis returned it: bytes (this client never decodes responses)."""
    return blob.encode("utf-8", "surrogateescape") if isinstance(blob, str) else blob


def derive_keys(secret: str, tenant: str) -> TenantKeys:
    if not valid_tenant(tenant):
        raise ValueError("not a tenant name")
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    ikm = secret.encode("utf-8")

    def derive(purpose: bytes) -> bytes:
        info = purpose + b"\x00" + tenant.encode("ascii")
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=HKDF_SALT, info=info).derive(ikm)

    return TenantKeys(pseudonym=derive(b"cordon/pseudonym/v1"), vault=derive(b"cordon/vault/v1"))


def associated_data(tenant: str, placeholder: str, purpose: bytes = b"cordon/vault/v1") -> bytes:
    return purpose + b"\x00" + tenant.encode("ascii") + b"\x00" + placeholder.encode("ascii")


def seal(
    key: bytes, tenant: str, placeholder: str, original: str, purpose: bytes = b"cordon/vault/v1"
) -> bytes:
    """One entry's stored bytes: version, a random nonce, AES-256-GCM of the UTF-8 value."""
    aes_gcm, _ = _cipher()
    nonce = os.urandom(NONCE_BYTES)
    ciphertext = aes_gcm(key).encrypt(
        nonce, original.encode("utf-8", "surrogatepass"), associated_data(tenant, placeholder, purpose)
    )
    return VERSION + nonce + ciphertext


def unseal(
    key: bytes, tenant: str, placeholder: str, blob: bytes, purpose: bytes = b"cordon/vault/v1"
) -> str | None:
    """The value of an entry, or None when it is not one this tenant wrote for this placeholder."""
    aes_gcm, invalid_tag = _cipher()
    if len(blob) < 1 + NONCE_BYTES + 16 or blob[:1] != VERSION:
        return None
    nonce, ciphertext = blob[1 : 1 + NONCE_BYTES], blob[1 + NONCE_BYTES :]
    try:
        plain = aes_gcm(key).decrypt(nonce, ciphertext, associated_data(tenant, placeholder, purpose))
    except invalid_tag:
        return None
    return plain.decode("utf-8", "surrogatepass")


SURROGATE_PURPOSE = b"cordon/surrogate/v1"


def surrogate_id(pseudonym_key: bytes, surrogate: str) -> str:
    """The registry's name for a surrogate: a keyed digest, so Redis keys name no surrogate."""
    message = b"cordon/surrogate-id/v1\x00" + claim_form(surrogate).encode("utf-8", "surrogatepass")
    return hmac.new(pseudonym_key, message, hashlib.sha256).hexdigest()[:32]


def surrogate_entry(family: str, original: str) -> str:
    """What a surrogate's entry holds (encrypted): the family and the normalised value."""
    return family + "\x00" + normalise_value(original)


@dataclass(frozen=True, slots=True)
class SurrogateWanted:
    """One distinct value of a request that needs a surrogate."""

    family: str
    original: str = field(repr=False)


class SurrogateExhausted(CordonError):
    """No free candidate within MAX_ATTEMPTS (the family's space is nearly full). Names no value."""


@dataclass(frozen=True, slots=True)
class VaultRead:
    """What a lookup found: placeholder → value, and how many entries existed but did not decrypt."""

    found: Mapping[str, str]
    invalid: int = 0


class Vault:
    """A tenant-keyed, encrypted placeholder store in one Redis (one Cluster slot per tenant).

    `timeout` bounds each whole operation (a write sits on the request path, as a receipt does).
    Both operations may be re-sent once on a lost connection: they are idempotent.
    """

    def __init__(
        self, client: RedisClient, *, secret: str, key_prefix: str = "cordon", timeout: float = 0.25
    ) -> None:
        if not key_prefix or any(c in key_prefix for c in "{}*?[]\\"):
            raise ValueError("key_prefix must be non-empty, without braces or glob characters")
        if not secret:
            raise ValueError("the vault needs TENANT_SECRET")
        _cipher()  # loaded now, at the worker's start, rather than inside its first request
        self._redis = client
        self._secret = secret
        self._prefix = key_prefix
        self._timeout = timeout
        self._keys: dict[str, TenantKeys] = {}

    def __repr__(self) -> str:
        return f"Vault(prefix={self._prefix!r})"

    @classmethod
    def from_url(cls, url: str, *, secret: str, timeout: float = 0.25) -> Vault:
        """A vault with its own client: commands re-sent once on a lost connection (both are
        idempotent), socket timeouts = `timeout`."""
        return cls(connect(url, timeout=timeout, retries=1), secret=secret, timeout=timeout)

    async def aclose(self) -> None:
        await self._redis.aclose()

    def keys(self, tenant: str) -> TenantKeys:
        keys = self._keys.get(tenant)
        if keys is None:
            keys = self._keys[tenant] = derive_keys(self._secret, tenant)
        return keys

    def pseudonym_key(self, tenant: str) -> bytes:
        return self.keys(tenant).pseudonym

    def entry_key(self, tenant: str, placeholder: str) -> str:
        if pseudonym_label(placeholder) is None:
            raise ValueError("not a consistent pseudonym")
        return tenant_key(self._prefix, tenant, f"vault:{placeholder[1:-1]}")

    async def _call(self, awaitable: Awaitable[_T]) -> _T:
        return await bounded(awaitable, self._timeout, VaultError)

    async def put(self, tenant: str, entries: Mapping[str, str], ttl_seconds: int) -> None:
        """Store every placeholder → value of a request, or raise VaultError (then store nothing more).

        One pipeline (one round trip per MAX_BATCH entries): EXPIRE extends an entry that exists,
        SET NX EX writes one that does not. Entries already written stay as they were.
        """
        if ttl_seconds < 1:
            raise ValueError("a vault entry needs a positive TTL")
        key = self.keys(tenant).vault
        items = [(self.entry_key(tenant, p), seal(key, tenant, p, value)) for p, value in entries.items()]

        async def write() -> None:
            for start in range(0, len(items), MAX_BATCH):
                async with self._redis.pipeline(transaction=False) as pipe:
                    for name, blob in items[start : start + MAX_BATCH]:
                        pipe.expire(name, ttl_seconds)
                        pipe.set(name, blob, nx=True, ex=ttl_seconds)
                    await pipe.execute()

        await self._call(write())

    async def get(self, tenant: str, placeholders: Iterable[str]) -> VaultRead:
        """The values of those placeholders this tenant's vault holds; absent ones are left out."""
        wanted = list(dict.fromkeys(placeholders))
        if not wanted:
            return VaultRead({})
        names = [self.entry_key(tenant, p) for p in wanted]

        async def read() -> list[bytes | None]:
            out: list[bytes | None] = []
            for start in range(0, len(names), MAX_BATCH):
                blobs = await self._redis.mget(names[start : start + MAX_BATCH])
                out += [_as_bytes(blob) for blob in blobs]
            return out

        blobs = await self._call(read())
        key = self.keys(tenant).vault
        found: dict[str, str] = {}
        invalid = 0
        for placeholder, blob in zip(wanted, blobs, strict=True):
            if blob is None:
                continue
            value = unseal(key, tenant, placeholder, blob)
            if value is None:
                invalid += 1
            else:
                found[placeholder] = value
        return VaultRead(found, invalid)

    # --- surrogates -----------------------------------------------------------------------------

    def surrogate_key(self, tenant: str, surrogate_id_hex: str) -> str:
        return tenant_key(self._prefix, tenant, f"surrogate:{surrogate_id_hex}")

    async def claim_surrogates(
        self,
        tenant: str,
        wanted: Iterable[SurrogateWanted],
        ttl_seconds: int,
        avoid: Callable[[str], bool] | None = None,
    ) -> dict[SurrogateWanted, str]:
        """One surrogate per wanted value, each claimed in the tenant's registry (or already its own).

        Rounds of one pipeline each: every value still open tries its next candidate with SET NX EX
        (the entry: its family and value, encrypted) and reads the entry back with GET. The entry
        decrypts to this value: the surrogate is this value's (just claimed, or claimed by an
        earlier request); anything else (another value, another secret, unreadable): the next
        candidate. An entry that expired between the two commands reads as absent: tried again.
        Then one pipeline extends the TTL of every entry used. Raises VaultError (Redis) or
        SurrogateExhausted; the caller refuses the request then.

        `avoid`: candidates this request must not use (text already in the request, a declared
        identifier): skipped before they are tried, as if taken. The value then holds a later
        candidate too; a request without the clash finds its earlier one again.
        """
        if ttl_seconds < 1:
            raise ValueError("a surrogate entry needs a positive TTL")
        keys = self.keys(tenant)
        attempts: dict[SurrogateWanted, int] = dict.fromkeys(dict.fromkeys(wanted), 0)
        chosen: dict[SurrogateWanted, str] = {}
        used: set[str] = set()  # claim forms taken in this request (two values, one round)
        names: dict[SurrogateWanted, str] = {}

        async def rounds() -> None:
            while attempts:
                tries: list[tuple[SurrogateWanted, str, str, str]] = []
                for item, attempt in list(attempts.items()):
                    while True:
                        if attempt >= MAX_ATTEMPTS:
                            raise SurrogateExhausted(f"no free {item.family.split(':')[0]} surrogate")
                        text = candidate(keys.pseudonym, item.family, item.original, attempt)
                        if text and claim_form(text) not in used and not (avoid and avoid(text)):
                            break
                        attempt += 1
                    attempts[item] = attempt
                    ident = surrogate_id(keys.pseudonym, text)
                    tries.append((item, text, ident, self.surrogate_key(tenant, ident)))
                async with self._redis.pipeline(transaction=False) as pipe:
                    for item, _, ident, name in tries:
                        entry = surrogate_entry(item.family, item.original)
                        pipe.set(
                            name,
                            seal(keys.vault, tenant, ident, entry, SURROGATE_PURPOSE),
                            nx=True,
                            ex=ttl_seconds,
                        )
                        pipe.get(name)
                    replies = await pipe.execute()
                for n, (item, text, ident, name) in enumerate(tries):
                    blob = replies[2 * n + 1]
                    if blob is None:
                        continue  # expired in between: the same candidate again
                    held = unseal(keys.vault, tenant, ident, blob, SURROGATE_PURPOSE)
                    if held == surrogate_entry(item.family, item.original) and claim_form(text) not in used:
                        chosen[item] = text
                        names[item] = name
                        used.add(claim_form(text))
                        del attempts[item]
                    else:
                        attempts[item] += 1
            async with self._redis.pipeline(transaction=False) as pipe:
                for name in names.values():
                    pipe.expire(name, ttl_seconds)
                await pipe.execute()

        await self._call(rounds())
        return chosen
