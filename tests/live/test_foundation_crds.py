"""The CRDs are real: the API server accepts them, enforces their rules and prints their columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane

from agent.common import crd_schema
from agent.common.report import (
    ComponentHealth,
    Health,
    NodeReport,
    RdmaDevice,
    RdmaPort,
    node_topology_object,
    report_from_spec,
)

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.apiserver


def hypernode(name: str, tier: int, tier_name: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "labels": {"test": "foundation"}},
        "spec": {"tier": tier, "tierName": tier_name, "members": members},
    }


def exact(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}


def apply(apiserver: ControlPlane, *objects: dict[str, Any], check: bool = True) -> Any:
    doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    return apiserver.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc), check=check)


def test_crds_are_established_with_their_names(apiserver: ControlPlane) -> None:
    out = apiserver.kubectl("get", "crd", "-o", "json").stdout
    crds = {c["metadata"]["name"]: c for c in json.loads(out)["items"]}
    hn = crds["hypernodes.topology.volcano.sh"]
    assert hn["spec"]["scope"] == "Cluster"
    assert hn["spec"]["names"]["shortNames"] == ["hn"]
    ntopo = crds["nodetopologies.hypertopo.io"]
    assert ntopo["spec"]["names"]["shortNames"] == ["ntopo"]
    for crd in (hn, ntopo):
        established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert established["Established"] == "True"
        assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_three_tier_hypernode_tree_is_accepted_and_listed_with_columns(
    apiserver: ControlPlane, unique: str
) -> None:
    leaves = [
        hypernode(
            f"leaf-{unique}-{i}", 1, "leaf", [exact("Node", f"node-{unique}-{i}-{j}") for j in range(2)]
        )
        for i in range(2)
    ]
    spine = hypernode(
        f"spine-{unique}", 2, "spine", [exact("HyperNode", leaf["metadata"]["name"]) for leaf in leaves]
    )
    core = hypernode(f"core-{unique}", 3, "core", [exact("HyperNode", spine["metadata"]["name"])])
    apply(apiserver, *leaves, spine, core)
    # nodeCount lives in status: write it through the status subresource, as the aggregator does.
    for name, count in [
        (leaves[0]["metadata"]["name"], 2),
        (spine["metadata"]["name"], 4),
        (core["metadata"]["name"], 4),
    ]:
        apiserver.kubectl(
            "patch",
            "hypernode",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"nodeCount": count}}),
        )
    table = apiserver.kubectl("get", "hn", "-l", "test=foundation").stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "TIER", "TIERNAME", "NODECOUNT", "AGE"]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert rows[f"core-{unique}"][1:4] == ["3", "core", "4"]
    assert rows[f"spine-{unique}"][1:4] == ["2", "spine", "4"]
    assert rows[f"leaf-{unique}-0"][1:4] == ["1", "leaf", "2"]
    apiserver.kubectl("delete", "hn", "-l", "test=foundation")


def test_member_with_two_selectors_is_rejected_with_the_cel_message(
    apiserver: ControlPlane, unique: str
) -> None:
    bad = hypernode(
        f"bad-{unique}",
        1,
        "leaf",
        [{"type": "Node", "selector": {"exactMatch": {"name": "n1"}, "regexMatch": {"pattern": "n.*"}}}],
    )
    proc = apply(apiserver, bad, check=False)
    assert proc.returncode != 0
    assert "Only one of ExactMatch, RegexMatch, or LabelMatch can be specified" in proc.stderr


def test_member_without_selector_kind_is_rejected(apiserver: ControlPlane, unique: str) -> None:
    bad = hypernode(f"empty-{unique}", 1, "leaf", [{"type": "Node", "selector": {}}])
    proc = apply(apiserver, bad, check=False)
    assert proc.returncode != 0
    assert "Either ExactMatch or RegexMatch or LabelMatch must be specified" in proc.stderr


def test_negative_tier_and_unknown_member_type_are_rejected(apiserver: ControlPlane, unique: str) -> None:
    proc = apply(apiserver, hypernode(f"neg-{unique}", -1, "leaf", [exact("Node", "n1")]), check=False)
    assert proc.returncode != 0 and "spec.tier" in proc.stderr
    proc = apply(apiserver, hypernode(f"typ-{unique}", 1, "leaf", [exact("Rack", "n1")]), check=False)
    assert proc.returncode != 0 and "Unsupported value" in proc.stderr


def test_node_topology_round_trips_through_create_get_and_status_update(
    apiserver: ControlPlane, unique: str
) -> None:
    report = NodeReport(
        node_name=f"gpu-{unique}",
        health={
            "rdma": ComponentHealth(Health.OK),
            "nvml": ComponentHealth(Health.ABSENT, "NVML library not found"),
        },
        rdma=(
            RdmaDevice(
                name="mlx5_0", node_guid="0x1", ports=(RdmaPort(1, "ACTIVE", "LinkUp", 400.0, "InfiniBand"),)
            ),
        ),
    )
    obj = node_topology_object(report)
    apiserver.kubectl("create", "-f", "-", input=json.dumps(obj))
    got = json.loads(apiserver.kubectl("get", "ntopo", report.node_name, "-o", "json").stdout)
    assert got["spec"] == obj["spec"]
    assert report_from_spec(got["spec"]) == report
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Seen",
                    "status": "True",
                    "reason": "Aggregated",
                    "message": "joined into the fabric graph",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    }
    apiserver.kubectl(
        "patch", "ntopo", report.node_name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )
    got = json.loads(apiserver.kubectl("get", "ntopo", report.node_name, "-o", "json").stdout)
    assert got["status"]["conditions"][0]["reason"] == "Aggregated"
    assert got["spec"] == obj["spec"]  # a status update leaves the report alone
    table = apiserver.kubectl("get", "ntopo", report.node_name).stdout.splitlines()
    assert table[0].split() == ["NAME", "GPUS", "NVLINK-DOMAIN", "RDMA-UP", "LLDP", "HEALTH", "AGE"]
    assert table[1].split()[1:3] == ["0", "1"]  # 0 GPUs, empty domain column omitted by split, 1 port up
    apiserver.kubectl("delete", "ntopo", report.node_name)


def test_node_topology_schema_rejects_a_wrong_health_state(apiserver: ControlPlane, unique: str) -> None:
    obj = node_topology_object(NodeReport(node_name=f"bad-{unique}", health={}))
    obj["spec"]["health"] = {"nvml": {"state": "great"}}
    proc = apiserver.kubectl("create", "-f", "-", input=json.dumps(obj), check=False)
    assert proc.returncode != 0 and "Unsupported value" in proc.stderr


def test_committed_node_topology_crd_matches_the_report_dataclasses() -> None:
    committed = (REPO / "crds" / "nodetopologies.hypertopo.io.yaml").read_text()
    assert yaml.safe_load(committed) == crd_schema.crd(), (
        "run: python -m agent.common.crd_schema > crds/nodetopologies.hypertopo.io.yaml"
    )
