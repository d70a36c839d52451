"""The scheduler's cache tells a Node's status heartbeat (hundreds a second on a large cluster)
from a change a decision reads: only the latter costs a rebuild of the tree, the node filters and
the free-capacity aggregates (`topology_generation`), or a scheduling pass (`generation`)."""

from __future__ import annotations

import copy
from typing import Any

from aggregator.live.node_marks import DEGRADED_ANNOTATION
from aggregator.placement.core.free_index import FreeIndex
from aggregator.placement.core.topology import Topology, build
from aggregator.placement.live.state import ClusterState


def _node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"rack": "r1"}, "resourceVersion": "1"},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "t0"}]}}


def _hypernode(ready: str = "True", count: int = 2) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in ("a", "b")]
    return {"metadata": {"name": "leaf", "resourceVersion": "1"}, "spec": {"tier": 1, "members": members},
            "status": {"nodeCount": count, "conditions": [{"type": "Ready", "status": ready}]}}


def _leaf_of_two() -> tuple[ClusterState, Topology, FreeIndex]:
    """A cache with nodes a and b in one leaf, and its free-capacity index built."""
    state = ClusterState("hypertopo")
    for name in ("a", "b"):
        state.apply("Node", "ADDED", _node(name))
    topology = build([_hypernode()])
    return state, topology, state.free_index(topology)


def _generations(state: ClusterState) -> tuple[int, int]:
    return state.topology_generation, state.generation


def test_a_node_heartbeat_changes_nothing_a_decision_reads_and_costs_nothing() -> None:
    state, topology, index = _leaf_of_two()
    before = _generations(state)
    beat = _node("a")
    beat["metadata"]["resourceVersion"] = "2"
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "t1"
    state.apply("Node", "MODIFIED", beat)
    assert _generations(state) == before
    assert state.nodes["a"] is beat  # the cache still holds the newest object
    assert state.free_index(topology) is index


def test_what_the_tree_filters_or_faults_read_on_a_node_moves_the_topology_generation() -> None:
    state = ClusterState("hypertopo")
    state.apply("Node", "ADDED", _node("a"))
    changes = [
        lambda n: n["metadata"]["labels"].update(rack="r2"),
        lambda n: n["metadata"].update(annotations={DEGRADED_ANNOTATION: "t"}),
        lambda n: n["spec"].update(taints=[{"key": "k", "effect": "NoSchedule"}]),
        lambda n: n["spec"].update(unschedulable=True),
    ]
    for change in changes:
        node = copy.deepcopy(state.nodes["a"])
        change(node)
        before = _generations(state)
        state.apply("Node", "MODIFIED", node)
        after = _generations(state)
        assert after[0] == before[0] + 1 and after[1] == before[1] + 1, node


def test_new_allocatable_reaches_the_free_capacity_without_a_tree_rebuild() -> None:
    state, topology, index = _leaf_of_two()
    before = _generations(state)
    state.apply("Node", "MODIFIED", _node("a", gpus=4))
    assert state.topology_generation == before[0] and state.generation == before[1] + 1
    assert state.free_index(topology) is index and index["a"].gpus == 4
    assert index.shape(4).node_cap == {"a": 1, "b": 2}


def test_a_hypernode_moves_the_topology_generation_for_its_spec_or_conditions_not_its_node_count() -> None:
    state = ClusterState("hypertopo")
    state.apply("HyperNode", "ADDED", _hypernode())
    start, passes = state.topology_generation, state.generation
    state.apply("HyperNode", "MODIFIED", _hypernode(count=3))
    assert (state.topology_generation, state.generation) == (start, passes)
    state.apply("HyperNode", "MODIFIED", _hypernode(ready="False", count=3))
    assert state.topology_generation == start + 1
    moved = _hypernode(ready="False", count=3)
    moved["spec"]["members"].pop()
    state.apply("HyperNode", "MODIFIED", moved)
    assert state.topology_generation == start + 2
    state.apply("HyperNode", "DELETED", moved)
    assert state.topology_generation == start + 3 and not state.hypernodes
