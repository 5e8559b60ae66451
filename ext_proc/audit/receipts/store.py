"""Receipts (SPEC §9): one record per exchange, chained by SHA-256 per tenant, kept in Redis.

Where this sits: Envoy message → dialect walk → detectors → redaction → media → egress check →
**receipt** → upstream. Once an exchange knows its decision (forwarded, refused at any stage,
reported) it builds a `ReceiptFields` and appends it here before the body is released; the hash
that comes back is the `X-Cordon-Receipt` header. The admin query and the auditors' command line
read the chain back through `ReceiptStore.verify`. A Redis failure is a `ReceiptError`: the caller
refuses, or counts the gap, as `failMode` says (SPEC §11).

A record holds counts per kind, verdicts and an HMAC of the subject ref. It cannot hold a value, a
header, a ref or a placeholder's original: the types only admit the fields below, each validated
(kinds must look like `EMAIL`, verdicts come from fixed sets, numbers are numbers).

The hash, exactly::

    R    = the record's present fields except `hash`, with `prev` included; an optional field that
           is absent is left out, never written as null (so adding an optional field later does
           not change the hash of a record that lacks it)
    C    = canonical_json(R): UTF-8 JSON, object keys sorted by code point at every level,
           separators "," and ":" with no whitespace, non-ASCII written as itself, no NaN
    hash = lowercase hex of SHA-256( ascii(prev) ‖ C )

`prev` is the previous record's `hash` as its 64 lowercase hex characters (those 64 ASCII bytes are
hashed, not the 32 raw bytes); the first record of a chain has `prev` = 64 zeros. An auditor can
recheck any record with ``printf '%s%s' "$prev" "$C" | sha256sum``.

Redis layout, one chain per tenant (the braces are the Cluster hash tag: every key of a chain lives
in one slot, so the append script and the verify snapshot work on Redis Cluster)::

    <prefix>:{<tenant>}:stream   a stream, one entry per record: r = C (the exact hashed bytes),
                                 h = hash
    <prefix>:{<tenant>}:head     a string: the hash of the chain's last record
    <prefix>:{<tenant>}:turn     a short-lived string (50 ms): the writer whose turn it is to
                                 append after losing a race (liveness only, see below)
    <prefix>:{<tenant>}:call:<token>  one short-lived key per appending call (until the call's
                                 fence has passed, plus a second), so a call sent twice
                                 appends once, whoever appended in between

Append is a compare-and-set, because Redis has no SHA-256 in Lua: the hash is computed here against
the head we believe in, and one Lua script checks that the head key still equals that `prev`, then
XADDs the entries and moves the head, atomically. On a conflict the script answers the current head
and we re-hash against it. Writers in one process queue per tenant, so conflicts only happen
between processes and replicas, and whoever holds the tenant's lock writes everything queued so
far in one call (a batch, chained locally: under load N exchanges cost one round trip, not N).
Plain optimistic retries starve under sustained contention (the last winner knows the new head
first and wins again), so the first loser of a race takes a short "turn" that only it may append
in; retries are bounded (count and `timeout`) with jitter. An append costs one round trip when
nothing raced it, whatever the chain's length.

Verification walks the stream in order and recomputes every hash from the stored bytes. It is
incremental: the last verified (stream id, hash) is kept as a checkpoint **in this process only**.
Anyone who can write Redis could also rewrite a checkpoint kept in Redis, so such a checkpoint would
let them hide an edit behind it; an in-process one cannot be moved from outside. A new process (the
command line) therefore verifies from the start. Records before a checkpoint are not re-read by an
incremental verify except the checkpoint record itself (still there, same hash); pass
`since_checkpoint=False` for a full walk. Redis must persist (AOF) and must not evict these keys
(`maxmemory-policy noeviction`), or a restart or eviction silently starts a new chain.

Topologies (REDIS_URL, see `redis_client`): one server, a Redis Cluster, or a master found through
Sentinel. Nothing here needs more than one slot at a time: the append, the verify snapshot and the
clock reading are scripts on a chain's own keys, so a cluster runs each on the node that holds that
chain; listing the chains scans every primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import random
import re
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Literal, TextIO, TypeVar, get_args

from redis.asyncio import RedisCluster

from ext_proc.errors import CordonError, Stage
from ext_proc.policy.model import MODES, Mode
from ext_proc.storage.redis_client import REDIS_ERRORS, RedisClient, bounded, connect

# "output": the record of what the output gate found in a reply (SPEC §15), after the exchange's
# own record; its `exchange` field is that record's hash.
Decision = Literal["forwarded", "refused", "reported", "output"]
Egress = Literal["verified", "refused", "skipped"]
BadReason = Literal["unparsable", "prev", "hash", "head", "checkpoint", "vanished"]

DECISIONS: tuple[str, ...] = get_args(Decision)
EGRESS_VERDICTS: tuple[str, ...] = get_args(Egress)
STAGES: tuple[str, ...] = get_args(Stage)

GENESIS = "0" * 64
log = logging.getLogger("cordon.receipts")
MAX_KIND_CHARS = 64
VERIFY_BATCH = 500

_HEX64 = re.compile(r"[0-9a-f]{64}")
_KIND = re.compile(r"[A-Z][A-Z0-9_]*")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
_DIALECT = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Python attribute → JSON field, where they differ.
_JSON_NAMES = {"ref_digest": "refDigest"}
_ATTR_NAMES = {v: k for k, v in _JSON_NAMES.items()}

_T = TypeVar("_T")


class ReceiptError(CordonError):
    """The receipt could not be written or read: Redis down, slow, or the chain head unusable.

    `uncertain`: (prev, hash) of each record whose append script was sent but whose answer never
    came (a timeout or a lost connection before the fence): it may be in the chain. A caller that
    refuses its exchange anyway hands it to `ReceiptStore.settle_later`.
    """

    def __init__(self, message: str, uncertain: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.uncertain = tuple(uncertain)


def utc_now() -> str:
    """Now as RFC 3339 UTC with milliseconds: `2025-01-31T12:00:00.123Z`."""
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def ref_digest(secret: bytes, ref: str) -> str:
    """`refDigest`: HMAC-SHA256 of the subject ref under the server secret, hex. Never the ref."""
    if not secret:
        raise ValueError("the receipt HMAC secret is empty")
    return hmac.new(secret, ref.encode("utf-8"), hashlib.sha256).hexdigest()


def valid_tenant(tenant: object) -> bool:
    """The policy files' tenant rule (letters, digits, '-', '_'; at most 64): no brace, no colon."""
    return (
        isinstance(tenant, str)
        and 0 < len(tenant) <= 64
        and tenant.replace("-", "").replace("_", "").isalnum()
    )


