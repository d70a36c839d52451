"""The Finding contract: grey-failure findings travel in the NodeTopology (wire form, CRD schema,
a real API server) and read back equal, so the aggregator sees what the agent measured."""

from __future__ import annotations

import json

import pytest
from controlplane.harness import ControlPlane

from agent.common.report import (
    ComponentHealth,
    Finding,
    Health,
    NodeReport,
    WireError,
    node_topology_object,
    report_from_spec,
    report_spec,
)

SLOW_PORT = Finding(
    component="rdma",
    subject="mlx5_0/1",
    kind="link-training",
    severity=Health.DEGRADED,
    value="200 Gb/s",
    threshold="400 Gb/s",
    window_s=0,
    reason="mlx5_0/1 trained at 200 Gb/s (2X NDR), its maximum is 400 Gb/s (4X NDR)",
)
ERRORS = Finding(
    "rdma", "mlx5_1/1", "error-rate", Health.FAILED, "120/min", "> 100/min", 60, "symbol_error 120/min"
)


def degraded_report(node: str) -> NodeReport:
    return NodeReport(
        node_name=node,
        health={"rdma": ComponentHealth(Health.FAILED, "2 findings"), "pcie": ComponentHealth(Health.OK)},
        findings=(SLOW_PORT, ERRORS),
    )


def test_findings_round_trip_through_the_wire_form() -> None:
    report = degraded_report("n1")
    spec = report_spec(report)
    assert spec["findings"][0] == {
        "component": "rdma",
        "subject": "mlx5_0/1",
        "kind": "link-training",
        "severity": "degraded",
        "value": "200 Gb/s",
        "threshold": "400 Gb/s",
        "windowS": 0,
        "reason": SLOW_PORT.reason,
    }
    assert report_from_spec(spec) == report


def test_a_spec_from_an_older_agent_without_findings_reads_as_no_findings() -> None:
    spec = report_spec(NodeReport(node_name="n1", health={}))
    assert spec["findings"] == []
    assert report_from_spec({k: v for k, v in spec.items() if k != "findings"}).findings == ()


def test_finding_with_a_bad_severity_is_refused_with_its_path() -> None:
    spec = report_spec(degraded_report("n1"))
    spec["findings"][1]["severity"] = "awful"
    with pytest.raises(WireError, match=r"spec.findings\[1\].severity"):
        report_from_spec(spec)


@pytest.mark.apiserver
def test_findings_survive_a_real_api_server(apiserver: ControlPlane, unique: str) -> None:
    report = degraded_report(f"grey-{unique}")
    obj = node_topology_object(report)
    apiserver.kubectl("create", "-f", "-", input=json.dumps(obj))
    try:
        got = json.loads(apiserver.kubectl("get", "ntopo", report.node_name, "-o", "json").stdout)
        assert got["spec"] == obj["spec"]  # nothing pruned by the schema
        assert report_from_spec(got["spec"]) == report
        assert got["spec"]["summary"]["health"] == "failed"
    finally:
        apiserver.kubectl("delete", "ntopo", report.node_name, "--ignore-not-found")
