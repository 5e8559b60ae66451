"""The request-headers phase: which tenant, route and subjects an exchange has, or why not.

In order: the key's tenant (each selecting header sent once; two keys must agree), `X-Tenant`
when trusted (only towards a tenant at least as strict), `X-Redact-Mode` when allowed (only
tighter), the placeholder grammar, the route Envoy chose and whether the tenant may reach its
upstream, then the declared subjects: parsed and compiled, and looked for in the path and the
other headers (they leave too). The result says whether the body must be read.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

from ext_proc.detect.subjects.header import SubjectHeader, SubjectHeaderError, parse_subject_header
from ext_proc.detect.subjects.matcher import CompiledSubjects, compile_subjects
from ext_proc.dialects import RouteInfo, classify
from ext_proc.errors import Refusal, Stage, describe
from ext_proc.exchange.context import Placeholders, RequestContext, uses_surrogates
from ext_proc.exchange.headers import (
    MODE_HEADER,
    SUBJECT_HEADER,
    TENANT_HEADER,
    UNREAD_HEADERS,
    Headers,
    api_keys,
    sent_twice,
)
from ext_proc.exchange.refusals import refusal_for
from ext_proc.exchange.runtime import Runtime
from ext_proc.policy.model import MODE_STRICTNESS, MODES, Policy, PolicySet
from ext_proc.policy.strictness import less_strict_knobs
from ext_proc.transform.placeholders import PlaceholderMap, PseudonymMap

log = logging.getLogger("cordon.exchange")


@dataclass(frozen=True, slots=True)
class Admitted:
    context: RequestContext
    read_body: bool  # False: forwarded as it is (nothing to redact, or report-only)
    stage: Stage | None = None  # report-only: the refusal it would have made


@dataclass(frozen=True, slots=True)
class Turned:
    """Refused at the headers: the policy and route known by then go into the receipt."""

    refusal: Refusal
    policy: Policy
    route: RouteInfo | None
    ref: str | None = None  # the subject header's, once read (its HMAC goes into the receipt)


class _Refused(Exception):
    def __init__(
        self, refusal: Refusal, policy: Policy, route: RouteInfo | None = None, ref: str | None = None
    ) -> None:
        self.outcome = Turned(refusal, policy, route, ref)


def admit(runtime: Runtime, headers: Headers) -> Admitted | Turned:
    """The request's context, or the refusal (with the policy and route chosen before it)."""
    try:
        return _admit(runtime, headers)
    except _Refused as refused:
        return refused.outcome


def _admit(runtime: Runtime, headers: Headers) -> Admitted:
    policy = _chosen(runtime, headers)
    route: RouteInfo | None = None
    header: SubjectHeader | None = None
    try:
        placeholders = _placeholders(runtime, policy)
        route = classify(headers.route_name, headers.path)
        if route is None:
            raise Refusal(404, "routing", "no upstream is configured for this path", code="not_found")
        if route.provider.name not in policy.upstreams:
            raise Refusal(403, "policy", f"this tenant may not reach the {route.provider.name} upstream")
        context = RequestContext(policy, route, placeholders)
        raw_subject = headers.get(SUBJECT_HEADER)
        if raw_subject is not None:
            header = _parsed(raw_subject)
            subjects = _compiled(header)
            context = replace(context, header=header, subjects=subjects)
            _check_policy_takes_subjects(policy)
            _check_path_and_headers(subjects, headers)
        elif policy.require_subject:
            raise Refusal(
                400, "request", "this tenant requires an X-Cordon-Subject header", code="subject_required"
            )
    except Refusal as refusal:
        raise _Refused(refusal, policy, route, header.ref if header is not None else None) from None
    encoding = (headers.get("content-encoding") or "identity").strip().lower()
    if encoding != "identity" and not headers.end_of_stream:
        compressed = Refusal(
            415, "request", "compressed request bodies cannot be read; send them uncompressed"
        )
        if not policy.report_only:
            raise _Refused(compressed, policy, route)
        return Admitted(context, read_body=False, stage=compressed.stage)  # recorded, forwarded as it is
    # Nothing to redact: forwarded as it is. (A subject request never gets here with mode off;
    # without a body, its path and headers were checked above.)
    return Admitted(context, read_body=not (policy.mode == "off" or headers.end_of_stream))


def _chosen(runtime: Runtime, headers: Headers) -> Policy:
    """The key's tenant; then `X-Tenant` (when trusted, towards a tenant at least as strict);
    then `X-Redact-Mode` (when the tenant allows it, only tighter)."""
    policies = runtime.policies
    repeated = sent_twice(headers)
    if repeated:
        # Joined, two keys would select no tenant (so the default policy) while the provider
        # may authenticate one of them; two subject or tenant headers are just as ambiguous.
        refusal = Refusal(400, "request", f"send each of these headers once: {', '.join(repeated)}")
        raise _Refused(refusal, policies.default)
    base = _key_policy(policies, headers)
    policy = base
    wanted = headers.get(TENANT_HEADER)
    if wanted is not None and runtime.trust_tenant_header:
        policy = _tenant_policy(policies, wanted.strip(), base)
    raw_mode = headers.get(MODE_HEADER)
    if raw_mode is not None:
        try:
            policy = override_mode(policy, raw_mode.strip().lower())
        except Refusal as refusal:
            raise _Refused(refusal, policy) from None
    return policy


