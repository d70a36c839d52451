"""The live scheduler holds reserved spares out of its shared free index (`spare_hold`) instead of
excluding them at every decision: the decisions are the same as with the per-decision exclusion
(a differential over randomized clusters, gangs and reservations), and the index stays what a
fresh build over the same free capacity and held nodes would be through spares taken, given up,
gangs ending, nodes leaving and coming back, resyncs and tree changes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from aggregator.placement.core import spares
from aggregator.placement.core.decide import decide
from aggregator.placement.core.free_index import FreeIndex, ShapeIndex
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology, build, node_labels_of
from aggregator.placement.kinds import podgroups
from aggregator.placement.live.spare_hold import ReservedSpares
from aggregator.placement.live.state import ClusterState

SCHED = "hypertopo-scheduler"
SPINES, LEAVES, NODES = 3, 4, 4  # 48 nodes of 8 GPUs
ALLOCATABLE = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}


def node_names() -> list[str]:
    return [f"s{s}l{leaf}n{n}" for s in range(SPINES) for leaf in range(LEAVES) for n in range(NODES)]


def hypernodes(spines: int = SPINES) -> list[dict[str, Any]]:
    def member(kind: str, name: str) -> dict[str, Any]:
        return {"type": kind, "selector": {"exactMatch": {"name": name}}}

    out = []
    for s in range(spines):
        for leaf in range(LEAVES):
            out.append({"metadata": {"name": f"s{s}l{leaf}"}, "spec": {"tier": 1, "tierName": "leaf", "members": [
                member("Node", f"s{s}l{leaf}n{n}") for n in range(NODES)]}})
        out.append({"metadata": {"name": f"s{s}"}, "spec": {"tier": 2, "tierName": "spine", "members": [
            member("HyperNode", f"s{s}l{leaf}") for leaf in range(LEAVES)]}})
    return out


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}}, "spec": {}, "status": {"allocatable": dict(ALLOCATABLE)}}


def pod(name: str, gpus: int, *, node_name: str = "", group: str = "", preemptible: bool = False,
        scheduler: str = SCHED) -> dict[str, Any]:
    labels = {"scheduling.x-k8s.io/pod-group": group} if group else {}
    if preemptible:
        labels[spares.PREEMPTIBLE_LABEL] = "true"
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": scheduler, "nodeName": node_name or None,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running" if node_name else "Pending"}}


def podgroup(name: str, min_member: int, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns", "uid": f"pg-{name}", "annotations": annotations},
            "spec": {"minMember": min_member}}


def scenario(seed: int) -> dict[str, Any]:
    """A random cluster (busy nodes, borrowers on spares), reservations and one gang to decide."""
    rng = random.Random(seed)
    names = node_names()
    busy = {n: rng.choice((0, 0, 2, 4, 6, 8)) for n in names}
    held = {("ns", f"r{i}"): tuple(sorted(rng.sample(names, rng.randint(1, 4)))) for i in range(rng.randint(1, 8))}
    size = rng.randint(1, 6)
    shapes = [rng.choice((1, 2, 4, 8))] * size if rng.random() < 0.8 else [rng.choice((1, 2, 4, 8)) for _ in range(size)]
    placed = rng.sample(range(size), rng.randint(1, size - 1)) if size > 1 and rng.random() < 0.35 else []
    notes: dict[str, str] = {}
    if rng.random() < 0.5:
        notes["volcano.sh/network-topology-mode"] = rng.choice(("hard", "soft"))
        notes["volcano.sh/network-topology-highest-tier"] = str(rng.choice((1, 2)))
    if rng.random() < 0.3:
        notes[spares.SPARE_REQUEST] = rng.choice(("1", "2"))
    if rng.random() < 0.4:  # the gang holds spares of its own (re-placement onto them, when it has anchors)
        held[("ns", "g")] = tuple(sorted(rng.sample(names, rng.randint(1, 3))))
    borrowers = [(f"borrow{i}", n, rng.choice((1, 4, 8))) for i, n in
                 enumerate(sorted({n for nodes in held.values() for n in nodes})) if rng.random() < 0.3]
    return {"busy": busy, "held": held, "shapes": shapes, "placed": {i: rng.choice(names) for i in placed},
            "notes": notes, "preemptible": rng.random() < 0.2, "borrowers": borrowers,
            "index_first": rng.random() < 0.5}


def cluster(case: dict[str, Any]) -> ClusterState:
    state = ClusterState(SCHED)
    for name in node_names():
        state.apply("Node", "ADDED", node(name))
    for obj in hypernodes():
        state.apply("HyperNode", "ADDED", obj)
    for name, gpus in case["busy"].items():
        if gpus:
            state.apply("Pod", "ADDED", pod(f"busy-{name}", gpus, node_name=name, scheduler="other"))
    for name, where, gpus in case["borrowers"]:
        if case["busy"][where] + gpus <= 8:
            state.apply("Pod", "ADDED", pod(name, gpus, node_name=where, preemptible=True, scheduler="other"))
    state.apply("PodGroup", "ADDED", podgroup("g", len(case["shapes"]), case["notes"]))
    for i, gpus in enumerate(case["shapes"]):
        where = case["placed"].get(i, "")
        state.apply("Pod", "ADDED", pod(f"g-{i}", gpus, node_name=where, group="g", preemptible=case["preemptible"]))
    return state


def tree(state: ClusterState) -> Topology:
    return build(state.hypernodes.values(), node_labels_of(state.nodes.values()))


def outcome(decision: Any) -> tuple[Any, ...]:
    placement = decision.placement
    where = (placement.tier, placement.domain, placement.leaves) if placement is not None else None
    return dict(decision.assignments), decision.reason, decision.spares, decision.reclaim, decision.warning, where


def shape_view(shape: ShapeIndex) -> tuple[Any, ...]:
    """A shape index's aggregates, without the empty entries an incremental update leaves behind."""
    return (shape.node_cap, shape.leaf_cap, {d: c for d, c in shape.domain_cap.items() if c or d == "(cluster)"},
            {d: h for d, h in shape.leaf_hist.items() if h}, {c: ls for c, ls in shape.leaves_by_cap.items() if ls},
            {t: r for t, r in shape.by_tier.items() if r})


