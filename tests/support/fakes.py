"""In-process stand-ins for what an exchange talks to: the receipt store, the vault, and Envoy.

`FakeReceipts` and `FakeVault` keep everything in memory and fit the `Runtime`'s store protocols
(`ext_proc.exchange.runtime`); each can be told to fail its next call the way Redis does.
`EnvoyStream` plays Envoy's side of one ext_proc stream: it builds the `ProcessingRequest` of each
message, hands it to `Exchange.process` and decodes the answers into `Answer`s. Nothing here
needs Redis, Envoy or tesseract, so a whole exchange runs in a unit test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.audit.receipts.chain import ReceiptError
from ext_proc.audit.receipts.record import GENESIS, Receipt, ReceiptFields, chain_hash
from ext_proc.audit.receipts.verify import VerifyResult
from ext_proc.errors import CordonError
from ext_proc.exchange.exchange import Exchange
from ext_proc.exchange.headers import EXT_PROC_FILTER, ROUTE_ATTRIBUTE
from ext_proc.exchange.runtime import ReceiptStorage, Runtime, VaultStorage
from ext_proc.policy.model import DEFAULT_TENANT, Policy, PolicySet, hash_api_key
from ext_proc.storage.vault import (
    SurrogateExhausted,
    SurrogateWanted,
    VaultError,
    VaultRead,
    derive_keys,
    surrogate_entry,
)
from ext_proc.transform.surrogates import MAX_ATTEMPTS, candidate, claim_form

if TYPE_CHECKING:
    from ext_proc.audit.receipts.store import ReceiptStore
    from ext_proc.storage.vault import Vault

    # The real stores fit the protocols the fakes fit (checked by mypy, never run).
    def _real_receipts(store: ReceiptStore) -> ReceiptStorage:
        return store

    def _real_vault(vault: Vault) -> VaultStorage:
        return vault


# --- policies -------------------------------------------------------------------------------------


def keyed(tenant: str, key: str | None = None, **knobs: Any) -> Policy:
    """A tenant's policy, selected by the API key `key` (None: by no key)."""
    keys = frozenset({hash_api_key(key)}) if key is not None else frozenset()
    return Policy(tenant=tenant, api_keys=keys, source=f"{tenant}.yaml", **knobs)


def policy_set(*policies: Policy) -> PolicySet:
    """The set of `policies`, indexed by their keys; a default tenant (all defaults) unless given."""
    tenants = {policy.tenant: policy for policy in policies}
    tenants.setdefault(DEFAULT_TENANT, keyed(DEFAULT_TENANT))
    by_key = {digest: policy for policy in tenants.values() for digest in policy.api_keys}
    return PolicySet(tenants=tenants, by_key=by_key)


# --- the receipt store ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settlement:
    """A refusal's record handed to `settle_later` after an uncertain append."""

    correction: ReceiptFields
    uncertain: tuple[str, str]


@dataclass(frozen=True, slots=True)
class _Failure:
    uncertain: bool
    reached: bool


