"""The receipt chains in Redis: key layout, the append and read scripts, and the calls that use them.

Where this sits: under the receipt store. `ChainRedis` is the only code that talks to Redis for
receipts; the store's writer, the settler and the verifier call it, each with its own logic. A
Redis failure or a call slower than `timeout` is a `ReceiptError`: the exchange then refuses (503
`audit`) a request with subjects or of a `failMode: closed` tenant, and under `failMode: open`
forwards a request without subjects, logging and counting the gap.

Redis layout, one chain per tenant (the braces are the Cluster hash tag: every key of a chain lives
in one slot, so the append script and the verify snapshot work on Redis Cluster)::

    <prefix>:{<tenant>}:stream   a stream, one entry per record: r = C (the exact hashed bytes),
                                 h = hash
    <prefix>:{<tenant>}:head     a string: the hash of the chain's last record
    <prefix>:{<tenant>}:turn     a short-lived string (50 ms): the writer whose turn it is to
                                 append after losing a race (liveness only: see the append script)
    <prefix>:{<tenant>}:call:<token>  one short-lived key per appending call (until the call's
                                 fence has passed, plus a second), so a call sent twice
                                 appends once, whoever appended in between
    <prefix>:{<tenant>}:trimmed  a hash, once retention has trimmed the chain's oldest records:
                                 id and hash of the last record trimmed (the chain now starts
                                 after it, so its hash is the next record's prev) and how many

Append is a compare-and-set, because Redis has no SHA-256 in Lua: the hash is computed here against
the head we believe in, and one Lua script checks that the head key still equals that `prev`, then
XADDs the entries and moves the head, atomically. On a conflict the script answers the current head
and the writer re-hashes against it.

Topologies (REDIS_URL, see `ext_proc.storage.redis_client`): one server, a Redis Cluster, or a
master found through Sentinel. Nothing here needs more than one slot at a time: the append, the
verify snapshot and the clock reading are scripts on a chain's own keys, so a cluster runs each on
the node that holds that chain; listing the chains scans every primary. Redis must persist (AOF)
and must not evict these keys (`maxmemory-policy noeviction`), or a restart or eviction silently
starts a new chain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from redis.asyncio import RedisCluster

from ext_proc.audit.receipts.record import valid_tenant
from ext_proc.errors import CordonError
from ext_proc.storage.redis_client import RedisClient, bounded

DEFAULT_KEY_PREFIX = "cordon"
# Records read per XRANGE / XREVRANGE call when walking a chain.
READ_BATCH = 500

# A stream entry as the clients return it (they decode nothing): (id, {b"r": C, b"h": hash}).
StreamEntry = tuple[bytes | str, dict[bytes, bytes]]
ScriptArg = bytes | str | int

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Trimmed:
    """The last record retention trimmed off a chain: the chain now starts after `id`, its first
    record's prev is `hash`; `count` records were trimmed in all."""

    id: str
    hash: str
    count: int