def tenant_key(prefix: str, tenant: str, part: str) -> str:
    """A Redis key of `tenant`'s: in the tenant's hash slot (the braces), so every key of one tenant
    lives on one Cluster node."""
    if not valid_tenant(tenant):
        raise ValueError("not a tenant name")
    return f"{prefix}:{{{tenant}}}:{part}"


def canonical_json(record: Mapping[str, object]) -> bytes:
    """Sorted keys, no whitespace, UTF-8, only present fields (a None value counts as absent)."""
    present = {key: value for key, value in record.items() if value is not None}
    return json.dumps(
        present, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _digest(prev: str, canonical: bytes) -> str:
    # The one place a chain hash is computed (tests count calls to it).
    return hashlib.sha256(prev.encode("ascii") + canonical).hexdigest()


def chain_hash(prev: str, record: Mapping[str, object]) -> str:
    """`sha256(ascii(prev) ‖ canonical_json(record + {"prev": prev}))`, lowercase hex.

    `record` is every present field but `hash`; `prev` may be in it already (it must then equal
    the `prev` argument) or is added.
    """
    if not _HEX64.fullmatch(prev):
        raise ValueError("prev must be 64 lowercase hex characters")
    if "hash" in record:
        raise ValueError("a record's hash is not part of what it hashes")
    if record.get("prev", prev) != prev:
        raise ValueError("the record's prev differs from the prev it is chained to")
    return _digest(prev, canonical_json({**record, "prev": prev}))


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"receipt field {what}")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _valid_time(value: object) -> bool:
    if not isinstance(value, str) or not _TIME.fullmatch(value):
        return False
    try:
        datetime.fromisoformat(value[:-1])
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptFields:
    """What an exchange records, before it is chained (no `prev`, no `hash` yet)."""

    tenant: str
    dialect: str
    mode: Mode
    decision: Decision
    counts: Mapping[str, int]
    time: str = field(default_factory=utc_now)
    stage: Stage | None = None
    ref_digest: str | None = None
    egress: Egress | None = None
    media: int | None = None
    exchange: str | None = None  # an output record: the hash of its exchange's record

    def __post_init__(self) -> None:
        _validate(self)

    def record(self) -> dict[str, object]:
        """The JSON fields (absent optional fields left out), without `prev` and `hash`."""
        out: dict[str, object] = {}
        for f in fields(ReceiptFields):
            value = getattr(self, f.name)
            if value is not None:
                out[_JSON_NAMES.get(f.name, f.name)] = dict(value) if f.name == "counts" else value
        return out

    def field_values(self) -> dict[str, object]:
        """The constructor arguments of these fields (to build a `Receipt` from them)."""
        return {f.name: getattr(self, f.name) for f in fields(ReceiptFields)}


_MODE_RULE = f"mode: one of {MODES}"
_DECISION_RULE = f"decision: one of {DECISIONS}"
_STAGE_RULE = f"stage: one of {STAGES}"
_EGRESS_RULE = f"egress: one of {EGRESS_VERDICTS}"
_KNOWN_KINDS: set[str] = set()  # kinds already checked against _KIND (a few dozen at most)


def _valid_kind(kind: object) -> bool:
    if kind in _KNOWN_KINDS:
        return True
    ok = isinstance(kind, str) and len(kind) <= MAX_KIND_CHARS and bool(_KIND.fullmatch(kind))
    if ok and len(_KNOWN_KINDS) < 4096:
        _KNOWN_KINDS.add(kind)  # type: ignore[arg-type]
    return ok


def _validate(r: ReceiptFields) -> None:
    _check(_valid_time(r.time), "time: RFC 3339 UTC with milliseconds")
    _check(valid_tenant(r.tenant), "tenant: a policy tenant name")
    _check(isinstance(r.dialect, str) and bool(_DIALECT.fullmatch(r.dialect)), "dialect: a dialect name")
    _check(r.mode in MODES, _MODE_RULE)
    _check(r.decision in DECISIONS, _DECISION_RULE)
    _check(r.stage is None or r.stage in STAGES, _STAGE_RULE)
    _check(r.egress is None or r.egress in EGRESS_VERDICTS, _EGRESS_RULE)
    _check(r.media is None or _count(r.media), "media: a count")
    _check(
        r.exchange is None or (isinstance(r.exchange, str) and bool(_HEX64.fullmatch(r.exchange))),
        "exchange: the SHA-256 hex of the exchange's record",
    )
    _check(
        r.ref_digest is None or (isinstance(r.ref_digest, str) and bool(_HEX64.fullmatch(r.ref_digest))),
        "refDigest: an HMAC-SHA256 in lowercase hex",
    )
    _check(isinstance(r.counts, Mapping), "counts: a mapping of kind to count")
    for kind, n in r.counts.items():
        _check(_valid_kind(kind), "counts: keys are kinds (EMAIL, SUBJECT1_NAME)")
        _check(_count(n), "counts: values are counts")
    # A private, sorted, read-only copy: the caller's dict cannot change a receipt afterwards.
    object.__setattr__(r, "counts", MappingProxyType(dict(sorted(r.counts.items()))))


