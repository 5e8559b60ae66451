"""The request-headers phase: which tenant, route and subjects an exchange has, or why not.

In order: the header names (no look-alike of the filter's own, no key header it does not read),
the key's tenant (each selecting header sent once, each credential readable; two keys must agree),
`X-Tenant` when trusted (only towards a tenant at least as strict), `X-Redact-Mode` when allowed
(only tighter), the placeholder grammar, the route Envoy chose and whether the tenant may reach its
upstream. Then what leaves outside the body: the declared subjects parsed and compiled, the header
values and the query read and rewritten like body strings (exchange.envelope), and, for a request
that declares subjects, the egress check over the path and every header. Under `reportOnly` a
refusal from there on is recorded, not made. The result says whether the body must be read.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

from ext_proc.detect.subjects.header import SubjectHeader, SubjectHeaderError, parse_subject_header
from ext_proc.detect.subjects.matcher import CompiledSubjects, compile_subjects
from ext_proc.dialects import RouteInfo, classify
from ext_proc.errors import DetectionError, Refusal, describe
from ext_proc.exchange.context import Placeholders, RequestContext, uses_surrogates
from ext_proc.exchange.envelope import Envelope, rewritten, survivor
from ext_proc.exchange.headers import (
    MODE_HEADER,
    SUBJECT_HEADER,
    TENANT_HEADER,
    HeaderError,
    Headers,
    api_keys,
    check_names,
    sent_twice,
)
from ext_proc.exchange.record import ExchangeRecord
from ext_proc.exchange.refusals import FAIL_CLOSED, refusal_for
from ext_proc.exchange.request import guarded
from ext_proc.exchange.runtime import Runtime
from ext_proc.policy.model import MODE_STRICTNESS, MODES, Policy, PolicySet
from ext_proc.policy.strictness import less_strict_knobs
from ext_proc.transform.actions import KindBlocked
from ext_proc.transform.placeholders import PlaceholderMap, PseudonymMap

log = logging.getLogger("cordon.exchange")


@dataclass(frozen=True, slots=True)
class Admitted:
    context: RequestContext
    read_body: bool  # False: forwarded without reading the body (nothing to redact, or reported)
    set_headers: tuple[tuple[str, str], ...] = ()  # header values (and `:path`) rewritten
    removed: tuple[str, ...] = ()  # headers dropped (their name holds a value)
    reported: Refusal | None = None  # reportOnly: the refusal enforcement would have made here


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


def admit(runtime: Runtime, headers: Headers, record: ExchangeRecord) -> Admitted | Turned:
    """The request's context, or the refusal (with the policy and route chosen before it).
    `record` gains the counts of what was replaced in the headers and query (or a gap)."""
    try:
        return _admit(runtime, headers, record)
    except _Refused as refused:
        return refused.outcome


def _admit(runtime: Runtime, headers: Headers, record: ExchangeRecord) -> Admitted:
    policy = _chosen(runtime, headers)
    route: RouteInfo | None = None
    try:
        placeholders = _placeholders(runtime, policy)
        route = classify(headers.route_name, headers.path)
        if route is None:
            raise Refusal(404, "routing", "no upstream is configured for this path", code="not_found")
        if route.provider.name not in policy.upstreams:
            raise Refusal(403, "policy", f"this tenant may not reach the {route.provider.name} upstream")
    except Refusal as refusal:
        raise _Refused(refusal, policy, route) from None
    context = RequestContext(policy, route, placeholders)
    envelope = Envelope((), headers.values)
    try:
        raw_subject = headers.get(SUBJECT_HEADER)
        if raw_subject is not None:
            header = _parsed(raw_subject)
            context = replace(context, header=header)
            context = replace(context, subjects=_compiled(header))
            _check_policy_takes_subjects(policy)
        elif policy.require_subject:
            raise Refusal(
                400, "request", "this tenant requires an X-Cordon-Subject header", code="subject_required"
            )
        if policy.mode != "off":
            envelope = _envelope(context, headers, record)
        if context.subjects is not None:
            _check_envelope(context, envelope)
        _check_encoding(headers)
    except Refusal as refusal:
        if not policy.report_only:
            ref = context.header.ref if context.header is not None else None
            raise _Refused(refusal, policy, route, ref) from None
        # reportOnly: recorded, and forwarded as it is (its body unread: enforcement stops here).
        return Admitted(context, read_body=False, reported=refusal)
    # Nothing to redact: forwarded as it is. (A subject request never gets here with mode off;
    # without a body, its path and headers were checked above.) reportOnly rewrites nothing.
    read_body = not (policy.mode == "off" or headers.end_of_stream)
    if policy.report_only:
        return Admitted(context, read_body)
    return Admitted(context, read_body, envelope.set_headers, envelope.removed)


def _chosen(runtime: Runtime, headers: Headers) -> Policy:
    """The key's tenant; then `X-Tenant` (when trusted, towards a tenant at least as strict);
    then `X-Redact-Mode` (when the tenant allows it, only tighter)."""
    policies = runtime.policies
    try:
        check_names(headers)
    except HeaderError as exc:
        raise _Refused(refusal_for(exc), policies.default) from None
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
    try:
        keys = api_keys(headers)
    except HeaderError as exc:
        # Unreadable, it selects no tenant: the default policy would apply to a key that the
        # provider may well accept, whatever its tenant's policy says.
        raise _Refused(refusal_for(exc), policies.default) from None
    selected = [policies.for_api_key(key) for key in keys]
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


def _envelope(context: RequestContext, headers: Headers, record: ExchangeRecord) -> Envelope:
    """The header values and query rewritten; a detection failure is handled like the body's."""
    if context.subjects is not None:
        return guarded(lambda: rewritten(context, headers, record.counts))
    policy = context.policy
    try:
        return rewritten(context, headers, record.counts)
    except DetectionError as exc:
        if policy.fail_mode == "closed" and not policy.report_only:
            message = f"detection failed on the request's headers ({exc}); failMode is closed"
            raise refusal_for(exc, message, FAIL_CLOSED) from None
        record.record_gap("detection", str(exc))
        return Envelope((), headers.values)
    except KindBlocked as exc:
        raise refusal_for(exc) from None


def _check_envelope(context: RequestContext, envelope: Envelope) -> None:
    """The path and header values leave too: a declared identifier still readable in one (after
    the rewrite) refuses the request. The path is also read percent-decoded: `mq%40example.com`."""
    subjects = context.subjects
    assert subjects is not None
    found = guarded(lambda: survivor(subjects, envelope, context.placeholders.nonce))
    if found is not None:
        raise Refusal(
            422, "egress", f"a declared identifier ({found.label}) is {found.where}", kind=found.label
        )


def _check_encoding(headers: Headers) -> None:
    encoding = (headers.get("content-encoding") or "identity").strip().lower()
    if encoding != "identity" and not headers.end_of_stream:
        raise Refusal(415, "request", "compressed request bodies cannot be read; send them uncompressed")
