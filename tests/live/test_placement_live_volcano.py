"""hypertopo-scheduler and Volcano's own objects on the real API server (Volcano's CRDs applied by
the harness), with kwok nodes: a Volcano PodGroup is admitted (Pending -> Inqueue), its gang placed
inside its `spec.networkTopology` and reported Running; closed or missing queues and impossible
limits give a condition and an event while other gangs go on; and `--remediate-only` acts on gangs
that another scheduler placed (the test plays vc-scheduler by binding them itself)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane.harness import ControlPlane
from placement_live import Cluster, wait_for

from aggregator.placement.adapters import kube

pytestmark = pytest.mark.apiserver
FAULT = "hypertopo.io/on-fabric-fault"


@pytest.fixture(scope="module", autouse=True)
def default_queue(apiserver: ControlPlane) -> None:
    """Volcano's `default` queue, as a Volcano install has it (vc-scheduler creates it at start):
    PodGroups without `spec.queue` belong to it, and a missing queue admits nothing."""
    body = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "default"},
            "spec": {"weight": 1, "reclaimable": True}}
    apiserver.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=json.dumps(body))


def leaf_of(layout: dict[str, list[str]]) -> dict[str, str]:
    return {n: leaf for leaf, nodes in layout.items() for n in nodes}


def add_vc_podgroup(cluster: Cluster, name: str, min_member: int, *, queue: str = "", annotations: dict[str, str] | None = None,
                    owner: dict[str, Any] | None = None, **spec: Any) -> None:
    meta: dict[str, Any] = {"name": name, "namespace": cluster.ns, "annotations": annotations or {},
                            "labels": {"hypertopo.io/test": cluster.tag}}
    if owner:
        meta["ownerReferences"] = [owner]
    body = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": meta,
            "spec": {"minMember": min_member, **({"queue": queue} if queue else {}), **spec}}
    cluster.api.create(kube.VC_PODGROUPS, body)


def vc_pod(cluster: Cluster, name: str, group: str, scheduler: str, *, gpus: int = 8,
           annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = cluster.pod_body(name, scheduler, gpus=gpus, annotations={"scheduling.k8s.io/group-name": group,
                                                                     **(annotations or {})})
    body["metadata"]["labels"].update(labels or {})
    return body


def vc_group(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.api.get(kube.VC_PODGROUPS, name, namespace=cluster.ns)


def condition(group: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (group.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def queue_state(sched: Any, name: str) -> str | None:
    """The state of Queue `name` as the scheduler's own view holds it (None: not seen yet)."""
    state: str | None = ((sched.state.queues.get(name) or {}).get("status") or {}).get("state")
    return state


@contextlib.contextmanager
def queue(cluster: Cluster, name: str, state: str = "Open") -> Iterator[str]:
    cluster.api.create(kube.QUEUES, {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                                           "metadata": {"name": name}, "spec": {"weight": 1}})
    cluster.api.patch_status(kube.QUEUES, None, name, {"status": {"state": state}})
    try:
        yield name
    finally:
        with contextlib.suppress(kube.ApiError):
            cluster._raw("DELETE", kube.QUEUES.path(name=name))


def test_a_volcano_podgroup_is_admitted_placed_inside_its_network_topology_and_runs(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=8)
    with cluster.scheduler() as sched, queue(cluster, f"q-{cluster.tag}") as q:
        name = sched.options.scheduler_name
        add_vc_podgroup(cluster, "train", 4, queue=q, networkTopology={"mode": "hard", "highestTierAllowed": 1})
        start = time.monotonic()
        cluster.add_pods([vc_pod(cluster, f"train-{i}", "train", name) for i in range(4)])
        placed = cluster.wait_bound(4)
        bound_s = time.monotonic() - start
        assert len({leaf_of(layout)[n] for n in placed.values()}) == 1
        # Running once the 4 are bound; `running` counts them as kwok starts them
        group = wait_for("PodGroup Running, 4 pods running",
                         lambda: (g := vc_group(cluster, "train"))["status"].get("phase") == "Running"
                         and g["status"].get("running") == 4 and g)
        scheduled = condition(group, "Scheduled")
        assert scheduled is not None and "tier 1" in scheduled["message"]
        print(f"volcano PodGroup: 4 pods bound in {bound_s:.2f}s, Running after {time.monotonic() - start:.2f}s")