@dataclass(frozen=True, slots=True, kw_only=True)
class Receipt(ReceiptFields):
    """A chained record: the fields, the previous record's hash and its own."""

    prev: str
    hash: str

    def __post_init__(self) -> None:
        _validate(self)
        _check(isinstance(self.prev, str) and bool(_HEX64.fullmatch(self.prev)), "prev: a SHA-256 hex")
        _check(isinstance(self.hash, str) and bool(_HEX64.fullmatch(self.hash)), "hash: a SHA-256 hex")

    @classmethod
    def chained(cls, receipt_fields: ReceiptFields, prev: str, hash_: str) -> Receipt:
        """The record the chain code just wrote: `receipt_fields` were validated when they were
        built, `prev` and `hash_` are the chain's own hex digests, so nothing is checked twice."""
        receipt = object.__new__(cls)
        for f in fields(ReceiptFields):
            object.__setattr__(receipt, f.name, getattr(receipt_fields, f.name))
        object.__setattr__(receipt, "prev", prev)
        object.__setattr__(receipt, "hash", hash_)
        return receipt

    def hashed_record(self) -> dict[str, object]:
        """R of the module docstring: every present field except `hash`."""
        return {**self.record(), "prev": self.prev}

    def to_json(self) -> dict[str, object]:
        """The whole record, `hash` included (what the admin query returns)."""
        return {**self.hashed_record(), "hash": self.hash}

    @classmethod
    def from_stored(cls, canonical: bytes, hash_: str) -> Receipt:
        """Parse a stream entry; ValueError unless `canonical` is exactly a valid record's C."""
        data = json.loads(canonical)
        if not isinstance(data, dict):
            raise ValueError("a receipt is a JSON object")
        if "hash" in data:
            raise ValueError("the stored record includes its own hash")
        receipt = cls(**{_ATTR_NAMES.get(k, k): v for k, v in data.items()}, hash=hash_)
        if canonical_json(receipt.hashed_record()) != canonical:
            raise ValueError("the stored record is not in canonical form")
        return receipt


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """One chain's verification. On failure, `bad_id` is the first bad record's stream id.

    `reason`: `unparsable` (not a valid canonical record of this tenant), `prev` (not chained to
    the record before it: one was deleted, inserted or moved), `hash` (its content changed),
    `checkpoint` (the last record verified earlier is gone or changed), `head` (the head key does
    not match the last record, `bad_id`: a record was cut off the end or the head was moved),
    `vanished` (this process appended to the chain, which has since started again from nothing:
    deleted, or a Redis restarted without its data; `bad_id` "0-0").
    """

    tenant: str
    ok: bool
    hashed: int  # records re-hashed by this call
    last_id: str | None  # the last good record (None: no good record)
    head: str  # its hash (GENESIS when none)
    bad_id: str | None = None
    reason: BadReason | None = None


class ChainBroken(CordonError):
    """A query found the chain broken: the answer is the first bad record's id, never records."""

    def __init__(self, result: VerifyResult) -> None:
        super().__init__(f"receipt chain of {result.tenant!r} broken at {result.bad_id} ({result.reason})")
        self.result = result


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    stream_id: str
    hash: str


# KEYS[1] stream, KEYS[2] head, KEYS[3] turn, KEYS[4] this call's key (a random token in its name);
# ARGV[1] the prev we hashed against, ARGV[2] genesis, ARGV[3] this writer's id, ARGV[4] how long
# a turn lasts (ms), ARGV[5] the fence: the last moment (Redis's clock, ms) at which the caller
# still waits, then ARGV[6..] pairs (C, hash) of one or more records already chained to each other
# locally, the first one to ARGV[1].
# Answers {1, id, id, ...} when all were appended; {2, head} on a lost race that earned this writer
# the next turn; {0, head} on a lost race (or while another writer's turn lasts); {-1, ""} when the
# head key is gone while the stream still has records (appending from genesis would fork the chain);
# {3, ""} when the script runs after the fence: a caller that gave up must not get its record in;
# {4, head} when this call's key exists: the same call appended before (its answer was lost with
# the connection and the client sent it again), nothing is appended twice, even if other writers
# appended in between. The key lives until the call's fence has passed (plus a second): a re-send
# after that finds the fence passed (status 3) and its caller has given up anyway. (A token, not
# the head hash: two exchanges with equal fields in one millisecond, chained onto the same prev,
# hash alike; only the second one's re-chaining keeps both.)
#
# The turn is only about liveness: a writer that keeps its own head cached would otherwise win
# every race against writers that first have to learn the new head. The first loser takes the turn;
# while it lasts only its holder may append; its append ends it. The CAS alone keeps the chain whole.
_APPEND_LUA = """
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {4, redis.call('GET', KEYS[2]) or ''}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if now_ms > tonumber(ARGV[5]) then
  return {3, ''}
end
local head = redis.call('GET', KEYS[2])
if not head then
  if redis.call('XLEN', KEYS[1]) ~= 0 then
    return {-1, ''}
  end
  head = ARGV[2]
end
local turn = redis.call('GET', KEYS[3])
if head == ARGV[1] and (not turn or turn == ARGV[3]) then
  local out = {1}
  local last = head
  for i = 6, #ARGV, 2 do
    out[#out + 1] = redis.call('XADD', KEYS[1], '*', 'r', ARGV[i], 'h', ARGV[i + 1])
    last = ARGV[i + 1]
  end
  redis.call('SET', KEYS[2], last)
  redis.call('SET', KEYS[4], '1', 'PX', tonumber(ARGV[5]) - now_ms + 1000)
  if turn then
    redis.call('DEL', KEYS[3])
  end
  return out
end
if not turn then
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
  return {2, head}
end
if turn == ARGV[3] then
  return {2, head}
end
return {0, head}
"""

