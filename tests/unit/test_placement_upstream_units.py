"""Kubernetes' own PodGroups (`scheduling.k8s.io/v1beta1`) in hypertopo-scheduler, without an API
server: pods join with `spec.schedulingGroup.podGroupName`, `gang.minCount` is the gang's minMember
(`basic` is no gang), the topology key `hypertopo.io/<tier>` keeps the gang in one HyperNode of that
tier (a key that is no tier is refused in one line), the `PodGroupInitiallyScheduled` condition is
written as kube-scheduler writes it (a strategic merge of one condition on `/status`), FabricHealthy
sits beside it, and the fault policies act on these gangs as on the others. The shapes are those of
k8s.io/api v0.37.2 scheduling/v1beta1 and core/v1 (PodSchedulingGroup)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from aggregator.live import slim
from aggregator.placement.core import rescheduler
from aggregator.placement.core.decide import decide
from aggregator.placement.core.topology import build
from aggregator.placement.kinds import podgroups, upstream
from aggregator.placement.live.scheduler import Options, Scheduler
from aggregator.placement.live.state import K8S, ClusterState
from aggregator.placement.live.status_writer import StatusWriter

SCHED = "hypertopo-scheduler"
LEAVES = {"leaf-0": ["n0", "n1"], "leaf-1": ["n2", "n3"]}  # 8 GPUs a node: 16 a leaf


def node(name: str, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    amounts = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {}}, "spec": {"taints": taints or []}, "status": {"allocatable": amounts}}


def hypernodes() -> list[dict[str, Any]]:
    out = [{"metadata": {"name": leaf}, "spec": {"tier": 1, "tierName": "leaf", "members": [
        {"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]}} for leaf, nodes in LEAVES.items()]
    out.append({"metadata": {"name": "spine"}, "spec": {"tier": 2, "tierName": "spine", "members": [
        {"type": "HyperNode", "selector": {"exactMatch": {"name": leaf}}} for leaf in LEAVES]}})
    return out


def pod(name: str, group: str | None, *, gpus: int = 4, node_name: str = "", phase: str = "Pending",
        scheduler: str = SCHED) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": scheduler, "nodeName": node_name or None,
                            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec, "status": {"phase": phase}}


def k8s_podgroup(name: str, min_count: int | None, key: str | None = None, *,
                 annotations: dict[str, str] | None = None, generation: int = 1) -> dict[str, Any]:
    """A PodGroup as kube-apiserver v1.37 serves it: a gang (or, with `min_count` None, basic)
    scheduling policy and, with `key`, one topology constraint."""
    policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    spec: dict[str, Any] = {"schedulingPolicy": policy}
    if key is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {"apiVersion": upstream.API_VERSION, "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-pg-{name}", "generation": generation,
                         "annotations": annotations or {}},
            "spec": spec}


def cluster(*objects: tuple[str, dict[str, Any]]) -> ClusterState:
    state = ClusterState(SCHED)
    for name in (n for nodes in LEAVES.values() for n in nodes):
        state.apply("Node", "ADDED", node(name))
    for obj in hypernodes():
        state.apply("HyperNode", "ADDED", obj)
    for kind, obj in objects:
        state.apply(kind, "ADDED", obj)
    return state


def topology_of(state: ClusterState) -> Any:
    return build(state.hypernodes.values())


def leaf_of(node_name: str) -> str:
    return next(leaf for leaf, nodes in LEAVES.items() if node_name in nodes)


# -- membership and minCount ------------------------------------------------------------------
def test_a_pod_joins_the_podgroup_its_scheduling_group_names_and_waits_for_it_and_for_min_count() -> None:
    state = cluster(("Pod", pod("g-0", "g")), ("Pod", pod("g-1", "g")), ("Pod", pod("alone", None)))
    views = {v.key: v for v in podgroups.collect(state)}
    assert views[("ns", "g")].flavour == K8S and views[("ns", "g")].min_member == -1  # no PodGroup yet: wait
    assert not views[("ns", "alone")].is_group
    state.apply("K8sPodGroup", "ADDED", k8s_podgroup("g", 3))
    view = next(v for v in podgroups.collect(state) if v.key == ("ns", "g"))
    assert (view.min_member, view.missing, len(view.pending), view.is_upstream) == (3, 1, 2, True)


def test_a_basic_policy_is_no_gang_so_its_pods_are_placed_as_they_fit() -> None:
    assert upstream.min_count(k8s_podgroup("b", None)) == 1
    state = cluster(("K8sPodGroup", k8s_podgroup("b", None)),
                    *(("Pod", pod(f"b-{i}", "b", gpus=8)) for i in range(6)))  # 48 GPUs asked, 32 exist
    for _ in range(6):  # decide as the scheduler's passes do, each charging what it placed
        view = next((v for v in podgroups.collect(state) if v.key == ("ns", "b")), None)
        decision = decide(state, topology_of(state), view) if view is not None else None
        for key, where in (decision.assignments if decision is not None else {}).items():
            state.assume(key, where)
    assert len(state.assumed) == 4 and len(state.pending_keys) == 2  # all or nothing would place none
    state = cluster(("K8sPodGroup", k8s_podgroup("b", 6)), *(("Pod", pod(f"b-{i}", "b", gpus=8)) for i in range(6)))
    view = next(v for v in podgroups.collect(state) if v.key == ("ns", "b"))
    assert not decide(state, topology_of(state), view).ok  # the same pods as a gang of 6: none


def test_the_scheduler_keeps_the_pods_scheduling_group_when_it_slims_a_pod() -> None:
    full = pod("g-0", "g")
    full["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    kept = slim.slim_pod(full)
    assert kept["spec"]["schedulingGroup"] == {"podGroupName": "g"}
    assert upstream.group_name(kept) == "g"


@pytest.mark.parametrize("bad", [None, "g", {"podGroupName": 7}, {"other": "g"}])
def test_a_malformed_scheduling_group_makes_no_gang(bad: Any) -> None:
    raw = pod("p", None)
    raw["spec"]["schedulingGroup"] = bad
    assert upstream.group_name(raw) == ""


# -- the topology constraint ------------------------------------------------------------------
def test_a_leaf_key_keeps_the_whole_gang_in_one_leaf_though_the_cluster_could_spread_it() -> None:
    # 3 pods x 4 GPUs: n0 already has 4 GPUs taken, so the gang fits leaf-0 only as 4+8 and
    # leaf-1 as 8+4; spread placements across the spine are never chosen
    state = cluster(("K8sPodGroup", k8s_podgroup("g", 3, "hypertopo.io/leaf")),
                    ("Pod", pod("other", None, gpus=4, node_name="n0", scheduler="default-scheduler")),
                    *(("Pod", pod(f"g-{i}", "g")) for i in range(3)))
    view = next(v for v in podgroups.collect(state) if v.key == ("ns", "g"))
    decision = decide(state, topology_of(state), view)
    assert decision.ok and len(decision.assignments) == 3
    assert len({leaf_of(n) for n in decision.assignments.values()}) == 1
    assert decision.placement is not None and decision.placement.tier == 1


def test_a_gang_too_big_for_any_leaf_stays_unschedulable_under_a_leaf_key_and_fits_under_the_spine() -> None:
    # 5 pods x 4 GPUs = 20 GPUs: a leaf has 16, the spine 32; without a key hypertopo spreads it too
    for key, fits in (("hypertopo.io/leaf", False), ("hypertopo.io/spine", True), (None, True)):
        state = cluster(("K8sPodGroup", k8s_podgroup("g", 5, key)), *(("Pod", pod(f"g-{i}", "g")) for i in range(5)))
        view = next(v for v in podgroups.collect(state) if v.key == ("ns", "g"))
        decision = decide(state, topology_of(state), view)
        assert decision.ok is fits, (key, decision.reason)
        if not fits:
            assert decision.reason.startswith("0/4 nodes are available") and "within tier <= 1 (leaf)" in decision.reason


@pytest.mark.parametrize("key", ["topology.kubernetes.io/zone", "hypertopo.io/rack", "kubernetes.io/hostname"])
def test_a_key_that_names_no_hypertopo_tier_is_refused_in_one_line_naming_it_and_the_keys_that_work(key: str) -> None:
    state = cluster(("K8sPodGroup", k8s_podgroup("g", 2, key)), *(("Pod", pod(f"g-{i}", "g")) for i in range(2)))
    view = next(v for v in podgroups.collect(state) if v.key == ("ns", "g"))
    decision = decide(state, topology_of(state), view)
    assert not decision.ok and decision.assignments == {}
    assert decision.reason == (f"pod group g: schedulingConstraints.topology key {key!r} is no hypertopo tier; "
                               "hypertopo-scheduler places by the keys hypertopo.io/leaf, hypertopo.io/spine")
    assert "\n" not in decision.reason


def test_a_refused_key_is_bounded_in_the_message() -> None:
    topology = build(hypernodes())
    problem = upstream.key_problem(k8s_podgroup("g", 2, "example.com/" + "x" * 300), topology)
    assert len(problem) < 300 and "..." in problem


def test_only_the_first_topology_constraint_counts_as_in_kube_scheduler() -> None:
    group = k8s_podgroup("g", 2, "hypertopo.io/leaf")
    group["spec"]["schedulingConstraints"]["topology"].append({"key": "nonsense"})
    assert upstream.topology_key(group) == "hypertopo.io/leaf"
    assert upstream.key_problem(group, build(hypernodes())) == ""


def test_placed_members_pin_the_leaf_of_a_replacement_as_kube_scheduler_pins_their_label_value() -> None:
    # g-0 runs on n2 (leaf-1); its replacement g-1 could fit anywhere, and goes next to it
    state = cluster(("K8sPodGroup", k8s_podgroup("g", 2, "hypertopo.io/leaf")),
                    ("Pod", pod("g-0", "g", node_name="n2", phase="Running")), ("Pod", pod("g-1", "g")))
    view = next(v for v in podgroups.collect(state) if v.key == ("ns", "g"))
    decision = decide(state, topology_of(state), view)
    assert decision.ok and leaf_of(decision.assignments[("ns", "g-1")]) == "leaf-1"


def test_hypertopos_sub_group_annotations_split_a_kubernetes_podgroup_under_its_topology_key() -> None:
    # pods of two rank groups, interleaved by name: filling by name would mix them in each leaf;
    # the sub-groups (one leaf each) under the PodGroup's spine key keep each group in its own leaf
    subgroups = {"hypertopo.io/subgroup-label-keys": "grp", "hypertopo.io/subgroup-highest-tier-name": "leaf",
                 "hypertopo.io/subgroup-size": "4"}
    pods = []
    for i in range(8):
        member = pod(f"g-{i}", "g")
        member["metadata"]["labels"] = {"grp": "ab"[i % 2]}
        pods.append(("Pod", member))
    state = cluster(("K8sPodGroup", k8s_podgroup("g", 8, "hypertopo.io/spine", annotations=subgroups)), *pods)
    view = next(v for v in podgroups.collect(state) if v.key == ("ns", "g"))
    decision = decide(state, topology_of(state), view)
    assert decision.ok and len(decision.assignments) == 8
    leaves = {group: {leaf_of(n) for k, n in decision.assignments.items() if int(k[1][2:]) % 2 == "ab".index(group)}
              for group in "ab"}
    assert all(len(found) == 1 for found in leaves.values()) and leaves["a"] != leaves["b"]


# -- status as kube-scheduler writes it -------------------------------------------------------
def test_the_initially_scheduled_condition_follows_kube_schedulers_rules() -> None:
    group = k8s_podgroup("g", 2, generation=3)
    unfit = upstream.condition(upstream.INITIALLY_SCHEDULED, "False", "Unschedulable", "0/4 nodes are available")
    first = upstream.to_write(group, unfit, "2026-01-01T00:00:00Z")
    assert first == {"type": "PodGroupInitiallyScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/4 nodes are available", "observedGeneration": 3,
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}
    group["status"] = {"conditions": [first]}
    assert upstream.to_write(group, unfit, "2026-01-01T00:01:00Z") is None  # already carried: no write
    other = upstream.condition(upstream.INITIALLY_SCHEDULED, "False", "Unschedulable", "another reason")
    again = upstream.to_write(group, other, "2026-01-01T00:02:00Z")
    assert again is not None and again["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # same status: time kept
    done = upstream.to_write(group, upstream.condition(upstream.INITIALLY_SCHEDULED, "True", "Scheduled", ""),
                             "2026-01-01T00:03:00Z")
    assert done is not None and done["lastTransitionTime"] == "2026-01-01T00:03:00Z"
    group["status"] = {"conditions": [done]}
    assert upstream.initially_scheduled(group)
    assert upstream.to_write(group, unfit, "2026-01-01T00:04:00Z") is None  # never back from True


class RecordingApi:
    """Records PATCH requests (path, content type, body) and events."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def request(self, method: str, path: str, *, body: Any = None, content_type: str = "") -> dict[str, Any]:
        with self.lock:
            self.patches.append((path, content_type, body))
        return {}

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(event)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: {}