class FakeReceipts:
    """Per-tenant hash chains in memory, hashed as the real store hashes them.

    `fail_next()`: the next append raises `ReceiptError`; `uncertain=True` as a lost answer does
    (the error carries the record's (prev, hash)), and `reached=True` appends it all the same.
    `down = True`: every append fails until it is set back. `journal`, shared with a `FakeVault`,
    says in which order the two stores were called.
    """

    def __init__(self, journal: list[str] | None = None) -> None:
        self.journal = journal if journal is not None else []
        self.chains: dict[str, list[Receipt]] = {}
        self.settlements: list[Settlement] = []
        self.down = False
        self._failures: list[_Failure] = []

    def fail_next(self, *, uncertain: bool = False, reached: bool = False) -> None:
        self._failures.append(_Failure(uncertain, reached))

    @property
    def receipts(self) -> list[Receipt]:
        """Every record of every chain, in the order they were appended within each tenant."""
        return [receipt for chain in self.chains.values() for receipt in chain]

    def chain(self, tenant: str) -> list[Receipt]:
        return self.chains.get(tenant, [])

    def by_hash(self, digest: str) -> Receipt:
        found = [receipt for receipt in self.receipts if receipt.hash == digest]
        assert len(found) == 1, f"{len(found)} receipts carry that hash"
        return found[0]

    def _chained(self, receipt_fields: ReceiptFields) -> Receipt:
        chain = self.chains.get(receipt_fields.tenant, [])
        prev = chain[-1].hash if chain else GENESIS
        return Receipt.chained(receipt_fields, prev, chain_hash(prev, receipt_fields.record()))

    async def append(self, receipt_fields: ReceiptFields) -> Receipt:
        self.journal.append(f"receipts.append:{receipt_fields.decision}")
        if self.down:
            raise ReceiptError("the receipt store is down")
        receipt = self._chained(receipt_fields)
        if self._failures:
            failure = self._failures.pop(0)
            if failure.reached:
                self.chains.setdefault(receipt.tenant, []).append(receipt)
            uncertain = [(receipt.prev, receipt.hash)] if failure.uncertain else []
            raise ReceiptError("receipt append did not finish within 0.25s", uncertain)
        self.chains.setdefault(receipt.tenant, []).append(receipt)
        return receipt

    def settle_later(
        self,
        correction: ReceiptFields,
        uncertain: tuple[str, str],
        done: Callable[[str], None] | None = None,
    ) -> None:
        self.settlements.append(Settlement(correction, uncertain))

    async def tenants(self) -> list[str]:
        return sorted(self.chains)

    async def verify(self, tenant: str, *, since_checkpoint: bool = True) -> VerifyResult:
        prev, last_id = GENESIS, None
        for n, receipt in enumerate(self.chain(tenant), start=1):
            stream_id = f"{n}-0"
            if receipt.prev != prev:
                return VerifyResult(tenant, False, n - 1, last_id, prev, bad_id=stream_id, reason="prev")
            if chain_hash(prev, receipt.record()) != receipt.hash:
                return VerifyResult(tenant, False, n - 1, last_id, prev, bad_id=stream_id, reason="hash")
            prev, last_id = receipt.hash, stream_id
        return VerifyResult(tenant, True, len(self.chain(tenant)), last_id, prev)

    async def find_by_ref_digest(self, tenant: str, digest: str) -> list[Receipt]:
        return [receipt for receipt in self.chain(tenant) if receipt.ref_digest == digest]


# --- the vault ------------------------------------------------------------------------------------


class FakeVault:
    """Pseudonyms and surrogates in memory (TTLs ignored), keyed as the real vault keys them.

    Surrogates are the real candidates (`ext_proc.transform.surrogates.candidate`) under the
    tenant's real pseudonym key, so they are deterministic; a registry per tenant keeps them
    distinct. `fail_next(op)` makes the next `put`, `get` or `claim` raise `error` (a
    `VaultError` unless given). `journal`: every call, as `vault.<op>`, in order.
    """

    def __init__(self, secret: str = "test-tenant-secret", journal: list[str] | None = None) -> None:
        self.secret = secret
        self.journal = journal if journal is not None else []
        self.entries: dict[str, dict[str, str]] = {}  # tenant → placeholder → value
        self.registry: dict[str, dict[str, str]] = {}  # tenant → claim form → family NUL value
        self._failures: dict[str, CordonError] = {}

    def fail_next(self, op: str, error: CordonError | None = None) -> None:
        assert op in ("put", "get", "claim"), op
        self._failures[op] = error or VaultError("vault call failed: connection refused")

    def _call(self, op: str) -> None:
        self.journal.append(f"vault.{op}")
        error = self._failures.pop(op, None)
        if error is not None:
            raise error

    def pseudonym_key(self, tenant: str) -> bytes:
        return derive_keys(self.secret, tenant).pseudonym

    async def put(self, tenant: str, entries: Mapping[str, str], ttl_seconds: int) -> None:
        self._call("put")
        stored = self.entries.setdefault(tenant, {})
        for placeholder, value in entries.items():
            stored.setdefault(placeholder, value)  # an entry that exists only has its TTL extended

    async def get(self, tenant: str, placeholders: Iterable[str]) -> VaultRead:
        self._call("get")
        stored = self.entries.get(tenant, {})
        return VaultRead({p: stored[p] for p in dict.fromkeys(placeholders) if p in stored})

    async def claim_surrogates(
        self,
        tenant: str,
        wanted: Iterable[SurrogateWanted],
        ttl_seconds: int,
        avoid: Callable[[str], bool] | None = None,
    ) -> dict[SurrogateWanted, str]:
        self._call("claim")
        key = self.pseudonym_key(tenant)
        registry = self.registry.setdefault(tenant, {})
        chosen: dict[SurrogateWanted, str] = {}
        for item in dict.fromkeys(wanted):
            entry = surrogate_entry(item.family, item.original)
            for attempt in range(MAX_ATTEMPTS):
                text = candidate(key, item.family, item.original, attempt)
                if not text or (avoid is not None and avoid(text)):
                    continue
                if registry.setdefault(claim_form(text), entry) == entry:
                    chosen[item] = text
                    break
            else:
                raise SurrogateExhausted(f"no free {item.family.split(':')[0]} surrogate")
        return chosen


