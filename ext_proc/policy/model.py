"""Tenant policy files (SPEC §10) → validated, frozen `Policy` objects; API key → tenant.

A policy directory holds one YAML file per tenant and must hold `default.yaml` (tenant `default`),
used for every request whose key matches no tenant. Every problem is reported with the file, the
key and the reason; an unknown key is an error, never ignored, because a misspelt knob that
silently falls back to a default is how a platform team ends up less strict than it wrote.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

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

# Knobs this version validates but cannot honour yet: a file that turns one on is refused at load
# time (naming the knob) instead of being silently weaker than it reads. (None at the moment.)
NOT_YET_SUPPORTED: dict[str, str] = {}

# How long the vault keeps a consistent pseudonym's value after the last request that sent it.
DEFAULT_VAULT_TTL_SECONDS = 86400
MIN_VAULT_TTL_SECONDS = 60
MAX_VAULT_TTL_SECONDS = 30 * 86400


class PolicyError(CordonError, ValueError):
    def __init__(self, source: Path | str, key: str, reason: str) -> None:
        super().__init__(f"{source}: {key}: {reason}")
        self.source = str(source)
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Policy:
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
    report_only: bool = False
    allow_header_override: bool = False
    upstreams: frozenset[str] = frozenset(PROVIDERS)
    skip_documentation_ips: bool = False
    output_gate: str = "report"
    output_sets_given: tuple[str, ...] | None = None  # None: the tenant's `sets`
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


def _bool(source: Path, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(source, key, "must be true or false")
    return value


def _choice(source: Path, key: str, value: object, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise PolicyError(source, key, "must be one of " + ", ".join(options))
    return value


def _seconds(source: Path, key: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PolicyError(source, key, f"must be a whole number of seconds from {low} to {high}")
    return value


def _string_list(source: Path, key: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(source, key, "must be a list of strings")
    return value


def _sets(source: Path, value: object, key: str = "sets") -> tuple[str, ...]:
    names = _string_list(source, key, value)
    for name in names:
        if name not in ALL_SETS:
            raise PolicyError(source, key, f"unknown set {name!r}; known: " + ", ".join(ALL_SETS))
    if len(set(names)) != len(names):
        raise PolicyError(source, key, "lists a set twice")
    # Keep the catalog's own order so equal policies compile to the same cached catalog.
    return tuple(s for s in ALL_SETS if s in names)


def _api_keys(source: Path, value: object) -> frozenset[str]:
    keys = _string_list(source, "apiKeys", value)
    out = set()
    for key in keys:
        algo, _, digest = key.partition(":")
        if algo != "sha256" or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            # Never echo the entry: someone may have pasted a raw key here by mistake.
            raise PolicyError(source, "apiKeys", "entries must be 'sha256:' + 64 lowercase hex digits")
        out.add(digest)
    return frozenset(out)


def _upstreams(source: Path, value: object) -> frozenset[str]:
    names = _string_list(source, "upstreams", value)
    if len(set(names)) != len(names):
        raise PolicyError(source, "upstreams", "lists an upstream twice")
    for name in names:
        if name not in PROVIDERS:
            raise PolicyError(source, "upstreams", f"unknown upstream {name!r}; known: openai, anthropic")
    return frozenset(names)


_PARSERS: dict[str, Any] = {
    "apiKeys": lambda src, v: ("api_keys", _api_keys(src, v)),
    # YAML 1.1 reads a bare `off` as false; `mode: off` is what an author writes, so take it as meant.
    "mode": lambda src, v: ("mode", _choice(src, "mode", "off" if v is False else v, MODES)),
    "sets": lambda src, v: ("sets", _sets(src, v)),
    "failMode": lambda src, v: ("fail_mode", _choice(src, "failMode", v, FAIL_MODES)),
    "redactSystem": lambda src, v: ("redact_system", _bool(src, "redactSystem", v)),
    "consistentPseudonyms": lambda src, v: ("consistent_pseudonyms", _bool(src, "consistentPseudonyms", v)),
    "vaultTtlSeconds": lambda src, v: (
        "vault_ttl_seconds",
        _seconds(src, "vaultTtlSeconds", v, MIN_VAULT_TTL_SECONDS, MAX_VAULT_TTL_SECONDS),
    ),
    "requireSubject": lambda src, v: ("require_subject", _bool(src, "requireSubject", v)),
    "subjectMedia": lambda src, v: ("subject_media", _choice(src, "subjectMedia", v, MEDIA_POLICIES)),
    "reportOnly": lambda src, v: ("report_only", _bool(src, "reportOnly", v)),
    "allowHeaderOverride": lambda src, v: ("allow_header_override", _bool(src, "allowHeaderOverride", v)),
    "upstreams": lambda src, v: ("upstreams", _upstreams(src, v)),
    "skipDocumentationIps": lambda src, v: ("skip_documentation_ips", _bool(src, "skipDocumentationIps", v)),
    # YAML 1.1 reads a bare `off` as false, as for `mode`.
    "outputGate": lambda src, v: (
        "output_gate",
        _choice(src, "outputGate", "off" if v is False else v, OUTPUT_GATES),
    ),
    # null (the default): the gate reads with the tenant's `sets`.
    "outputSets": lambda src, v: ("output_sets_given", None if v is None else _sets(src, v, "outputSets")),
}


def parse_policy(source: Path, data: object) -> Policy:
    if not isinstance(data, Mapping):
        raise PolicyError(source, "(file)", "must be a YAML mapping of policy keys")
    tenant = data.get("tenant")
    if (
        not isinstance(tenant, str)
        or not tenant
        or len(tenant) > 64
        or not tenant.replace("-", "").replace("_", "").isalnum()
    ):
        raise PolicyError(source, "tenant", "must be a name of letters, digits, '-' or '_' (at most 64)")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "tenant":
            continue
        parser = _PARSERS.get(key) if isinstance(key, str) else None
        if parser is None:
            raise PolicyError(source, str(key), "unknown key; known: tenant, " + ", ".join(_PARSERS))
        attr, parsed = parser(source, value)
        if key in NOT_YET_SUPPORTED and parsed is True:
            raise PolicyError(source, key, NOT_YET_SUPPORTED[key])
        values[attr] = parsed
    return Policy(tenant=tenant, source=str(source), **values)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice (plain YAML keeps the last one, silently)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[object, object]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise PolicyError(
                loader.name, "(file)", f"a key is not a plain name (line {key_node.start_mark.line + 1})"
            )
        key = loader.construct_object(key_node)
        if key in seen:
            raise PolicyError(
                loader.name, str(key), f"is written twice (line {key_node.start_mark.line + 1})"
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_policy_file(path: str | Path) -> Policy:
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(source, "(file)", f"cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PolicyError(source, "(file)", "is not UTF-8 text") from None
    try:
        loader = _StrictLoader(text)
        loader.name = str(source)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except PolicyError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PolicyError(source, "(file)", f"is not valid YAML{where}") from None
    except RecursionError:
        raise PolicyError(source, "(file)", "is nested too deeply") from None
    except (TypeError, ValueError, OverflowError) as exc:
        # A value YAML cannot build (a timestamp like 2026-13-45): the type names the problem, the
        # message could quote the file.
        raise PolicyError(
            source, "(file)", f"holds a value YAML cannot read ({type(exc).__name__})"
        ) from None
    return parse_policy(source, data)


# What a policy needs from the deployment beyond its own file (a secret in the environment). The
# server and `make up` apply it at load and reload; `policy check` does not (it is for CI, which
# holds no secrets). Raises PolicyError naming the file and the knob.
PolicyCheck = Callable[[Policy], None]


def deployment_check(*, tenant_secret: bool) -> PolicyCheck:
    """The check for a deployment with (or without) a usable TENANT_SECRET."""

    def check(policy: Policy) -> None:
        if policy.consistent_pseudonyms and not tenant_secret:
            raise PolicyError(
                policy.source,
                "consistentPseudonyms",
                "needs TENANT_SECRET, which is unset: set it (at least 32 random characters, the same "
                "on every replica) or turn consistentPseudonyms off",
            )
        if policy.mode == "surrogate" and not tenant_secret:
            raise PolicyError(
                policy.source,
                "mode",
                "surrogate needs TENANT_SECRET, which is unset: set it (at least 32 random characters, "
                "the same on every replica) or choose another mode",
            )

    return check


def _no_check(policy: Policy) -> None:
    return None


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


def _policy_files(directory: str | Path) -> list[Path]:
    root = Path(directory)
    if not root.is_dir():
        raise PolicyError(root, "(directory)", "does not exist or is not a directory")
    # Dotfiles are editors' (`.#acme.yaml` lock links, swap files) or ConfigMap internals.
    files = [*root.glob("*.yaml"), *root.glob("*.yml")]
    return sorted(path for path in files if not path.name.startswith("."))


def _policy_set(root: Path, policies: Iterable[Policy]) -> PolicySet:
    """The rules that span files, checked in file order; the first one broken is raised.

    Each policy's file is its `source`. Shared by the strict start (`load_policy_dir`, which hands
    in a generator so a bad file and a cross-file conflict are reported in file order) and reload.
    """
    tenants: dict[str, Policy] = {}
    by_key: dict[str, Policy] = {}
    for policy in policies:
        path = Path(policy.source)
        if policy.tenant in tenants:
            raise PolicyError(path, "tenant", f"tenant {policy.tenant!r} is also defined in another file")
        if (path.stem == DEFAULT_TENANT) != (policy.tenant == DEFAULT_TENANT):
            raise PolicyError(path, "tenant", "the default tenant lives in default.yaml and only there")
        for digest in policy.api_keys:
            if digest in by_key:
                raise PolicyError(path, "apiKeys", "a key digest also selects another tenant")
            by_key[digest] = policy
        tenants[policy.tenant] = policy
    if DEFAULT_TENANT not in tenants:
        raise PolicyError(root / "default.yaml", "(file)", "is missing: every policy directory needs one")
    default = tenants[DEFAULT_TENANT]
    if default.api_keys:
        raise PolicyError(default.source, "apiKeys", "the default tenant is selected by no key")
    return PolicySet(tenants=tenants, by_key=by_key)


def _load_checked(path: Path, check: PolicyCheck) -> Policy:
    policy = load_policy_file(path)
    check(policy)
    return policy


def load_policy_dir(directory: str | Path, *, check: PolicyCheck = _no_check) -> PolicySet:
    """Every policy file of `directory`, validated (and `check`ed); the first problem is raised
    (start is strict)."""
    root = Path(directory)
    return _policy_set(root, (_load_checked(path, check) for path in _policy_files(root)))


def reload_policy_dir(
    directory: str | Path, previous: PolicySet, *, check: PolicyCheck = _no_check
) -> tuple[PolicySet, list[PolicyError]]:
    """Re-read `directory` after a change, falling back per file; never raises PolicyError.

    A file that no longer loads (or fails `check`) keeps the policy `previous` loaded from the same
    path (matched on
    `Policy.source`, so pass the directory spelled as it was at start); a new file that does not
    load is left out. Either way its error is returned. A deleted file drops its tenant, whose keys
    then select the default. If the merged set breaks a rule that spans files (a tenant defined
    twice, a key digest selecting two tenants, default.yaml missing or keyed), nothing is applied:
    `previous` comes back whole, with that error first. An empty error list means all files loaded.
    """
    root = Path(directory)
    try:
        paths = _policy_files(root)
    except PolicyError as exc:
        return previous, [exc]
    kept_by_source = {policy.source: policy for policy in previous.tenants.values()}
    policies: list[Policy] = []
    errors: list[PolicyError] = []
    for path in paths:
        try:
            policies.append(_load_checked(path, check))
        except PolicyError as exc:
            errors.append(exc)
            kept = kept_by_source.get(str(path))
            if kept is not None:
                policies.append(kept)
    try:
        return _policy_set(root, policies), errors
    except PolicyError as exc:
        return previous, [exc, *errors]


def policy_signature(directory: str | Path) -> tuple[tuple[str, int, int], ...]:
    """(name, mtime in ns, size) of every policy file, sorted: a cheap poll for "did anything change".

    A missing directory gives (); a file that cannot be stat'ed (a dangling symlink) gives -1s, so
    its appearance still changes the signature. Stat follows symlinks, so a Kubernetes ConfigMap
    swap (files are links into a directory that is replaced) is seen as a change.
    """
    try:
        paths = _policy_files(directory)
    except PolicyError:
        return ()
    entries: list[tuple[str, int, int]] = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            entries.append((path.name, -1, -1))
        else:
            entries.append((path.name, stat.st_mtime_ns, stat.st_size))
    return tuple(sorted(entries))


# --- strictness: which tenant X-Tenant may select (SPEC §10) -------------------------------------

# Rank of each value, higher = stricter. MODE_STRICTNESS is also what lets X-Redact-Mode only
# tighten a tenant's mode.
# `surrogate` sits between off and reversible: like reversible it hides every value and restores
# it, but the model sees each value's kind and shape (a plausible name, a phone's layout, a date's
# distance to the others), where a placeholder shows only the kind.
MODE_STRICTNESS: Mapping[str, int] = {"off": 0, "surrogate": 1, "reversible": 2, "strip": 3}
FAIL_MODE_STRICTNESS: Mapping[str, int] = {"open": 0, "closed": 1}
MEDIA_STRICTNESS: Mapping[str, int] = {"allow": 0, "mask": 1, "block": 2}
OUTPUT_GATE_STRICTNESS: Mapping[str, int] = {"off": 0, "report": 1, "deny": 2}
_TRUE_IS_STRICTER: Mapping[bool, int] = {False: 0, True: 1}
_FALSE_IS_STRICTER: Mapping[bool, int] = {True: 0, False: 1}


def _ranked(ranks: Mapping[Any, int]) -> Callable[[Any, Any], bool]:
    return lambda target, base: ranks[target] >= ranks[base]


def _superset(target: tuple[str, ...], base: tuple[str, ...]) -> bool:
    return set(target) >= set(base)


def _output_sets(target: tuple[bool, tuple[str, ...]], base: tuple[bool, tuple[str, ...]]) -> bool:
    # Where neither file writes outputSets, the gate reads `sets`: a difference is `sets`'s to report.
    return not (target[0] or base[0]) or _superset(target[1], base[1])


@dataclass(frozen=True, slots=True)
class _Knob:
    key: str  # as written in a policy file, and as reported
    attr: str  # the `Policy` attribute
    at_least_as_strict: Callable[[Any, Any], bool]  # (target's value, base's value) → allowed


# One row per knob of `Policy` (all but the tenant's name and keys), in the order less_strict_knobs
# reports them; why each direction is stricter is in its docstring.
_STRICTNESS: tuple[_Knob, ...] = (
    _Knob("mode", "mode", _ranked(MODE_STRICTNESS)),
    _Knob("sets", "sets", _superset),
    _Knob("failMode", "fail_mode", _ranked(FAIL_MODE_STRICTNESS)),
    _Knob("redactSystem", "redact_system", _ranked(_TRUE_IS_STRICTER)),
    _Knob("consistentPseudonyms", "consistent_pseudonyms", _ranked(_FALSE_IS_STRICTER)),
    _Knob("vaultTtlSeconds", "vault_retention", lambda target, base: base == 0 or target <= base),
    _Knob("requireSubject", "require_subject", _ranked(_TRUE_IS_STRICTER)),
    _Knob("subjectMedia", "subject_media", _ranked(MEDIA_STRICTNESS)),
    _Knob("reportOnly", "report_only", _ranked(_FALSE_IS_STRICTER)),
    _Knob("allowHeaderOverride", "allow_header_override", _ranked(_FALSE_IS_STRICTER)),
    _Knob("skipDocumentationIps", "skip_documentation_ips", _ranked(_FALSE_IS_STRICTER)),
    _Knob("outputGate", "output_gate", _ranked(OUTPUT_GATE_STRICTNESS)),
    _Knob("outputSets", "output_sets_knob", _output_sets),
    _Knob("upstreams", "upstreams", operator.eq),
)


def less_strict_knobs(target: Policy, base: Policy) -> list[str]:
    """The policy-file keys on which `target` is less strict than `base`; [] = `target` is allowed.

    With TRUST_TENANT_HEADER=true a caller may name its tenant in X-Tenant, but only one at least as
    strict as the tenant its API key selects (`base`), knob by knob, so the header can never buy a
    caller less protection than the platform team gave its key. Keys come in the order below.

    - mode: off < surrogate < reversible < strip. Off sends values as they are; surrogate hides
      them behind fictional values of the same kind and shape (the model sees the shape) and
      brings them back; reversible hides them behind placeholders (the model sees only the kind)
      and brings them back; strip hides them for good.
    - sets: the target must detect every set the base detects (a superset); fewer sets, fewer
      redactions.
    - failMode: open < closed. Open forwards unredacted text when a step fails.
    - redactSystem: false < true. False leaves system prompts and instructions unread.
    - consistentPseudonyms: true < false. Placeholders stable across requests let the model link
      the same value between conversations; per-request placeholders link nothing across them.
    - vaultTtlSeconds: longer < shorter, between two tenants that both keep values in the vault
      (consistent pseudonyms, or the surrogate registry): a longer TTL keeps them, encrypted, for
      longer. The TTL of a tenant that keeps nothing never counts; a target that keeps values
      where the base keeps none is already less strict on consistentPseudonyms or mode.
    - requireSubject: false < true. False lets a request through without declared subjects.
    - subjectMedia: allow < mask < block. Allow forwards images as they are; mask forwards what OCR
      could paint over (and OCR can miss); block forwards no media.
    - reportOnly: true < false. Report-only forwards the request unchanged.
    - allowHeaderOverride: true < false. The target may not hand the caller more control over its
      own redaction than the base does.
    - skipDocumentationIps: true < false. True leaves some addresses unredacted.
    - outputGate: off < report < deny. Off reads no model output; report counts what it finds;
      deny refuses a reply that carries a finding.
    - outputSets: the target's gate must read every set the base's gate reads (a superset; a gate
      that is off reads none). Where neither file writes outputSets, both gates read their `sets`,
      and a difference there is reported as `sets`.
    - upstreams: must be identical. The set of reachable providers is an access decision, not a
      scale: fewer is not "stricter" for whoever routes there, and more is a way out.
    """
    return [
        knob.key
        for knob in _STRICTNESS
        if not knob.at_least_as_strict(getattr(target, knob.attr), getattr(base, knob.attr))
    ]


# --- the last good set, for a worker restarted while a file is broken -------------------------

_SNAPSHOT_VERSION = 1


def dump_policy_set(policies: PolicySet) -> str:
    """The whole set as JSON (key digests only, as in the files): what a restarted worker loads
    when the directory no longer loads strictly."""
    out = []
    for policy in policies.tenants.values():
        record: dict[str, object] = {}
        for name in Policy.__dataclass_fields__:
            value = getattr(policy, name)
            record[name] = (
                sorted(value)
                if isinstance(value, frozenset)
                else list(value)
                if isinstance(value, tuple)
                else value
            )
        out.append(record)
    return json.dumps({"version": _SNAPSHOT_VERSION, "tenants": out}, sort_keys=True)


def load_policy_snapshot(text: str) -> PolicySet:
    """The inverse of `dump_policy_set`; ValueError when it is not one."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("version") != _SNAPSHOT_VERSION:
        raise ValueError("not a policy snapshot of this version")
    policies = []
    for record in data["tenants"]:
        values = dict(record)
        for name in ("api_keys", "upstreams"):
            values[name] = frozenset(values[name])
        values["sets"] = tuple(values["sets"])
        if values.get("output_sets_given") is not None:
            values["output_sets_given"] = tuple(values["output_sets_given"])
        policies.append(Policy(**values))
    by_key = {digest: policy for policy in policies for digest in policy.api_keys}
    tenants = {policy.tenant: policy for policy in policies}
    if DEFAULT_TENANT not in tenants:
        raise ValueError("a policy snapshot without the default tenant")
    return PolicySet(tenants=tenants, by_key=by_key)
