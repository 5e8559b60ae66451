"""The facts of one exchange: what its receipt records and its log line and metrics say.

Phases add facts as they learn them (counts per kind, the media count, the egress verdict, a gap
forwarded under failMode: open, timings); the decision is taken once, when the request is
released or refused. Nothing here holds a value: counts by kind, stages and durations only.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from ext_proc.audit.metrics import Metrics
from ext_proc.audit.receipts.record import Decision, Egress, ReceiptFields, ref_digest
from ext_proc.dialects import RouteInfo
from ext_proc.dialects.providers import DEFAULT_PROVIDER, Provider
from ext_proc.errors import Refusal, Stage
from ext_proc.policy.model import Policy

log = logging.getLogger("cordon.exchange")


@dataclass(slots=True)
class ExchangeRecord:
    metrics: Metrics
    policy: Policy | None = None  # the tenant's, once chosen (a refusal before: the default)
    route: RouteInfo | None = None
    ref: str | None = field(default=None, repr=False)  # the subject header's ref (only its HMAC leaves)
    decision: Decision | None = None
    stage: Stage | None = None
    status: int | None = None
    egress: Egress = "skipped"
    media: int | None = None
    gap: str | None = None  # a failure forwarded under failMode: open (detection, audit)
    counts: Counter[str] = field(default_factory=Counter)
    timings: dict[str, float] = field(default_factory=dict)
    receipt_hash: str | None = None
    started: float = field(default_factory=time.perf_counter)
    _logged: bool = False

    @property
    def tenant(self) -> str | None:
        return self.policy.tenant if self.policy is not None else None

    @property
    def dialect(self) -> str:
        return self.route.dialect.name if self.route is not None else "none"

    @property
    def provider(self) -> Provider:
        """Whose error shape a refusal takes: the route's provider, or the default before a route."""
        return self.route.provider if self.route is not None else DEFAULT_PROVIDER

    def refused(self, refusal: Refusal) -> None:
        self.decision = "refused"
        self.stage = refusal.stage
        self.status = refusal.status
        if refusal.stage == "egress":
            self.egress = "refused"

    def report(self, refusal: Refusal) -> None:
        """reportOnly: the refusal enforcement would have made, recorded; the request goes on."""
        self.stage = refusal.stage
        if refusal.stage == "egress":
            self.egress = "refused"

    def timed(self, name: str, start: float) -> None:
        """Record the milliseconds since `start` under `name` (added to an earlier figure)."""
        ms = round((time.perf_counter() - start) * 1000, 3)
        self.timings[name] = round(self.timings.get(name, 0) + ms, 3)

    def record_gap(self, what: str, reason: str) -> None:
        """A failure forwarded anyway (failMode: open, or a refusal's receipt): logged and counted."""
        self.gap = what
        self.metrics.inc("cordon_gaps_total", what=what)
        log.warning(json.dumps({"event": f"{what}_gap", "tenant": self.tenant, "reason": reason}))

    def log_event(self, level: int, event: str, **fields: object) -> None:
        """An event of this exchange for the log: counts and reasons only, never a value."""
        log.log(level, json.dumps({"event": event, "tenant": self.tenant, **fields}))

    def receipt_fields(self, secret: bytes) -> ReceiptFields:
        assert self.policy is not None and self.decision is not None, "a receipt is written once decided"
        return ReceiptFields(
            tenant=self.policy.tenant,
            dialect=self.dialect,
            mode=self.policy.mode,
            decision=self.decision,
            stage=self.stage,
            counts=self.counts,
            ref_digest=ref_digest(secret, self.ref) if self.ref else None,
            egress=self.egress,
            media=self.media,
        )

    def finish(self) -> None:
        """The exchange's log line and metrics, once it is decided; later calls do nothing."""
        if self._logged or self.decision is None:
            return
        self._logged = True
        ms = round((time.perf_counter() - self.started) * 1000, 3)
        if log.isEnabledFor(logging.INFO):  # built and encoded for nothing under LOG_LEVEL=WARNING
            self._log_line(ms)
        self._count(ms)

    def _log_line(self, ms: float) -> None:
        line: dict[str, object] = {
            "event": "exchange",
            "tenant": self.tenant,
            "provider": self.provider.name,
            "dialect": self.route.dialect.name if self.route else None,
            "mode": self.policy.mode if self.policy else None,
            "decision": self.decision,
            "counts": dict(self.counts),
            "receipt": self.receipt_hash,
            "ms": ms,
            **self.timings,
        }
        if self.stage:
            line["stage"] = self.stage
        if self.status:
            line["status"] = self.status
        if self.gap:
            line["gap"] = self.gap
        log.info(json.dumps(line, separators=(",", ":")))

    def _count(self, total_ms: float) -> None:
        metrics = self.metrics
        # Tenant names come from the policy files (a bounded set); "none" before one is chosen.
        tenant = self.tenant or "none"
        metrics.inc(
            "cordon_exchanges_total", tenant=tenant, dialect=self.dialect, decision=str(self.decision)
        )
        if self.decision == "refused":
            metrics.inc("cordon_refusals_total", tenant=tenant, stage=str(self.stage))
        for kind, n in self.counts.items():
            metrics.inc("cordon_findings_total", n, tenant=tenant, kind=kind)
        for name, ms in self.timings.items():
            if name.endswith("_ms"):
                metrics.observe("cordon_phase_seconds", ms / 1000, phase=name.removesuffix("_ms"))
        metrics.observe("cordon_phase_seconds", total_ms / 1000, phase="exchange")