def make_runtime(
    *policies: Policy,
    receipts: FakeReceipts | None = None,
    vault: FakeVault | None = None,
    secret: bytes = b"receipt-secret",
    trust_tenant_header: bool = False,
) -> Runtime:
    """A worker's runtime over `policies` (see `policy_set`) and the fakes given."""
    return Runtime(
        policies=policy_set(*policies),
        receipts=receipts,
        receipt_secret=secret,
        trust_tenant_header=trust_tenant_header,
        vault=vault,
    )


# --- Envoy's side of a stream ---------------------------------------------------------------------

_MODES = processing_mode_pb2.ProcessingMode.BodySendMode


@dataclass(frozen=True, slots=True)
class Answer:
    """One `ProcessingResponse`, decoded.

    `phase`: which answer it is (`request_headers`, `request_body`, `response_headers`,
    `response_body`, `immediate_response`, or `override_message_timeout`). `body`: the immediate
    response's body, or the replacement a body mutation carries (None: the body goes unchanged;
    b"" with `cleared`). `headers`: the headers set (of the immediate response, or by the mutation).
    """

    phase: str
    raw: pb.ProcessingResponse = field(repr=False)
    status: int | None = None
    body: bytes | None = None
    cleared: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    removed: tuple[str, ...] = ()
    request_body_mode: str | None = None  # a mode override's body modes (NONE, BUFFERED, STREAMED)
    response_body_mode: str | None = None
    timeout: float | None = None

    @property
    def immediate(self) -> bool:
        """Answered here (Envoy calls no upstream): a refusal, or the admin API's answer."""
        return self.phase == "immediate_response"

    @property
    def refused(self) -> bool:
        return self.immediate and (self.status or 0) >= 400

    def json(self) -> Any:
        assert self.body is not None, "the answer carries no body"
        return json.loads(self.body)


def _set_headers(mutation: pb.HeaderMutation) -> dict[str, str]:
    out: dict[str, str] = {}
    for option in mutation.set_headers:
        header = option.header
        out[header.key] = header.raw_value.decode("utf-8") if header.raw_value else header.value
    return out


def decode(response: pb.ProcessingResponse) -> Answer:
    phase = response.WhichOneof("response")
    modes: dict[str, Any] = {}
    if response.HasField("mode_override"):
        mode = response.mode_override
        modes = {
            "request_body_mode": _MODES.Name(mode.request_body_mode),
            "response_body_mode": _MODES.Name(mode.response_body_mode),
        }
    if phase is None:
        assert response.HasField("override_message_timeout"), "an empty ProcessingResponse"
        duration = response.override_message_timeout
        return Answer("override_message_timeout", response, timeout=duration.seconds + duration.nanos / 1e9)
    if phase == "immediate_response":
        immediate = response.immediate_response
        return Answer(
            phase,
            response,
            status=int(immediate.status.code),
            body=bytes(immediate.body),
            headers=_set_headers(immediate.headers),
            removed=tuple(immediate.headers.remove_headers),
        )
    common: pb.CommonResponse = getattr(response, phase).response
    body: bytes | None = None
    cleared = False
    if common.HasField("body_mutation"):
        mutation = common.body_mutation
        cleared = mutation.WhichOneof("mutation") == "clear_body"
        body = b"" if cleared else bytes(mutation.body)
    return Answer(
        phase,
        response,
        body=body,
        cleared=cleared,
        headers=_set_headers(common.header_mutation),
        removed=tuple(common.header_mutation.remove_headers),
        **modes,
    )


HeaderList = Mapping[str, str] | Sequence[tuple[str, str]]