# KEYS[1] stream, KEYS[2] head: the stream's last id (or nil) and the head (or nil), read at one
# instant. A script, not MULTI, because a cluster client routes it by its keys like any command.
_SNAPSHOT_LUA = """
local tail = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local last = false
if tail[1] then
  last = tail[1][1]
end
return {last, redis.call('GET', KEYS[2])}
"""

# KEYS[1] a chain's stream: TIME on the node that runs that chain's append script (on a cluster a
# plain TIME goes to any node, whose clock is not the one the fence is checked against).
_TIME_LUA = "return redis.call('TIME')"

MAX_BATCH = 64
BATCH_GRACE_SECONDS = 0.05  # how long a queued caller past its deadline waits for its batch's end
SETTLE_INTERVAL_SECONDS = 1.0  # settle_later: between two looks at the chains
SETTLE_ATTEMPTS = 60  # ... for about a minute
SETTLE_SCAN = 10_000  # ... reading back at most this many records from a chain's tail
MAX_SETTLING = 1024  # exchanges waiting to be settled at once; more are given up (`unknown`)
CLOCK_RETRY_SECONDS = 1.0  # a clock measured again in the background: between two tries ...
CLOCK_RETRIES = 60  # ... for about a minute
_PREV_FIELD = b'"prev":"'
FENCE_MARGIN_MS = 20  # the script gives up this long before its caller does
CLOCK_CHECK_SECONDS = 60.0  # how often Redis's clock is compared with ours


_Pending = tuple[ReceiptFields, "asyncio.Future[Receipt]", float]  # fields, result, deadline


@dataclass(slots=True, eq=False)
class _Settling:
    """An exchange refused after an unanswered append, waiting to be settled."""

    correction: ReceiptFields  # the refusal's record, `exchange` = the uncertain record's hash
    link: tuple[str, str]  # (prev, hash) of the uncertain record
    done: Callable[[str], None] | None
    attempts: int
    outcome: str | None = None
    written: tuple[str, str] | None = None  # (prev, hash) of our own append, itself unanswered
    written_outcome: str = "corrected"

    def finish(self, outcome: str) -> None:
        if self.done is not None:
            self.done(outcome)


def _fail(items: list[_Pending], error: ReceiptError) -> None:
    """Every caller of a batch gets the error, with the uncertain link of its own record."""
    own = len(error.uncertain) == len(items)
    for i, item in enumerate(items):
        if not item[1].done():
            mine = ReceiptError(str(error), error.uncertain[i : i + 1]) if own else error
            item[1].set_exception(mine)


def _consume(future: asyncio.Future[Receipt]) -> None:
    # A caller that timed out never awaits its future: read its exception so asyncio does not
    # report it as never retrieved.
    if not future.cancelled():
        future.exception()


def _text(value: bytes | str) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else value


def _id_key(stream_id: str) -> tuple[int, int]:
    ms, seq = stream_id.split("-")
    return int(ms), int(seq)


