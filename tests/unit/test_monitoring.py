"""The Grafana dashboard and the Prometheus alert rules under envoy/monitoring/ parse, and every
metric they name is one Cordon exports (ext_proc/audit/metrics.py), with a suffix its type has."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from ext_proc.audit.metrics import HELP

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "envoy" / "monitoring"
METRIC = re.compile(r"\bcordon_[a-z_]+\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def exported(name: str) -> bool:
    """`name` is an exported series: a counter or gauge by its name, a histogram by a suffix."""
    if name in HELP:
        return HELP[name][0] != "histogram"
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and HELP.get(base, ("",))[0] == "histogram":
            return True
    return False


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return loaded


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_dashboard_uses_exported_metrics_only() -> None:
    board = dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs.append(board["templating"]["list"][1]["query"]["query"])
    names = {name for expr in exprs for name in METRIC.findall(expr)}
    assert names and {n for n in names if not exported(n)} == set()


def test_the_dashboard_has_the_panels_operations_need() -> None:
    board = dashboard()
    titles = {p["title"] for p in board["panels"]}
    assert {
        "Exchanges by decision",
        "Refusals by stage",
        "Findings by kind",
        "Phase latency p50 / p99",
    } <= titles
    assert {"OCR", "Redis and vault errors", "Receipt appends", "Output gate", "Readiness"} <= titles
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


def test_the_alert_rules_use_exported_metrics_only() -> None:
    rules = alert_rules()
    names = {name for rule in rules for name in METRIC.findall(rule["expr"])}
    assert names and {n for n in names if not exported(n)} == set()
    alerts = {rule["alert"] for rule in rules}
    assert {"CordonRefusalSpike", "CordonAuditFailing", "CordonVaultFailing"} <= alerts
    assert {"CordonNotReady", "CordonLatencySLO"} <= alerts
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


def test_the_check_can_fail() -> None:
    assert not exported("cordon_exchanges_total_bucket")
    assert not exported("cordon_nothing_total")
    assert exported("cordon_phase_seconds_bucket") and exported("cordon_ready")