def assert_index_as_built(state: ClusterState, topology: Topology, held: frozenset[str]) -> None:
    index = state.free_index(topology)
    assert index.held == held
    fresh = FreeIndex(topology, state.free(), held)
    for gpus in (1, 2, 4, 8):
        assert shape_view(index.shape(gpus)) == shape_view(fresh.shape(gpus))
    for request in index.request_shapes():
        assert shape_view(index.request_shape(request)) == shape_view(fresh.request_shape(request))


@pytest.mark.parametrize("seed", range(160))
def test_holding_spares_out_of_the_index_decides_as_excluding_them_per_decision(seed: int) -> None:
    case = scenario(seed)
    old, new = cluster(case), cluster(case)
    topology = tree(old)
    old_view, = podgroups.collect(old)
    if case["index_first"]:
        new.free_index(topology)  # built before the spares are held: they are taken out of it one by one
    reserved = ReservedSpares(new)
    for gang, nodes in case["held"].items():
        reserved.keep(gang, nodes)
    new_view, = podgroups.collect(new)
    before = outcome(decide(old, topology, old_view, reserved=case["held"]))
    after = outcome(decide(new, topology, new_view, reserved=reserved))
    assert after == before
    assert_index_as_built(new, topology, reserved.nodes)  # the gang's own spares held again after it


def test_the_differential_covers_every_path_a_spare_changes() -> None:
    """The random cases reach each way spares weigh on a decision (else the differential proves little)."""
    seen = set()
    for seed in range(160):
        case = scenario(seed)
        state = cluster(case)
        view, = podgroups.collect(state)
        decision = decide(state, tree(state), view, reserved=case["held"])
        seen.add("placed" if decision.ok else "refused")
        seen.update({"kept spares"} if decision.ok and decision.spares else set())
        seen.update({"reclaim"} if decision.reclaim else set())
        own = set(case["held"].get(("ns", "g"), ()))
        seen.update({"onto its own spares"} if own & set(decision.assignments.values()) else set())
        seen.update({"others' spares in the reason"} if "another gang's spares" in decision.reason else set())
        seen.update({"preemptible"} if case["preemptible"] and decision.ok else set())
    assert seen == {"placed", "refused", "kept spares", "reclaim", "onto its own spares", "others' spares in the reason",
                    "preemptible"}


