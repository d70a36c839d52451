"""Ranks of a real Volcano Job (issue 24 point 2): under the real vc-controller-manager, the Job's
pods carry `volcano.sh/task-spec` and `volcano.sh/task-index`; hypertopo-scheduler ranks them in
the order of the Job's `spec.tasks` (here the workers before the parameter servers, which the
leader-first fallback would put first), fills the nodes in fabric order, and publishes the map on
the PodGroup and as the hostfile ConfigMap `<job>-hostfile`, owned by the PodGroup. The controller
acts on every Job of the API server, so the test runs on a control plane of its own."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aggregator_controller_kit import private_plane
from controlplane.harness import ControlPlane
from placement_live import KEEP_RUNNING, Cluster, keep_running_stages, kwok_running, wait_for
from volcano_live import volcano_running

from aggregator.placement.adapters import kube
from aggregator.placement.core import ranks

pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with private_plane() as cp, kwok_running(cp, config=keep_running_stages(cp.workdir)), \
            volcano_running(cp, scheduler=False, controller_manager=True):
        queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "default"},
                 "spec": {"weight": 1, "reclaimable": True}}
        cp.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(queue))
        yield cp


def _task(cluster: Cluster, name: str, replicas: int) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8", "cpu": "1"}}
    template = {"metadata": {"labels": {"hypertopo.io/test": cluster.tag}, "annotations": {KEEP_RUNNING: "true"}},
                "spec": {"terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                         "containers": [{"name": "main", "image": "trainer:latest", "resources": resources}]}}
    return {"name": name, "replicas": replicas, "template": template}


def _podgroup_of(cluster: Cluster, job: str) -> dict[str, Any] | None:
    items, _ = cluster.api.list(kube.VC_PODGROUPS, namespace=cluster.ns)
    return next((g for g in items if any(r.get("name") == job for r in g["metadata"].get("ownerReferences") or [])),
                None)


def _config_map(cluster: Cluster, name: str) -> dict[str, Any] | None:
    try:
        return cluster.api.get(kube.CONFIGMAPS, name, namespace=cluster.ns)
    except kube.ApiError as exc:
        if exc.status == 404:
            return None
        raise


def test_a_volcano_jobs_ranks_follow_its_task_order_in_fabric_order_with_a_hostfile(plane: ControlPlane) -> None:
    cluster = Cluster(plane, "vcranks")
    try:
        layout = cluster.leaf_spine(leaves=2, per_leaf=3, gpus=8)  # 5 pods of 8 GPUs: 3 on one leaf, 2 on the other
        leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
        with cluster.scheduler() as sched:
            job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                   "metadata": {"name": "train", "namespace": cluster.ns},
                   "spec": {"schedulerName": sched.options.scheduler_name, "queue": "default", "minAvailable": 5,
                            "tasks": [_task(cluster, "worker", 3), _task(cluster, "ps", 2)]}}
            cluster.api.create(kube.VC_JOBS, job)
            placement = cluster.wait_bound(5, timeout=60)
            group = wait_for("the rank map on the Job's PodGroup", lambda: (g := _podgroup_of(cluster, "train"))
                             and ranks.RANK_MAP_ANNOTATION in (g["metadata"].get("annotations") or {}) and g, timeout=30)
            config_map = wait_for("the hostfile ConfigMap", lambda: _config_map(cluster, "train-hostfile"), timeout=30)
        pods = cluster.pods()
        assert {p["metadata"]["labels"].get("volcano.sh/task-spec") for p in pods.values()} == {"worker", "ps"}
        rows = json.loads(group["metadata"]["annotations"][ranks.RANK_MAP_ANNOTATION])
        # the Job's task order (worker, then ps), each task by its task-index
        assert [name for name, _ in rows] == ["train-worker-0", "train-worker-1", "train-worker-2", "train-ps-0",
                                              "train-ps-1"]
        assert rows == [[name, placement[name]] for name, _ in rows]
        nodes = [node for _, node in rows]
        assert nodes == sorted(nodes, key=ranks.natural)  # nodes in fabric order (leaf, then name)
        crossed = sum(leaf_of[a] != leaf_of[b] for a, b in itertools.pairwise(nodes))
        assert crossed == len({leaf_of[n] for n in nodes}) - 1 == 1  # the minimum
        assert config_map["data"]["rank-map"] == group["metadata"]["annotations"][ranks.RANK_MAP_ANNOTATION]
        assert config_map["data"]["hostfile"] == "".join(f"{node} slots=1\n" for node in nodes)
        owners = config_map["metadata"]["ownerReferences"]
        assert [(o["apiVersion"], o["kind"], o["name"], o["uid"]) for o in owners] == [
            ("scheduling.volcano.sh/v1beta1", "PodGroup", group["metadata"]["name"], group["metadata"]["uid"])]
    finally:
        cluster.cleanup()
