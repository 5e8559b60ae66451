"""Keeping a worker's policies current: the first load, and reloads on change or SIGHUP.

A file is taken only once it has stopped changing: one whose size or modification time changed
less than `SETTLE_SECONDS` ago is still being written and keeps its last good version (a file
written in pieces could otherwise parse half-written, as a looser policy with its strict knobs
still missing). Files written whole by a rename are taken at the next poll after they settle.
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ext_proc.audit.metrics import Metrics
from ext_proc.policy.load import PolicyCheck, load_policy_dir, policy_signature, reload_policy_dir
from ext_proc.policy.model import PolicyError, PolicySet
from ext_proc.policy.snapshot import dump_policy_set, load_policy_snapshot
from ext_proc.runtime.files import write_atomically

log = logging.getLogger("cordon.policy")

POLL_SECONDS = 0.25
SETTLE_SECONDS = 0.5  # a file unchanged for this long is written; one that changed since is not
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
        settling = Settling(signature)
        pending = False
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_SECONDS):
                    await wake.wait()
            forced = wake.is_set()
            wake.clear()
            changed = settling.observe(self.signature(), time.monotonic())
            pending = pending or changed or forced
            if not pending:
                continue
            unsettled = settling.unsettled(time.monotonic())
            try:
                policies, errors = reload_policy_dir(
                    self.directory, current(), check=self.check, unsettled=unsettled
                )
            except Exception as exc:  # a bug here must not end reloading for good: keep the set, say so
                self.metrics.inc("cordon_policy_reload_errors_total")
                log.error(json.dumps({"event": "policy_reload_failed", "error": type(exc).__name__}))
                continue  # pending: try again at the next poll
            pending = bool(unsettled)  # the files still being written are read once they settle
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


class Settling:
    """When each policy file last changed (size or modification time), as the polls saw it."""

    def __init__(self, signature: Signature) -> None:
        self._seen = {name: (mtime, size) for name, mtime, size in signature}
        self._changed_at: dict[str, float] = {}

    def observe(self, signature: Signature, now: float) -> bool:
        """Take a poll's signature; True if any file appeared, changed or went since the last."""
        seen = {name: (mtime, size) for name, mtime, size in signature}
        changed = seen != self._seen
        for name, stat in seen.items():
            if self._seen.get(name) != stat:
                self._changed_at[name] = now
        self._seen = seen
        return changed

    def unsettled(self, now: float) -> frozenset[str]:
        """The files that changed less than SETTLE_SECONDS ago (forgotten once settled)."""
        for name, at in list(self._changed_at.items()):
            if now - at >= SETTLE_SECONDS or name not in self._seen:
                del self._changed_at[name]
        return frozenset(self._changed_at)
