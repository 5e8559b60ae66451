"""A policy's action per kind, applied to the findings of one text: redact, block or allow.

Where this sits: the request pipeline (ext_proc.exchange.pipeline) and the header rewrite
(ext_proc.exchange.envelope) pass the catalog's findings of every string through `apply_actions`
before overlaps are resolved: a kind under `block` raises `KindBlocked` (the exchange refuses the
request, ext_proc.exchange.refusals), a kind under `allow` is left in the text and counted as
`ALLOWED_{KIND}`, every other finding goes on to be redacted. Declared subjects never reach here.
"""

from __future__ import annotations

from collections import Counter

from ext_proc.detect.catalog.extensions import ALLOWED_PREFIX, Extensions
from ext_proc.detect.findings import Finding
from ext_proc.transform.redact import SUBJECT_PRIORITY_LIMIT
from ext_proc.transform.walk import BodyError


class KindBlocked(BodyError):
    """The request carries a kind its policy blocks; it is not forwarded. Names the kind only."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"the policy blocks requests that carry {kind}; it was not forwarded")
        self.kind = kind


def apply_actions(findings: list[Finding], extensions: Extensions, counts: Counter[str]) -> list[Finding]:
    """The findings to redact; raises KindBlocked for a blocked kind, counts the allowed ones."""
    if not findings or not extensions.actions:
        return findings
    kept: list[Finding] = []
    for finding in findings:
        # A declared subject's finding is redacted whatever the policy says of its kind.
        action = "redact" if finding.priority < SUBJECT_PRIORITY_LIMIT else extensions.action(finding.kind)
        if action == "block":
            raise KindBlocked(finding.kind)
        if action == "allow":
            counts[ALLOWED_PREFIX + finding.kind] += 1
        else:
            kept.append(finding)
    return kept