def test_closed_or_missing_queues_keep_a_podgroup_pending_while_other_gangs_run(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=1, per_leaf=4, gpus=8)
    with cluster.scheduler() as sched, queue(cluster, f"closed-{cluster.tag}", "Closed") as closed, \
            queue(cluster, f"open-{cluster.tag}") as open_q:
        name = sched.options.scheduler_name
        # the queues' states reach the scheduler through its Queue informer, in no order with the
        # PodGroups and pods below: decided before it sees them, "shut" would be admitted (a Queue
        # without a state yet counts as open) or told its queue does not exist, and "fine" refused
        wait_for("the scheduler sees both queues' states",
                 lambda: queue_state(sched, closed) == "Closed" and queue_state(sched, open_q) == "Open")
        add_vc_podgroup(cluster, "shut", 1, queue=closed)
        add_vc_podgroup(cluster, "lost", 1, queue=f"nowhere-{cluster.tag}")
        add_vc_podgroup(cluster, "fine", 2, queue=open_q)
        cluster.add_pods([vc_pod(cluster, "shut-0", "shut", name), vc_pod(cluster, "lost-0", "lost", name),
                          *[vc_pod(cluster, f"fine-{i}", "fine", name) for i in range(2)]])
        placed = cluster.wait_bound(2)
        assert set(placed) == {"fine-0", "fine-1"}
        for group, why in (("shut", f"queue 'closed-{cluster.tag}' is Closed"),
                           ("lost", f"queue 'nowhere-{cluster.tag}' does not exist")):
            got = wait_for(f"{group} Unschedulable", lambda g=group: condition(vc_group(cluster, g), "Unschedulable"))
            assert why in got["message"]
            assert vc_group(cluster, group)["status"].get("phase", "Pending") == "Pending"
        messages = [e["message"] for e in cluster.wait_events("FailedScheduling", 2)]
        assert any("is Closed" in m for m in messages) and any("does not exist" in m for m in messages)
        assert sched.healthy()


