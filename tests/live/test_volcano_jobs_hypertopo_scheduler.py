"""A Volcano `Job` with `schedulerName: hypertopo-scheduler` under the real vc-controller-manager
(built from Volcano's Go module by tests/controlplane/volcano/build_volcano.sh), on kwok nodes.

The job controller creates the Job's PodGroup and creates its pods only once hypertopo-scheduler
has moved the group to Inqueue; hypertopo-scheduler then places the gang inside the Job's
`networkTopology`, the PodGroup goes Running and so does the Job. A node's fabric fault then gets
the `restart-pods` pod evicted, Volcano's job controller recreates it and hypertopo-scheduler
places it next to the rest of the gang. The controller acts on every Job of the API server, so the
test runs on a control plane of its own."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aggregator_controller_kit import private_plane
from controlplane.harness import ControlPlane
from placement_live import KEEP_RUNNING, Cluster, keep_running_stages, kwok_running, wait_for
from volcano_live import volcano_running

from aggregator.placement.adapters import kube

pytestmark = pytest.mark.apiserver
FAULT = "hypertopo.io/on-fabric-fault"


@contextlib.contextmanager
def volcano_job_plane() -> Iterator[ControlPlane]:
    """A control plane of its own with kwok and Volcano's controllers (no vc-scheduler) and the
    default Queue: the job controller acts on every Job of the API server."""
    with private_plane() as cp, kwok_running(cp, config=keep_running_stages(cp.workdir)), volcano_running(cp, scheduler=False, controller_manager=True):
        queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "default"},
                 "spec": {"weight": 1, "reclaimable": True}}
        cp.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(queue))
        yield cp


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with volcano_job_plane() as cp:
        yield cp


def job_body(cluster: Cluster, name: str, scheduler: str, replicas: int, *, gpus: int = 8,
             annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}
    # kwok completes Running pods owned by a "Job" at once (Volcano's Job too): trainers run on
    template = {"metadata": {"labels": {"hypertopo.io/test": cluster.tag}, "annotations": {KEEP_RUNNING: "true"}},
                "spec": {"terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                         "containers": [{"name": "main", "image": "trainer:latest", "resources": resources}]}}
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "namespace": cluster.ns, "annotations": annotations or {}},
            "spec": {"schedulerName": scheduler, "queue": "default", "minAvailable": replicas,
                     "tasks": [{"name": "worker", "replicas": replicas, "template": template}], **spec}}


def job_phase(cluster: Cluster, name: str) -> str:
    job = cluster.api.get(kube.VC_JOBS, name, namespace=cluster.ns)
    return str(((job.get("status") or {}).get("state") or {}).get("phase") or "")


def podgroup_of(cluster: Cluster, job: str) -> dict[str, Any] | None:
    items, _ = cluster.api.list(kube.VC_PODGROUPS)
    return next((g for g in items if g["metadata"]["namespace"] == cluster.ns
                 and any(r.get("name") == job for r in g["metadata"].get("ownerReferences") or [])), None)


def test_a_volcano_job_runs_under_hypertopo_scheduler_inside_its_network_topology(plane: ControlPlane) -> None:
    cluster = Cluster(plane, "vcjob")
    try:
        layout = cluster.leaf_spine(leaves=2, per_leaf=5, gpus=8)  # 4 pods per leaf and one node to spare
        leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
        with cluster.scheduler() as sched:
            start = time.monotonic()
            cluster.api.create(kube.VC_JOBS, job_body(
                cluster, "train", sched.options.scheduler_name, 4, annotations={FAULT: "restart-pods"},
                networkTopology={"mode": "hard", "highestTierAllowed": 1}))
            group = wait_for("the Job's PodGroup Inqueue", lambda: (g := podgroup_of(cluster, "train"))
                             and g.get("status", {}).get("phase") in ("Inqueue", "Running") and g, timeout=30)
            admitted = time.monotonic() - start
            assert group["spec"]["networkTopology"]["highestTierAllowed"] == 1
            placed = cluster.wait_bound(4, timeout=30)
            bound = time.monotonic() - start
            assert len({leaf_of[n] for n in placed.values()}) == 1, placed
            wait_for("Job Running", lambda: job_phase(cluster, "train") == "Running", timeout=30)
            running = time.monotonic() - start
            wait_for("PodGroup Running", lambda: ((podgroup_of(cluster, "train") or {}).get("status") or {}).get("phase")
                     == "Running", timeout=15)
            print(f"\nVolcano Job under hypertopo-scheduler: Inqueue {admitted:.2f}s, 4 pods bound {bound:.2f}s, "
                  f"Job Running {running:.2f}s")

            # fault on one node: its pod is evicted, Volcano recreates it, we place it in the same leaf
            victim_pod, victim_node = sorted(placed.items())[0]
            leaf = leaf_of[victim_node]
            start = time.monotonic()
            cluster.taint(victim_node)
            wait_for("the failed node's pod evicted", lambda: victim_node not in cluster.placement().values(), timeout=30)
            evicted = time.monotonic() - start
            after = wait_for("4 pods bound again, none on the failed node", lambda: (p := cluster.placement())
                             and len(p) == 4 and victim_node not in p.values() and p, timeout=30)
            replaced = time.monotonic() - start
            assert {leaf_of[n] for n in after.values()} == {leaf}  # room in the same leaf: it stays there
            # Volcano recreates the pod under its old name; the other three never moved
            assert after[victim_pod] != victim_node
            assert {p: n for p, n in after.items() if p != victim_pod} == {p: n for p, n in placed.items() if p != victim_pod}
            print(f"fault -> eviction {evicted:.2f}s, -> replacement bound {replaced:.2f}s")
    finally:
        cluster.cleanup()


def test_restart_gang_of_a_volcano_job_is_carried_out_by_volcano_and_the_gang_re_placed(plane: ControlPlane) -> None:
    cluster = Cluster(plane, "vcgang")
    try:
        layout = cluster.leaf_spine(leaves=2, per_leaf=3, gpus=8)
        leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
        with cluster.scheduler() as sched:
            cluster.api.create(kube.VC_JOBS, job_body(
                cluster, "gang", sched.options.scheduler_name, 3, annotations={FAULT: "restart-gang"},
                networkTopology={"mode": "hard", "highestTierAllowed": 1}))
            before = cluster.wait_bound(3, timeout=30)
            uids = {n: p["metadata"]["uid"] for n, p in cluster.pods().items()}
            leaf = leaf_of[next(iter(before.values()))]
            victim = sorted(before.values())[0]
            start = time.monotonic()
            cluster.taint(victim)

            def restarted() -> dict[str, str] | None:
                pods = cluster.pods()
                fresh = {n: p for n, p in pods.items() if uids.get(n) != p["metadata"]["uid"]}
                placed = {n: p["spec"].get("nodeName") for n, p in fresh.items() if p["spec"].get("nodeName")}
                return placed if len(placed) == 3 else None

            after = wait_for("every pod of the Job recreated by Volcano and placed again", restarted, timeout=60)
            took = time.monotonic() - start
            items, _ = cluster.api.list(kube.COMMANDS)
            assert not [c for c in items if c["metadata"]["namespace"] == cluster.ns]  # Volcano consumed it
            # the leaf lost a node: 2 healthy nodes are left there, so the whole gang moves to the other leaf
            assert victim not in after.values()
            assert len({leaf_of[n] for n in after.values()}) == 1 and leaf_of[next(iter(after.values()))] != leaf
            print(f"\nrestart-gang: fault -> RestartJob -> all 3 pods recreated and placed in {took:.2f}s")
    finally:
        cluster.cleanup()


def test_a_volcano_jobs_partitions_each_stay_in_one_leaf(plane: ControlPlane) -> None:
    # Volcano's job controller turns a task's partitionPolicy into the PodGroup's subGroupPolicy
    # (labelSelector on the task, matchLabelKeys volcano.sh/partition-id): 2 partitions of 2 pods,
    # each within a leaf. Leaf 0 has 3 free nodes, leaf 1 one, leaf 2 three: the gang alone would fill
    # leaf 0 and put its 4th pod elsewhere, splitting a partition
    cluster = Cluster(plane, "vcpart")
    try:
        layout = cluster.leaf_spine(leaves=3, per_leaf=3, gpus=8)
        leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
        fillers = [cluster.pod_body(f"filler-{i}", "none", gpus=8) for i in range(2)]
        for body, node in zip(fillers, layout[f"leaf-{cluster.tag}-1"][:2], strict=True):
            body["spec"]["nodeName"] = node
        cluster.add_pods(fillers)
        with cluster.scheduler() as sched:
            body = job_body(cluster, "part", sched.options.scheduler_name, 4)
            body["spec"]["tasks"][0]["partitionPolicy"] = {
                "totalPartitions": 2, "partitionSize": 2, "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
            cluster.api.create(kube.VC_JOBS, body)
            placed = wait_for("the Job's 4 pods bound", lambda: (p := {
                n: node for n, node in cluster.placement().items() if n.startswith("part-")}) and len(p) == 4 and p, timeout=30)
            group = podgroup_of(cluster, "part")
            assert group is not None and group["spec"]["subGroupPolicy"][0]["matchLabelKeys"] == ["volcano.sh/partition-id"]
            partitions: dict[str, set[str]] = {}
            for name, pod in cluster.pods().items():
                if name in placed:
                    partitions.setdefault(pod["metadata"]["labels"]["volcano.sh/partition-id"], set()).add(leaf_of[placed[name]])
            assert len(partitions) == 2 and all(len(leaves) == 1 for leaves in partitions.values()), partitions
    finally:
        cluster.cleanup()