class ReceiptError(CordonError):
    """The receipt could not be written or read: Redis down, slow, or the chain head unusable.

    `uncertain`: (prev, hash) of each record whose append script was sent but whose answer never
    came (a timeout or a lost connection before the fence): it may be in the chain. A caller that
    refuses its exchange anyway hands it to `ReceiptStore.settle_later`.
    """

    def __init__(self, message: str, uncertain: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.uncertain = tuple(uncertain)


def tenant_key(prefix: str, tenant: str, part: str) -> str:
    """A Redis key of `tenant`'s: in the tenant's hash slot (the braces), so every key of one tenant
    lives on one Cluster node."""
    if not valid_tenant(tenant):
        raise ValueError("not a tenant name")
    return f"{prefix}:{{{tenant}}}:{part}"


def text(value: bytes | str) -> str:
    """A stream id or hash as the clients return it (bytes), as text."""
    return value.decode("ascii") if isinstance(value, bytes) else value


def id_key(stream_id: str) -> tuple[int, int]:
    """A stream id as a sortable (milliseconds, sequence)."""
    ms, seq = stream_id.split("-")
    return int(ms), int(seq)


# The append script's answers (its first element).
APPENDED = 1  # {1, id, id, ...}: every record was appended
TURN_EARNED = 2  # {2, head}: a lost race that earned this writer the next turn
RACE_LOST = 0  # {0, head}: a lost race, or another writer's turn lasts
HEAD_MISSING = -1  # {-1, ""}: the head key is gone while the stream has records
FENCED = 3  # {3, ""}: the script ran after the fence and wrote nothing
REPEATED = 4  # {4, head}: this same call appended before; nothing appended twice


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
# Appended, it publishes the last record's stream id and hash on a channel named after the head
# key, for the other writers' next guess of `prev` (ext_proc.audit.receipts.heads): advisory, so
# through `pcall` (a Redis user without pub/sub rights still appends).
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
  redis.pcall('PUBLISH', KEYS[2], out[#out] .. ' ' .. last)
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

# KEYS[1] stream, KEYS[2] the trimmed anchor; ARGV[1] the first stream id (ms-seq) to keep. Trims
# every record older than that, and records the last one trimmed (its id and hash, and the running
# count), in one step: the chain stays verifiable from the anchor. Answers {trimmed, last id}.
_TRIM_LUA = """
local last = redis.call('XREVRANGE', KEYS[1], '(' .. ARGV[1], '-', 'COUNT', 1)
if not last[1] then
  return {0, false}
end
local fields = last[1][2]
local hash = false
for i = 1, #fields, 2 do
  if fields[i] == 'h' then
    hash = fields[i + 1]
  end
end
if not hash then
  return {-1, last[1][1]}
end
local n = redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1])
local count = tonumber(redis.call('HGET', KEYS[2], 'count') or '0') + n
redis.call('HSET', KEYS[2], 'id', last[1][1], 'hash', hash, 'count', count)
return {n, last[1][1]}
"""

# KEYS[1] a chain's stream: TIME on the node that runs that chain's append script (on a cluster a
# plain TIME goes to any node, whose clock is not the one the fence is checked against).
_TIME_LUA = "return redis.call('TIME')"


class ChainRedis:
    """The Redis calls of the receipt chains under one key prefix: keys, scripts, bounded reads.

    `reader` serves reads and the scripts that write nothing; `writer` (by default `reader`) runs
    the append script. Every call but the append script and the clock reading is bounded by
    `timeout` here; those two run inside the append's own deadline, which bounds the whole append.
    """

    def __init__(
        self, reader: RedisClient, *, writer: RedisClient | None = None, key_prefix: str, timeout: float
    ) -> None:
        if not key_prefix or any(c in key_prefix for c in "{}*?[]\\"):
            raise ValueError("key_prefix must be non-empty, without braces or glob characters")
        self.reader = reader
        self.writer = writer or reader
        self.prefix = key_prefix
        self.timeout = timeout
        self._append_script = self.writer.register_script(_APPEND_LUA)
        self._snapshot_script = self.reader.register_script(_SNAPSHOT_LUA)
        self._time_script = self.reader.register_script(_TIME_LUA)
        self._trim_script = self.writer.register_script(_TRIM_LUA)

    async def aclose(self) -> None:
        await self.reader.aclose()
        if self.writer is not self.reader:
            await self.writer.aclose()

    def _key(self, tenant: str, part: str) -> str:
        return tenant_key(self.prefix, tenant, part)

    def stream_key(self, tenant: str) -> str:
        return self._key(tenant, "stream")

    def head_key(self, tenant: str) -> str:
        return self._key(tenant, "head")

    def turn_key(self, tenant: str) -> str:
        return self._key(tenant, "turn")

    def call_key(self, tenant: str, token: str) -> str:
        return self._key(tenant, f"call:{token}")

    def head_key_pattern(self) -> str:
        """Every chain's head key under this prefix, as a glob (the appends' head channels)."""
        return f"{self.prefix}:{{*}}:head"

    def head_key_tenant(self, name: str) -> str | None:
        """The tenant of a head key (or head channel) name under this prefix; None for another."""
        start, end = f"{self.prefix}:{{", "}:head"
        if not (name.startswith(start) and name.endswith(end)):
            return None
        tenant = name[len(start) : -len(end)]
        return tenant if valid_tenant(tenant) else None

    def trimmed_key(self, tenant: str) -> str:
        return self._key(tenant, "trimmed")

    def timed_out(self) -> ReceiptError:
        return ReceiptError(f"receipt append did not finish within {self.timeout}s")

    async def call(self, awaitable: Awaitable[_T]) -> _T:
        """`awaitable` within `timeout`; a timeout or a Redis error as a ReceiptError."""
        return await bounded(awaitable, self.timeout, ReceiptError)

    async def append(self, tenant: str, token: str, args: Sequence[ScriptArg]) -> list[Any]:
        """Run the append script once for `tenant` under the call key of `token` (unbounded: the
        caller's deadline bounds it). `args` as the script's ARGV; its answer as Redis gives it."""
        keys = [self.stream_key(tenant), self.head_key(tenant), self.turn_key(tenant)]
        answer = await self._append_script(keys=[*keys, self.call_key(tenant, token)], args=args)
        return cast("list[Any]", answer)

    async def redis_time(self, tenant: str) -> tuple[int, int]:
        """TIME (seconds, microseconds) on the node holding `tenant`'s chain (unbounded)."""
        seconds, micros = await self._time_script(keys=[self.stream_key(tenant)])
        return int(seconds), int(micros)

    async def snapshot(self, tenant: str) -> tuple[str | None, str | None]:
        """(the stream's last id, the head's hash) read at one instant; None for either missing."""
        tail, head = await self.call(
            self._snapshot_script(keys=[self.stream_key(tenant), self.head_key(tenant)])
        )
        return (text(tail) if tail is not None else None), (text(head) if head is not None else None)

    async def read(self, tenant: str, start: str, end: str, count: int = READ_BATCH) -> list[StreamEntry]:
        """XRANGE of the chain from `start` to `end` (ids, or "(" + id for exclusive)."""
        batch = await self.call(self.reader.xrange(self.stream_key(tenant), start, end, count=count))
        return cast("list[StreamEntry]", batch)

    async def read_back(self, tenant: str, end: str) -> list[StreamEntry]:
        """XREVRANGE of the chain from `end` back towards its first record, READ_BATCH at most."""
        batch = await self.call(self.reader.xrevrange(self.stream_key(tenant), end, "-", count=READ_BATCH))
        return cast("list[StreamEntry]", batch)

    async def trim(self, tenant: str, keep_from_ms: int) -> int:
        """Trim the records appended before `keep_from_ms` (Redis's clock), keeping the chain
        verifiable from the anchor of the last one trimmed; how many were trimmed."""
        answer = await self.call(
            self._trim_script(
                keys=[self.stream_key(tenant), self.trimmed_key(tenant)], args=[f"{keep_from_ms}-0"]
            )
        )
        if int(answer[0]) < 0:
            raise ReceiptError("a record to trim carries no hash: the chain is not ours to trim")
        return int(answer[0])

    async def trimmed(self, tenant: str) -> Trimmed | None:
        """Where the chain starts after retention trimmed it (None: it was never trimmed)."""
        found = await self.call(self.reader.hgetall(self.trimmed_key(tenant)))
        if not found:
            return None
        try:
            return Trimmed(text(found[b"id"]), text(found[b"hash"]), int(found[b"count"]))
        except (KeyError, ValueError):
            raise ReceiptError("the chain's trimmed anchor is unreadable") from None

    async def chain_tenants(self) -> set[str]:
        """Every tenant with a key under this prefix: a SCAN of the server, or of every primary."""
        found: set[str] = set()
        pattern = f"{self.prefix}:{{*}}:*"

        async def scan() -> None:
            if isinstance(self.reader, RedisCluster):
                keys = self.reader.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES)
            else:
                keys = self.reader.scan_iter(match=pattern, count=1000)
            async for key in keys:
                name = text(key)[len(self.prefix) + 2 :]
                for suffix in ("}:stream", "}:head", "}:trimmed"):
                    if name.endswith(suffix) and valid_tenant(name[: -len(suffix)]):
                        found.add(name[: -len(suffix)])

        await self.call(scan())
        return found
