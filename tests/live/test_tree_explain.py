"""An empty or partial HyperNode tree says why (issue 21.6): each reason a node is in no HyperNode,
through the pure module, `render`, `tree` and the controller's log and metrics."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from aggregator_fabric import ibnetdiscover_dump

from agent.cluster_model import load_model
from agent.common.report import Interface, LldpNeighbour, NodeReport, node_topology_object
from agent.model_probe import report_for
from aggregator import cli
from aggregator.live.controller import ClusterView, Controller, Options, build_parser, pipeline_compute
from aggregator.live.metrics import AggregatorMetrics
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.tree import explain as tree_explain
from aggregator.tree.cli import explain_tree
from aggregator.tree.explain import (
    NO_DOMAIN,
    NO_FABRIC_SOURCE,
    NO_NEIGHBOURS,
    NO_NODES,
    NO_REPORT,
    NOT_FABRIC,
    NOT_IN_SOURCE,
    REFUSED,
    Narrator,
    explain,
)
from aggregator.tree.model import Tree

MODEL = load_model(str(Path(__file__).parent.parent / "models" / "small-tree.yaml"))
NODES = MODEL.nodes()  # node01..node08: node01-04 on leaf1, node05-08 on leaf2


def cabled(node: str) -> NodeReport:
    return report_for(MODEL, node)


def deaf(node: str) -> NodeReport:
    """The node's report without any LLDP neighbour (switches that send no LLDP)."""
    return dataclasses.replace(cabled(node), lldp=())


def on_management_nic(node: str) -> NodeReport:
    """Neighbours only on a NIC that carries no RDMA device: the rack's management switch."""
    report = cabled(node)
    eno1 = Interface(name="eno1", mac="b8:3f:d2:10:00:01", oper_state="up", kind="physical",
                     pci_address="0000:01:00.0")  # fmt: skip
    heard = LldpNeighbour(interface="eno1", chassis_id="aa:bb:cc:00:00:01", port_id="Eth1/3", ttl=120,
                          system_name="mgmt-sw1")  # fmt: skip
    return dataclasses.replace(report, interfaces=(*report.interfaces, eno1), lldp=(heard,))


def render(reports: dict[str, NodeReport], **inputs: object) -> tree_explain.Explanation:
    """What `render` computes and explains for these reports (the same functions it calls)."""
    cluster = ClusterInputs(reports, **inputs)  # type: ignore[arg-type]
    desired = Pipeline().compute(cluster, now=0.0)
    return cli.explain_render(cluster, desired)


def test_nothing_to_place_is_no_nodes() -> None:
    found = render({})
    assert (found.empty_reason, found.unplaced) == (NO_NODES, {})
    assert found.lines() == [f"no HyperNodes: {tree_explain.TEXT[NO_NODES]}"]


def test_reports_without_neighbours_and_no_fabric_source_say_so() -> None:
    found = render({n: deaf(n) for n in NODES})
    assert found.empty_reason == NO_FABRIC_SOURCE and found.unplaced == {NO_NEIGHBOURS: tuple(NODES)}
    assert found.lines()[0].startswith("no HyperNodes: no fabric source is configured (--ibnetdiscover")
    assert found.lines()[1].startswith("8 of 8 nodes in no HyperNode: their reports carry no LLDP neighbour")


def test_a_partial_tree_names_the_nodes_it_leaves_out_and_why() -> None:
    reports = {n: cabled(n) for n in NODES[:5]}
    reports |= {NODES[5]: deaf(NODES[5]), NODES[6]: on_management_nic(NODES[6])}
    found = render(reports, node_ready={n: True for n in NODES})  # node08 is a Node without a report
    assert found.hypernodes > 0 and found.empty_reason is None
    assert found.unplaced == {NO_NEIGHBOURS: ("node06",), NOT_FABRIC: ("node07",), NO_REPORT: ("node08",)}
    assert [line.split(":")[0] for line in found.lines()] == ["1 of 8 nodes in no HyperNode"] * 3


