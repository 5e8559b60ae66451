"""Counters and latency histograms per worker, summed across workers into Prometheus text.

Each worker counts in memory (`Metrics`) and writes a snapshot to
`RUN_DIR/extproc/metrics/worker-<index>-<pid>.json` about once a second (write + rename, so a
reader never sees half a file). The supervisor serves `GET /metrics` on `METRICS_PORT` and sums
every snapshot it finds, the final snapshots of workers that died included, so a restarted worker
does not make a counter go backwards (it loses at most its last second).

Gauges (a worker's readiness) are read from the snapshots of running workers only: a snapshot
older than STALE_SECONDS, left by a worker that died, gives its counters but no gauge.

Labels are names this code chooses (dialect, decision, stage, kind, phase, what, worker) and the
tenant names of the policy files (a bounded set): never a value, a ref, a header or any string
a request supplies.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ext_proc import __version__
from ext_proc.runtime.files import write_atomically

STALE_SECONDS = 5.0  # a snapshot older than this is a dead worker's: no gauge from it

# Latency buckets in seconds: 0.1 ms to 10 s.
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)

HELP = {
    "cordon_exchanges_total": (
        "counter",
        "Exchanges by tenant, dialect and decision (forwarded, refused, reported).",
    ),
    "cordon_refusals_total": ("counter", "Refusals by tenant and stage."),
    "cordon_findings_total": (
        "counter",
        "Values redacted (or that would have been, reportOnly), by tenant and kind.",
    ),
    "cordon_unrouted_total": (
        "counter",
        "Requests for a path no route knows: answered 404, no receipt written.",
    ),
    "cordon_ready": (
        "gauge",
        "1 while a worker is ready (serving, its Redis answering), 0 while not; by worker.",
    ),
    "cordon_build_info": ("gauge", "Always 1; the version of Cordon serving the metrics."),
    "cordon_gaps_total": (
        "counter",
        "Failures forwarded anyway (failMode open) or refusals left without a receipt.",
    ),
    "cordon_receipts_total": ("counter", "Receipts appended to the chains."),
    "cordon_redis_errors_total": ("counter", "Receipt appends that failed (Redis down, slow or refusing)."),
    "cordon_receipts_trimmed_total": ("counter", "Records trimmed off the chains by retention, by tenant."),
    "cordon_receipt_chain_broken_total": (
        "counter",
        "Periodic checks that found a chain this worker appended to broken, by reason.",
    ),
    "cordon_receipt_settlements_total": (
        "counter",
        "Refused exchanges whose unanswered append was looked for afterwards, by outcome.",
    ),
    "cordon_vault_writes_total": ("counter", "Pseudonyms written to (or kept alive in) the vault."),
    "cordon_vault_errors_total": (
        "counter",
        "Vault operations that failed, by op (a write refuses its request).",
    ),
    "cordon_vault_lookups_total": ("counter", "Placeholders of earlier requests looked up, by result."),
    "cordon_vault_unrestored_total": (
        "counter",
        "Placeholders left in a reply unrestored because the vault was unavailable or over the limit.",
    ),
    "cordon_vault_invalid_entries_total": ("counter", "Vault entries that did not decrypt (read as absent)."),
    "cordon_surrogate_claims_total": (
        "counter",
        "Surrogates claimed (or kept alive) in the surrogate registry, one per distinct value.",
    ),
    "cordon_output_findings_total": (
        "counter",
        "Distinct values the output gate found in model output, by kind (outputGate report or deny).",
    ),
    "cordon_output_denied_total": (
        "counter",
        "Replies refused by the output gate (outputGate: deny), by dialect.",
    ),
    "cordon_policy_reload_errors_total": ("counter", "Policy files that failed to reload (last good kept)."),
    "cordon_policy_reloads_total": ("counter", "Policy reloads that changed the policy set."),
    "cordon_phase_seconds": ("histogram", "Time per pipeline phase."),
    "cordon_ocr_pass_seconds": ("histogram", "Time of one tesseract pass over one image."),
}

Labels = tuple[tuple[str, str], ...]


def _labels(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


class Metrics:
    """One worker's counters and histograms (single-threaded use from the event loop, plus the
    body threads: the GIL makes each `+=` on a dict entry safe enough for counting)."""

    def __init__(self) -> None:
        self.counters: dict[tuple[str, Labels], float] = {}
        self.histograms: dict[tuple[str, Labels], list[float]] = {}  # bucket counts…, sum, count
        self.gauges: dict[tuple[str, Labels], float] = {}
        self._lock = threading.Lock()

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        key = (name, _labels(labels))
        with self._lock:
            self.counters[key] = self.counters.get(key, 0) + amount

    def set_gauge(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self.gauges[(name, _labels(labels))] = value

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.gauges.get((name, _labels(labels)))

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        key = (name, _labels(labels))
        with self._lock:
            row = self.histograms.get(key)
            if row is None:
                row = self.histograms[key] = [0.0] * (len(BUCKETS) + 2)
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    row[i] += 1
            row[-2] += seconds
            row[-1] += 1

    def counter(self, name: str, **labels: str) -> float:
        return self.counters.get((name, _labels(labels)), 0)

    def snapshot(self) -> dict[str, list[object]]:
        with self._lock:
            return {
                "counters": [[n, list(map(list, ls)), v] for (n, ls), v in self.counters.items()],
                "histograms": [[n, list(map(list, ls)), list(r)] for (n, ls), r in self.histograms.items()],
                "gauges": [[n, list(map(list, ls)), v] for (n, ls), v in self.gauges.items()],
            }


def metrics_dir(run_dir: Path) -> Path:
    return run_dir / "extproc" / "metrics"


def write_snapshot(metrics: Metrics, run_dir: Path, index: int) -> None:
    path = metrics_dir(run_dir) / f"worker-{index}-{os.getpid()}.json"
    write_atomically(path, json.dumps(metrics.snapshot()))


def _rows(snapshot: Mapping[str, list[Any]], section: str) -> list[tuple[Any, list[Any], Any]]:
    """A snapshot's rows of one section: (name, labels as pairs, value or bucket row)."""
    return [(row[0], row[1], row[2]) for row in snapshot.get(section, [])]


