"""Grey failures in the scheduler (unit level): degraded nodes are preferred against, never failed,
and `restart-pods-on-degraded` moves pods only off nodes that stayed degraded long enough."""

from __future__ import annotations

from typing import Any

from aggregator.live.node_marks import DEGRADED_ANNOTATION
from aggregator.placement.core import degraded, rescheduler
from aggregator.placement.core.decide import decide
from aggregator.placement.core.topology import build
from aggregator.placement.kinds import podgroups
from aggregator.placement.live.state import ClusterState

SCHED = "hypertopo-scheduler"
LEAVES = {"leaf-a": ["a1", "a2", "a3"], "leaf-b": ["b1", "b2", "b3"]}


def node(name: str, *, degraded_since: str | None = None) -> dict[str, Any]:
    amounts = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    annotations = {DEGRADED_ANNOTATION: degraded_since} if degraded_since else {}
    return {"metadata": {"name": name, "labels": {}, "annotations": annotations}, "spec": {},
            "status": {"allocatable": amounts}}


def hypernode(name: str, tier: int, members: list[tuple[str, str]], *, fabric_degraded: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True", "reason": "MembersHealthy", "message": "ok"},
                  {"type": "FabricDegraded", "status": "True" if fabric_degraded else "False",
                   "reason": "RDMADegraded" if fabric_degraded else "NoDegradedMembers",
                   "message": "1 of 3 nodes degraded: a1: RDMA mlx5_0/1 error-rate" if fabric_degraded else "none"}]
    return {"metadata": {"name": name},
            "spec": {"tier": tier, "tierName": {1: "leaf", 2: "spine"}[tier],
                     "members": [{"type": t, "selector": {"exactMatch": {"name": n}}} for t, n in members]},
            "status": {"conditions": conditions}}


def tree(*, degraded_leaf: str | None = None) -> list[dict[str, Any]]:
    leaves = [hypernode(leaf, 1, [("Node", n) for n in nodes], fabric_degraded=leaf == degraded_leaf)
              for leaf, nodes in LEAVES.items()]
    return [*leaves, hypernode("spine", 2, [("HyperNode", leaf) for leaf in LEAVES],
                               fabric_degraded=degraded_leaf is not None)]


def pod(name: str, *, gang: str, node_name: str = "", gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "labels": {"scheduling.x-k8s.io/pod-group": gang}, "annotations": {},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": SCHED, "nodeName": node_name or None,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running" if node_name else "Pending"}}


def podgroup(name: str, min_member: int, policy: str | None = None) -> dict[str, Any]:
    annotations = {"hypertopo.io/on-fabric-fault": policy} if policy else {}
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations}, "spec": {"minMember": min_member}}


def state_of(hypernodes: list[dict[str, Any]], nodes: list[dict[str, Any]], *objects: tuple[str, dict[str, Any]]
             ) -> ClusterState:
    state = ClusterState(SCHED)
    for obj in nodes:
        state.apply("Node", "ADDED", obj)
    for obj in hypernodes:
        state.apply("HyperNode", "ADDED", obj)
    for kind, obj in objects:
        state.apply(kind, "ADDED", obj)
    return state


def place_gang(state: ClusterState, pods: int) -> dict[str, str]:
    objs = [("PodGroup", podgroup("g", pods))] + [("Pod", pod(f"g-{i}", gang="g")) for i in range(pods)]
    for kind, obj in objs:
        state.apply(kind, "ADDED", obj)
    topo = build(state.hypernodes.values())
    marks = frozenset(degraded.degraded_nodes(state.nodes, state.hypernodes, topo))
    [view] = podgroups.collect(state)
    decision = decide(state, topo, view, degraded_nodes=marks)
    assert decision.ok, decision.reason
    return {key[1]: node for key, node in decision.assignments.items()}


def all_nodes(**marks: str) -> list[dict[str, Any]]:
    return [node(n, degraded_since=marks.get(n)) for nodes in LEAVES.values() for n in nodes]


def test_without_grey_failures_name_order_picks_leaf_a() -> None:
    """The baseline the next tests move away from: two equal leaves, the tie goes to leaf-a."""
    placed = place_gang(state_of(tree(), all_nodes()), 2)
    assert set(placed.values()) <= set(LEAVES["leaf-a"])


def test_a_new_gang_goes_to_the_healthy_leaf_of_two_equal_ones_marked_node() -> None:
    state = state_of(tree(degraded_leaf="leaf-a"), all_nodes(a1="2026-01-01T00:00:00Z"))
    placed = place_gang(state, 2)
    assert set(placed.values()) <= set(LEAVES["leaf-b"]), placed


def test_a_fabric_degraded_leaf_without_node_marks_is_avoided_too() -> None:
    placed = place_gang(state_of(tree(degraded_leaf="leaf-a"), all_nodes()), 3)
    assert sorted(placed.values()) == ["b1", "b2", "b3"]


def test_the_preference_is_soft_a_gang_that_needs_the_degraded_leaf_still_gets_it() -> None:
    """4 pods: no leaf holds them alone; the spine spreads them over both leaves, degraded node included
    (excluding it would need 4 of the 5 healthy nodes over two leaves as well: as good, so taken);
    6 pods need every node, the degraded one too: placed, not refused."""
    state = state_of(tree(degraded_leaf="leaf-a"), all_nodes(a1="2026-01-01T00:00:00Z"))
    four = place_gang(state, 4)
    assert "a1" not in four.values() and len(four) == 4
    six = place_gang(state_of(tree(degraded_leaf="leaf-a"), all_nodes(a1="2026-01-01T00:00:00Z")), 6)
    assert sorted(six.values()) == ["a1", "a2", "a3", "b1", "b2", "b3"]


