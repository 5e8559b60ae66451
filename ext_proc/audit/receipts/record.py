"""What a receipt is: the record an exchange writes, its canonical JSON and its chain hash.

Where this sits: once an exchange knows its decision (forwarded, refused at any stage, reported) it
builds a `ReceiptFields`; the store (`ext_proc.audit.receipts.store`) chains it onto its tenant's
chain as a `Receipt`, and verification recomputes the hashes defined here from the stored bytes.

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
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal, get_args

from ext_proc.errors import Stage
from ext_proc.policy.model import MODES, Mode

# "output": the record of what the output gate found in a reply, written after the exchange's own
# record; its `exchange` field is that record's hash.
Decision = Literal["forwarded", "refused", "reported", "output"]
Egress = Literal["verified", "refused", "skipped"]

DECISIONS: tuple[str, ...] = get_args(Decision)
EGRESS_VERDICTS: tuple[str, ...] = get_args(Egress)
STAGES: tuple[str, ...] = get_args(Stage)

GENESIS = "0" * 64
MAX_KIND_CHARS = 64

_HEX64 = re.compile(r"[0-9a-f]{64}")
_KIND = re.compile(r"[A-Z][A-Z0-9_]*")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
_DIALECT = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Python attribute → JSON field, where they differ.
_JSON_NAMES = {"ref_digest": "refDigest"}
_ATTR_NAMES = {v: k for k, v in _JSON_NAMES.items()}


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


def is_sha256_hex(value: object) -> bool:
    """A SHA-256 digest as 64 lowercase hex characters (a chain hash, a refDigest)."""
    return isinstance(value, str) and bool(_HEX64.fullmatch(value))


def canonical_json(record: Mapping[str, object]) -> bytes:
    """Sorted keys, no whitespace, UTF-8, only present fields (a None value counts as absent)."""
    present = {key: value for key, value in record.items() if value is not None}
    return json.dumps(
        present, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def record_hash(prev: str, canonical: bytes) -> str:
    """The chain hash of a record whose canonical JSON is `canonical`: the one place it is computed."""
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
    return record_hash(prev, canonical_json({**record, "prev": prev}))


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
    if not isinstance(kind, str):
        return False
    if kind in _KNOWN_KINDS:
        return True
    ok = len(kind) <= MAX_KIND_CHARS and bool(_KIND.fullmatch(kind))
    if ok and len(_KNOWN_KINDS) < 4096:
        _KNOWN_KINDS.add(kind)
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
        r.exchange is None or is_sha256_hex(r.exchange),
        "exchange: the SHA-256 hex of the exchange's record",
    )
    _check(
        r.ref_digest is None or is_sha256_hex(r.ref_digest),
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
        _check(is_sha256_hex(self.prev), "prev: a SHA-256 hex")
        _check(is_sha256_hex(self.hash), "hash: a SHA-256 hex")

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
        # JSON's values are untyped until the constructor has validated them.
        values: dict[str, Any] = {_ATTR_NAMES.get(str(k), str(k)): v for k, v in data.items()}
        receipt = cls(**values, hash=hash_)
        if canonical_json(receipt.hashed_record()) != canonical:
            raise ValueError("the stored record is not in canonical form")
        return receipt