class ReceiptStore:
    """Appends receipts to, and verifies, per-tenant chains in Redis (on a Cluster, one slot each).

    `timeout` bounds every Redis call, and a whole `append` (queueing, retries and all): a receipt
    sits on the request path. The append script carries a fence, the caller's deadline in Redis's
    clock less FENCE_MARGIN_MS, and does nothing once it has passed: a caller told "timed out" does
    not get its record written later by a slow Redis. A script whose answer was lost with its
    connection is sent once more: a second run of a call that already appended finds that call's
    token as the last appending call's and appends nothing (status 4), so nothing is chained twice. What
    remains: when the second send fails too, the record of a request its caller then refused may
    be in the chain; never a forwarded request without its record.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        writer: RedisClient | None = None,
        key_prefix: str = "cordon",
        timeout: float = 0.25,
        max_attempts: int = 100,
        turn_ms: int = 50,
    ) -> None:
        if not key_prefix or any(c in key_prefix for c in "{}*?[]\\"):
            raise ValueError("key_prefix must be non-empty, without braces or glob characters")
        self._redis = client
        self._writer = writer or client
        self._prefix = key_prefix
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._turn_ms = str(turn_ms)
        self._writer_id = secrets.token_hex(8)
        self._append_script = self._writer.register_script(_APPEND_LUA)
        self._snapshot_script = self._redis.register_script(_SNAPSHOT_LUA)
        self._time_script = self._redis.register_script(_TIME_LUA)
        # Per tenant: (Redis's TIME minus ours in ms, when measured). Per tenant because on a
        # cluster each chain's script runs on its own node, with its own clock.
        self._clocks: dict[str, tuple[float, float]] = {}
        self._clock_checks: dict[str, asyncio.Task[None]] = {}  # background re-measurements
        self._heads: dict[str, str] = {}  # the last head seen per tenant: a guess, the script decides
        self._confirmed: dict[str, str] = {}  # the last head Redis itself answered per tenant
        self._queues: dict[str, list[_Pending]] = {}
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._writing: set[str] = set()  # tenants whose chain a caller or a drain is writing
        self._checkpoints: dict[str, _Checkpoint] = {}
        self._in_flight: dict[str, list[tuple[str, str]]] = {}  # links of a script sent, unanswered
        self._settling: list[_Settling] = []
        self._settler: asyncio.Task[None] | None = None
        self._vanished: set[str] = set()  # chains this process appended to that were restarted
        self.races_lost = 0  # compare-and-set conflicts seen, for a metric

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 0.25, **kwargs: object) -> ReceiptStore:
        """A store with its own clients for REDIS_URL `url` (one server, `redis+cluster://` or
        `redis+sentinel://`; a malformed URL is a `RedisUrlError`, a ValueError), socket timeouts =
        `timeout`: both clients reconnect once at once (a restarted Redis). Sending the append
        script again is safe: a second run of a call that already appended finds its own last hash
        at the head and appends nothing (status 4)."""
        client = connect(url, timeout=timeout, retries=1)
        writer = connect(url, timeout=timeout, retries=1)
        return cls(client, writer=writer, timeout=timeout, **kwargs)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        for task in [*self._drains.values(), *self._clock_checks.values(), self._settler]:
            if task is not None:
                task.cancel()
        if self._settler is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._settler
        for item in self._settling:  # every exchange still waiting stays unknown, and is told so
            item.finish("unknown")
        self._settling.clear()
        await self._redis.aclose()
        if self._writer is not self._redis:
            await self._writer.aclose()

    def _key(self, tenant: str, part: str) -> str:
        return tenant_key(self._prefix, tenant, part)

    def stream_key(self, tenant: str) -> str:
        return self._key(tenant, "stream")

    def head_key(self, tenant: str) -> str:
        return self._key(tenant, "head")

    def turn_key(self, tenant: str) -> str:
        return self._key(tenant, "turn")

    def call_key(self, tenant: str, token: str) -> str:
        return self._key(tenant, f"call:{token}")

    async def _call(self, awaitable: Awaitable[_T]) -> _T:
        return await bounded(awaitable, self._timeout, ReceiptError)

    # ---- append -------------------------------------------------------------------------------

    async def append(self, receipt_fields: ReceiptFields) -> Receipt:
        """Chain one record onto its tenant's chain; returns it with `prev` and `hash`.

        Appends of one tenant queue in this process and one writer at a time sends them:
        everything queued so far (up to MAX_BATCH), chained locally, in one script call. Under load
        N waiting exchanges cost one round trip instead of N; alone, an append costs one (the
        caller writes its own record). A caller that gives up while its record is still queued
        takes it out; a batch in flight is fenced by the earliest deadline in it.
        """
        tenant = receipt_fields.tenant
        self.stream_key(tenant)  # validates the tenant before anything is queued
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        queue = self._queues.setdefault(tenant, [])
        if tenant not in self._writing:
            # Nobody is writing this chain: this caller writes its own record now, and whatever
            # queued meanwhile is handed to a drain task afterwards.
            self._writing.add(tenant)
            try:
                return (await self._write(tenant, [receipt_fields], deadline))[0]
            finally:
                self._writing.discard(tenant)
                if queue:
                    self._start_drain(tenant)
        item: _Pending = (receipt_fields, loop.create_future(), deadline)
        item[1].add_done_callback(_consume)
        queue.append(item)
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(item[1])
        except TimeoutError as exc:
            if item in queue:
                queue.remove(item)
                raise self._timed_out() from exc
        # Taken into a batch, which is fenced at its earliest deadline, so it is ending now: its
        # answer says whether this record may have been appended.
        try:
            async with asyncio.timeout(BATCH_GRACE_SECONDS):
                return await asyncio.shield(item[1])
        except TimeoutError as exc:
            raise self._timed_out() from exc

    def _timed_out(self) -> ReceiptError:
        return ReceiptError(f"receipt append did not finish within {self._timeout}s")

    async def _write(self, tenant: str, batch: list[ReceiptFields], deadline: float) -> list[Receipt]:
        """`_append_locked` within `deadline`, every failure as a ReceiptError."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self._append_locked(tenant, batch, deadline)
        except TimeoutError as exc:
            self._check_clock_later(tenant)  # Sentinel may have failed over to another clock
            raise ReceiptError(str(self._timed_out()), self._unanswered(tenant)) from exc
        except REDIS_ERRORS as exc:
            self._check_clock_later(tenant)
            raise ReceiptError(f"Redis failed: {type(exc).__name__}", self._unanswered(tenant)) from exc

    def _unanswered(self, tenant: str) -> list[tuple[str, str]]:
        """The links of a script sent but not answered. When Redis answers late, it ran: its last
        record is the likeliest head, and guessing it saves the next append a lost race (on a slow
        Redis, a race lost every time made every append time out)."""
        uncertain = self._in_flight.pop(tenant, [])
        if uncertain:
            self._heads[tenant] = uncertain[-1][1]
        return uncertain

    def _start_drain(self, tenant: str) -> None:
        self._writing.add(tenant)
        self._drains[tenant] = asyncio.create_task(self._drain(tenant))

    async def _drain(self, tenant: str) -> None:
        """Write the tenant's queue, batch after batch, until it is empty."""
        queue = self._queues[tenant]
        try:
            while queue:
                batch = [item for item in queue[:MAX_BATCH] if not item[1].done()]
                del queue[:MAX_BATCH]
                if batch:
                    await self._append_batch(tenant, batch)
        except BaseException:
            # Cancelled (the store is closing): nobody queued may wait for a writer that is gone.
            _fail([*queue], ReceiptError("the receipt store is closing"))
            queue.clear()
            raise
        finally:
            self._writing.discard(tenant)
            self._drains.pop(tenant, None)

    async def _append_batch(self, tenant: str, batch: list[_Pending]) -> None:
        """Write `batch` in order; every future gets its Receipt or the same ReceiptError."""
        deadline = min(item[2] for item in batch)
        try:
            receipts = await self._write(tenant, [item[0] for item in batch], deadline)
        except ReceiptError as exc:
            _fail(batch, exc)
        except BaseException:
            _fail(batch, ReceiptError("receipt append interrupted"))
            raise
        else:
            for item, receipt in zip(batch, receipts, strict=True):
                if not item[1].done():
                    item[1].set_result(receipt)

    async def _fence(self, tenant: str, deadline: float) -> int:
        """`deadline` (this loop's clock) as TIME in ms of the node holding `tenant`'s chain, less
        FENCE_MARGIN_MS."""
        loop = asyncio.get_running_loop()
        clock = self._clocks.get(tenant)
        if clock is None:
            clock = await self._measure_clock(tenant)
        elif loop.time() - clock[1] > CLOCK_CHECK_SECONDS:
            self._check_clock_later(tenant)  # the last measurement serves meanwhile
        remaining_ms = (deadline - loop.time()) * 1000
        return int(time.time() * 1000 + clock[0] + remaining_ms - FENCE_MARGIN_MS)

    async def _measure_clock(self, tenant: str) -> tuple[float, float]:
        before = time.time()
        seconds, micros = await self._time_script(keys=[self.stream_key(tenant)])
        after = time.time()
        redis_ms = int(seconds) * 1000 + int(micros) / 1000
        clock = (redis_ms - (before + after) * 500, asyncio.get_running_loop().time())  # midpoint
        self._clocks[tenant] = clock
        return clock

    def _check_clock_later(self, tenant: str) -> None:
        """Measure `tenant`'s Redis clock again in the background, never on a caller's time: after
        a failure (a failover may have brought another node's clock), or when it is due. Spending
        a round trip of each append's budget on it made a slow Redis refuse every append and never
        recover; the last measurement serves meanwhile."""
        if tenant in self._clocks and tenant not in self._clock_checks:
            task = asyncio.get_running_loop().create_task(self._remeasure(tenant))
            self._clock_checks[tenant] = task
            task.add_done_callback(lambda _: self._clock_checks.pop(tenant, None))

    async def _remeasure(self, tenant: str) -> None:
        for _ in range(CLOCK_RETRIES):
            try:
                await self._call(self._measure_clock(tenant))
                return
            except ReceiptError:
                await asyncio.sleep(CLOCK_RETRY_SECONDS)

    async def _append_locked(self, tenant: str, batch: list[ReceiptFields], deadline: float) -> list[Receipt]:
        fixed_keys = [self.stream_key(tenant), self.head_key(tenant), self.turn_key(tenant)]
        records = [receipt_fields.record() for receipt_fields in batch]
        prev = self._heads.get(tenant, GENESIS)
        for _ in range(self._max_attempts):
            chained: list[tuple[str, str]] = []  # (prev, hash) of each record
            fence = await self._fence(tenant, deadline)
            # This attempt's own key: a re-send of it (redis-py's retry) names the same one.
            keys = [*fixed_keys, self.call_key(tenant, secrets.token_hex(8))]
            args: list[object] = [prev, GENESIS, self._writer_id, self._turn_ms, fence]
            link = prev
            for record in records:
                canonical = canonical_json({**record, "prev": link})
                digest = _digest(link, canonical)
                chained.append((link, digest))
                args += [canonical, digest]
                link = digest
            self._in_flight[tenant] = chained
            answer = await self._append_script(keys=keys, args=args)
            del self._in_flight[tenant]
            status = answer[0]
            if status in (1, 4):  # appended now, or by this same call's earlier run
                self._heads[tenant] = self._confirmed[tenant] = link
                return [
                    Receipt.chained(receipt_fields, p, h)
                    for receipt_fields, (p, h) in zip(batch, chained, strict=True)
                ]
            if status == -1:
                raise ReceiptError("the chain head key is missing while the stream has records")
            if status == 3:
                self._check_clock_later(tenant)  # or Redis's clock moved
                raise self._timed_out()  # the script ran past its fence and wrote nothing
            self.races_lost += 1
            head = _text(answer[1])
            confirmed = self._confirmed.get(tenant, GENESIS)
            if head == GENESIS and confirmed != GENESIS and tenant not in self._vanished:
                # The chain this process was appending to is gone (deleted, or a Redis restarted
                # without its data): it starts again, and the loss is said, not hidden.
                self._vanished.add(tenant)
                log.error(json.dumps({"event": "receipt_chain_restarted", "tenant": tenant}))
            prev = self._heads[tenant] = self._confirmed[tenant] = head
            if status == 0:  # another writer's turn: give it about a round trip
                await asyncio.sleep(random.uniform(0.0001, 0.0006))
        raise ReceiptError(f"receipt append lost {self._max_attempts} races for the chain head in a row")

    # ---- settling an uncertain append ------------------------------------------------------------

    def settle_later(
        self,
        correction: ReceiptFields,
        uncertain: tuple[str, str],
        done: Callable[[str], None] | None = None,
    ) -> None:
        """An exchange refused because its append got no answer: if that record reached the chain
        after all, it says `forwarded` for a request that was not. In the background (about a
        minute, while Redis does not answer), find out. If it is there, append `correction` (the
        refusal, with `exchange` = that record's hash) after it; if it never got in, append the
        refusal without `exchange`, so the exchange has its one record. `uncertain` is (prev,
        hash). `done` gets the outcome: `corrected`, `recorded`, or `unknown` (no answer in
        time, not found among the last SETTLE_SCAN records, MAX_SETTLING already waiting, or the
        store closing). One task settles everything waiting, one tail read per chain per round."""
        item = _Settling(correction, uncertain, done, SETTLE_ATTEMPTS)
        if len(self._settling) >= MAX_SETTLING:
            item.finish("unknown")
            return
        self._settling.append(item)
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._settle_all())

    async def _settle_all(self) -> None:
        try:
            while self._settling:
                await asyncio.sleep(SETTLE_INTERVAL_SECONDS)
                for tenant in sorted({item.correction.tenant for item in self._settling}):
                    waiting = [item for item in self._settling if item.correction.tenant == tenant]
                    with contextlib.suppress(ReceiptError):  # Redis not answering: next round
                        await self._settle_tenant(tenant, waiting)
                    for item in waiting:
                        item.attempts -= 1
                        if item.outcome is None and item.attempts <= 0:
                            item.outcome = "unknown"
                        if item.outcome is not None:
                            self._settling.remove(item)
                            item.finish(item.outcome)
        finally:
            for item in self._settling:
                item.finish("unknown")
            self._settling.clear()

    async def _settle_tenant(self, tenant: str, waiting: list[_Settling]) -> None:
        """One round for one chain: read its tail once, then append what each exchange needs."""
        wanted = {h for item in waiting for h in (*item.link, *(item.written or ()))}
        seen, whole = await self._tail_hashes(tenant, wanted)
        for item in waiting:
            if item.written is not None and item.written[1] in seen:
                item.outcome = item.written_outcome  # an earlier round's append got in after all
                continue
            if item.link[1] in seen:
                record, outcome = item.correction, "corrected"
            elif item.link[0] in seen or whole:
                # Not after its prev, or not in the whole chain: it never got in. The exchange's
                # own record, the refusal, is all there is to write.
                record, outcome = replace(item.correction, exchange=None), "recorded"
            else:
                item.outcome = "unknown"  # further back than SETTLE_SCAN records
                continue
            try:
                await self.append(record)
            except ReceiptError as exc:
                if exc.uncertain:  # it may be in: the next round looks before writing again
                    item.written, item.written_outcome = exc.uncertain[0], outcome
                continue
            item.outcome = outcome

    async def _tail_hashes(self, tenant: str, wanted: set[str]) -> tuple[set[str], bool]:
        """The hashes of `wanted` found among the chain's last SETTLE_SCAN records, and whether
        the read reached the chain's first record."""
        stream, end, read, found = self.stream_key(tenant), "+", 0, set()
        targets = {h.encode("ascii") for h in wanted}
        while read < SETTLE_SCAN:
            batch = await self._call(self._redis.xrevrange(stream, end, "-", count=VERIFY_BATCH))
            for _, entry in batch:
                read += 1
                digest = entry.get(b"h")
                if digest in targets:
                    found.add(_text(digest))
            if len(batch) < VERIFY_BATCH:
                return found, True
            end = f"({_text(batch[-1][0])}"
        return found, False

    # ---- verify -------------------------------------------------------------------------------

    async def verify(self, tenant: str, *, since_checkpoint: bool = True) -> VerifyResult:
        """Walk the chain (from this process's checkpoint, or from the start) and recheck it.

        The stream's last entry and the head key are read together by one script, so writers
        appending meanwhile never look like a head mismatch; the walk stops at that entry.
        """
        stream, head_key = self.stream_key(tenant), self.head_key(tenant)
        if tenant in self._vanished:
            # This process appended to a chain that later started again from nothing.
            return VerifyResult(tenant, False, 0, None, GENESIS, "0-0", "vanished")
        tail_value, head_value = await self._call(self._snapshot_script(keys=[stream, head_key]))
        tail_id = _text(tail_value) if tail_value is not None else None
        head = _text(head_value) if head_value is not None else None

        prev, last_id, start = GENESIS, None, "-"
        checkpoint = self._checkpoints.get(tenant) if since_checkpoint else None
        if checkpoint is not None:
            found = await self._call(
                self._redis.xrange(stream, checkpoint.stream_id, checkpoint.stream_id, count=1)
            )
            if not found or found[0][1].get(b"h") != checkpoint.hash.encode("ascii"):
                return VerifyResult(tenant, False, 0, None, GENESIS, checkpoint.stream_id, "checkpoint")
            prev, last_id, start = checkpoint.hash, checkpoint.stream_id, f"({checkpoint.stream_id}"

        hashed = 0
        if tail_id is not None and (last_id is None or _id_key(last_id) < _id_key(tail_id)):
            while True:
                batch = await self._call(self._redis.xrange(stream, start, tail_id, count=VERIFY_BATCH))
                for raw_id, entry in batch:
                    entry_id = _text(raw_id)
                    hashed += 1
                    reason, digest = _check_entry(tenant, prev, entry)
                    if reason is not None:
                        return VerifyResult(tenant, False, hashed, last_id, prev, entry_id, reason)
                    prev, last_id = digest, entry_id
                if len(batch) < VERIFY_BATCH:
                    break
                start = f"({last_id}"

        if head != (prev if last_id is not None else None):
            return VerifyResult(tenant, False, hashed, last_id, prev, tail_id or "0-0", "head")
        if last_id is not None:
            self._checkpoints[tenant] = _Checkpoint(last_id, prev)
        else:
            self._checkpoints.pop(tenant, None)
        return VerifyResult(tenant, True, hashed, last_id, prev)

    async def tenants(self) -> list[str]:
        """Every tenant with a chain (a key under this prefix: a SCAN of the server, or of every
        primary of a cluster), and every tenant this store has verified or appended a record of:
        a chain deleted whole since then is still asked about, and its verification fails."""
        found: set[str] = {*self._checkpoints, *self._vanished}
        found.update(tenant for tenant, head in self._confirmed.items() if head != GENESIS)
        pattern = f"{self._prefix}:{{*}}:*"

        async def scan() -> None:
            if isinstance(self._redis, RedisCluster):
                keys = self._redis.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES)
            else:
                keys = self._redis.scan_iter(match=pattern, count=1000)
            async for key in keys:
                name = _text(key)[len(self._prefix) + 2 :]
                for suffix in ("}:stream", "}:head"):
                    if name.endswith(suffix) and valid_tenant(name[: -len(suffix)]):
                        found.add(name[: -len(suffix)])

        await self._call(scan())
        return sorted(found)

    async def find_by_ref_digest(self, tenant: str, digest: str) -> list[Receipt]:
        """The verified records whose `refDigest` is `digest`; ChainBroken if the chain is not whole.

        The chain is verified first (incrementally), then read from its first record up to the
        one verification reached. That pass reads every record anyway, so it rechecks each one as
        it goes: its `prev` is the hash of the record before it, and its stored hash is the
        SHA-256 of that `prev` and its bytes (about a microsecond: no JSON is parsed but the
        matches'). A record deleted, moved or rewritten before this worker's checkpoint (a
        refDigest taken out of it, to hide it from this query) is caught too.
        """
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise ValueError("a refDigest is 64 lowercase hex characters")
        result = await self.verify(tenant)
        if not result.ok:
            raise ChainBroken(result)
        if result.last_id is None:
            return []
        stream = self.stream_key(tenant)
        needle = b'"refDigest":"' + digest.encode("ascii") + b'"'
        matches: list[Receipt] = []
        start = "-"
        link = GENESIS.encode("ascii")
        while True:
            batch = await self._call(self._redis.xrange(stream, start, result.last_id, count=VERIFY_BATCH))
            for raw_id, entry in batch:
                raw = entry.get(b"r", b"")
                at = raw.find(_PREV_FIELD)
                stored_prev = raw[at + len(_PREV_FIELD) : at + len(_PREV_FIELD) + 64] if at >= 0 else b""
                if stored_prev != link:
                    raise ChainBroken(VerifyResult(tenant, False, 0, None, GENESIS, _text(raw_id), "prev"))
                stored_hash = entry.get(b"h", b"")
                if _digest(link.decode("ascii"), raw).encode("ascii") != stored_hash:
                    raise ChainBroken(VerifyResult(tenant, False, 0, None, GENESIS, _text(raw_id), "hash"))
                link = stored_hash
                if needle not in raw:
                    continue
                try:
                    receipt = Receipt.from_stored(raw, stored_hash.decode("ascii"))
                except (ValueError, TypeError, UnicodeDecodeError):
                    bad = VerifyResult(tenant, False, 0, None, GENESIS, _text(raw_id), "unparsable")
                    raise ChainBroken(bad) from None
                if receipt.ref_digest == digest:
                    matches.append(receipt)
            if len(batch) < VERIFY_BATCH:
                return matches
            start = f"({_text(batch[-1][0])}"


