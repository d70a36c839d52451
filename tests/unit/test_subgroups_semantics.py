"""Sub-groups as vc-scheduler v1.14 reads `subGroupPolicy` (pkg/scheduler/api/job_info.go
getOrCreateSubJob, sub_job_info.go getSubJobMatchValues), without an API server: which pods form
which sub-group, and what a sub-group's minimum and a policy's minSubGroups ask of a placement.
The same cases against the real vc-scheduler: tests/live/test_subgroups_vs_volcano.py."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.placement.core.decide import decide
from aggregator.placement.core.topology import build
from aggregator.placement.kinds import podgroups, subgroups
from aggregator.placement.live.state import ClusterState

SCHED = "hypertopo-scheduler"


def pod(name: str, labels: dict[str, str] | None = None, *, gpus: int = 8, node: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": dict(labels or {}),
                         "annotations": {"scheduling.k8s.io/group-name": "pg"}, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": SCHED, "nodeName": node or None,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running" if node else "Pending"}}


def policies(*items: dict[str, Any]) -> tuple[subgroups.Policy, ...]:
    return subgroups.from_volcano({"spec": {"subGroupPolicy": list(items)}})


def names(groups: list[subgroups.SubGroup]) -> dict[str, list[str]]:
    return {g.name: [p["metadata"]["name"] for p in g.pods] for g in groups}


def test_a_pod_joins_the_first_policy_that_selects_it_and_has_all_its_keys() -> None:
    rules = policies({"name": "a", "matchLabelKeys": ["part"], "labelSelector": {"matchLabels": {"role": "w"}}},
                     {"name": "b", "matchLabelKeys": ["part"]})
    pods = [pod("w0", {"role": "w", "part": "0"}), pod("w1", {"role": "w", "part": "0"}),
            pod("p0", {"role": "ps", "part": "0"}),  # not selected by a: falls to b
            pod("e0", {"role": "w", "part": ""}),  # an empty value matches no policy: default
            pod("n0", {"role": "w"})]  # key missing: default
    groups, default = subgroups.partition(rules, pods)
    assert names(groups) == {"a-0": ["w0", "w1"], "b-0": ["p0"]}
    assert [p["metadata"]["name"] for p in default] == ["e0", "n0"]


def test_a_policy_without_keys_forms_no_subgroup() -> None:
    groups, default = subgroups.partition(policies({"name": "tp", "subGroupSize": 4}), [pod(f"w{i}") for i in range(8)])
    assert groups == [] and len(default) == 8


def test_values_are_joined_with_a_dash_as_volcano_names_subjobs() -> None:
    # Volcano's sub-job id joins the values with "-": ("a-b", "c") and ("a", "b-c") are one sub-job
    rules = policies({"name": "tp", "matchLabelKeys": ["x", "y"]})
    groups, _ = subgroups.partition(rules, [pod("p0", {"x": "a-b", "y": "c"}), pod("p1", {"x": "a", "y": "b-c"})])
    assert names(groups) == {"tp-a-b-c": ["p0", "p1"]}


def test_bad_policies_are_said_not_guessed() -> None:
    with pytest.raises(subgroups.SubGroupError, match="operator 'Near'"):
        policies({"name": "tp", "matchLabelKeys": ["k"], "labelSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}})
    with pytest.raises(subgroups.SubGroupError, match="subGroupSize must be at least 1"):
        policies({"name": "tp", "subGroupSize": 0})
    with pytest.raises(subgroups.SubGroupError, match="at most 64"):
        policies(*[{"name": f"p{i}"} for i in range(65)])


# -- placement ------------------------------------------------------------------------------
def hn(name: str, tier: int, nodes: tuple[str, ...] = (), kids: tuple[str, ...] = ()) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": k}}} for k in kids]
    return {"metadata": {"name": name}, "spec": {"tier": tier, "tierName": {1: "leaf", 2: "spine"}[tier], "members": members}}


# two leaves of 3 nodes of 8 GPUs under one spine
TREE = [hn("leaf-a", 1, ("a0", "a1", "a2")), hn("leaf-b", 1, ("b0", "b1", "b2")), hn("spine", 2, kids=("leaf-a", "leaf-b"))]


def decide_for(spec: dict[str, Any], pods: list[dict[str, Any]]) -> Any:
    state = ClusterState(SCHED)
    for n in ("a0", "a1", "a2", "b0", "b1", "b2"):
        amounts = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
        state.apply("Node", "ADDED", {"metadata": {"name": n, "labels": {}}, "spec": {}, "status": {"allocatable": amounts}})
    state.apply("VolcanoPodGroup", "ADDED", {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                                             "metadata": {"name": "pg", "namespace": "ns", "uid": "pg"},
                                             "spec": spec, "status": {"phase": "Inqueue"}})
    for p in pods:
        state.apply("Pod", "ADDED", p)
    [view] = podgroups.collect(state)
    return decide(state, build(TREE), view)


LEAF = {"mode": "hard", "highestTierAllowed": 1}


def test_one_subgroup_larger_than_any_leaf_is_never_split_across_leaves() -> None:
    # 4 pods, subGroupSize 2, leaf limit: the old reading cut them into two sub-groups of 2, one per leaf
    spec = {"minMember": 4, "subGroupPolicy": [{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 2,
                                                "networkTopology": LEAF}]}
    decision = decide_for(spec, [pod(f"w{i}", {"part": "0"}) for i in range(4)])
    assert not decision.ok and "sub-group" in decision.reason


def test_pods_beyond_the_minimum_stay_with_their_subgroup() -> None:
    spec = {"minMember": 3, "subGroupPolicy": [{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 2,
                                                "networkTopology": LEAF}]}
    decision = decide_for(spec, [pod(f"w{i}", {"part": "0"}) for i in range(3)])
    assert decision.ok and len({n[0] for n in decision.assignments.values()}) == 1  # one leaf


def test_a_subgroup_below_its_minimum_places_nothing() -> None:
    # tp-1 has 1 pod, minimum 2: never placed (vc-scheduler's sub-job never becomes ready); the gang
    # needs only the 3 pods of tp-0
    pods = [pod(f"w{i}", {"part": "0"}) for i in range(3)] + [pod("lonely", {"part": "1"})]
    spec = {"minMember": 3, "subGroupPolicy": [{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 2}]}
    decision = decide_for(spec, pods)
    assert decision.ok and ("ns", "lonely") not in decision.assignments and len(decision.assignments) == 3
    spec["minMember"] = 4
    refused = decide_for(spec, pods)
    assert not refused.ok and "sub-group tp-1 has 1 pod(s), fewer than its minimum 2" in refused.reason


def test_min_subgroups_counts_subgroups_at_their_minimum_and_refuses_when_too_few_exist() -> None:
    pods = [pod(f"w{i}", {"part": str(i % 3)}) for i in range(6)]
    policy = {"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 2, "minSubGroups": 2, "networkTopology": LEAF}
    # another pod on each of a0, a1, b0: leaf-a has 1 free node, leaf-b 2: one sub-group at its minimum fits
    taken = [pod(f"other-{n}", node=n) for n in ("a0", "a1", "b0")]
    for p in taken:
        p["metadata"]["annotations"] = {}
    refused = decide_for({"minMember": 2, "subGroupPolicy": [policy]}, pods + taken)
    assert not refused.ok and "1 of the 2 sub-groups of 'tp' minSubGroups reach their minimum" in refused.reason, \
        refused.reason
    one = decide_for({"minMember": 2, "subGroupPolicy": [{**policy, "minSubGroups": 1}]}, pods + taken)
    assert one.ok and set(one.assignments.values()) == {"b1", "b2"}
    too_many = {**policy, "minSubGroups": 4}
    refused = decide_for({"minMember": 2, "subGroupPolicy": [too_many]}, pods)
    assert not refused.ok and "has 3 sub-group(s) among the gang's pods, minSubGroups is 4" in refused.reason


def test_running_members_count_toward_their_subgroups_minimum() -> None:
    # w0 runs on a0: the two pending pods of the same sub-group join it in leaf-a
    pods = [pod("w0", {"part": "0"}, node="a0"), pod("w1", {"part": "0"}), pod("w2", {"part": "0"})]
    spec = {"minMember": 3, "subGroupPolicy": [{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 3,
                                                "networkTopology": LEAF}]}
    decision = decide_for(spec, pods)
    assert decision.ok and set(decision.assignments.values()) <= {"a1", "a2"}


def test_annotations_form_the_same_subgroups_as_the_equivalent_volcano_policy() -> None:
    annotated = subgroups.from_annotations({subgroups.KEYS_ANNOTATION: "part", subgroups.SIZE_ANNOTATION: "2",
                                            subgroups.TIER_ANNOTATION: "1", subgroups.MIN_ANNOTATION: "1"})
    volcano = policies({"name": "subgroup", "matchLabelKeys": ["part"], "subGroupSize": 2, "minSubGroups": 1,
                        "networkTopology": {"mode": "hard", "highestTierAllowed": 1}})
    assert annotated == volcano
    pods = [pod(f"w{i}", {"part": str(i % 2)} if i < 6 else {}) for i in range(8)]
    assert subgroups.partition(annotated, pods) == subgroups.partition(volcano, pods)


def test_min_task_member_holds_for_gangs_with_subgroups_too() -> None:
    # vc-scheduler's gang plugin asks both (CheckTaskReady and CheckSubJobReady): two free nodes hold
    # the worker sub-group (minMember 2) but not the ps pod that minTaskMember asks for
    pods = [pod("w0", {"part": "0"}), pod("w1", {"part": "0"}), pod("ps0")]
    for p in pods:
        p["metadata"]["annotations"]["volcano.sh/task-spec"] = "ps" if p["metadata"]["name"] == "ps0" else "worker"
    taken = [pod(f"other-{n}", node=n) for n in ("a0", "a1", "a2", "b0")]
    for p in taken:
        p["metadata"]["annotations"] = {}
    spec = {"minMember": 2, "minTaskMember": {"ps": 1},
            "subGroupPolicy": [{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 2, "networkTopology": LEAF}]}
    refused = decide_for(spec, pods + taken)
    assert not refused.ok and "minTaskMember not met: task ps has 0 of minTaskMember 1" in refused.reason
    placed = decide_for(spec, pods + taken[:3])  # b0 free too: all three fit
    assert placed.ok and ("ns", "ps0") in placed.assignments