def test_a_dump_whose_hosts_match_no_node_is_nodes_not_in_any_fabric_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "fabric.topo"
    dump.write_text(ibnetdiscover_dump(MODEL, ca_description=lambda node, i: f"{node}.other.example HCA-{i + 1}"))
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in NODES]}))  # fmt: skip
    assert cli.main(["render", "--nodes", str(nodes), "--ibnetdiscover", str(dump), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["items"] == []
    assert f"render: no HyperNodes: {tree_explain.TEXT[NOT_IN_SOURCE]}" in err
    assert "8 of 8 nodes in no HyperNode: in no fabric source" in err and "--strip-domain" in err


def test_refused_reports_and_cabled_nodes_without_a_domain_are_told_apart() -> None:
    reports = {n: cabled(n) for n in NODES}
    found = explain(nodes=NODES, placed=NODES[2:], hypernodes=3, reports=reports, fabric_sources=["ibnetdiscover"],
                    refused={"node01"})  # fmt: skip
    assert found.unplaced == {REFUSED: ("node01",), NO_DOMAIN: ("node02",)}
    empty = explain(nodes=NODES, placed=(), hypernodes=0, reports=reports, fabric_sources=())
    assert (empty.empty_reason, empty.unplaced) == (NO_DOMAIN, {NO_DOMAIN: tuple(NODES)})  # cabled, still nothing


def test_tree_explains_a_live_cluster_from_its_nodes_and_reports() -> None:
    reports = {n: cabled(n) if n < "node05" else deaf(n) for n in NODES}
    hypernodes = Pipeline().compute(ClusterInputs(reports), now=0.0).hypernodes
    topologies = {n: node_topology_object(r) for n, r in reports.items()}
    lines = explain_tree(Tree(hypernodes), [*NODES, "cpu-01"], topologies)
    assert lines[0] == "1 of 9 nodes in no HyperNode: " + tree_explain.TEXT[NO_REPORT] + ": 1: cpu-01"
    assert lines[1] == "4 of 9 nodes in no HyperNode: " + tree_explain.TEXT[NO_NEIGHBOURS] + (
        ": 4: node05, node06, node07, node08")
    assert "is not known here" in lines[2]
    assert explain_tree(Tree([]), [], {})[0] == f"no HyperNodes: {tree_explain.TEXT[NO_NODES]}"


def test_the_controller_logs_a_changed_explanation_once_and_exports_it(caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(["--no-leader-election"])
    compute = pipeline_compute(args)
    metrics = AggregatorMetrics()
    controller = Controller(object(), compute, options=Options(), metrics=metrics)  # type: ignore[arg-type]
    nodes = {n: {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in NODES}
    deaf_view = ClusterView({n: node_topology_object(deaf(n)) for n in NODES}, nodes, None)

    def gauge(name: str, reason: str) -> float | None:
        return metrics.registry.get_sample_value(f"hypertopo_aggregator_{name}", {"reason": reason})

    with caplog.at_level(logging.INFO, logger="aggregator.tree.explain"):
        for _ in range(3):  # the same tree every reconcile: said once
            controller._explain(compute(deaf_view, 0.0), deaf_view)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned[0].startswith("tree: no HyperNodes: no fabric source is configured") and len(warned) == 2
    assert gauge("tree_empty_reason", NO_FABRIC_SOURCE) == 1 and gauge("tree_empty_reason", NO_NODES) == 0
    assert gauge("nodes_unplaced", NO_NEIGHBOURS) == 8
    caplog.clear()
    whole = ClusterView({n: node_topology_object(cabled(n)) for n in NODES}, nodes, None)
    with caplog.at_level(logging.INFO, logger="aggregator.tree.explain"):
        controller._explain(compute(whole, 1.0), whole)
    assert [r.getMessage() for r in caplog.records] == ["tree: every node is in a HyperNode again"]
    assert gauge("tree_empty_reason", NO_FABRIC_SOURCE) == 0 and gauge("nodes_unplaced", NO_NEIGHBOURS) == 0


def test_a_narrator_reparses_a_report_only_when_its_object_is_replaced() -> None:
    narrator = Narrator(fabric_sources=())
    objects = {n: node_topology_object(deaf(n)) for n in NODES}
    first = narrator.observe(nodes=NODES, placed=(), hypernodes=0, topologies=objects)
    again = narrator.observe(nodes=NODES, placed=(), hypernodes=0, topologies=dict(objects))
    assert first == again and first.unplaced == {NO_NEIGHBOURS: tuple(NODES)}
    objects["node01"] = node_topology_object(cabled("node01"))  # a fresh object: read again
    moved = narrator.observe(nodes=NODES, placed=(), hypernodes=0, topologies=objects)
    assert moved.unplaced[NO_DOMAIN] == ("node01",) and len(moved.unplaced[NO_NEIGHBOURS]) == 7


def test_a_reconcile_with_nothing_changed_keeps_the_last_explanation() -> None:
    narrator = Narrator(fabric_sources=())
    objects = {n: node_topology_object(deaf(n)) for n in NODES}
    placed: dict[str, str] = {}
    first = narrator.observe(nodes=NODES, placed=placed, hypernodes=0, topologies=objects, changed=None)
    objects["node01"] = node_topology_object(cabled("node01"))  # not announced as changed: not looked at
    assert narrator.observe(nodes=NODES, placed=placed, hypernodes=0, topologies=objects, changed=()) is first
    told = narrator.observe(nodes=NODES, placed=placed, hypernodes=0, topologies=objects, changed={"node01"})
    assert told.unplaced[NO_DOMAIN] == ("node01",)
    assert narrator.observe(nodes=NODES, placed={}, hypernodes=0, topologies=objects, changed=()) is not told  # a new tree


@pytest.mark.apiserver
def test_the_live_tree_names_the_nodes_it_leaves_out_and_why(apiserver: Any, tmp_path: Path, unique: str) -> None:
    """A Node whose agent reports no LLDP neighbour, on a real API server: `tree` says so by name."""
    name = f"0-explain-{unique}"  # sorts first among the shared server's Nodes: among the names shown
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    report = node_topology_object(dataclasses.replace(deaf("node01"), node_name=name))
    try:
        apiserver.kubectl("apply", "-f", "-", input=yaml.safe_dump(node))
        apiserver.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(report))
        proc = subprocess.run([sys.executable, "-m", "aggregator", "tree"], capture_output=True, text=True,
                              timeout=120, check=False, env={**apiserver.env(), "HOME": str(tmp_path)})  # fmt: skip
    finally:
        apiserver.kubectl("delete", "nodetopology", name, "--ignore-not-found")
        apiserver.kubectl("delete", "node", name, "--ignore-not-found")
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stdout.splitlines() if "nodes in no HyperNode: " + tree_explain.TEXT[NO_NEIGHBOURS] in line]
    assert len(said) == 1 and f": {name}" in said[0], proc.stdout
