"""Volcano gangs in the scheduler's pure parts, without an API server: pods joining Volcano
PodGroups by annotation, the phases Volcano's job controller waits for, queue and minResources
admission, networkTopology limits from the PodGroup spec, sub-groups (Volcano's subGroupPolicy and
hypertopo's annotations), minTaskMember, and fault plans for gangs another scheduler placed."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.placement.core import rescheduler
from aggregator.placement.core.decide import decide
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import build
from aggregator.placement.kinds import podgroups, subgroups, volcano
from aggregator.placement.live.state import VOLCANO, XK8S, ClusterState, gang_ref

SCHED = "hypertopo-scheduler"
JOB_REF = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train", "uid": "job-uid", "controller": True}


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    amounts = {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {}}, "spec": {}, "status": {"allocatable": amounts}}


def vc_pod(name: str, group: str = "pg", *, gpus: int = 8, node_name: str = "", scheduler: str = SCHED,
           labels: dict[str, str] | None = None, task: str = "worker", phase: str = "Pending",
           owner: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": dict(labels or {}),
                            "annotations": {"scheduling.k8s.io/group-name": group, "volcano.sh/task-spec": task},
                            "creationTimestamp": "2026-01-01T00:00:00Z"}
    if owner:
        meta["ownerReferences"] = [JOB_REF]
    return {"metadata": meta,
            "spec": {"schedulerName": scheduler, "nodeName": node_name or None,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


def vc_group(name: str = "pg", min_member: int = 4, *, phase: str = "Inqueue", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": volcano.API_VERSION, "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": {}},
            "spec": {"minMember": min_member, **spec}, "status": {"phase": phase}}


def hn(name: str, tier: int, nodes: tuple[str, ...] = (), kids: tuple[str, ...] = ()) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": k}}} for k in kids]
    return {"metadata": {"name": name},
            "spec": {"tier": tier, "tierName": {1: "leaf", 2: "spine"}[tier], "members": members}}


# two leaves of 4 nodes (8 GPUs each) under one spine
TREE = [hn("leaf-a", 1, ("a1", "a2", "a3", "a4")), hn("leaf-b", 1, ("b1", "b2", "b3", "b4")),
        hn("spine", 2, kids=("leaf-a", "leaf-b"))]
NODES = ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"]


def cluster(*objects: tuple[str, dict[str, Any]]) -> ClusterState:
    state = ClusterState(SCHED)
    for name in NODES:
        state.apply("Node", "ADDED", node(name))
    for kind, obj in objects:
        state.apply(kind, "ADDED", obj)
    return state


def decide_one(state: ClusterState) -> Any:
    [view] = podgroups.collect(state)
    return decide(state, build(TREE), view)


def leaf_of(node_name: str) -> str:
    return "leaf-" + node_name[0]


# -- gang membership ---------------------------------------------------------------------------
def test_a_pod_joins_a_volcano_podgroup_through_the_group_name_annotation() -> None:
    assert gang_ref(vc_pod("w0", "train-pg")) == (("ns", "train-pg"), VOLCANO)
    labelled = vc_pod("w1")
    labelled["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "other"
    assert gang_ref(labelled) == (("ns", "other"), XK8S)  # the explicit scheduler-plugins label wins


def test_a_volcano_gang_waits_for_minmember_pods_and_reads_its_own_podgroup() -> None:
    state = cluster(("VolcanoPodGroup", vc_group(min_member=3)), ("Pod", vc_pod("w0")), ("Pod", vc_pod("w1")))
    [view] = podgroups.collect(state)
    assert view.is_volcano and view.min_member == 3 and view.missing == 1
    assert view.podgroup is state.vc_podgroups[("ns", "pg")]


# -- phases ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("phase", "pods", "expected"), [
    ("Pending", [], "Pending"),  # not admitted yet: stays Pending
    ("Inqueue", [vc_pod("w0")], "Inqueue"),  # admitted, pods not bound yet
    ("Inqueue", [vc_pod("w0", node_name="a1"), vc_pod("w1", node_name="a2")], "Running"),  # minMember 2 bound
    ("Running", [vc_pod("w0", node_name="a1", phase="Succeeded"), vc_pod("w1", node_name="a2", phase="Failed")],
     "Completed"),  # every scheduled pod finished
    ("Running", [vc_pod("w0", node_name="a1"), vc_pod("w1")], "Inqueue"),  # a pod being recreated: admitted still
])
def test_volcano_phase_follows_what_vc_scheduler_writes(phase: str, pods: list[dict[str, Any]], expected: str) -> None:
    assert volcano.status(vc_group(min_member=2, phase=phase), pods)["phase"] == expected


def test_admission_needs_an_existing_open_queue_and_room_for_min_resources() -> None:
    group = vc_group(phase="Pending", queue="team-a", minResources={"nvidia.com/gpu": "32"})
    open_queue = {"team-a": {"metadata": {"name": "team-a"}, "status": {"state": "Open"}}}
    closed = {"team-a": {"metadata": {"name": "team-a"}, "status": {"state": "Closed"}}}
    plenty, little = Resources(gpus=64), Resources(gpus=16)
    assert volcano.enqueue_problem(group, open_queue, plenty) == ""
    assert volcano.enqueue_problem(group, None, plenty) == ""  # no Queue CRD: nothing to respect
    assert volcano.enqueue_problem(group, {}, plenty) == "queue 'team-a' does not exist"
    assert "is Closed" in volcano.enqueue_problem(group, closed, plenty)
    assert "nvidia.com/gpu 32 > 16" in volcano.enqueue_problem(group, open_queue, little)
    bad = vc_group(phase="Pending", minResources={"cpu": "lots"})
    assert "spec.minResources" in volcano.enqueue_problem(bad, None, plenty)


def test_a_condition_replaces_its_opposite_and_an_unchanged_one_is_not_rewritten() -> None:
    group = vc_group()
    first = volcano.with_condition(group, volcano.condition("Unschedulable", "R", "no room", "t0"))
    assert first is not None and [c["type"] for c in first] == ["Unschedulable"]
    group["status"]["conditions"] = first
    assert volcano.with_condition(group, volcano.condition("Unschedulable", "R", "no room", "t1")) is None
    scheduled = volcano.with_condition(group, volcano.condition("Scheduled", "ok", "placed", "t2"))
    assert scheduled is not None and [c["type"] for c in scheduled] == ["Scheduled"]


# -- limits and sub-groups -------------------------------------------------------------------
def test_network_topology_from_the_podgroup_spec_keeps_a_hard_tier1_gang_in_one_leaf() -> None:
    group = vc_group(networkTopology={"mode": "hard", "highestTierAllowed": 1})
    state = cluster(("VolcanoPodGroup", group), *[("Pod", vc_pod(f"w{i}")) for i in range(4)])
    decision = decide_one(state)
    assert decision.ok
    assert len({leaf_of(n) for n in decision.assignments.values()}) == 1


def test_a_hard_tier1_gang_larger_than_any_leaf_does_not_fit_and_says_so() -> None:
    group = vc_group(min_member=5, networkTopology={"mode": "hard", "highestTierAllowed": 1})
    state = cluster(("VolcanoPodGroup", group), *[("Pod", vc_pod(f"w{i}")) for i in range(5)])
    decision = decide_one(state)
    assert not decision.ok
    assert "tier <= 1" in decision.reason and "1 pods (8 GPUs) short" in decision.reason


def test_an_unknown_highest_tier_name_is_reported_not_guessed() -> None:
    group = vc_group(networkTopology={"mode": "hard", "highestTierName": "rack"})
    state = cluster(("VolcanoPodGroup", group), *[("Pod", vc_pod(f"w{i}")) for i in range(4)])
    decision = decide_one(state)
    assert not decision.ok and "'rack' matches no tier" in decision.reason


def _split_job(with_policy: bool) -> Any:
    """Two sub-groups of 3 pods x 8 GPUs (by label `part`), the gang hard within the spine; a1 is
    taken by another pod, so leaf-a has 3 free nodes and leaf-b 4."""
    pods = [vc_pod(f"w{i}", labels={"part": str(i % 2)}) for i in range(6)]
    policy = {"name": "tp", "subGroupSize": 3, "matchLabelKeys": ["part"],
              "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
    spec: dict[str, Any] = {"networkTopology": {"mode": "hard", "highestTierAllowed": 2}}
    if with_policy:
        spec["subGroupPolicy"] = [policy]
    other = vc_pod("other", "another-pg", node_name="a1", scheduler="volcano", phase="Running")
    state = cluster(("Pod", other), ("VolcanoPodGroup", vc_group(min_member=6, **spec)), *[("Pod", p) for p in pods])
    decision = decide_one(state)
    assert decision.ok, decision.reason
    leaves: dict[str, set[str]] = {}
    for (_, name), node_name in decision.assignments.items():
        leaves.setdefault(str(int(name[1:]) % 2), set()).add(leaf_of(node_name))
    return leaves


def test_each_subgroup_lands_in_its_own_leaf_while_the_gang_spans_the_spine() -> None:
    # without sub-groups the core fills leaf-b first and splits a part across the leaves
    assert any(len(v) > 1 for v in _split_job(with_policy=False).values())
    leaves = _split_job(with_policy=True)
    assert all(len(v) == 1 for v in leaves.values()), leaves
    assert leaves["0"] != leaves["1"]  # one part per leaf: neither leaf holds 6 such pods


def test_subgroups_that_cannot_each_fit_a_leaf_keep_the_gang_pending() -> None:
    # a1 and a2 are taken: 6 free nodes hold the 6 pods as one gang, but each part of 3 needs a
    # leaf of its own and leaf-a has only 2 free nodes
    pods = [vc_pod(f"w{i}", labels={"part": str(i % 2)}) for i in range(6)]
    policy = {"name": "tp", "subGroupSize": 3, "matchLabelKeys": ["part"],
              "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
    taken = [vc_pod(f"other{n}", "another-pg", node_name=n, scheduler="volcano", phase="Running") for n in ("a1", "a2")]
    group = vc_group(min_member=6, subGroupPolicy=[policy])
    state = cluster(*[("Pod", p) for p in taken], ("VolcanoPodGroup", group), *[("Pod", p) for p in pods])
    decision = decide_one(state)
    assert not decision.ok
    assert "the gang fits, but its sub-groups do not" in decision.reason and "sub-group tp-" in decision.reason


def test_a_subgroup_size_is_a_minimum_not_a_divisor() -> None:
    # vc-scheduler binds 6 pods with subGroupSize 4 as one sub-group of 6 (the old reading refused:
    # "4 does not divide 6"); without matchLabelKeys the policy forms no sub-group at all
    pods = [vc_pod(f"w{i}", gpus=1, labels={"part": "x"}) for i in range(6)]
    group = vc_group(min_member=6, subGroupPolicy=[{"name": "tp", "subGroupSize": 4, "matchLabelKeys": ["part"]}])
    state = cluster(("VolcanoPodGroup", group), *[("Pod", p) for p in pods])
    decision = decide_one(state)
    assert decision.ok, decision.reason
    [only] = subgroups.partition(subgroups.from_volcano(group), pods)[0]
    assert only.name == "tp-x" and len(only.pods) == 6 and only.minimum == 4


def test_min_subgroups_lets_a_gang_start_with_fewer_subgroups() -> None:
    policy = {"name": "tp", "subGroupSize": 2, "minSubGroups": 1, "matchLabelKeys": ["part"],
              "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
    groups = subgroups.partition(subgroups.from_volcano(vc_group(subGroupPolicy=[policy])),
                                 [vc_pod(f"w{i}", labels={"part": str(i // 2)}) for i in range(6)])[0]
    assert [g.name for g in groups] == ["tp-0", "tp-1", "tp-2"]
    assert subgroups.required_by_policy(groups) == {"tp": 1}


def test_scheduler_plugins_gangs_declare_subgroups_through_annotations() -> None:
    [policy] = subgroups.from_annotations({subgroups.SIZE_ANNOTATION: "4", subgroups.KEYS_ANNOTATION: "rank-group",
                                           subgroups.TIER_ANNOTATION: "1"})
    assert policy.size == 4 and policy.match_label_keys == ("rank-group",)
    assert policy.topology is not None and policy.topology.highest_tier == 1
    with pytest.raises(subgroups.SubGroupError, match="whole number"):
        subgroups.from_annotations({subgroups.SIZE_ANNOTATION: "four", subgroups.KEYS_ANNOTATION: "g"})
    # without keys no pod would form a sub-group (Volcano's rule): said, not silently ignored
    with pytest.raises(subgroups.SubGroupError, match="label-keys is required"):
        subgroups.from_annotations({subgroups.SIZE_ANNOTATION: "4"})


def test_min_task_member_refuses_a_partial_placement_that_starves_a_task() -> None:
    # minMember 2 of 3 pods would let the core place any two; minTaskMember wants the one "ps" pod
    # too, so the whole gang (which fits) is placed instead
    pods = [vc_pod("w0", task="worker"), vc_pod("w1", task="worker"), vc_pod("ps0", task="ps", gpus=8)]
    group = vc_group(min_member=2, minTaskMember={"worker": 1, "ps": 1})
    state = cluster(("VolcanoPodGroup", group), *[("Pod", p) for p in pods])
    decision = decide_one(state)
    assert decision.ok and ("ns", "ps0") in decision.assignments


# -- fault handling for gangs another scheduler placed ------------------------------------------
def test_fault_plans_cover_volcano_gangs_placed_by_vc_scheduler() -> None:
    job = {"metadata": {"name": "train", "namespace": "ns", "uid": "job-uid",
                        "annotations": {"hypertopo.io/on-fabric-fault": "restart-pods"}},
           "spec": {"schedulerName": "volcano"}}
    group = vc_group(phase="Running")
    group["metadata"]["ownerReferences"] = [JOB_REF]
    pods = [vc_pod(f"w{i}", node_name=n, scheduler="volcano", owner=True, phase="Running")
            for i, n in enumerate(["a1", "a2", "a3", "a4"])]
    state = cluster(("VolcanoJob", job), ("VolcanoPodGroup", group), *[("Pod", p) for p in pods])
    assert podgroups.collect(state) == []  # not ours to place
    gangs = podgroups.gangs_on_nodes(state, {"a2"})
    assert [g.key for g in gangs] == [("ns", "pg")] and gangs[0].fault_policy == "restart-pods"
    plan = rescheduler.plan(gangs, {"a2": "taint"}, state.vc_jobs)
    assert [e.pod for e in plan] == [("ns", "w1")]  # only the pod on the failed node

    job["metadata"]["annotations"]["hypertopo.io/on-fabric-fault"] = "restart-gang"
    state.apply("VolcanoJob", "MODIFIED", job)
    gangs = podgroups.gangs_on_nodes(state, {"a2"})
    assert rescheduler.plan(gangs, {"a2": "taint"}, state.vc_jobs) == []  # the Job is restarted instead
    [restart] = rescheduler.job_restarts(gangs, {"a2": "taint"}, state.vc_jobs)
    assert restart.job == ("ns", "train")
    command = volcano.command_restart_job(job, restart.reason)
    assert command["action"] == "RestartJob" and command["target"]["name"] == "train"


def test_gangs_on_healthy_nodes_or_without_a_policy_are_left_alone() -> None:
    pods = [vc_pod(f"w{i}", node_name=n, scheduler="volcano", phase="Running") for i, n in enumerate(["a1", "b1"])]
    state = cluster(("VolcanoPodGroup", vc_group(min_member=2)), *[("Pod", p) for p in pods])
    assert podgroups.gangs_on_nodes(state, {"a4"}) == []
    gangs = podgroups.gangs_on_nodes(state, {"a1"})
    assert rescheduler.plan(gangs, {"a1": "taint"}) == []  # no annotation: policy none


def test_scheduler_plugins_gangs_get_subgroups_from_their_podgroup_annotations() -> None:
    # the same shape as the Volcano case above, declared through hypertopo's annotations
    annotations = {subgroups.SIZE_ANNOTATION: "3", subgroups.KEYS_ANNOTATION: "part", subgroups.TIER_ANNOTATION: "1",
                   "volcano.sh/network-topology-highest-tier": "2"}
    group = {"metadata": {"name": "pp", "namespace": "ns", "annotations": annotations}, "spec": {"minMember": 6}}
    pods = []
    for i in range(6):
        pod = vc_pod(f"w{i}", labels={"part": str(i % 2), "scheduling.x-k8s.io/pod-group": "pp"})
        del pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"]
        pods.append(pod)
    other = vc_pod("other", "another-pg", node_name="a1", scheduler="volcano", phase="Running")
    state = cluster(("Pod", other), ("PodGroup", group), *[("Pod", p) for p in pods])
    decision = decide_one(state)
    assert decision.ok, decision.reason
    leaves: dict[str, set[str]] = {}
    for (_, name), node_name in decision.assignments.items():
        leaves.setdefault(str(int(name[1:]) % 2), set()).add(leaf_of(node_name))
    assert all(len(v) == 1 for v in leaves.values()) and leaves["0"] != leaves["1"], leaves