def test_the_index_follows_spares_taken_given_up_ended_and_resynced() -> None:
    rng = random.Random(7)
    state = ClusterState(SCHED)
    names = node_names()
    for name in names:
        state.apply("Node", "ADDED", node(name))
    for obj in hypernodes():
        state.apply("HyperNode", "ADDED", obj)
    topology = tree(state)
    reserved = ReservedSpares(state)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for i in range(6):  # reserved through PodGroup annotations, as after a scheduler restart
        nodes = sorted(rng.sample(names, 3))
        groups[("ns", f"g{i}")] = podgroup(f"g{i}", 2, {spares.RESERVED: spares.annotation(nodes)})
    reserved.rebuild(groups)
    assert_index_as_built(state, topology, reserved.nodes)
    reserved.keep(("ns", "g0"), reserved[("ns", "g0")][1:])  # a spare took a member
    state.apply("Pod", "ADDED", pod("m0", 8, node_name=reserved[("ns", "g1")][0]))  # bound onto a held spare
    assert_index_as_built(state, topology, reserved.nodes)
    reserved.keep(("ns", "g2"), ())  # restarted whole: gives its spares up
    del groups[("ns", "g3")]  # its PodGroup deleted
    groups[("ns", "g4")] = {**groups[("ns", "g4")], "status": {"phase": "Completed"}}  # ended
    reserved.rebuild(groups)
    assert ("ns", "g3") not in reserved and ("ns", "g4") not in reserved and ("ns", "g2") not in reserved
    assert_index_as_built(state, topology, reserved.nodes)
    gone = reserved[("ns", "g5")][0]
    state.apply("Node", "DELETED", node(gone))  # a held node leaves and comes back
    assert_index_as_built(state, topology, reserved.nodes)
    state.apply("Node", "ADDED", node(gone))
    assert_index_as_built(state, topology, reserved.nodes)
    state.resync("Node", [node(n) for n in names])  # a fresh list
    state.resync("Pod", [pod("m0", 4, node_name=reserved[("ns", "g1")][0])])
    assert_index_as_built(state, topology, reserved.nodes)
    for obj in hypernodes(SPINES - 1):  # the tree changes: the index is built again, still holding them
        state.apply("HyperNode", "MODIFIED", obj)
    state.apply("HyperNode", "DELETED", {"metadata": {"name": f"s{SPINES - 1}"}})
    smaller = tree(state)
    assert smaller is not topology
    assert_index_as_built(state, smaller, reserved.nodes)
    reserved.rebuild({})  # every PodGroup gone: nothing held
    assert reserved.nodes == frozenset() and state.free_index(smaller).held == frozenset()
    assert_index_as_built(state, smaller, frozenset())


def test_a_node_two_gangs_reserve_stays_held_until_neither_does() -> None:
    state = ClusterState(SCHED)
    for name in node_names():
        state.apply("Node", "ADDED", node(name))
    reserved = ReservedSpares(state)
    reserved.keep(("ns", "a"), ("s0l0n0", "s0l0n1"))
    reserved.keep(("ns", "b"), ("s0l0n1",))  # a hand-edited annotation may name another gang's spare
    assert reserved.others(("ns", "a")) == {"s0l0n1"} and reserved.others(("ns", "b")) == {"s0l0n0", "s0l0n1"}
    assert reserved.others(("ns", "a")) == spares.others(dict(reserved), ("ns", "a"))
    reserved.keep(("ns", "a"), ())
    assert state.free_index(build([])).held == {"s0l0n1"}
    reserved.keep(("ns", "b"), ())
    assert state.free_index(build([])).held == frozenset()
    assert state.free(["s0l0n1"])["s0l0n1"] == Resources(8, 64_000, 512 * 1024**3, 110)