def _header_map(headers: Iterable[tuple[str, str]]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=name, raw_value=value.encode("utf-8")) for name, value in headers]
    )


def _pairs(headers: HeaderList) -> list[tuple[str, str]]:
    return list(headers.items()) if isinstance(headers, Mapping) else list(headers)


def _bytes(body: bytes | str | Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body).encode("utf-8")


class EnvoyStream:
    """One ext_proc stream, Envoy's side: each method sends one message and returns the answers.

    Messages go to `Exchange.process` in a fresh event loop each (`asyncio.run`): the exchange
    keeps no state bound to a loop between messages, as the fakes keep none.
    """

    def __init__(self, runtime: Runtime, *, offload: bool = False) -> None:
        self.runtime = runtime
        self.exchange = Exchange(runtime)
        self.offload = offload
        self.answers: list[Answer] = []

    def send(self, request: pb.ProcessingRequest) -> list[Answer]:
        async def run() -> list[pb.ProcessingResponse]:
            return [r async for r in self.exchange.process(request, offload=self.offload)]

        answers = [decode(response) for response in asyncio.run(run())]
        self.answers.extend(answers)
        return answers

    def _one(self, request: pb.ProcessingRequest) -> Answer:
        answers = self.send(request)
        assert len(answers) == 1, f"{len(answers)} answers to one message"
        return answers[0]

    def request_headers(
        self,
        path: str = "/v1/chat/completions",
        headers: HeaderList = (),
        *,
        method: str = "POST",
        route: str | None = "openai",
        end_of_stream: bool = False,
    ) -> Answer:
        """The request's headers; `route` is the route name Envoy chose (None: no attribute)."""
        pairs = [(":method", method), (":path", path), (":authority", "api.test"), *_pairs(headers)]
        request = pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(headers=_header_map(pairs), end_of_stream=end_of_stream)
        )
        if route is not None:
            request.attributes[EXT_PROC_FILTER].fields[ROUTE_ATTRIBUTE].string_value = route
        return self._one(request)

    def request_body(self, body: bytes | str | Any) -> list[Answer]:
        """The whole buffered request body (JSON-encoded unless bytes or text): its answers, one
        or, when images are masked first, a timeout extension and then the answer."""
        message = pb.HttpBody(body=_bytes(body), end_of_stream=True)
        return self.send(pb.ProcessingRequest(request_body=message))

    def response_headers(
        self,
        headers: HeaderList = (("content-type", "application/json"),),
        *,
        status: int = 200,
        end_of_stream: bool = False,
    ) -> Answer:
        pairs = [(":status", str(status)), *_pairs(headers)]
        message = pb.HttpHeaders(headers=_header_map(pairs), end_of_stream=end_of_stream)
        return self._one(pb.ProcessingRequest(response_headers=message))

    def response_body(self, chunk: bytes | str | Any, *, end_of_stream: bool = True) -> Answer:
        message = pb.HttpBody(body=_bytes(chunk), end_of_stream=end_of_stream)
        return self._one(pb.ProcessingRequest(response_body=message))

    def stream_reply(self, chunks: Sequence[bytes], content_type: str = "text/event-stream") -> bytes:
        """An SSE reply sent as `chunks` (the last with end_of_stream): what the client receives."""
        self.response_headers([("content-type", content_type)])
        out = b""
        for n, chunk in enumerate(chunks):
            answer = self.response_body(chunk, end_of_stream=n == len(chunks) - 1)
            out += chunk if answer.body is None else answer.body
        return out

    def close(self) -> None:
        self.exchange.close()


# --- bodies ---------------------------------------------------------------------------------------


def chat(text: str, *, system: str | None = None) -> dict[str, Any]:
    """A Chat Completions request asking `text` (after `system`, when given)."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    return {"model": "gpt-test", "messages": [*messages, {"role": "user", "content": text}]}


def chat_reply(text: str) -> dict[str, Any]:
    """A Chat Completions reply saying `text`."""
    return {"id": "r1", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def chat_stream(*deltas: str) -> bytes:
    """A Chat Completions SSE reply whose content arrives as `deltas`, then `[DONE]`."""
    events = [
        b"data: " + json.dumps({"id": "r1", "choices": [{"index": 0, "delta": {"content": d}}]}).encode()
        for d in deltas
    ]
    return b"".join(event + b"\n\n" for event in [*events, b"data: [DONE]"])
