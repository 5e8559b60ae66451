"""What the supervisor, its workers and the local stack agree on: the ready file a worker writes,
its liveness service, the exit code of a worker whose port is taken, the drain grace.

Kept apart from `worker` so that the processes that only start and watch workers (the `serve`
supervisor, `stack run`) need not import the worker's gRPC server, protobuf bindings and
detectors to learn these names.
"""

from __future__ import annotations

from pathlib import Path

from ext_proc.runtime.config import Settings

DRAIN_SECONDS = 20.0
# gRPC health service that is SERVING while a worker answers at all (readiness is the overall one).
LIVENESS_SERVICE = "liveness"
# The exit code of a worker whose port is taken: the supervisor stops with an error naming the
# port instead of restarting it, since another try would find the port taken again.
PORT_TAKEN = 69


def ready_file(settings: Settings, index: int) -> Path:
    return settings.run_dir / "extproc" / f"worker-{index}.ready"
