"""A gang is read once (`gang_spec.read`): each PodGroup kind (Volcano, scheduler-plugins,
Kubernetes' own) with its annotations and sub-groups becomes one frozen spec; bad sub-group
policies and spare requests are refused with the words the decision has always used; and the
decision, given the spec, places it without going back to any reader."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from aggregator.placement.core import ranks, spares
from aggregator.placement.core.decide import decide, decide_spec
from aggregator.placement.core.gang import Mode, PodSpec
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import build
from aggregator.placement.kinds import gang_spec, podgroups, subgroups, upstream, volcano
from aggregator.placement.kinds.gang_spec import GangSpec, Limits, SubGroupSpec
from aggregator.placement.live.state import K8S, SINGLE, VOLCANO, XK8S, ClusterState

SCHED = "hypertopo-scheduler"
GPU8 = Resources(8, 0, 0, 1)


def hn(name: str, tier: int, nodes: tuple[str, ...] = (), kids: tuple[str, ...] = ()) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": k}}} for k in kids]
    return {"metadata": {"name": name}, "spec": {"tier": tier, "tierName": {1: "leaf", 2: "spine"}[tier], "members": members}}


TREE = [hn("leaf-a", 1, ("a0", "a1", "a2", "a3")), hn("leaf-b", 1, ("b0", "b1", "b2", "b3")),
        hn("spine", 2, kids=("leaf-a", "leaf-b"))]


def pod(name: str, *, group: tuple[str, str] | None = None, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, node: str = "", priority: int | None = None) -> dict[str, Any]:
    """A pod of 8 GPUs; `group` = (kind, name): volcano (annotation), x-k8s (label), k8s (schedulingGroup)."""
    meta_labels, meta_annotations = dict(labels or {}), dict(annotations or {})
    spec: dict[str, Any] = {"schedulerName": SCHED, "nodeName": node or None,
                            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]}
    if priority is not None:
        spec["priority"] = priority
    if group is not None:
        kind, group_name = group
        if kind == VOLCANO:
            meta_annotations["scheduling.k8s.io/group-name"] = group_name
        elif kind == XK8S:
            meta_labels["scheduling.x-k8s.io/pod-group"] = group_name
        else:
            spec["schedulingGroup"] = {"podGroupName": group_name}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": meta_labels,
                         "annotations": meta_annotations, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def cluster(group_kind: str, group: dict[str, Any] | None, pods: list[dict[str, Any]]) -> ClusterState:
    state = ClusterState(SCHED)
    amounts = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    for leaf in ("a", "b"):
        for i in range(4):
            state.apply("Node", "ADDED", {"metadata": {"name": f"{leaf}{i}", "labels": {}}, "spec": {},
                                          "status": {"allocatable": amounts}})
    for obj in TREE:
        state.apply("HyperNode", "ADDED", obj)
    if group is not None:
        state.apply(group_kind, "ADDED", group)
    for p in pods:
        state.apply("Pod", "ADDED", p)
    return state


def only_view(state: ClusterState) -> podgroups.GangView:
    [view] = podgroups.collect(state)
    return view


def vc_group(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": volcano.API_VERSION, "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": "ns", "uid": "pg", "annotations": annotations or {}},
            "spec": spec, "status": {"phase": "Inqueue"}}


def x_group(min_member: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": "ns", "uid": "pg", "annotations": annotations or {}},
            "spec": {"minMember": min_member}}


def k8s_group(min_count: int, key: str) -> dict[str, Any]:
    return {"apiVersion": upstream.API_VERSION, "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": "ns", "uid": "pg", "generation": 1},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}},
                     "schedulingConstraints": {"topology": [{"key": key}]}}}


def volcano_gang() -> ClusterState:
    """A Volcano gang of 4 (two tasks, two sub-groups of 2) asking one spare, its limit the spine."""
    spec = {"minMember": 4, "minTaskMember": {"ps": 1, "worker": 2},
            "networkTopology": {"mode": "soft", "highestTierAllowed": 2},
            "subGroupPolicy": [{"name": "tp", "subGroupSize": 2, "matchLabelKeys": ["part"],
                                "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}]}
    tasks = {"p0": "ps", "p1": "worker", "p2": "worker", "p3": "worker"}
    pods = [pod(n, group=(VOLCANO, "pg"), labels={"part": str(i // 2)}, annotations={volcano.TASK_SPEC_KEY: t})
            for i, (n, t) in enumerate(tasks.items())]
    return cluster("VolcanoPodGroup", vc_group(spec, {spares.SPARE_REQUEST: "1"}), pods)


def test_a_volcano_podgroup_reads_into_one_spec() -> None:
    spec = gang_spec.read(only_view(volcano_gang()))
    keys = [("ns", f"p{i}") for i in range(4)]
    assert (spec.key, spec.flavour, spec.group_name, spec.min_member) == (("ns", "pg"), VOLCANO, "pg", 4)
    assert spec.members == tuple(keys) and spec.placed == {}
    assert [p.name for p in spec.pods] == [f"ns/p{i}" for i in range(4)]
    assert all(p.request == GPU8 and p.rank is not None for p in spec.pods)
    assert spec.limits == Limits(Mode.SOFT, 2, None)  # spec.networkTopology, not the annotations
    assert spec.topology_key == "" and spec.spare_count == 1 and not spec.preemptible and spec.invalid == ""
    assert [p.name for p in spec.policies] == ["tp"]
    assert spec.subgroups == (SubGroupSpec("tp-0", "tp", 2, Limits(Mode.HARD, 1, None), tuple(keys[:2])),
                              SubGroupSpec("tp-1", "tp", 2, Limits(Mode.HARD, 1, None), tuple(keys[2:])))
    assert spec.loose == () and spec.too_few_subgroups == "" and spec.required_parts == {}
    assert spec.min_task_member == {"ps": 1, "worker": 2}
    assert spec.tasks == {keys[0]: "ps", keys[1]: "worker", keys[2]: "worker", keys[3]: "worker"}
    assert spec.task_shortfall(["ns/p1"]) == {"ps": (0, 1), "worker": (1, 2)}


def test_a_scheduler_plugins_podgroup_reads_its_annotations() -> None:
    notes = {"volcano.sh/network-topology-mode": "hard", "volcano.sh/network-topology-highest-tier": "1",
             subgroups.KEYS_ANNOTATION: "part", subgroups.SIZE_ANNOTATION: "2", subgroups.MIN_ANNOTATION: "3",
             spares.SPARE_REQUEST: "50%"}
    pods = [pod(f"p{i}", group=(XK8S, "pg"), labels={"part": str(i // 2)}, priority=-1) for i in range(4)]
    spec = gang_spec.read(only_view(cluster("PodGroup", x_group(4, notes), pods)))
    assert (spec.flavour, spec.min_member, spec.limits) == (XK8S, 4, Limits(Mode.HARD, 1, None))
    assert spec.spare_count == 2  # 50 % of 4 members
    assert spec.preemptible  # priority below 0: may borrow other gangs' spares
    assert [(g.name, g.minimum, g.limits) for g in spec.subgroups] == [("subgroup-0", 2, None), ("subgroup-1", 2, None)]
    assert spec.too_few_subgroups == "subGroupPolicy 'subgroup' has 2 sub-group(s) among the gang's pods, minSubGroups is 3"
    assert spec.required_parts == {"subgroup": 3}
    assert spec.min_task_member == {} and spec.tasks == {}  # minTaskMember is Volcano's only


def test_a_kubernetes_podgroup_reads_its_topology_key_as_a_hard_tier_limit() -> None:
    pods = [pod(f"p{i}", group=(K8S, "pg")) for i in range(2)]
    spec = gang_spec.read(only_view(cluster("K8sPodGroup", k8s_group(2, "hypertopo.io/leaf"), pods)))
    assert (spec.flavour, spec.min_member, spec.topology_key) == (K8S, 2, "hypertopo.io/leaf")
    assert spec.limits == Limits(Mode.HARD, None, "leaf")
    assert spec.tree_problem(build(TREE)) == ""
    wrong = gang_spec.read(only_view(cluster("K8sPodGroup", k8s_group(2, "topology.kubernetes.io/zone"), pods)))
    assert wrong.limits == Limits(Mode.HARD, None, "topology.kubernetes.io/zone")
    group = k8s_group(2, "topology.kubernetes.io/zone")
    assert wrong.tree_problem(build(TREE)) == upstream.key_problem(group, build(TREE)) != ""


def test_a_single_pod_is_soft_and_asks_no_spares() -> None:
    lone = pod("solo", annotations={"volcano.sh/network-topology-highest-tier": "1", spares.SPARE_REQUEST: "2"})
    spec = gang_spec.read(only_view(cluster("PodGroup", None, [lone])), default_spares="3")
    assert (spec.flavour, spec.key, spec.min_member) == (SINGLE, ("ns", "solo"), 1)
    assert spec.limits == Limits(Mode.SOFT, 1, None) and spec.spare_count == 0 and spec.policies == ()


def test_the_namespace_default_counts_only_where_the_gang_says_nothing() -> None:
    pods = [pod(f"p{i}", group=(XK8S, "pg")) for i in range(2)]
    assert gang_spec.read(only_view(cluster("PodGroup", x_group(2), pods)), default_spares="1").spare_count == 1
    said = cluster("PodGroup", x_group(2, {spares.SPARE_REQUEST: "0"}), pods)
    assert gang_spec.read(only_view(said), default_spares="1").spare_count == 0


@pytest.mark.parametrize(("group_kind", "group", "error"), [
    ("VolcanoPodGroup", vc_group({"minMember": 2, "subGroupPolicy": [{"name": "tp", "subGroupSize": 0}]}),
     lambda: subgroups.from_volcano({"spec": {"subGroupPolicy": [{"name": "tp", "subGroupSize": 0}]}})),
    ("PodGroup", x_group(2, {subgroups.SIZE_ANNOTATION: "4"}),
     lambda: subgroups.from_annotations({subgroups.SIZE_ANNOTATION: "4"})),
    ("PodGroup", x_group(2, {spares.SPARE_REQUEST: "lots"}), lambda: spares.parse_request("lots", 2)),
])
def test_a_bad_policy_or_spare_request_is_refused_with_the_readers_own_words(group_kind: str, group: dict[str, Any],
                                                                               error: Any) -> None:
    kind = VOLCANO if group_kind == "VolcanoPodGroup" else XK8S
    state = cluster(group_kind, group, [pod(f"p{i}", group=(kind, "pg")) for i in range(2)])
    with pytest.raises((subgroups.SubGroupError, spares.SpareRequestError)) as raised:
        error()
    what = "sub-group policy" if isinstance(raised.value, subgroups.SubGroupError) else "spare request"
    spec = gang_spec.read(only_view(state))
    assert spec.invalid == f"invalid {what}: {raised.value}"
    decision = decide(state, build(TREE), only_view(state))
    assert not decision.ok and decision.reason == spec.invalid


def test_the_spec_is_frozen() -> None:
    spec = gang_spec.read(only_view(volcano_gang()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.min_member = 1  # type: ignore[misc]


def test_the_decision_places_the_spec_without_going_back_to_any_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reader raises once the spec is read: the decision on the spec is the decision on the view."""
    state = volcano_gang()
    view = only_view(state)
    topology = build(TREE)
    expected = decide(state, topology, view)
    spec = gang_spec.read(view, jobs=state.vc_jobs, request_of=state.request_of)

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a reader was called while deciding")

    for module, name in [(subgroups, "from_volcano"), (subgroups, "from_annotations"), (subgroups, "partition"),
                         (subgroups, "too_few_subgroups"), (volcano, "network_topology"), (volcano, "min_task_member"),
                         (volcano, "task_of"), (volcano, "task_shortfall"), (upstream, "topology_key"),
                         (upstream, "key_problem"), (ranks, "pod_rank_key"), (spares, "parse_request"),
                         (gang_spec, "limits_from_annotations"), (gang_spec, "read")]:
        monkeypatch.setattr(module, name, refuse)
    decision = decide_spec(state, topology, spec)
    assert decision.ok and expected.ok
    assert (decision.assignments, decision.spares, decision.reason) == (expected.assignments, expected.spares, expected.reason)
    assert decision.gang == spec


def test_the_core_gang_comes_from_the_spec() -> None:
    spec = GangSpec(key=("ns", "g"), flavour=XK8S, group_name="g", pending=(), members=(("ns", "a"), ("ns", "b")),
                    placed={("ns", "a"): "a0"}, min_member=2, pods=(PodSpec("ns/b", GPU8),),
                    limits=Limits(Mode.HARD, 1, "leaf"))
    gang = spec.gang({("ns", "a"): "a0"})
    assert (gang.name, gang.min_member, gang.mode, gang.highest_tier, gang.highest_tier_name) == \
        ("ns/g", 1, Mode.HARD, 1, "leaf")
    assert gang.running == {"ns/a": "a0"} and gang.pods == spec.pods