def test_bad_topology_and_subgroup_settings_are_reported_and_other_gangs_still_run(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    with cluster.scheduler() as sched:
        name = sched.options.scheduler_name
        add_vc_podgroup(cluster, "tiername", 2, networkTopology={"mode": "hard", "highestTierName": "rack"})
        add_vc_podgroup(cluster, "size", 3, subGroupPolicy=[{"name": "tp", "subGroupSize": 2, "minSubGroups": 2,
                                                             "matchLabelKeys": ["part"]}])
        add_vc_podgroup(cluster, "toobig", 3, networkTopology={"mode": "hard", "highestTierAllowed": 1})
        add_vc_podgroup(cluster, "ok", 2, networkTopology={"mode": "hard", "highestTierAllowed": 1})
        add_vc_podgroup(cluster, "softname", 1, networkTopology={"mode": "soft", "highestTierName": "rack"})
        cluster.add_pods([*[vc_pod(cluster, f"tiername-{i}", "tiername", name) for i in range(2)],
                          vc_pod(cluster, "softname-0", "softname", name),
                          *[vc_pod(cluster, f"size-{i}", "size", name, gpus=1, labels={"part": "0"}) for i in range(3)],
                          *[vc_pod(cluster, f"toobig-{i}", "toobig", name) for i in range(3)],
                          *[vc_pod(cluster, f"ok-{i}", "ok", name) for i in range(2)]])
        assert set(cluster.wait_bound(3)) == {"ok-0", "ok-1", "softname-0"}
        # soft mode places without the unknown tier name, and says so in hard mode's words
        said = wait_for("the soft gang's warning", lambda: [
            e for e in cluster.events("FailedScheduling") if e["involvedObject"]["name"] in ("softname-0", "softname")])
        assert all("highest tier name 'rack' matches no tier" in e["message"] and "soft mode" in e["message"]
                   for e in said), said
        expected = {"tiername": "highest tier name 'rack' matches no tier",
                    "size": "subGroupPolicy 'tp' has 1 sub-group(s) among the gang's pods, minSubGroups is 2",
                    "toobig": "within tier <= 1"}
        for group, text in expected.items():
            got = wait_for(f"{group} Unschedulable", lambda g=group: condition(vc_group(cluster, g), "Unschedulable"))
            assert text in got["message"], got
        assert sched.healthy()


def test_subgroups_each_stay_in_one_leaf(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=3, gpus=8)
    with cluster.scheduler() as sched:
        name = sched.options.scheduler_name
        policy = {"name": "tp", "subGroupSize": 3, "matchLabelKeys": ["part"],
                  "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
        add_vc_podgroup(cluster, "pp", 6, networkTopology={"mode": "hard", "highestTierAllowed": 2},
                        subGroupPolicy=[policy])
        cluster.add_pods([vc_pod(cluster, f"pp-{i}", "pp", name, labels={"part": str(i % 2)}) for i in range(6)])
        placed = cluster.wait_bound(6)
        parts: dict[str, set[str]] = {}
        for pod, node in placed.items():
            parts.setdefault(str(int(pod.rsplit("-", 1)[1]) % 2), set()).add(leaf_of(layout)[node])
        assert all(len(leaves) == 1 for leaves in parts.values()), parts


def bind(cluster: Cluster, pod: str, node: str) -> None:
    uid = cluster.pods()[pod]["metadata"]["uid"]
    cluster.api.bind(cluster.ns, pod, uid, node)


def test_remediate_only_evicts_the_failed_nodes_pods_of_a_gang_another_scheduler_placed(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=1, per_leaf=4, gpus=8)
    nodes = layout[f"leaf-{cluster.tag}-0"]
    add_vc_podgroup(cluster, "vc", 3, annotations={FAULT: "restart-pods"})
    cluster.add_pods([vc_pod(cluster, f"vc-{i}", "vc", "volcano") for i in range(3)])
    cluster.add_pods([vc_pod(cluster, "stray", "vc", "volcano")])
    for i in range(3):
        bind(cluster, f"vc-{i}", nodes[i])  # the test plays vc-scheduler
    with cluster.scheduler(remediate_only=True) as sched:
        # a pending pod that names this scheduler is left alone: remediate-only binds nothing
        cluster.add_pods([cluster.pod_body("mine", sched.options.scheduler_name)])
        start = time.monotonic()
        cluster.taint(nodes[1])
        wait_for("the failed node's pod evicted", lambda: "vc-1" not in cluster.pods(), timeout=20)
        evicted_s = time.monotonic() - start
        time.sleep(1.0)
        left = cluster.placement()
        assert left == {"vc-0": nodes[0], "vc-2": nodes[2]}
        assert "mine" in cluster.pods() and not cluster.pods()["mine"]["spec"].get("nodeName")
        assert vc_group(cluster, "vc").get("status", {}).get("phase") in (None, "Pending")  # never written
        print(f"remediate-only: fault to eviction {evicted_s:.2f}s")


def test_restart_gang_of_a_volcano_job_asks_volcano_to_restart_it(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=1, per_leaf=2, gpus=8)
    nodes = layout[f"leaf-{cluster.tag}-0"]
    job = cluster.api.create(kube.VC_JOBS, {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "train", "namespace": cluster.ns, "annotations": {FAULT: "restart-gang"}},
        "spec": {"schedulerName": "volcano", "minAvailable": 2, "tasks": [{"name": "w", "replicas": 2, "template": {
            "spec": {"containers": [{"name": "main", "image": "trainer:latest"}]}}}]}})
    owner = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train",
             "uid": job["metadata"]["uid"], "controller": True}
    add_vc_podgroup(cluster, "train-pg", 2, owner=owner)
    cluster.add_pods([vc_pod(cluster, f"train-w-{i}", "train-pg", "volcano") for i in range(2)])
    for i in range(2):
        bind(cluster, f"train-w-{i}", nodes[i])
    with cluster.scheduler(remediate_only=True):
        cluster.taint(nodes[0])

        def commands() -> list[dict[str, Any]] | None:
            items, _ = cluster.api.list(kube.COMMANDS)
            found = [c for c in items if c["metadata"]["namespace"] == cluster.ns]
            return found or None

        [command] = wait_for("a RestartJob Command", commands, timeout=20)
        assert command["action"] == "RestartJob"
        assert command["target"]["name"] == "train" and command["target"]["uid"] == job["metadata"]["uid"]
        time.sleep(1.0)
        assert len(cluster.pods()) == 2  # the Job is restarted by Volcano, not evicted pod by pod
        assert len(commands() or []) == 1  # once per fault, not once per cycle
