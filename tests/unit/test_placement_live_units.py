"""The live scheduler's pure parts, without an API server: the assumed-pod ledger, gang views,
PodGroup status, taint/toleration filters, fault detection with its grace period, eviction plans
and the eviction rate limit."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.placement.core import rescheduler
from aggregator.placement.core.decide import tolerates, why_not
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import build
from aggregator.placement.kinds import podgroups
from aggregator.placement.live.eviction import TokenBucket
from aggregator.placement.live.state import ClusterState

SCHED = "hypertopo-scheduler"


def node(name: str, gpus: int = 8, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    amounts = {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {}}, "spec": {"taints": taints or []}, "status": {"allocatable": amounts}}


def pod(name: str, *, gpus: int = 1, node_name: str = "", gang: str = "", phase: str = "Pending",
        annotations: dict[str, str] | None = None, scheduler: str = SCHED) -> dict[str, Any]:
    labels = {"scheduling.x-k8s.io/pod-group": gang} if gang else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels,
                     "annotations": annotations or {}, "creationTimestamp": f"2026-01-01T00:00:{name[-1]}0Z"},
        "spec": {"schedulerName": scheduler, "nodeName": node_name or None,
                 "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase},
    }


def podgroup(name: str, min_member: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations or {}},
            "spec": {"minMember": min_member}}


def fresh(*objects: tuple[str, dict[str, Any]]) -> ClusterState:
    state = ClusterState(SCHED)
    for kind, obj in objects:
        state.apply(kind, "ADDED", obj)
    return state


def test_assumed_pods_are_charged_at_once_so_two_decisions_never_double_book() -> None:
    state = fresh(("Node", node("a", 8)), ("Pod", pod("p1", gpus=6)), ("Pod", pod("p2", gpus=6)))
    assert state.free()["a"].gpus == 8
    state.assume(("ns", "p1"), "a")
    # 8 - 6 = 2 left: the second 6-GPU pod no longer fits, though the API has not seen a bind yet
    assert state.free()["a"].gpus == 2
    assert [p["metadata"]["name"] for p in state.pending()] == ["p2"]


def test_a_confirmed_bind_replaces_the_assumption_without_charging_twice() -> None:
    state = fresh(("Node", node("a", 8)), ("Pod", pod("p1", gpus=3)))
    state.assume(("ns", "p1"), "a")
    state.apply("Pod", "MODIFIED", pod("p1", gpus=3, node_name="a"))
    assert state.assumed == {}
    assert state.free()["a"].gpus == 5  # 8 - 3, once


def test_forgetting_a_failed_bind_releases_its_resources() -> None:
    state = fresh(("Node", node("a", 8)), ("Pod", pod("p1", gpus=8)))
    state.assume(("ns", "p1"), "a")
    state.forget(("ns", "p1"))
    assert state.free()["a"].gpus == 8
    assert state.pending_keys == {("ns", "p1")}


def test_finished_and_foreign_pods_count_only_where_they_hold_resources() -> None:
    state = fresh(("Node", node("a", 8)),
                  ("Pod", pod("done", gpus=4, node_name="a", phase="Succeeded")),
                  ("Pod", pod("other", gpus=2, node_name="a", scheduler="default-scheduler")),
                  ("Pod", pod("mine", gpus=1, scheduler="default-scheduler")))
    assert state.free()["a"].gpus == 6  # only the running foreign pod holds GPUs
    assert state.pending() == []  # not our scheduler's pod


def test_resync_drops_objects_deleted_while_not_watching() -> None:
    state = fresh(("Node", node("a")), ("Node", node("b")), ("Pod", pod("p1", gpus=8, node_name="b")))
    state.resync("Node", [node("a")])
    state.resync("Pod", [])
    assert set(state.free()) == {"a"}
    assert state.pods == {} and state.pending_keys == set()


def test_gang_waits_for_its_podgroup_and_for_min_member() -> None:
    state = fresh(("Pod", pod("g-1", gang="g")), ("Pod", pod("g-2", gang="g")))
    (view,) = podgroups.collect(state)
    assert view.min_member == -1  # no PodGroup yet: unknown, wait
    state.apply("PodGroup", "ADDED", podgroup("g", 3))
    (view,) = podgroups.collect(state)
    assert (view.min_member, view.missing, len(view.pending)) == (3, 1, 2)


def test_podgroup_annotations_win_over_pod_annotations() -> None:
    state = fresh(("Pod", pod("g-1", gang="g", annotations={"hypertopo.io/on-fabric-fault": "restart-gang"})),
                  ("PodGroup", podgroup("g", 1, {"hypertopo.io/on-fabric-fault": "restart-pods"})))
    (view,) = podgroups.collect(state)
    assert view.fault_policy == "restart-pods"


@pytest.mark.parametrize(
    ("phases", "scheduled", "expected"),
    [
        (["Pending"] * 4, 0, "Pending"),
        (["Pending"] * 4, 4, "Scheduled"),  # bound, not yet running
        (["Running"] * 3 + ["Pending"], 4, "Running"),  # 3 running >= minMember 3
        (["Succeeded"] * 3 + ["Running"], 4, "Finished"),
        (["Failed", "Running", "Pending", "Pending"], 4, "Failed"),  # 1 running < 3, one failed
    ],
)
def test_podgroup_phase_follows_its_members(phases: list[str], scheduled: int, expected: str) -> None:
    pods = [pod(f"p{i}", phase=ph) for i, ph in enumerate(phases)]
    assert podgroups.group_status(podgroup("g", 3), pods, scheduled)["phase"] == expected


def test_status_patch_is_none_when_nothing_changes_and_sets_start_time_once() -> None:
    group = podgroup("g", 2)
    wanted = {"phase": "Scheduled", "scheduled": 2, "running": 0, "succeeded": 0, "failed": 0}
    patch = podgroups.status_patch(group, wanted, "2026-01-01T00:00:00Z")
    assert patch == {"status": {"phase": "Scheduled", "scheduled": 2, "scheduleStartTime": "2026-01-01T00:00:00Z"}}
    group["status"] = {**wanted, "scheduleStartTime": "2026-01-01T00:00:00Z"}
    assert podgroups.status_patch(group, wanted, "2026-01-01T00:01:00Z") is None


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
        ({"key": "k", "value": "w"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
        ({"key": "k", "operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoExecute"}, True),
        ({"operator": "Exists"}, {"key": "anything", "effect": "NoSchedule"}, True),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, {"key": "k", "effect": "NoSchedule"}, False),
    ],
)
def test_tolerations_match_as_kubernetes_does(toleration: dict[str, str], taint: dict[str, str], tolerated: bool) -> None:
    assert tolerates([toleration], taint) is tolerated


def test_fabric_taint_excludes_a_node_even_for_a_pod_that_tolerates_everything() -> None:
    tainted = node("a", taints=[{"key": "hypertopo.io/fabric-unhealthy", "effect": "NoSchedule"}])
    tolerant = pod("p")
    tolerant["spec"]["tolerations"] = [{"operator": "Exists"}]
    assert "fabric" in (why_not(tolerant, tainted) or "")
    assert why_not(tolerant, node("b")) is None


def hypernode(name: str, ready: str | None, nodes: list[str]) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name}, "spec": {"tier": 1, "tierName": "leaf",
                           "members": [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]}}
    if ready:
        obj["status"] = {"conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "m"}]}
    return obj


def test_unknown_counts_as_failed_only_after_the_grace_period_and_false_at_once() -> None:
    tracker = rescheduler.FaultTracker(grace_seconds=60)
    hns = {"leaf-a": hypernode("leaf-a", "Unknown", ["a"]), "leaf-b": hypernode("leaf-b", "False", ["b"])}
    assert set(tracker.failed_domains(hns, now=100.0)) == {"leaf-b"}
    assert set(tracker.failed_domains(hns, now=159.0)) == {"leaf-b"}  # 59 s < 60 s grace
    assert set(tracker.failed_domains(hns, now=160.0)) == {"leaf-a", "leaf-b"}
    hns["leaf-a"] = hypernode("leaf-a", "True", ["a"])  # back: the clock restarts next time
    assert set(tracker.failed_domains(hns, now=161.0)) == {"leaf-b"}
    assert tracker.unknown_since == {}


def test_eviction_plan_follows_each_gangs_policy() -> None:
    objs: list[tuple[str, dict[str, Any]]] = [("Node", node(n)) for n in ("a", "b", "c")]
    for gang, policy in (("rp", "restart-pods"), ("rg", "restart-gang"), ("no", "none")):
        objs.append(("PodGroup", podgroup(gang, 2, {"hypertopo.io/on-fabric-fault": policy})))
        objs += [("Pod", pod(f"{gang}-1", gang=gang, node_name="a")), ("Pod", pod(f"{gang}-2", gang=gang, node_name="b"))]
    state = fresh(*objs)
    topo = build([hypernode("leaf", "True", ["a", "b", "c"])])
    failed = rescheduler.failed_nodes(state, topo, {})
    assert failed == {}
    state.apply("Node", "MODIFIED", node("a", taints=[{"key": "hypertopo.io/fabric-unhealthy", "effect": "NoSchedule"}]))
    failed = rescheduler.failed_nodes(state, topo, {})
    plan = rescheduler.plan(podgroups.gangs_on_nodes(state, set(failed)), failed)
    assert sorted(e.pod[1] for e in plan) == ["rg-1", "rg-2", "rp-1"]


def test_failed_hypernode_fails_every_node_below_it() -> None:
    state = fresh(*(("Node", node(n)) for n in ("a", "b", "c")))
    topo = build([hypernode("leaf-1", None, ["a", "b"]), hypernode("leaf-2", None, ["c"])])
    assert set(rescheduler.failed_nodes(state, topo, {"leaf-1": "down"})) == {"a", "b"}


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3)
    for _ in range(3):
        assert bucket.wait(0.0) == 0.0
        bucket.take()
    assert bucket.wait(0.0) == pytest.approx(0.5)  # 1 token / 2 per second
    assert bucket.wait(0.5) == 0.0


def test_resources_of_a_gpu_node_are_parsed_once_into_the_free_map() -> None:
    state = fresh(("Node", node("a", 4)))
    assert state.free() == {"a": Resources(gpus=4, cpu_milli=64000, memory=512 * 2**30, pods=110)}


def spine(name: str, ready: str | None, leaves: list[str]) -> dict[str, Any]:
    obj = hypernode(name, ready, [])
    obj["spec"] = {"tier": 2, "tierName": "spine",
                   "members": [{"type": "HyperNode", "selector": {"exactMatch": {"name": n}}} for n in leaves]}
    return obj


def test_a_tainted_node_names_the_fault_so_its_healthy_leaf_mates_are_not_failed() -> None:
    taint = [{"key": "hypertopo.io/fabric-unhealthy", "effect": "NoSchedule"}]
    state = fresh(("Node", node("a", taints=taint)), ("Node", node("b")), ("Node", node("c")))
    topo = build([hypernode("leaf-1", "False", ["a", "b"]), hypernode("leaf-2", "True", ["c"]),
                  spine("spine", "False", ["leaf-1", "leaf-2"])])
    failed = rescheduler.failed_nodes(state, topo, {"leaf-1": "leaf down", "spine": "rolled up"})
    assert set(failed) == {"a"}


def test_a_failed_spine_above_a_failed_leaf_is_carried_not_a_fault_of_its_own() -> None:
    state = fresh(*(("Node", node(n)) for n in ("a", "b", "c")))
    topo = build([hypernode("leaf-1", "False", ["a", "b"]), hypernode("leaf-2", "True", ["c"]),
                  spine("spine", "False", ["leaf-1", "leaf-2"])])
    # No taints: the leaf's nodes are all suspect, the other leaf is not; it stays usable for placement.
    assert set(rescheduler.failed_nodes(state, topo, {"leaf-1": "down", "spine": "rolled up"})) == {"a", "b"}
    assert topo.usable == {"leaf-1": False, "leaf-2": True, "spine": True}
