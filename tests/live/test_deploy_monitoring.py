"""daemonset/monitoring is real: it applies against prometheus-operator's own CRDs, its alert rules
pass promtool, and every metric its rules and dashboard query is one the components export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane
from prometheus_client import CollectorRegistry, generate_latest
from realparts import missing, require_binary

from agent.collect import CollectConfig, Prober
from agent.metrics import AgentMetrics, PublishCounts

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "daemonset" / "monitoring"
TREES = REPO / "tests" / "fixtures" / "sysfs"


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
    apiserver.wait_crds_established("podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")
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


def agent_series(sysfs: Path, metric: str, node: str) -> list[str]:
    """The agent's real exposition of `metric` for a sysfs tree, as promtool series (with the
    `node` label the PodMonitor adds)."""
    prober = Prober(CollectConfig(node, sysfs=sysfs, nvml="off"), links=lambda: ())
    prober.collect()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentMetrics(lambda: prober.latest, PublishCounts))
    text = generate_latest(registry).decode()
    found = re.findall(rf"^({metric}\{{[^}}]*)\}} (\S+)$", text, re.M)
    return [f'{labels},node="{node}"}}' for labels, _ in found]


def promtool_test(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": tests}))
    return subprocess.run([promtool, "test", "rules", str(tmp_path / "tests.yaml")],
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_a_port_never_cabled_raises_no_rdma_alert_and_a_port_that_went_down_does(tmp_path: Path) -> None:
    """down-port: port 1 ACTIVE, port 2 Polling since boot (never cabled). The same port after its
    link once trained (link_downed 1) is a port down and must alert."""
    cabled = tmp_path / "sys"
    shutil.copytree(TREES / "down-port", cabled, symlinks=True)
    port2 = (cabled / "class" / "infiniband" / "mlx5_0").resolve() / "ports" / "2"
    (port2 / "counters" / "link_downed").write_text("1\n")
    tests = []
    for sysfs, node, alerts in ((TREES / "down-port", "uncabled", []), (cabled, "cabled", [2])):
        series = agent_series(sysfs, "hypertopo_rdma_port_up", node)
        values = {s: ("1x15" if 'port="1"' in s else "0x15") for s in series}
        expected = [{"exp_labels": {"severity": "warning", "device": "mlx5_0", "port": str(p), "link_layer": "InfiniBand",
                                    "netdev": f"ib{p - 1}", "node": node},
                     "exp_annotations": {"summary": f"RDMA port mlx5_0/{p} on {node} is down"}} for p in alerts]  # fmt: skip
        tests.append({
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in values.items()],
            "alert_rule_test": [{"eval_time": "10m", "alertname": "HypertopoRdmaPortDown", "exp_alerts": expected}],
        })  # fmt: skip
    proc = promtool_test(tmp_path, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
