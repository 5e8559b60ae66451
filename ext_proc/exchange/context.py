"""What the request-headers phase decided about an exchange, fixed for the rest of it.

A `RequestContext` is built once, when the request's headers have been admitted: the tenant's
policy (after `X-Tenant` and `X-Redact-Mode`), the route and its dialect, the declared subjects
compiled, and the placeholder map redaction writes into. Every later phase reads it; none changes
which tenant, route or subjects an exchange has.
"""

from __future__ import annotations

from dataclasses import dataclass

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import SubjectHeader
from ext_proc.detect.subjects.matcher import CompiledSubjects
from ext_proc.dialects import Dialect, RouteInfo
from ext_proc.dialects.providers import Provider
from ext_proc.policy.model import Policy
from ext_proc.transform.placeholders import PlaceholderMap, PseudonymMap

Placeholders = PlaceholderMap | PseudonymMap


@dataclass(frozen=True, slots=True)
class RequestContext:
    policy: Policy
    route: RouteInfo
    # Filled by redaction (this request's placeholders and their originals); never logged.
    placeholders: Placeholders
    header: SubjectHeader | None = None
    subjects: CompiledSubjects | None = None

    @property
    def dialect(self) -> Dialect:
        return self.route.dialect

    @property
    def provider(self) -> Provider:
        return self.route.provider

    @property
    def restores(self) -> bool:
        """Whether redaction writes placeholders that a reply may carry back (not strip markers)."""
        return self.policy.mode in ("reversible", "surrogate")

    @property
    def uses_surrogates(self) -> bool:
        """`mode: surrogate`, and the body leaves redacted (not reportOnly)."""
        return uses_surrogates(self.policy)

    def catalog(self) -> Catalog:
        policy = self.policy
        return Catalog.for_sets(
            policy.sets, skip_documentation_ips=policy.skip_documentation_ips, extensions=policy.extensions
        )

    def output_catalog(self) -> Catalog:
        policy = self.policy
        return Catalog.for_sets(
            policy.output_sets,
            skip_documentation_ips=policy.skip_documentation_ips,
            extensions=policy.extensions,
        )


def uses_surrogates(policy: Policy) -> bool:
    return policy.mode == "surrogate" and not policy.report_only