def _check_entry(tenant: str, prev: str, entry: Mapping[bytes, bytes]) -> tuple[BadReason | None, str]:
    """(None, hash) for a good record chained to `prev`, else (what is wrong, "")."""
    raw, stored_hash = entry.get(b"r"), entry.get(b"h")
    if raw is None or stored_hash is None or len(entry) != 2:
        return "unparsable", ""
    try:
        receipt = Receipt.from_stored(raw, stored_hash.decode("ascii"))
    except (ValueError, TypeError, UnicodeDecodeError):
        return "unparsable", ""
    if receipt.tenant != tenant:
        return "unparsable", ""
    if receipt.prev != prev:
        return "prev", ""
    if _digest(prev, raw) != receipt.hash:
        return "hash", ""
    return None, receipt.hash


def verify_cli(
    url: str, tenant: str | None = None, *, out: TextIO | None = None, timeout: float = 5.0
) -> int:
    """`receipts verify [--tenant T]`: full walk of one chain or all; 0 whole, 1 broken, 2 error.

    Prints tenant names, counts and stream ids only.
    """
    out = out or sys.stdout

    async def run() -> int:
        try:
            store = ReceiptStore.from_url(url, timeout=timeout)
        except ValueError as exc:  # a malformed REDIS_URL: the message names no password
            print(f"receipts verify: {exc}", file=out)
            return 2
        try:
            tenants = [tenant] if tenant is not None else await store.tenants()
            if not tenants:
                print("no receipt chains", file=out)
            code = 0
            for name in tenants:
                result = await store.verify(name, since_checkpoint=False)
                if result.ok:
                    print(f"{name}: ok, {result.hashed} records", file=out)
                else:
                    print(f"{name}: BROKEN at {result.bad_id} ({result.reason})", file=out)
                    code = 1
            return code
        except (ReceiptError, ValueError) as exc:
            print(f"receipts verify: {exc}", file=out)
            return 2
        finally:
            await store.aclose()

    return asyncio.run(run())
