"""daemonset/monitoring is real: it applies against prometheus-operator's own CRDs, its alert rules
pass promtool, and every metric its rules and dashboard query is one the components export."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane
from realparts import missing, require_binary

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "daemonset" / "monitoring"


def operator_crds() -> Path:
    proc = subprocess.run(
        ["bash", str(REPO / "tests/controlplane/prometheus_operator_crds.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        missing(f"prometheus-operator CRDs unavailable: {proc.stderr[-500:]}")
    return Path(proc.stdout.strip())


def rule_groups() -> list[dict[str, Any]]:
    doc = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    groups: list[dict[str, Any]] = doc["spec"]["groups"]
    return groups


def queried_metrics() -> set[str]:
    exprs = [rule["expr"] for group in rule_groups() for rule in group["rules"]]
    dashboard = json.loads((MONITORING / "hypertopo-dashboard.json").read_text())
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    names = {m for expr in exprs for m in re.findall(r"\bhypertopo_[a-z_]+", expr)}
    return {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in names}


@pytest.mark.apiserver
def test_monitoring_manifests_apply_against_the_prometheus_operator_crds(apiserver: ControlPlane) -> None:
    crds = operator_crds()
    for kind in ("podmonitors", "prometheusrules", "servicemonitors"):
        apiserver.kubectl("apply", "--server-side", "-f", str(crds / f"monitoring.coreos.com_{kind}.yaml"))
    apiserver.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/podmonitors.monitoring.coreos.com"
    )
    apiserver.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/prometheusrules.monitoring.coreos.com"
    )
    apiserver.kubectl("create", "namespace", "hypertopo-system", check=False)
    proc = apiserver.kubectl("apply", "--server-side", "--dry-run=server", "-k", str(MONITORING))
    assert proc.stdout.count("(server dry run)") == 5, proc.stdout  # 3 PodMonitors, 1 rule, 1 dashboard


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = {rule["alert"] for group in rule_groups() for rule in group["rules"]}
    assert {
        "HypertopoHyperNodeNotReady",
        "HypertopoAgentStale",
        "HypertopoNVLinkDown",
        "HypertopoXidStorm",
    } <= alerts


def test_rules_and_dashboard_query_only_metrics_the_components_export() -> None:
    source = "\n".join(p.read_text() for pkg in ("agent", "aggregator") for p in (REPO / pkg).rglob("*.py"))
    exported = set(re.findall(r"\bhypertopo_[a-z_]+", source))
    exported |= {f"hypertopo_aggregator_{m}" for m in re.findall(r'f"\{PREFIX\}_([a-z_]+)"', source)}
    unknown = queried_metrics() - exported
    assert not unknown, f"rules/dashboard query metrics nobody exports: {sorted(unknown)}"
