"""Keeping a worker's policies current: the first load, and reloads on change or SIGHUP.

A file that no longer loads keeps its last good version, and the reason is logged (file, key,
reason: never a value); so is one this deployment cannot honour (`consistentPseudonyms: true`
without TENANT_SECRET). The set a worker serves is also written to RUN_DIR, so that a worker
restarted while a file is broken starts from the set the others serve rather than failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ext_proc.audit.metrics import Metrics
from ext_proc.policy.load import PolicyCheck, load_policy_dir, policy_signature, reload_policy_dir
from ext_proc.policy.model import PolicyError, PolicySet
from ext_proc.policy.snapshot import dump_policy_set, load_policy_snapshot
from ext_proc.runtime.files import write_atomically

log = logging.getLogger("cordon.policy")

POLL_SECONDS = 1.0
Signature = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class PolicySource:
    directory: Path
    snapshot: Path  # the last good set a worker served, for a worker restarted meanwhile
    check: PolicyCheck  # what this deployment can honour
    metrics: Metrics

    def signature(self) -> Signature:
        return policy_signature(self.directory)

    def initial(self) -> PolicySet:
        """The strict load; if a file broke since the server started (this is a restarted
        worker), the last good set the other workers serve, with every file that still loads
        applied, and the errors of those that do not logged."""
        try:
            policies = load_policy_dir(self.directory, check=self.check)
        except PolicyError as first:
            try:
                previous = load_policy_snapshot(self.snapshot.read_text())
            except (OSError, ValueError, TypeError, KeyError):
                raise first from None
            policies, errors = reload_policy_dir(self.directory, previous, check=self.check)
            log.warning(json.dumps({"event": "policy_last_good_kept", "tenants": sorted(policies.tenants)}))
            self.log_errors(errors)
            return policies
        self.save(policies)
        return policies

    def save(self, policies: PolicySet) -> None:
        write_atomically(self.snapshot, dump_policy_set(policies))

    def log_errors(self, errors: list[PolicyError]) -> None:
        for error in errors:
            self.metrics.inc("cordon_policy_reload_errors_total")
            where = {"file": error.source, "key": error.key}
            log.error(json.dumps({"event": "policy_reload_error", **where, "reason": error.reason}))

    async def watch(
        self,
        current: Callable[[], PolicySet],
        apply: Callable[[PolicySet], None],
        wake: asyncio.Event,
        signature: Signature,
    ) -> None:
        """Reload when a file changes (polled) or on SIGHUP (`wake`). `signature` is the directory
        as it was just before the first load, so an edit made while the worker started is seen."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_SECONDS):
                    await wake.wait()
            forced = wake.is_set()
            wake.clear()
            now = self.signature()
            if now == signature and not forced:
                continue
            signature = now
            try:
                policies, errors = reload_policy_dir(self.directory, current(), check=self.check)
            except Exception as exc:  # a bug here must not end reloading for good: keep the set, say so
                self.metrics.inc("cordon_policy_reload_errors_total")
                log.error(json.dumps({"event": "policy_reload_failed", "error": type(exc).__name__}))
                signature = ()  # and try again at the next poll
                continue
            self.log_errors(errors)
            if policies == current():
                continue
            apply(policies)
            self.metrics.inc("cordon_policy_reloads_total")
            log.info(json.dumps({"event": "policy_reloaded", "tenants": sorted(policies.tenants)}))
            try:
                self.save(policies)
            except OSError as exc:
                log.warning(json.dumps({"event": "policy_snapshot_failed", "error": type(exc).__name__}))
