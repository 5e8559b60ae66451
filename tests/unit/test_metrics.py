"""The metrics registry: counting, merging worker snapshots, the Prometheus text."""

from __future__ import annotations

import json
from pathlib import Path

from ext_proc.audit.metrics import BUCKETS, Metrics, merge, read_all, render, write_snapshot


def test_counters_and_histograms_merge_across_workers(tmp_path: Path) -> None:
    a, b = Metrics(), Metrics()
    a.inc("cordon_exchanges_total", dialect="chat", decision="forwarded")
    b.inc("cordon_exchanges_total", 2, decision="forwarded", dialect="chat")  # label order irrelevant
    b.inc("cordon_refusals_total", stage="egress")
    a.observe("cordon_phase_seconds", 0.0003, phase="receipt")
    b.observe("cordon_phase_seconds", 20.0, phase="receipt")
    total = merge([json.loads(json.dumps(a.snapshot())), b.snapshot()])
    assert total.counter("cordon_exchanges_total", dialect="chat", decision="forwarded") == 3
    text = render(total)
    assert 'cordon_exchanges_total{decision="forwarded",dialect="chat"} 3' in text
    assert 'cordon_refusals_total{stage="egress"} 1' in text
    # Buckets are cumulative: 0.3 ms is in every bucket from 0.5 ms on; 20 s only in +Inf.
    assert 'cordon_phase_seconds_bucket{phase="receipt",le="0.00025"} 0' in text
    assert 'cordon_phase_seconds_bucket{phase="receipt",le="0.0005"} 1' in text
    assert f'cordon_phase_seconds_bucket{{phase="receipt",le="{BUCKETS[-1]:g}"}} 1' in text
    assert 'cordon_phase_seconds_bucket{phase="receipt",le="+Inf"} 2' in text
    assert 'cordon_phase_seconds_count{phase="receipt"} 2' in text
    assert "# TYPE cordon_phase_seconds histogram" in text


def test_a_dead_workers_last_snapshot_still_counts(tmp_path: Path) -> None:
    """A restarted worker writes a new file (new pid): the old one's counts are kept, not lost."""
    first = Metrics()
    first.inc("cordon_receipts_total", 5)
    write_snapshot(first, tmp_path, 0)
    dead = next((tmp_path / "extproc" / "metrics").glob("worker-0-*.json"))
    dead.rename(dead.with_name("worker-0-1.json"))  # as if written by another (dead) pid
    second = Metrics()
    second.inc("cordon_receipts_total", 2)
    write_snapshot(second, tmp_path, 0)
    assert read_all(tmp_path).counter("cordon_receipts_total") == 7


def test_label_values_are_escaped() -> None:
    m = Metrics()
    m.inc("cordon_gaps_total", what='a"b\\c\nd')
    assert 'what="a\\"b\\\\c\\nd"' in render(m)


def test_gauges_come_from_running_workers_only(tmp_path: Path) -> None:
    """A worker's readiness is a gauge: a dead worker's old snapshot gives its counters, not it."""
    import os

    from ext_proc.audit.metrics import STALE_SECONDS

    live, dead = Metrics(), Metrics()
    live.set_gauge("cordon_ready", 1, worker="0")
    dead.set_gauge("cordon_ready", 0, worker="1")
    dead.inc("cordon_receipts_total", 3)
    write_snapshot(dead, tmp_path, 1)
    old = next((tmp_path / "extproc" / "metrics").glob("worker-1-*.json"))
    os.utime(old, (old.stat().st_atime - STALE_SECONDS - 1, old.stat().st_mtime - STALE_SECONDS - 1))
    write_snapshot(live, tmp_path, 0)
    total = read_all(tmp_path)
    assert total.gauge("cordon_ready", worker="0") == 1
    assert total.gauge("cordon_ready", worker="1") is None
    assert total.counter("cordon_receipts_total") == 3
    assert "# TYPE cordon_ready gauge" in render(total)


def test_build_info_names_the_version() -> None:
    from ext_proc import __version__
    from ext_proc.audit.metrics import with_build_info

    text = render(with_build_info(Metrics()))
    assert f'cordon_build_info{{version="{__version__}"}} 1' in text
    assert "# TYPE cordon_build_info gauge" in text
