"""Which tenant X-Tenant may select: `less_strict_knobs` compares two policies knob by knob.

Where this sits: at admission, when TRUST_TENANT_HEADER=true and a request names its tenant in
X-Tenant, the exchange allows that tenant only if it is at least as strict as the one the
caller's API key selects. The ranks of the knobs' values are in `ext_proc.policy.model`; the table
below says how each knob is compared.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ext_proc.detect.catalog.deny import term_key
from ext_proc.detect.catalog.extensions import ACTION_STRICTNESS, CustomKind, Extensions
from ext_proc.policy.model import (
    FAIL_MODE_STRICTNESS,
    MEDIA_STRICTNESS,
    MODE_STRICTNESS,
    OUTPUT_GATE_STRICTNESS,
    Policy,
)

_TRUE_IS_STRICTER: Mapping[bool, int] = {False: 0, True: 1}
_FALSE_IS_STRICTER: Mapping[bool, int] = {True: 0, False: 1}


def _ranked(ranks: Mapping[Any, int]) -> Callable[[Any, Any], bool]:
    return lambda target, base: ranks[target] >= ranks[base]


def _superset(target: tuple[str, ...], base: tuple[str, ...]) -> bool:
    return set(target) >= set(base)


def _output_sets(target: tuple[bool, tuple[str, ...]], base: tuple[bool, tuple[str, ...]]) -> bool:
    # Where neither file writes outputSets, the gate reads `sets`: a difference is `sets`'s to report.
    return not (target[0] or base[0]) or _superset(target[1], base[1])


def _custom_kinds(target: Extensions, base: Extensions) -> bool:
    # More custom kinds are stricter: the target must define every kind the base defines, alike.
    mine: set[CustomKind] = set(target.custom_kinds)
    return all(kind in mine for kind in base.custom_kinds)


def _deny(target: Extensions, base: Extensions) -> bool:
    # More deny terms are stricter: every base term must be denied by the target (compared as
    # the deny list reads them, so a term written in another case or spacing is the same term).
    mine = {term_key(term) for term in target.deny}
    return all(term_key(term) in mine for term in base.deny)


def _allow(target: Extensions, base: Extensions) -> bool:
    # Fewer allow entries are stricter: the target may allow nothing the base does not.
    return set(target.allow_values) <= set(base.allow_values) and set(target.allow_patterns) <= set(
        base.allow_patterns
    )


def _actions(target: Extensions, base: Extensions) -> bool:
    # Per kind, block > redact > allow.
    kinds = {kind for kind, _ in (*target.actions, *base.actions)}
    return all(
        ACTION_STRICTNESS[target.action(kind)] >= ACTION_STRICTNESS[base.action(kind)] for kind in kinds
    )


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
    _Knob("media", "media", _ranked(MEDIA_STRICTNESS)),
    _Knob("reportOnly", "report_only", _ranked(_FALSE_IS_STRICTER)),
    _Knob("allowHeaderOverride", "allow_header_override", _ranked(_FALSE_IS_STRICTER)),
    _Knob("skipDocumentationIps", "skip_documentation_ips", _ranked(_FALSE_IS_STRICTER)),
    _Knob("outputGate", "output_gate", _ranked(OUTPUT_GATE_STRICTNESS)),
    _Knob("outputSets", "output_sets_knob", _output_sets),
    _Knob("upstreams", "upstreams", operator.eq),
    _Knob("customKinds", "extensions", _custom_kinds),
    _Knob("allow", "extensions", _allow),
    _Knob("deny", "extensions", _deny),
    _Knob("actions", "extensions", _actions),
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
    - media: allow < mask < block, for the same reasons, in requests without declared subjects.
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
    - customKinds: the target must define every kind the base defines, with the same pattern,
      validator, context and minimum length (more kinds, more redactions).
    - allow: the target's allow entries must be among the base's (fewer values passed through).
    - deny: the target must deny every term the base denies (compared as the deny list reads
      them: case, spacing and separators aside).
    - actions: per kind, allow < redact < block.
    """
    return [
        knob.key
        for knob in _STRICTNESS
        if not knob.at_least_as_strict(getattr(target, knob.attr), getattr(base, knob.attr))
    ]