def merge(snapshots: Iterable[Mapping[str, list[Any]]]) -> Metrics:
    total = Metrics()
    for snap in snapshots:
        for name, labels, value in _rows(snap, "counters"):
            key = (str(name), tuple((str(k), str(v)) for k, v in labels))
            total.counters[key] = total.counters.get(key, 0) + float(value)
        for name, labels, row in _rows(snap, "histograms"):
            key = (str(name), tuple((str(k), str(v)) for k, v in labels))
            have = total.histograms.setdefault(key, [0.0] * (len(BUCKETS) + 2))
            for i, x in enumerate(row):
                have[i] += float(x)
        for name, labels, value in _rows(snap, "gauges"):
            total.gauges[(str(name), tuple((str(k), str(v)) for k, v in labels))] = float(value)
    return total


def read_all(run_dir: Path) -> Metrics:
    snapshots = []
    now = time.time()
    for path in sorted(metrics_dir(run_dir).glob("worker-*.json")):
        try:
            snapshot = json.loads(path.read_text())
            if now - path.stat().st_mtime > STALE_SECONDS:
                snapshot.pop("gauges", None)  # a dead worker's: its counters count, not its state
        except (OSError, ValueError):
            continue  # being replaced right now: the next scrape reads it
        snapshots.append(snapshot)
    return merge(snapshots)


def with_build_info(metrics: Metrics) -> Metrics:
    metrics.set_gauge("cordon_build_info", 1, version=__version__)
    return metrics


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render_labels(labels: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}" if inner else ""


def render(metrics: Metrics) -> str:
    """Prometheus text exposition format 0.0.4."""
    lines: list[str] = []
    names = sorted(
        {n for n, _ in metrics.counters} | {n for n, _ in metrics.histograms} | {n for n, _ in metrics.gauges}
    )
    for name in sorted(set(names) | set(HELP)):
        kind, text = HELP.get(name, ("counter", name))
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        if kind in ("counter", "gauge"):
            values = metrics.counters if kind == "counter" else metrics.gauges
            for (n, labels), value in sorted(values.items()):
                if n == name:
                    lines.append(f"{name}{_render_labels(labels)} {value:g}")
        else:
            for (n, labels), row in sorted(metrics.histograms.items()):
                if n != name:
                    continue
                for bound, count in zip(BUCKETS, row, strict=False):
                    lines.append(f"{name}_bucket{_render_labels([*labels, ('le', f'{bound:g}')])} {count:g}")
                lines.append(f"{name}_bucket{_render_labels([*labels, ('le', '+Inf')])} {row[-1]:g}")
                lines.append(f"{name}_sum{_render_labels(labels)} {row[-2]:.6f}")
                lines.append(f"{name}_count{_render_labels(labels)} {row[-1]:g}")
    return "\n".join(lines) + "\n"


def serve_metrics(run_dir: Path, address: str, port: int) -> ThreadingHTTPServer:
    """`GET /metrics` in a daemon thread of the supervisor."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            body = render(with_build_info(read_all(run_dir))).encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # no access log: nothing to say per scrape

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