def test_a_condition_goes_as_a_strategic_merge_of_itself_alone_on_the_status_subresource() -> None:
    api = RecordingApi()
    writer = StatusWriter(api, lambda target: None)
    group = k8s_podgroup("g", 2)
    group["status"] = {"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "True", "reason": "Scheduled",
                                       "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    cond = upstream.condition("FabricHealthy", "False", "FabricFailed", "1 of 2 members on 1 node(s)")
    writer.k8s_condition(("ns", "g"), group, cond)
    writer.k8s_condition(("ns", "g"), group, cond)  # queued already, not yet on the object: not twice
    writer.shutdown()
    (path, content_type, body), = api.patches
    assert path == "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups/g/status"
    assert content_type == "application/strategic-merge-patch+json"
    (entry,) = body["status"]["conditions"]  # kube-scheduler's condition is not in the patch: it stays
    assert {k: entry[k] for k in ("type", "status", "reason")} == {"type": "FabricHealthy", "status": "False",
                                                                   "reason": "FabricFailed"}
    assert writer.status_completed == 1


class RefusingApi(RecordingApi):
    """Refuses the first `refusals` PATCH requests (an API server restarting, a conflict)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    def request(self, method: str, path: str, *, body: Any = None, content_type: str = "") -> dict[str, Any]:
        if self.refusals > 0:
            self.refusals -= 1
            raise RuntimeError("503 the server is currently unable to handle the request")
        return super().request(method, path, body=body, content_type=content_type)


def test_a_refused_condition_write_is_queued_again_on_the_next_try() -> None:
    api, failed = RefusingApi(1), list[Any]()
    writer = StatusWriter(api, failed.append)
    group = k8s_podgroup("g", 2)
    cond = upstream.condition(upstream.INITIALLY_SCHEDULED, "False", "Unschedulable", "0/4 nodes are available")
    writer.k8s_condition(("ns", "g"), group, cond)
    assert wait_for_true(lambda: failed == [("k8s:PodGroupInitiallyScheduled", ("ns", "g"))])
    writer.forget(failed[0])  # what the scheduler loop does with a failed target
    writer.k8s_condition(("ns", "g"), group, cond)  # the next unfit decision says the same
    writer.shutdown()
    (path, _, body), = api.patches
    assert path.endswith("/podgroups/g/status") and body["status"]["conditions"][0]["reason"] == "Unschedulable"


def wait_for_true(predicate: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not predicate():
        time.sleep(0.005)
    return bool(predicate())


def test_initially_scheduled_goes_true_once_min_count_members_are_bound() -> None:
    state = cluster(("K8sPodGroup", k8s_podgroup("g", 2)), ("Pod", pod("g-0", "g", node_name="n0")), ("Pod", pod("g-1", "g")))
    api = RecordingApi()
    writer = StatusWriter(api, lambda target: None)
    writer.write_dirty(state, set())
    time.sleep(0.05)
    assert api.patches == []  # one of minCount 2 bound
    state.apply("Pod", "MODIFIED", pod("g-1", "g", node_name="n1"))
    writer.write_dirty(state, set())
    writer.shutdown()
    (path, _, body), = api.patches
    (entry,) = body["status"]["conditions"]
    assert path.endswith("/podgroups/g/status")
    assert (entry["type"], entry["status"], entry["reason"]) == ("PodGroupInitiallyScheduled", "True", "Scheduled")


def _scheduler(api: RecordingApi, *objects: tuple[str, dict[str, Any]]) -> Scheduler:
    sched = Scheduler(api, Options(scheduler_name=SCHED))
    for name in (n for nodes in LEAVES.values() for n in nodes):
        sched.state.apply("Node", "ADDED", node(name))
    for obj in hypernodes():
        sched.state.apply("HyperNode", "ADDED", obj)
    for kind, obj in objects:
        sched.state.apply(kind, "ADDED", obj)
    return sched


def _flush(sched: Scheduler) -> None:
    """Waits for the binds, hands their outcomes to the loop (as its thread would), then writes."""
    sched.binder.shutdown()
    sched._drain(timeout=0.1)
    sched.events.shutdown()
    sched.status.shutdown()


def test_the_scheduler_refuses_an_unknown_key_with_one_event_per_object_and_the_unschedulable_condition() -> None:
    api = RecordingApi()
    sched = _scheduler(api, ("K8sPodGroup", k8s_podgroup("g", 2, "topology.kubernetes.io/zone")),
                       *(("Pod", pod(f"g-{i}", "g")) for i in range(2)))
    sched._cycle()
    _flush(sched)
    assert sched.state.assumed == {}
    on_group = [e for e in api.events if e["involvedObject"]["kind"] == "PodGroup"]
    (event,) = on_group
    assert event["reason"] == "FailedScheduling" and event["involvedObject"]["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert "'topology.kubernetes.io/zone' is no hypertopo tier" in event["message"]
    assert sorted(e["involvedObject"]["name"] for e in api.events if e["involvedObject"]["kind"] == "Pod") == ["g-0", "g-1"]
    (path, _, body), = api.patches
    (entry,) = body["status"]["conditions"]
    assert path == "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups/g/status"
    assert (entry["type"], entry["status"], entry["reason"]) == ("PodGroupInitiallyScheduled", "False", "Unschedulable")
    assert entry["message"] == event["message"] and entry["observedGeneration"] == 1


def test_the_scheduler_places_a_leaf_gang_in_one_leaf_and_says_scheduled_on_the_podgroup() -> None:
    api = RecordingApi()
    sched = _scheduler(api, ("K8sPodGroup", k8s_podgroup("g", 3, "hypertopo.io/leaf")),
                       *(("Pod", pod(f"g-{i}", "g")) for i in range(3)))
    sched._cycle()
    _flush(sched)
    assert len(sched.state.assumed) == 3 and len({leaf_of(n) for n in sched.state.assumed.values()}) == 1
    scheduled = [e for e in api.events if e["reason"] == "Scheduled" and e["involvedObject"]["kind"] == "PodGroup"]
    assert [e["involvedObject"]["apiVersion"] for e in scheduled] == ["scheduling.k8s.io/v1beta1"]


def test_a_lone_pod_placed_without_its_unknown_soft_limit_is_warned_without_a_podgroup() -> None:
    # the warning path names the PodGroup's apiVersion per flavour; a gang of one has none
    api = RecordingApi()
    lone = pod("lone", None)
    lone["metadata"]["annotations"] = {"hypertopo.io/highest-tier-name": "nope"}
    sched = _scheduler(api, ("Pod", lone))
    sched._cycle()
    _flush(sched)
    assert sched.state.assumed.keys() == {("ns", "lone")}
    (warning,) = [e for e in api.events if e["reason"] == "FailedScheduling"]
    assert warning["involvedObject"]["name"] == "lone" and "nope" in warning["message"]


# -- fault handling ---------------------------------------------------------------------------
def test_the_fault_policies_act_on_kubernetes_podgroups_as_on_the_others() -> None:
    taint = [{"key": "hypertopo.io/fabric-unhealthy", "effect": "NoSchedule"}]
    objs: list[tuple[str, dict[str, Any]]] = []
    # "ks" was placed by kube-scheduler: fault handling is the gang's opt-in, whoever placed it
    for gang, policy, by in (("rp", "restart-pods", SCHED), ("rg", "restart-gang", SCHED), ("no", "none", SCHED),
                             ("ks", "restart-pods", "default-scheduler")):
        objs.append(("K8sPodGroup", k8s_podgroup(gang, 2, "hypertopo.io/leaf",
                                                 annotations={"hypertopo.io/on-fabric-fault": policy})))
        objs += [("Pod", pod(f"{gang}-0", gang, node_name="n0", phase="Running", scheduler=by)),
                 ("Pod", pod(f"{gang}-1", gang, node_name="n1", phase="Running", scheduler=by))]
    state = cluster(*objs)
    state.apply("Node", "MODIFIED", node("n0", taints=taint))
    failed = rescheduler.failed_nodes(state, topology_of(state), {})
    assert set(failed) == {"n0"}
    gangs = podgroups.gangs_on_nodes(state, set(failed))
    assert {g.key[1]: g.flavour for g in gangs} == {"rp": K8S, "rg": K8S, "no": K8S, "ks": K8S}
    assert sorted(e.pod[1] for e in rescheduler.plan(gangs, failed)) == ["ks-0", "rg-0", "rg-1", "rp-0"]