def _key_policy(policies: PolicySet, headers: Headers) -> Policy:
    selected = [policies.for_api_key(key) for key in api_keys(headers)]
    if len({policy.tenant for policy in selected}) > 1:
        # Which one the provider authenticates with is its business; which tenant's policy
        # applies is ours, and a junk token beside a real key must not pick the lenient one.
        refusal = Refusal(
            400, "request", "Authorization and x-api-key select different tenants; send one key"
        )
        raise _Refused(refusal, policies.default)
    return selected[0] if selected else policies.default


def _tenant_policy(policies: PolicySet, wanted: str, base: Policy) -> Policy:
    target = policies.tenants.get(wanted)
    if target is None:
        refusal = Refusal(403, "policy", "X-Tenant names no configured tenant", code="tenant_forbidden")
        raise _Refused(refusal, base)
    looser = less_strict_knobs(target, base)
    if looser:
        refusal = Refusal(
            403,
            "policy",
            "X-Tenant may only select a tenant at least as strict as the API key's tenant; "
            f"the one named is less strict on: {', '.join(looser)}",
            code="tenant_forbidden",
        )
        raise _Refused(refusal, base)
    return target


def override_mode(policy: Policy, wanted: str) -> Policy:
    """`X-Redact-Mode`: another mode only when the tenant allows it, and only a tighter one."""
    if wanted not in MODES:
        raise Refusal(400, "request", "X-Redact-Mode must be one of " + ", ".join(MODES))
    if wanted == policy.mode:
        return policy
    if MODE_STRICTNESS[wanted] < MODE_STRICTNESS[policy.mode]:
        raise Refusal(
            403,
            "policy",
            f"X-Redact-Mode may only tighten the tenant's mode ({policy.mode}), never loosen it",
        )
    if not policy.allow_header_override:
        raise Refusal(
            403, "policy", "this tenant does not let X-Redact-Mode change its mode (allowHeaderOverride)"
        )
    return replace(policy, mode=wanted)


def _placeholders(runtime: Runtime, policy: Policy) -> Placeholders:
    """Consistent pseudonyms for a tenant that restores and wants them; per-request otherwise
    (strip writes markers, and under reportOnly nothing leaves redacted to be restored).
    `mode: surrogate` writes per-request placeholders first: the commit replaces them."""
    if uses_surrogates(policy) and runtime.vault is None:
        # Refused at load without TENANT_SECRET; X-Redact-Mode cannot ask for it (it only
        # tightens, and surrogate is looser than every mode but off).
        raise Refusal(503, "vault", "surrogates are not configured (TENANT_SECRET)")
    if not policy.consistent_pseudonyms or policy.mode != "reversible" or policy.report_only:
        return PlaceholderMap()
    if runtime.vault is None:
        # Policies that need TENANT_SECRET are refused at load without it: not reached.
        raise Refusal(503, "vault", "consistent pseudonyms are not configured (TENANT_SECRET)")
    return PseudonymMap(runtime.vault.pseudonym_key(policy.tenant))


def _parsed(raw: str) -> SubjectHeader:
    """The declared subjects; anything unreadable is a 400, never a fallback."""
    try:
        return parse_subject_header(raw)
    except SubjectHeaderError as exc:
        raise refusal_for(exc) from None


def _compiled(header: SubjectHeader) -> CompiledSubjects:
    try:
        return compile_subjects(header)
    except SubjectHeaderError as exc:
        raise refusal_for(exc) from None
    except Exception as exc:
        log.error(json.dumps({"event": "subject_compile_failed", **describe(exc)}))
        raise Refusal(422, "detection", "the declared subjects could not be compiled") from None


def _check_policy_takes_subjects(policy: Policy) -> None:
    if policy.mode == "off":
        raise Refusal(
            422,
            "policy",
            "this tenant does not redact (mode: off); a request declaring subjects is refused",
        )
    if policy.report_only:
        raise Refusal(
            422,
            "policy",
            "this tenant only reports (reportOnly: true) and would forward the body unchanged; "
            "a request declaring subjects is refused",
        )


def _check_path_and_headers(subjects: CompiledSubjects, headers: Headers) -> None:
    """The path and header values leave too: a declared identifier in one refuses the request.
    (The path is also read percent-decoded: `mq%40example.com`.)"""
    survivor = subjects.first_survivor(headers.path)
    if survivor is not None:
        raise Refusal(
            422, "egress", f"a declared identifier ({survivor}) is in the request path", kind=survivor
        )
    for name, value in headers.values.items():
        if name in UNREAD_HEADERS or name.startswith(":"):
            continue
        survivor = subjects.first_survivor(f"{name} {value}")
        if survivor is not None:
            raise Refusal(
                422, "egress", f"a declared identifier ({survivor}) is in a request header", kind=survivor
            )
