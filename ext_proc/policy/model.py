"""What a tenant's policy is: the `Policy` value, the `PolicySet` of a directory, the knobs' values.

Where this sits: the worker loads the policy directory at start (`ext_proc.policy.load`), and for
every request the exchange picks a `Policy` from the `PolicySet` by the caller's API key; every
later stage (detection sets, redaction mode, media, output gate, receipts) reads its knobs from it.
The values are frozen, so a reload swaps a whole set and never changes one a request is using.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ext_proc.detect.catalog.extensions import NO_EXTENSIONS, Extensions
from ext_proc.detect.findings import ALL_SETS
from ext_proc.errors import CordonError

Mode = Literal["reversible", "surrogate", "strip", "off"]
FailMode = Literal["closed", "open"]
MediaPolicy = Literal["block", "mask", "allow"]

MODES: tuple[Mode, ...] = ("reversible", "surrogate", "strip", "off")
FAIL_MODES: tuple[FailMode, ...] = ("closed", "open")
MEDIA_POLICIES: tuple[MediaPolicy, ...] = ("block", "mask", "allow")
OUTPUT_GATES: tuple[str, ...] = ("off", "report", "deny")
PROVIDERS = ("openai", "anthropic")
DEFAULT_TENANT = "default"

# How long the vault keeps a consistent pseudonym's value after the last request that sent it.
DEFAULT_VAULT_TTL_SECONDS = 86400
MIN_VAULT_TTL_SECONDS = 60
MAX_VAULT_TTL_SECONDS = 30 * 86400

# Rank of each value, higher = stricter (`ext_proc.policy.strictness` compares tenants with them).
# MODE_STRICTNESS is also what lets X-Redact-Mode only tighten a tenant's mode.
# `surrogate` sits between off and reversible: like reversible it hides every value and restores
# it, but the model sees each value's kind and shape (a plausible name, a phone's layout, a date's
# distance to the others), where a placeholder shows only the kind.
MODE_STRICTNESS: Mapping[str, int] = {"off": 0, "surrogate": 1, "reversible": 2, "strip": 3}
FAIL_MODE_STRICTNESS: Mapping[str, int] = {"open": 0, "closed": 1}
MEDIA_STRICTNESS: Mapping[str, int] = {"allow": 0, "mask": 1, "block": 2}
OUTPUT_GATE_STRICTNESS: Mapping[str, int] = {"off": 0, "report": 1, "deny": 2}


class PolicyError(CordonError, ValueError):
    """A policy file (or directory) that cannot be used: names the file, the key and the reason."""

    def __init__(self, source: Path | str, key: str, reason: str) -> None:
        super().__init__(f"{source}: {key}: {reason}")
        self.source = str(source)
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Policy:
    """One tenant's policy file, validated: the knobs every stage of its requests reads."""

    tenant: str
    api_keys: frozenset[str] = frozenset()
    mode: Mode = "reversible"
    sets: tuple[str, ...] = ALL_SETS
    fail_mode: FailMode = "closed"
    redact_system: bool = True
    consistent_pseudonyms: bool = False
    vault_ttl_seconds: int = DEFAULT_VAULT_TTL_SECONDS
    require_subject: bool = False
    subject_media: MediaPolicy = "block"
    media: MediaPolicy = "allow"  # media in requests without declared subjects
    report_only: bool = False
    allow_header_override: bool = False
    upstreams: frozenset[str] = frozenset(PROVIDERS)
    skip_documentation_ips: bool = False
    output_gate: str = "report"
    output_sets_given: tuple[str, ...] | None = None  # None: the tenant's `sets`
    # customKinds, allow, deny and actions: what the tenant adds to the catalog.
    extensions: Extensions = NO_EXTENSIONS
    source: str = ""

    @property
    def output_sets(self) -> tuple[str, ...]:
        """The catalog sets the output gate reads model output with."""
        return self.output_sets_given if self.output_sets_given is not None else self.sets

    @property
    def output_gate_sets(self) -> tuple[str, ...]:
        """What the gate actually reads: nothing when it is off."""
        return () if self.output_gate == "off" else self.output_sets

    @property
    def output_sets_knob(self) -> tuple[bool, tuple[str, ...]]:
        """(written in the file?, the sets the gate reads), for the strictness rule."""
        return self.output_sets_given is not None, self.output_gate_sets

    @property
    def vault_retention(self) -> int:
        """Seconds the vault keeps this tenant's values (consistent pseudonyms, or the surrogate
        registry under `mode: surrogate`): the TTL, or 0 when it keeps none."""
        return self.vault_ttl_seconds if self.consistent_pseudonyms or self.mode == "surrogate" else 0


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class PolicySet:
    """Every tenant of a policy directory, and the index from key digest to tenant."""

    tenants: Mapping[str, Policy]
    by_key: Mapping[str, Policy] = field(default_factory=dict)

    @property
    def default(self) -> Policy:
        return self.tenants[DEFAULT_TENANT]

    def for_api_key(self, key: str | None) -> Policy:
        if key:
            digest = hash_api_key(key)
            for known, policy in self.by_key.items():
                # Constant time per comparison: the digest of a caller's key is not to be probed.
                if hmac.compare_digest(known, digest):
                    return policy
        return self.default
