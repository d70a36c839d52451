"""Warm spares (issue 25.1), without an API server: the request's bounds, placement only where the
gang's lowest domain also holds its spares, reserved spares kept from other gangs (but lent to
preemptible pods), re-placed pods going to the spares first, and spares released when the gang ends.

Nodes have 8 GPUs; gang pods ask 8 GPUs, so one pod fills one node."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.placement.core import spares
from aggregator.placement.core.decide import decide
from aggregator.placement.core.gang import Gang, PodSpec
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology, build
from aggregator.placement.kinds import podgroups, subgroups
from aggregator.placement.live.state import FABRIC_TAINT, ClusterState

SCHED = "hypertopo-scheduler"


def hn(name: str, tier: int, nodes: tuple[str, ...] = (), kids: tuple[str, ...] = ()) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": k}}} for k in kids]
    return {"metadata": {"name": name}, "spec": {"tier": tier, "members": members}}


# spine: leaf-a (a1..a4), leaf-b (b1..b3)
TREE = [hn("leaf-a", 1, ("a1", "a2", "a3", "a4")), hn("leaf-b", 1, ("b1", "b2", "b3")),
        hn("spine", 2, kids=("leaf-a", "leaf-b"))]
NODES = ("a1", "a2", "a3", "a4", "b1", "b2", "b3")


def node(name: str, taint: bool = False) -> dict[str, Any]:
    amounts = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    taints = [{"key": FABRIC_TAINT, "effect": "NoSchedule"}] if taint else []
    return {"metadata": {"name": name, "labels": {}}, "spec": {"taints": taints}, "status": {"allocatable": amounts}}


def pod(name: str, gang: str, node_name: str = "", *, preemptible: bool = False) -> dict[str, Any]:
    labels = {"scheduling.x-k8s.io/pod-group": gang}
    if preemptible:
        labels[spares.PREEMPTIBLE_LABEL] = "true"
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": SCHED, "nodeName": node_name or None,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
            "status": {"phase": "Running" if node_name else "Pending"}}


def group(name: str, min_member: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations or {}},
            "spec": {"minMember": min_member}}


def cluster(*objects: tuple[str, dict[str, Any]], tainted: tuple[str, ...] = ()) -> tuple[ClusterState, Topology]:
    state = ClusterState(SCHED)
    for name in NODES:
        state.apply("Node", "ADDED", node(name, name in tainted))
    for kind, obj in objects:
        state.apply(kind, "ADDED", obj)
    return state, build(TREE)


def view(state: ClusterState, name: str) -> podgroups.GangView:
    found = podgroups.view_of(state, ("ns", name))
    assert found is not None
    return found


def placed_nodes(decision: Any) -> set[str]:
    return set(decision.assignments.values())


# -- the request ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "members", "count"), [
    ("", 8, 0), (None, 8, 0), ("2", 8, 2), (" 1 ", 3, 1), ("0", 8, 0),
    ("10%", 4, 1),  # 0.4 rounded up: a percentage that asks anything asks at least one node
    ("25%", 8, 2), ("0%", 8, 0), ("100%", 3, 3),
])
def test_a_spare_request_is_a_count_or_a_percentage_of_the_members_rounded_up(raw: str | None, members: int,
                                                                               count: int) -> None:
    assert spares.parse_request(raw, members) == count


@pytest.mark.parametrize(("raw", "words"), [
    ("lots", "neither a node count nor a percentage"), ("-1", "neither"), ("1.5", "neither"),
    ("150%", "from 0% to 100%"), ("x%", "from 0% to 100%"), ("65", "at most 64"),
    ("1" * 40, "longer than 8 characters"),
])
def test_a_bad_spare_request_is_refused_with_the_annotation_named(raw: str, words: str) -> None:
    with pytest.raises(spares.SpareRequestError) as caught:
        spares.parse_request(raw, 8)
    assert spares.SPARE_REQUEST in str(caught.value) and words in str(caught.value)


def test_a_bad_spare_request_makes_the_gang_unschedulable_with_a_clear_reason() -> None:
    state, topo = cluster(("PodGroup", group("g", 1, {spares.SPARE_REQUEST: "lots"})), ("Pod", pod("g-0", "g")))
    decision = decide(state, topo, view(state, "g"))
    assert not decision.ok
    assert decision.reason.startswith("invalid spare request: hypertopo.io/spare-nodes: 'lots'")


def test_a_reserved_annotation_that_is_not_a_bounded_list_of_names_reserves_nothing() -> None:
    assert spares.parse_reserved('["a1","a4"]') == ("a1", "a4")
    assert spares.parse_reserved("a1,a4") == ()
    assert spares.parse_reserved('{"a1": 1}') == ()
    assert spares.parse_reserved("[" + ",".join('"n"' for _ in range(65)) + "]") == ()
    assert spares.parse_reserved('["ok", 3, ""]') == ("ok",)


# -- placement with spares -----------------------------------------------------------------------

def core_gang(pods: int) -> Gang:
    return Gang("g", tuple(PodSpec(f"p{i}", Resources(8, 1000, 2**30, 1)) for i in range(pods)))


def free_nodes(*busy: str) -> dict[str, Resources]:
    return {n: Resources(0 if n in busy else 8, 64_000, 512 * 2**30, 110) for n in NODES}


def test_a_gang_with_spares_goes_only_where_its_leaf_also_holds_the_spares() -> None:
    topo = build(TREE)
    # without spares best fit picks leaf-b (3 nodes for 3 pods, nothing left over)
    placement, chosen = spares.place(topo, free_nodes(), core_gang(3), 0)
    assert placement.domain == "leaf-b" and chosen == ()
    # with one spare leaf-b (3 nodes) cannot hold 3 + 1: leaf-a (4 nodes) can
    placement, chosen = spares.place(topo, free_nodes(), core_gang(3), 1)
    assert placement.domain == "leaf-a" and placement.tier == 1
    assert len(chosen) == 1 and chosen[0].startswith("a")
    assert chosen[0] not in set(placement.assignments.values())
    assert len(set(placement.assignments.values())) == 3


def test_when_no_leaf_holds_gang_and_spares_they_share_the_lowest_domain_that_does() -> None:
    topo = build(TREE)
    placement, chosen = spares.place(topo, free_nodes(), core_gang(4), 1)  # 5 nodes: only the spine
    # the spare is in the gang's own lowest domain (the spine), so using it never raises the tier:
    # taken from the leaf with the most of the gang (leaf-a), the members spread over both leaves
    assert placement.ok and placement.domain == "spine" and placement.tier == 2
    assert chosen and chosen[0].startswith("a")
    assert len(set(placement.assignments.values()) | set(chosen)) == 5


def test_a_gang_whose_spares_fit_nowhere_is_not_placed_and_says_why() -> None:
    topo = build(TREE)
    placement, chosen = spares.place(topo, free_nodes("a1", "a2", "b1"), core_gang(3), 2)  # 4 free, 5 asked
    assert not placement.ok and chosen == ()
    assert placement.failure is not None and "its 2 spare node(s)" in placement.failure.message


# -- reservations in decisions -------------------------------------------------------------------

def test_a_placed_gang_reports_the_spares_it_reserves() -> None:
    state, topo = cluster(("PodGroup", group("g", 3, {spares.SPARE_REQUEST: "1"})),
                          *(("Pod", pod(f"g-{i}", "g")) for i in range(3)))
    decision = decide(state, topo, view(state, "g"))
    assert decision.ok and decision.placement is not None and decision.placement.domain == "leaf-a"
    assert decision.spares is not None and len(decision.spares) == 1
    assert decision.spares[0] in {"a1", "a2", "a3", "a4"} - placed_nodes(decision)


def test_reserved_spares_are_not_given_to_another_gang() -> None:
    # g runs on a1..a3 with spare a4; b1..b3 are busy: the only free node is g's spare
    running = [("Pod", pod(f"g-{i}", "g", f"a{i + 1}")) for i in range(3)]
    busy = [("Pod", pod(f"x-{i}", "x", f"b{i + 1}")) for i in range(3)]
    state, topo = cluster(("PodGroup", group("g", 3)), ("PodGroup", group("x", 3)), ("PodGroup", group("o", 1)),
                          *running, *busy, ("Pod", pod("o-0", "o")))
    reserved = {("ns", "g"): ("a4",)}
    assert decide(state, topo, view(state, "o")).assignments  # sanity: a4 is free to anyone without the reservation
    refused = decide(state, topo, view(state, "o"), reserved=reserved)
    assert not refused.ok and "1 node(s) were reserved as another gang's spares" in refused.reason


def test_a_preemptible_pod_may_borrow_a_reserved_spare() -> None:
    running = [("Pod", pod(f"g-{i}", "g", f"a{i + 1}")) for i in range(3)]
    busy = [("Pod", pod(f"x-{i}", "x", f"b{i + 1}")) for i in range(3)]
    state, topo = cluster(("PodGroup", group("g", 3)), ("PodGroup", group("x", 3)), ("PodGroup", group("o", 1)),
                          *running, *busy, ("Pod", pod("o-0", "o", preemptible=True)))
    decision = decide(state, topo, view(state, "o"), reserved={("ns", "g"): ("a4",)})
    assert placed_nodes(decision) == {"a4"}


def test_a_negative_priority_counts_as_preemptible() -> None:
    assert spares.is_preemptible({"spec": {"priority": -1}})
    assert not spares.is_preemptible({"spec": {"priority": 0}})
    assert not spares.is_preemptible({"metadata": {"labels": {spares.PREEMPTIBLE_LABEL: "no"}}})


def test_a_replacement_goes_to_the_gangs_spare_in_the_same_leaf_and_the_tier_stays() -> None:
    # g ran on a1..a3 with spare a4; a1 failed (tainted), its pod g-0 was recreated and is pending.
    # leaf-b is empty, so without the spare the best-fit core would have room elsewhere too.
    running = [("Pod", pod(f"g-{i}", "g", f"a{i + 1}")) for i in (1, 2)]
    state, topo = cluster(("PodGroup", group("g", 3)), *running, ("Pod", pod("g-0", "g")), tainted=("a1",))
    decision = decide(state, topo, view(state, "g"), reserved={("ns", "g"): ("a4",)})
    assert decision.assignments == {("ns", "g-0"): "a4"}
    assert decision.placement is not None and decision.placement.tier == 1 and decision.placement.domain == "leaf-a"
    assert decision.spares == ()  # the spare now holds a member: none left


def test_the_tier_does_not_rise_while_a_spare_is_free_even_when_the_leaf_is_otherwise_full() -> None:
    # leaf-a: g on a2, a3; other work on a1 (failed node's pod moved off... a1 now busy with x);
    # spare a4 is the leaf's last free node. Another gang asked first: it must not take a4.
    state, topo = cluster(("PodGroup", group("g", 3)), ("PodGroup", group("x", 1)), ("PodGroup", group("y", 1)),
                          ("Pod", pod("g-1", "g", "a2")), ("Pod", pod("g-2", "g", "a3")),
                          ("Pod", pod("x-0", "x", "a1")), ("Pod", pod("y-0", "y")), ("Pod", pod("g-0", "g")))
    reserved = {("ns", "g"): ("a4",)}
    other = decide(state, topo, view(state, "y"), reserved=reserved)
    assert placed_nodes(other) <= {"b1", "b2", "b3"}
    mine = decide(state, topo, view(state, "g"), reserved=reserved)
    assert mine.assignments == {("ns", "g-0"): "a4"}
    assert mine.placement is not None and mine.placement.tier == 1


def test_a_spare_borrowed_by_preemptible_work_is_reclaimed_first_when_needed() -> None:
    running = [("Pod", pod(f"g-{i}", "g", f"a{i + 1}")) for i in (1, 2)]
    state, topo = cluster(("PodGroup", group("g", 3)), ("PodGroup", group("o", 1)), *running,
                          ("Pod", pod("o-0", "o", "a4", preemptible=True)), ("Pod", pod("g-0", "g")),
                          *(("Pod", pod(f"x-{i}", "x", f"b{i + 1}")) for i in range(3)), tainted=("a1",))
    decision = decide(state, topo, view(state, "g"), reserved={("ns", "g"): ("a4",)})
    assert not decision.ok
    assert decision.reclaim == (("ns", "o-0"),)
    assert "waiting for preemptible pods to leave its spare node(s) a4" in decision.reason


def test_spares_are_released_when_the_gang_ends() -> None:
    live = group("g", 3, {spares.RESERVED: '["a4"]'})
    done = {**group("h", 3, {spares.RESERVED: '["b3"]'}), "status": {"phase": "Completed"}}
    found = spares.reservations({("ns", "g"): live, ("ns", "h"): done}, {})
    assert found == {("ns", "g"): ("a4",)}  # h completed: b3 is free for anyone
    assert spares.reservations({}, {("ns", "g"): ("a4",)}) == {}  # g's PodGroup deleted: nothing reserved
    # what this scheduler just decided counts before its annotation is seen back
    assert spares.reservations({("ns", "g"): live}, {("ns", "g"): ("a3",)}) == {("ns", "g"): ("a3",)}
    assert spares.reservations({("ns", "g"): live}, {("ns", "g"): ()}) == {}  # every spare used


def test_a_used_or_failed_spare_is_no_longer_a_spare() -> None:
    assert spares.remaining(("a3", "a4", "b1"), used=["a4"], failed=["b1"]) == ("a3",)
    assert spares.annotation(["b1", "a4", "a4"]) == '["a4","b1"]'


# -- the simulator -------------------------------------------------------------------------------

def test_the_simulator_counts_recoveries_that_kept_their_tier_with_and_without_spares() -> None:
    from aggregator.placement.sim.policies import policy
    from aggregator.placement.sim.simulate import Simulation, node_capacity
    from aggregator.placement.sim.trace import Failure, Job, Trace

    # "train" (3 nodes, restart-pods) then "fill" (4 nodes, left alone on a fault); a1 and b1 fail.
    # Without spares: train best-fits leaf-b, fill takes leaf-a; b1 fails, and no node is free for
    # train's replacement: the recovery fails. With 1 spare: train takes leaf-a (3 + its spare),
    # fill (4) waits, a1 fails, and the replacement goes to the spare in leaf-a: the tier is kept.
    jobs = (Job("train", 0.0, 3, 8, 1000.0, on_fabric_fault="restart-pods"),
            Job("fill", 1.0, 4, 8, 1000.0, on_fabric_fault="none"))
    trace = Trace(jobs, (Failure(10.0, node="a1", duration=5000.0), Failure(10.0, node="b1", duration=5000.0)))
    topo, capacity = build(TREE), node_capacity(list(NODES))
    without = Simulation(topo, capacity, trace, policy("hypertopo")).run()
    with_spares = Simulation(topo, capacity, trace, policy("hypertopo"), spare_nodes="1").run()
    assert (without["recoveries"], without["recoveries_kept_tier"], without["spare_gpu_hours"]) == (1, 0, 0.0)
    assert (with_spares["recoveries"], with_spares["recoveries_kept_tier"], with_spares["recoveries_on_spares"]) == (1, 1, 1)
    # train's spare stood idle the 10 s before the fault; fill then starts at 1000 s on the 5 nodes
    # left (4 + its spare) and holds its spare until it ends at 2000 s: 8 GPUs x (10 + 1000) s
    assert with_spares["spare_gpu_hours"] == round(8 * (10 + 1000) / 3600, 2)


def test_spare_options_accept_counts_and_shares_and_refuse_the_rest_in_one_line() -> None:
    import argparse

    from aggregator.placement.cli import spare_value
    from aggregator.placement.live.scheduler import spare_default

    assert spare_value(" 10% ") == "10%"
    assert spare_default("team-a=2") == ("team-a", "2")
    assert spare_default("*=5%") == ("*", "5%")
    for bad in ("team-a", "=2", "team-a=lots", "team-a=101%"):
        with pytest.raises(argparse.ArgumentTypeError):
            spare_default(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="at most 64"):
        spare_value("65")


# -- partial use of spares, sub-groups -----------------------------------------------------------

def test_more_lost_pods_than_free_spares_fill_the_spares_first_and_place_only_the_rest() -> None:
    # one leaf of six: g ran on c1..c3 with spare c6; c1 and c2 failed: two pods pending, one spare.
    # Placed as if it had no spare, the gang would take c4 and c5 (by name) and keep c6 idle while
    # holding two more nodes; the spare takes one pod, only the other takes a free node.
    wide = ("c1", "c2", "c3", "c4", "c5", "c6")
    state = ClusterState(SCHED)
    for name in wide:
        state.apply("Node", "ADDED", node(name, name in ("c1", "c2")))
    for kind, obj in (("PodGroup", group("g", 3)), ("Pod", pod("g-2", "g", "c3")), ("Pod", pod("g-0", "g")),
                      ("Pod", pod("g-1", "g"))):
        state.apply(kind, "ADDED", obj)
    topo = build([hn("leaf-c", 1, wide)])
    decision = decide(state, topo, view(state, "g"), reserved={("ns", "g"): ("c6",)})
    assert sorted(decision.assignments.values()) == ["c4", "c6"] and decision.spares == ()
    assert decision.placement is not None and decision.placement.domain == "leaf-c"


def test_a_partial_replacement_whose_rest_fits_nowhere_falls_back_to_the_usual_placement() -> None:
    topo = build(TREE)
    lost = Gang("g", tuple(PodSpec(f"p{i}", Resources(8, 1000, 2**30, 1)) for i in range(3)), running={"p9": "a1"})
    free = free_nodes("a2", "a3", "b1", "b2", "b3")  # a4 (the spare) is the only free node
    spare_free = {"a4": free["a4"]}
    placement, reclaim = spares.replace(topo, spare_free, free, lost, ("a4",))
    assert reclaim == () and placement is not None and not placement.ok  # 1 on the spare, 2 nowhere
    placement, reclaim = spares.replace(topo, spare_free, free_nodes("a1", "a2", "a3"), lost, ("a4",))
    assert placement is not None and placement.ok and reclaim == ()
    assert sorted(placement.assignments.values()) == ["a4", "b1", "b2"]  # the spare first, the rest beside


def subgroup_pod(name: str, part: str, node_name: str = "") -> dict[str, Any]:
    found = pod(name, "g", node_name)
    found["metadata"]["labels"]["part"] = part
    return found


SUBGROUPS = {subgroups.KEYS_ANNOTATION: "part", subgroups.SIZE_ANNOTATION: "2",
             subgroups.TIER_ANNOTATION: "1"}  # each part of 2 pods inside one leaf


def test_a_gang_with_sub_groups_gets_its_spares_in_its_own_domain() -> None:
    members = [("Pod", subgroup_pod(f"g-{i}", "x" if i < 2 else "y")) for i in range(4)]
    state, topo = cluster(("PodGroup", group("g", 4, {**SUBGROUPS, spares.SPARE_REQUEST: "1"})), *members)
    decision = decide(state, topo, view(state, "g"))
    assert decision.ok and decision.spares is not None and len(decision.spares) == 1
    spare = decision.spares[0]
    assert spare not in placed_nodes(decision)
    by_part: dict[str, set[str]] = {}
    for key, node_name in decision.assignments.items():
        by_part.setdefault(key[1].split("-")[1], set()).add(topo.node_leaf[node_name])
    assert all(len(leaves) == 1 for leaves in by_part.values())  # the sub-groups' limits still hold
    # the spare shares the gang's own lowest domain: using it will not raise the gang's tier
    assert decision.placement is not None and decision.placement.domain == topo.lca([*placed_nodes(decision), spare])


def test_a_gang_with_sub_groups_whose_spares_fit_nowhere_waits_and_says_why() -> None:
    members = [("Pod", subgroup_pod(f"g-{i}", "x" if i < 2 else "y")) for i in range(4)]
    busy = [("Pod", pod("z-0", "z", "b3"))]
    state, topo = cluster(("PodGroup", group("g", 4, {**SUBGROUPS, spares.SPARE_REQUEST: "3"})),
                          ("PodGroup", group("z", 1)), *members, *busy)
    decision = decide(state, topo, view(state, "g"))  # 4 members + 3 spares > the 6 free nodes
    assert not decision.ok and "its 3 spare node(s)" in decision.reason


def test_lost_sub_group_members_fill_the_spare_first_and_the_rest_keeps_the_sub_groups_limit() -> None:
    # part x (limit: one leaf) lost a1 and a2; the gang's spare a3 takes one pod, and the other must
    # join it in leaf-a (a4), not the emptier leaf-b a plain placement would pick
    members = [("Pod", subgroup_pod("g-0", "x")), ("Pod", subgroup_pod("g-1", "x")),
               ("Pod", subgroup_pod("g-2", "y", "b1")), ("Pod", subgroup_pod("g-3", "y", "b2"))]
    state, topo = cluster(("PodGroup", group("g", 4, SUBGROUPS)), *members, tainted=("a1", "a2"))
    decision = decide(state, topo, view(state, "g"), reserved={("ns", "g"): ("a3",)})
    assert sorted(decision.assignments.values()) == ["a3", "a4"] and decision.spares == ()
