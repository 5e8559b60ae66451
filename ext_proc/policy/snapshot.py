"""The last good `PolicySet` as JSON, for a worker restarted while a policy file is broken.

Where this sits: beside the flow. After each successful load or reload the worker writes the set
with `dump_policy_set`; a worker that restarts while the directory no longer loads strictly reads
it back with `load_policy_snapshot` and reloads the directory over it, so a broken file keeps its
last good version there too.
"""

from __future__ import annotations

import json

from ext_proc.policy.extensions import extensions_from_record, extensions_record
from ext_proc.policy.model import DEFAULT_TENANT, Policy, PolicySet

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
                extensions_record(value)
                if name == "extensions"
                else sorted(value)
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
        if "extensions" in values:
            values["extensions"] = extensions_from_record(values["extensions"])
        if values.get("output_sets_given") is not None:
            values["output_sets_given"] = tuple(values["output_sets_given"])
        policies.append(Policy(**values))
    by_key = {digest: policy for policy in policies for digest in policy.api_keys}
    tenants = {policy.tenant: policy for policy in policies}
    if DEFAULT_TENANT not in tenants:
        raise ValueError("a policy snapshot without the default tenant")
    return PolicySet(tenants=tenants, by_key=by_key)
