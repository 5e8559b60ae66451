"""Policy files → a `PolicySet`: parse and validate each YAML file, load or reload a directory.

Where this sits: at start the worker (and `policy check`, and `make up`) loads the policy
directory strictly; while it runs, a poll of `policy_signature` notices a change and
`reload_policy_dir` swaps in the new set, keeping the last good version of a file that broke.
Every problem is a `PolicyError` naming the file, the key and the reason; an unknown key is an
error, never ignored, because a misspelt knob that silently falls back to a default is how a
platform team ends up less strict than it wrote.

A directory holds one YAML file per tenant and must hold `default.yaml` (tenant `default`, selected
by no key), used for every request whose key matches no tenant. A tenant is named by letters,
digits, '-' and '_' (at most 64), in one file only; an API key is written as its digest
(`sha256:` + 64 lowercase hex digits) and selects one tenant at most.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from pathlib import Path
from typing import Any

import yaml

from ext_proc.detect.findings import ALL_SETS
from ext_proc.policy.extensions import EXTENSION_KEYS, parse_extensions
from ext_proc.policy.model import (
    DEFAULT_TENANT,
    FAIL_MODES,
    MAX_VAULT_TTL_SECONDS,
    MEDIA_POLICIES,
    MIN_VAULT_TTL_SECONDS,
    MODES,
    OUTPUT_GATES,
    PROVIDERS,
    Policy,
    PolicyError,
    PolicySet,
)

# Knobs this version validates but cannot honour yet: a file that turns one on is refused at load
# time (naming the knob) instead of being silently weaker than it reads. (None at the moment.)
NOT_YET_SUPPORTED: dict[str, str] = {}


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


# Policy-file key → (Policy attribute, validated value); raises PolicyError naming that key.
_PARSERS: dict[str, Callable[[Path, object], tuple[str, object]]] = {
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
    "media": lambda src, v: ("media", _choice(src, "media", v, MEDIA_POLICIES)),
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
        if key == "tenant" or key in EXTENSION_KEYS:
            continue
        parser = _PARSERS.get(key) if isinstance(key, str) else None
        if parser is None:
            known = ", ".join(["tenant", *_PARSERS, *EXTENSION_KEYS])
            raise PolicyError(source, str(key), "unknown key; known: " + known)
        attr, parsed = parser(source, value)
        if key in NOT_YET_SUPPORTED and parsed is True:
            raise PolicyError(source, key, NOT_YET_SUPPORTED[key])
        values[attr] = parsed
    extensions = parse_extensions(source, {k: v for k, v in data.items() if k in EXTENSION_KEYS})
    if extensions.custom_kinds and values.get("consistent_pseudonyms"):
        # A consistent pseudonym's label is one every replica's restore and vault know in
        # advance; a tenant's own kinds are not among them, so their values could not come back.
        raise PolicyError(source, "customKinds", "cannot be combined with consistentPseudonyms: true")
    if values.get("mode") == "off" and values.get("media", "allow") != "allow":
        # Under mode: off the body is forwarded unread, so no media part could be blocked or masked.
        raise PolicyError(
            source, "media", "block and mask cannot be combined with mode: off (the body is not read)"
        )
    return Policy(tenant=tenant, source=str(source), extensions=extensions, **values)


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
    directory: str | Path,
    previous: PolicySet,
    *,
    check: PolicyCheck = _no_check,
    unsettled: Set[str] = frozenset(),
) -> tuple[PolicySet, list[PolicyError]]:
    """Re-read `directory` after a change, falling back per file; never raises PolicyError.

    A file named in `unsettled` (still being written) is not read: it keeps the policy `previous`
    loaded from it, and a new one is left out until it settles.

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
        if path.name in unsettled:
            kept = kept_by_source.get(str(path))
            if kept is not None:
                policies.append(kept)
            continue
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
