"""Label hygiene of `--node-labels` (issue 26.5), what kube-scheduler's topology constraints, Kueue
and KAI rely on: a value of `hypertopo.io/<tier>` is unique cluster-wide (it names one HyperNode of
that tier and every node holding it is under that HyperNode), the same tree gives the same values
after an aggregator restart (no Node written again), and a node that leaves a domain loses its
label; a tier that vanishes leaves no label behind and KAI's Topology is recreated for the new
tiers. The live part runs `hypertopo-aggregator run` on a real API server of its own."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from aggregator_controller_kit import (
    AggregatorProcess,
    apply_objects,
    private_plane,
    ready_with_agents,
    wait_for,
)
from controlplane.harness import ControlPlane
from test_kai_topology import install_kai_topology_crd

from agent.cluster_model import load_model, parse_model
from agent.common.report import node_topology_object
from agent.model_probe import report_for
from aggregator.live.kueue_topology import HOSTNAME_LABEL
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.render import domain_name
from aggregator.tiers.infer import NVLINK

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "models"
PREFIX = "hypertopo.io/"


def desired_of(model: Path) -> Any:
    return Pipeline().compute(ClusterInputs(reports={}, model=load_model(str(model))), now=0.0)


def nodes_under(hypernodes: dict[str, dict[str, Any]], name: str) -> set[str]:
    found: set[str] = set()
    for member in hypernodes[name]["spec"]["members"]:
        child = member["selector"]["exactMatch"]["name"]
        found |= {child} if member["type"] == "Node" else nodes_under(hypernodes, child)
    return found


@pytest.mark.parametrize("model", sorted(p.name for p in MODELS.glob("*.yaml")))
def test_each_label_value_names_one_hypernode_of_its_tier_and_exactly_the_nodes_under_it(model: str) -> None:
    desired = desired_of(MODELS / model)
    hypernodes = {o["metadata"]["name"]: o for o in desired.hypernodes}
    holders: dict[tuple[str, str], set[str]] = defaultdict(set)
    for node, labels in desired.node_labels.items():
        for key, value in labels.items():
            holders[key, value].add(node)
    assert holders, f"{model}: no node labels"
    for (key, value), nodes in holders.items():
        assert key.startswith(PREFIX) and hypernodes[value]["spec"]["tierName"] == key[len(PREFIX):]
        assert nodes == nodes_under(hypernodes, value), f"{model}: {key}={value} spans other nodes"
    # every HyperNode of a tier has its own value: as many values per key as HyperNodes of that tier
    per_tier: dict[str, int] = defaultdict(int)
    for obj in hypernodes.values():
        per_tier[obj["spec"]["tierName"]] += 1
    values: dict[str, set[str]] = defaultdict(set)
    for key, value in holders:
        values[key].add(value)
    assert {k[len(PREFIX):]: len(v) for k, v in values.items()} == dict(per_tier)


def test_two_nvlink_racks_whose_cluster_uuids_share_the_head_get_two_values() -> None:
    """The name shows the first 8 hex digits of the cluster UUID; two racks may share them (about 1 in
    4,000 pairs among 1,000 racks), and their clique IDs are often equal: they must not share a
    HyperNode name, or their `hypertopo.io/nvlink` label would merge two racks into one domain."""
    one = domain_name(NVLINK, ("6b1d2c3e-1111-4aaa-8bbb-000000000001/32766",))
    two = domain_name(NVLINK, ("6b1d2c3e-2222-4ccc-9ddd-000000000002/32766",))
    assert one != two
    assert one.startswith("nvlink-6b1d2c3e-c32766-") and two.startswith("nvlink-6b1d2c3e-c32766-")
    assert domain_name(NVLINK, ("6b1d2c3e-1111-4aaa-8bbb-000000000001/32766",)) == one  # stable


def test_the_same_tree_gives_the_same_values_in_a_new_process() -> None:
    """A fresh pipeline (an aggregator restart) derives the values from identities alone."""
    for model in ("fat-tree-3tier.yaml", "nvl72-racks.yaml", "rail-8.yaml"):
        first, second = desired_of(MODELS / model), desired_of(MODELS / model)
        assert dict(first.node_labels) == dict(second.node_labels)


def _node(plane: ControlPlane, name: str) -> dict[str, Any]:
    return dict(json.loads(plane.kubectl("get", "node", name, "-o", "json").stdout))


def _ours(node: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in node["metadata"].get("labels", {}).items() if k.startswith(PREFIX)}


def _moved_model(tmp: Path) -> Path:
    """fat-tree-3tier with h004 recabled from pod1-leaf1 to pod2-leaf2 and h016 in no block at all."""
    text = (MODELS / "fat-tree-3tier.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    doc["blocks"] = [{"switch": "pod1-leaf1", "nodes": ["h[001-003]"]},
                     {"switch": "pod1-leaf2", "nodes": ["h[005-008]"]},
                     {"switch": "pod2-leaf1", "nodes": ["h[009-012]"]},
                     {"switch": "pod2-leaf2", "nodes": ["h[013-015]", "h004"]}]
    del doc["expect"]
    path = tmp / "moved.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _two_tier_model(tmp: Path) -> Path:
    """The same 16 nodes without the core switch: one spine above the four leaves."""
    doc = {"switches": {"spine": {"switches": ["pod1-leaf1", "pod1-leaf2", "pod2-leaf1", "pod2-leaf2"]}},
           "blocks": yaml.safe_load((MODELS / "fat-tree-3tier.yaml").read_text(encoding="utf-8"))["blocks"]}
    path = tmp / "two-tier.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _aggregator(plane: ControlPlane, model: Path, name: str) -> AggregatorProcess:
    flags = ["--kubeconfig", str(plane.kubeconfig), "--no-leader-election", "--agent-selector", "",
             "--hold-down", "0", "--debounce", "0.05", "--model", str(model), "--node-labels"]
    return AggregatorProcess(plane, flags, name=name)


def _reconciles(agg: AggregatorProcess) -> float:
    return agg.metrics().get("hypertopo_aggregator_reconcile_duration_seconds_count", 0)


def _settled_labels(plane: ControlPlane, model: Path, nodes: list[str]) -> dict[str, dict[str, str]]:
    """Waits until every Node carries exactly the labels the pipeline derives from `model`."""
    want = {n: dict(desired_of(model).node_labels.get(n, {})) for n in nodes}

    def live() -> bool:
        return all(_ours(_node(plane, n)) == want[n] for n in nodes)

    wait_for(live, timeout=60, what="the node labels of " + model.name)
    return want


@pytest.mark.apiserver
def test_live_labels_are_stable_across_a_restart_and_leave_nodes_that_leave_a_domain(tmp_path: Path) -> None:
    fat_tree = MODELS / "fat-tree-3tier.yaml"
    nodes = load_model(str(fat_tree)).nodes()
    with private_plane() as plane:
        items = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"team": "ml"}}} for n in nodes]
        plane.kubectl("apply", "--server-side", "-f", "-",
                      input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

        # KAI not installed: labels are written, the Topology is a log line, the aggregator runs on
        first = _aggregator(plane, fat_tree, "first")
        want = _settled_labels(plane, fat_tree, nodes)
        wait_for(lambda: "KAI's Topology API (kai.scheduler/v1alpha1) is not served" in first.log.read_text(),
                 timeout=30, what="the log line saying KAI is absent")
        assert first.proc.poll() is None
        versions = {n: _node(plane, n)["metadata"]["resourceVersion"] for n in nodes}
        assert first.stop() == 0

        # restart (KAI installed meanwhile): same values, not one Node written; KAI's Topology made
        install_kai_topology_crd(plane)
        second = _aggregator(plane, fat_tree, "second")
        topology = wait_for(lambda: _kai_topology(plane), timeout=60, what="KAI's Topology")
        assert tuple(level["nodeLabel"] for level in topology["spec"]["levels"]) == (
            "hypertopo.io/core", "hypertopo.io/spine", "hypertopo.io/leaf", HOSTNAME_LABEL)
        start = _reconciles(second)
        wait_for(lambda: _reconciles(second) >= start + 3, timeout=30, what="three more reconciles")
        assert {n: _ours(_node(plane, n)) for n in nodes} == want
        assert {n: _node(plane, n)["metadata"]["resourceVersion"] for n in nodes} == versions
        assert second.stop() == 0

        # h004 recabled to another leaf, h016 in no domain: old values go, foreign labels stay
        moved = _moved_model(tmp_path)
        third = _aggregator(plane, moved, "third")
        after = _settled_labels(plane, moved, nodes)
        assert after["h004"]["hypertopo.io/leaf"] == want["h013"]["hypertopo.io/leaf"] != want["h004"]["hypertopo.io/leaf"]
        assert after["h004"]["hypertopo.io/spine"] == want["h013"]["hypertopo.io/spine"]
        assert after["h016"] == {} and _node(plane, "h016")["metadata"]["labels"] == {"team": "ml"}
        assert all(_node(plane, n)["metadata"]["labels"]["team"] == "ml" for n in nodes)
        assert _kai_topology(plane)["metadata"]["uid"] == topology["metadata"]["uid"]  # same tiers: kept
        assert third.stop() == 0

        # the core tier vanishes: its label leaves every node, KAI's Topology is recreated
        two_tier = _two_tier_model(tmp_path)
        fourth = _aggregator(plane, two_tier, "fourth")
        _settled_labels(plane, two_tier, nodes)
        assert not any("hypertopo.io/core" in _node(plane, n)["metadata"]["labels"] for n in nodes)
        recreated = wait_for(lambda: _replaced(plane, topology["metadata"]["uid"]), timeout=60,
                             what="KAI's Topology recreated")
        assert tuple(level["nodeLabel"] for level in recreated["spec"]["levels"]) == (
            "hypertopo.io/spine", "hypertopo.io/leaf", HOSTNAME_LABEL)
        assert fourth.stop() == 0


def _kai_topology(plane: ControlPlane) -> dict[str, Any] | None:
    got = plane.kubectl("get", "topologies.kai.scheduler", "hypertopo", "-o", "json", check=False)
    return dict(json.loads(got.stdout)) if got.returncode == 0 else None


def _replaced(plane: ControlPlane, old_uid: str) -> dict[str, Any] | None:
    live = _kai_topology(plane)
    return live if live is not None and live["metadata"]["uid"] != old_uid else None


@pytest.mark.apiserver
def test_live_a_recabled_node_moves_leaf_and_a_node_whose_report_goes_loses_its_label() -> None:
    """Without a restart (the pipeline's incremental path): the agents' reports alone (LLDP, one
    tier of leaves), one node recabled to the other leaf, another's NodeTopology deleted."""
    small = MODELS / "small-tree.yaml"
    model = load_model(str(small))
    reports = {n: report_for(model, n) for n in model.nodes()}
    recabled = parse_model({"switches": {"spine1": {"switches": ["leaf1", "leaf2"]}},
                            "blocks": [{"switch": "leaf1", "nodes": ["node[01-03]"]},
                                       {"switch": "leaf2", "nodes": ["node[04-08]"]}]})
    with private_plane() as plane:
        ready_with_agents(plane, [{"apiVersion": "v1", "kind": "Node",
                                   "metadata": {"name": n, "labels": {"team": "ml"}}} for n in reports], reports)
        flags = ["--kubeconfig", str(plane.kubeconfig), "--no-leader-election", "--hold-down", "0",
                 "--debounce", "0.05", "--node-labels"]
        agg = AggregatorProcess(plane, flags, name="moves")
        want = {n: {"hypertopo.io/leaf": "leaf-leaf1" if n <= "node04" else "leaf-leaf2"} for n in reports}
        wait_for(lambda: {n: _ours(_node(plane, n)) for n in reports} == want, timeout=60, what="the leaf labels")
        versions = {n: _node(plane, n)["metadata"]["resourceVersion"] for n in reports}

        apply_objects(plane, [node_topology_object(report_for(recabled, "node04"))])
        wait_for(lambda: _ours(_node(plane, "node04")) == {"hypertopo.io/leaf": "leaf-leaf2"}, timeout=30,
                 what="node04's new leaf label")
        plane.kubectl("delete", "nodetopology", "node08")
        wait_for(lambda: _ours(_node(plane, "node08")) == {}, timeout=30, what="node08's label removed")
        assert _node(plane, "node08")["metadata"]["labels"]["team"] == "ml"
        # no other Node was written: their labels and versions are as they were
        others = [n for n in reports if n not in ("node04", "node08")]
        assert {n: _node(plane, n)["metadata"]["resourceVersion"] for n in others} == {n: versions[n] for n in others}
        assert agg.stop() == 0