def test_the_preference_never_costs_a_tier() -> None:
    """3 pods of leaf-a fit in one leaf only if a1 is used when leaf-b is full: stay in the leaf."""
    state = state_of(tree(degraded_leaf="leaf-a"), all_nodes(a1="2026-01-01T00:00:00Z"),
                     ("PodGroup", podgroup("busy", 3)),
                     *(("Pod", pod(f"busy-{n}", gang="busy", node_name=n)) for n in LEAVES["leaf-b"]))
    placed = place_gang(state, 3)
    assert sorted(placed.values()) == ["a1", "a2", "a3"]


def test_a_degraded_node_is_never_a_failed_node() -> None:
    state = state_of(tree(degraded_leaf="leaf-a"), all_nodes(a1="2026-01-01T00:00:00Z"))
    topo = build(state.hypernodes.values())
    tracker = rescheduler.FaultTracker(grace_seconds=0)
    failed_domains = tracker.failed_domains(state.hypernodes, now=0.0)
    assert failed_domains == {} and rescheduler.failed_nodes(state, topo, failed_domains) == {}
    assert topo.node_usable("a1") and all(topo.usable.values())


def test_restart_pods_on_degraded_is_a_known_policy_and_acts_as_restart_pods_on_failures() -> None:
    state = state_of(tree(), all_nodes(), ("PodGroup", podgroup("g", 2, "restart-pods-on-degraded")),
                     ("Pod", pod("g-0", gang="g", node_name="a1")), ("Pod", pod("g-1", gang="g", node_name="a2")))
    [view] = podgroups.gangs_on_nodes(state, {"a1"})
    assert view.fault_policy == "restart-pods-on-degraded"
    plan = rescheduler.plan([view], {"a1": "node a1 has taint hypertopo.io/fabric-unhealthy"})
    assert [(e.pod[1], e.node) for e in plan] == [("g-0", "a1")]


def test_pods_move_off_a_degraded_node_only_after_the_configured_time_and_only_when_asked() -> None:
    since = "2026-01-01T00:00:00Z"
    objs = [("PodGroup", podgroup("asks", 2, "restart-pods-on-degraded")),
            ("Pod", pod("asks-0", gang="asks", node_name="a1", gpus=1)),
            ("Pod", pod("asks-1", gang="asks", node_name="a2", gpus=1)),
            ("PodGroup", podgroup("plain", 1, "restart-pods")),
            ("Pod", pod("plain-0", gang="plain", node_name="a1", gpus=1)),
            ("PodGroup", podgroup("quiet", 1)),
            ("Pod", pod("quiet-0", gang="quiet", node_name="a1", gpus=1))]
    state = state_of(tree(degraded_leaf="leaf-a"), all_nodes(a1=since), *objs)
    tracker = degraded.DegradedTracker(after_seconds=600)
    marked = degraded.marked_nodes(state.nodes)
    assert marked == {"a1": since}

    def evicted(now: float) -> list[tuple[str, str]]:
        due = tracker.due(marked, now)
        return [(e.pod[1], e.policy) for e in degraded.plan(podgroups.gangs_on_nodes(state, set(due)), due)]

    assert evicted(1000.0) == []  # first seen now
    assert tracker.next_due(1000.0) == 600.0
    assert evicted(1599.0) == []  # 599 s < 600 s
    assert evicted(1600.0) == [("asks-0", "restart-pods-on-degraded")]  # only the gang that asked, only a1
    marked = {}  # the mark went away: the clock starts again when it comes back
    assert evicted(1700.0) == [] and tracker.since == {}
    marked = {"a1": since}
    assert evicted(1800.0) == [] and tracker.next_due(1800.0) == 600.0


def test_prefer_healthy_keeps_the_first_answer_when_avoiding_costs_more_leaves() -> None:
    from aggregator.placement.core.gang import Placement

    first = Placement({"p0": "a1", "p1": "a2"}, tier=1, domain="leaf-a", leaves=1, nodes=2)
    worse = Placement({"p0": "a2", "p1": "b1"}, tier=2, domain="spine", leaves=2, nodes=2)
    better = Placement({"p0": "b1", "p1": "b2"}, tier=1, domain="leaf-b", leaves=1, nodes=2)
    calls: list[frozenset[str]] = []

    def again(result: Placement) -> Any:
        return lambda avoid: calls.append(avoid) or result

    leaf_a, a1 = frozenset({"a1", "a2", "a3"}), frozenset({"a1"})
    assert degraded.prefer_healthy(first, (leaf_a, a1), again(worse)) is first
    assert calls == [leaf_a, a1]  # the whole leaf, then the node alone: both cost a tier
    assert degraded.prefer_healthy(first, (leaf_a, a1), again(better)) is better
    assert calls[2:] == [leaf_a]
    assert degraded.prefer_healthy(first, (frozenset({"b9"}),), again(better)) is first  # not used: no retry
    assert len(calls) == 3


def test_avoid_levels_are_the_degraded_members_leaves_then_the_nodes() -> None:
    topo = build(tree())
    assert degraded.avoid_levels(topo, {"a1"}) == (frozenset({"a1", "a2", "a3"}), frozenset({"a1"}))
    assert degraded.avoid_levels(topo, set()) == ()
