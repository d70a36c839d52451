"""End to end on the real Volcano controller (issue 25.5): a Volcano Job with
`hypertopo.io/spare-nodes: "1"` placed by hypertopo-scheduler fills a leaf with its members and its
spare; another Job does not get the spare; a member's node loses its fabric, the pod is evicted,
Volcano's job controller recreates it, and the replacement is bound on the spare in the same leaf.
Prints fault -> evicted -> bound -> Running. A control plane of its own: the controller acts on
every Job of the API server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from controlplane.harness import ControlPlane
from placement_live import Cluster, wait_for
from test_volcano_jobs_hypertopo_scheduler import job_body, job_phase, podgroup_of, volcano_job_plane

from aggregator.placement.adapters import kube
from aggregator.placement.core import spares

pytestmark = pytest.mark.apiserver
FAULT = "hypertopo.io/on-fabric-fault"


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with volcano_job_plane() as cp:
        yield cp


def pod_phase(cluster: Cluster, name: str) -> str:
    return str(((cluster.pods().get(name) or {}).get("status") or {}).get("phase") or "")


def test_a_volcano_jobs_replacement_is_bound_on_its_spare_in_the_same_full_leaf(plane: ControlPlane) -> None:
    cluster = Cluster(plane, "vcspare")
    try:
        layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=8)
        leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
        with cluster.scheduler() as sched:
            name = sched.options.scheduler_name
            cluster.api.create(kube.VC_JOBS, job_body(
                cluster, "train", name, 3, annotations={FAULT: "restart-pods", spares.SPARE_REQUEST: "1"},
                networkTopology={"mode": "hard", "highestTierAllowed": 1}))
            placed = cluster.wait_bound(3, timeout=40)
            leaf = {leaf_of[n] for n in placed.values()}
            assert len(leaf) == 1
            group = wait_for("the spare on the Job's PodGroup", lambda: (g := podgroup_of(cluster, "train"))
                             and spares.RESERVED in (g["metadata"].get("annotations") or {}) and g, timeout=20)
            spare_nodes = json.loads(group["metadata"]["annotations"][spares.RESERVED])
            assert len(spare_nodes) == 1 and leaf_of[spare_nodes[0]] in leaf and spare_nodes[0] not in placed.values()
            spare = spare_nodes[0]
            wait_for("Job Running", lambda: job_phase(cluster, "train") == "Running", timeout=30)

            # the other leaf goes to a second Job; a third (one node) finds only the spare: it waits
            cluster.api.create(kube.VC_JOBS, job_body(cluster, "fill", name, 4,
                                                      networkTopology={"mode": "hard", "highestTierAllowed": 1}))
            cluster.wait_bound(7, timeout=40)
            cluster.api.create(kube.VC_JOBS, job_body(cluster, "side", name, 1))
            wait_for("the side Job told the spare is reserved", lambda: [
                e for e in cluster.events("FailedScheduling") if "reserved as another gang's spares" in e["message"]],
                timeout=40)
            assert spare not in cluster.placement().values()
            cluster.api.delete(kube.VC_JOBS, "side", namespace=cluster.ns)

            victim_pod, victim_node = sorted((p, n) for p, n in placed.items())[0]
            start = time.monotonic()
            cluster.taint(victim_node)
            wait_for("the failed node's pod evicted", lambda: victim_node not in cluster.placement().values(), timeout=30)
            evicted = time.monotonic() - start
            node = wait_for("the replacement bound", lambda: cluster.placement().get(victim_pod), timeout=40)
            bound = time.monotonic() - start
            assert node == spare and leaf_of[node] in leaf
            wait_for("the replacement Running", lambda: pod_phase(cluster, victim_pod) == "Running", timeout=30)
            running = time.monotonic() - start
            train = {p: n for p, n in cluster.placement().items() if p.startswith("train-")}
            assert len(train) == 3 and {leaf_of[n] for n in train.values()} == leaf  # the tier did not rise
            print(f"\nVolcano Job with a warm spare: fault on {victim_node} -> evicted {evicted:.2f}s, "
                  f"-> bound on spare {spare} {bound:.2f}s, -> Running {running:.2f}s")
    finally:
        cluster.cleanup()
