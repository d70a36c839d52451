"""A whole `hypertopo-aggregator run` against a real API server (with Volcano's own HyperNode CRD):
a node whose agent reports grey findings makes its leaf `FabricDegraded=True` with the node and
the findings in the message, `Ready` stays exactly as it was, the node gets the degraded mark,
the per-condition gauge counts it, and healing clears all of it."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aggregator_controller_kit import apply_objects, live, private_plane, ready_with_agents, scrape, wait_for
from controlplane.harness import ControlPlane
from realparts import free_port

from agent.cluster_model import load_model
from agent.common.report import ComponentHealth, Finding, Health, NodeReport, node_topology_object
from agent.model_probe import report_for
from aggregator.live.node_marks import DEGRADED_ANNOTATION, TAINT_KEY

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tests" / "models" / "small-tree.yaml"
pytestmark = pytest.mark.apiserver
SYMBOLS = Finding("rdma", "mlx5_0/1", "error-rate", Health.DEGRADED, "12.0/s", "1.0/s", 300,
                  "mlx5_0/1 symbol_error 12.0/s over 300s (degraded above 1.0/s)")


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with private_plane() as cp:
        yield cp


def grey(report: NodeReport) -> NodeReport:
    """What an agent reports for a port whose symbol errors climb: rdma degraded, the finding listed."""
    health = {**report.health, "rdma": ComponentHealth(Health.DEGRADED, SYMBOLS.reason)}
    return dataclasses.replace(report, health=health, findings=(SYMBOLS,))


@pytest.fixture
def cluster(plane: ControlPlane) -> Iterator[dict[str, NodeReport]]:
    """The small-tree model's 8 nodes: Ready Nodes, NodeTopology objects, a Ready agent pod each."""
    model = load_model(str(MODEL))
    names = sorted({n for block in model.blocks for n in block.nodes})
    reports = {n: report_for(model, n) for n in names}
    nodes = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "annotations": {"owner": "infra"}}}
             for n in names]  # fmt: skip
    ready_with_agents(plane, nodes, reports)
    yield reports
    plane.kubectl("delete", "nodetopologies,nodes,hypernodes", "--all", "--wait=false")
    plane.kubectl("delete", "pods", "--all", "-n", "hypertopo-system", "--grace-period=0", "--force")


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def status_of(plane: ControlPlane, name: str, kind: str) -> str | None:
    cond = conditions(live(plane).get(name, {})).get(kind)
    return cond["status"] if cond else None


def annotations(plane: ControlPlane, node: str) -> dict[str, str]:
    obj = json.loads(plane.kubectl("get", "node", node, "-o", "json").stdout)
    return dict(obj["metadata"].get("annotations") or {})


def test_grey_findings_make_the_leaf_fabric_degraded_and_leave_ready_untouched(
    plane: ControlPlane, cluster: dict[str, NodeReport]
) -> None:
    port = free_port()
    log = plane.workdir / f"aggregator-degraded-{port}.log"
    argv = [sys.executable, "-m", "aggregator", "run", "--kubeconfig", str(plane.kubeconfig), "--no-leader-election",
            "--listen", f"127.0.0.1:{port}", "--model", str(MODEL), "--hold-down", "1", "--debounce", "0.05",
            "--mark-degraded", "--taint-unhealthy"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        leaf, other, spine = "leaf-leaf1", "leaf-leaf2", "spine-spine1"
        wait_for(lambda: status_of(plane, leaf, "FabricDegraded") == "False"
                 and status_of(plane, other, "FabricDegraded") == "False", timeout=30, what="the tree")
        before = conditions(live(plane)[leaf])["Ready"]
        assert before["status"] == "True"

        apply_objects(plane, [node_topology_object(grey(cluster["node02"]))])
        wait_for(lambda: status_of(plane, leaf, "FabricDegraded") == "True", timeout=15, what="FabricDegraded=True")
        degraded = conditions(live(plane)[leaf])["FabricDegraded"]
        print("FabricDegraded:", json.dumps(degraded))
        assert degraded["reason"] == "RDMADegraded"
        assert degraded["message"] == ("1 of 4 nodes degraded (tolerates 0% of nodes): node02: RDMA mlx5_0/1 "
                                       "error-rate: mlx5_0/1 symbol_error 12.0/s over 300s (degraded above 1.0/s)")
        assert degraded["lastTransitionTime"] != before["lastTransitionTime"]
        assert conditions(live(plane)[leaf])["Ready"] == before  # Ready: not one field moved
        assert status_of(plane, other, "FabricDegraded") == "False"
        assert status_of(plane, spine, "FabricDegraded") == "True" and status_of(plane, spine, "Ready") == "True"
        wait_for(lambda: DEGRADED_ANNOTATION in annotations(plane, "node02"), timeout=10, what="the node mark")
        assert annotations(plane, "node02")["owner"] == "infra"
        assert DEGRADED_ANNOTATION not in annotations(plane, "node01")
        taints = json.loads(plane.kubectl("get", "node", "node02", "-o", "json").stdout)["spec"].get("taints") or []
        assert TAINT_KEY not in {t["key"] for t in taints}  # degraded is not failed: no fabric taint
        gauge = 'hypertopo_aggregator_hypernode_conditions{condition="FabricDegraded",status="%s",tier="1",tier_name="leaf"}'
        # the gauges are published after the reconcile's writes, which can be seen before that
        samples = wait_for(lambda: (s := scrape(port)).get(gauge % "True") is not None and s, timeout=10,
                           what="the FabricDegraded=True leaf in the gauges")
        assert samples[gauge % "True"] == 1 and samples[gauge % "False"] == 1
        ready = 'hypertopo_aggregator_hypernode_conditions{condition="Ready",status="True",tier="1",tier_name="leaf"}'
        assert samples[ready] == 2

        apply_objects(plane, [node_topology_object(cluster["node02"])])
        wait_for(lambda: status_of(plane, leaf, "FabricDegraded") == "False", timeout=15, what="FabricDegraded=False")
        assert conditions(live(plane)[leaf])["FabricDegraded"]["reason"] == "NoDegradedMembers"
        assert conditions(live(plane)[leaf])["Ready"] == before
        wait_for(lambda: DEGRADED_ANNOTATION not in annotations(plane, "node02"), timeout=10, what="the mark removed")
        assert annotations(plane, "node02") == {"owner": "infra"}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
