"""Grey failures on the real API server with kwok nodes: a new gang goes to the healthy one of two
equal leaves when the other has a degraded member, and `restart-pods-on-degraded` moves a gang's
pod off a degraded node only after the configured time, while a gang without it stays put.

The aggregator's outputs are written as it writes them: the node annotation
`hypertopo.io/fabric-degraded` (`--mark-degraded`) and the leaf's `FabricDegraded` condition."""

from __future__ import annotations

import time

import pytest
from placement_live import Cluster, wait_for

from aggregator.live.node_marks import DEGRADED_ANNOTATION
from aggregator.placement.adapters import kube

pytestmark = pytest.mark.apiserver


def mark_degraded(cluster: Cluster, node: str) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster._raw("PATCH", kube.NODES.path(name=node), body={"metadata": {"annotations": {DEGRADED_ANNOTATION: since}}},
                 content_type=kube.MERGE_PATCH)


def set_fabric_degraded(cluster: Cluster, leaf: str, node: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [
        {"type": "Ready", "status": "True", "reason": "MembersHealthy", "message": "all 2 nodes healthy",
         "lastTransitionTime": stamp},
        {"type": "FabricDegraded", "status": "True", "reason": "RDMADegraded", "lastTransitionTime": stamp,
         "message": f"1 of 2 nodes degraded (tolerates 0% of nodes): {node}: RDMA mlx5_0/1 error-rate: 12/s"},
    ]
    cluster.api.patch_status(kube.HYPERNODES, None, leaf, {"status": {"conditions": conditions}})


def leaf_of(layout: dict[str, list[str]]) -> dict[str, str]:
    return {n: leaf for leaf, nodes in layout.items() for n in nodes}


def test_a_new_gang_goes_to_the_healthy_leaf_of_two_equal_ones(cluster: Cluster) -> None:
    # 3 leaves x 2 nodes x 8 GPUs. With all equal, a 2-pod gang goes to the first leaf by name
    # (shown by the first gang); then leaf 1 gets a degraded member and leaves 1 and 2 are equal:
    # by name the second gang would go to leaf 1, the healthy leaf 2 must win.
    layout = cluster.leaf_spine(leaves=3, per_leaf=2, gpus=8)
    leaves = sorted(layout)
    with cluster.scheduler() as sched:
        cluster.add_gang("first", 2, gpus=8)
        first = cluster.wait_bound(2)
        assert {leaf_of(layout)[n] for n in first.values()} == {leaves[0]}

        degraded_node = layout[leaves[1]][0]
        mark_degraded(cluster, degraded_node)
        set_fabric_degraded(cluster, leaves[1], degraded_node)
        wait_for("the scheduler sees the degraded node", lambda: degraded_node in sched._degraded_nodes)
        cluster.add_gang("second", 2, gpus=8)
        placed = cluster.wait_bound(4)
        second = {p: n for p, n in placed.items() if p.startswith("second-")}
        assert {leaf_of(layout)[n] for n in second.values()} == {leaves[2]}, second
        # never failed: no eviction, no failed node, the degraded leaf stays usable
        assert sched.metrics.failed_nodes._value.get() == 0 and sched.evictions._offered == set()

        # soft: a gang that needs the degraded leaf's nodes still gets them
        cluster.add_gang("third", 2, gpus=8)
        third = {p: n for p, n in cluster.wait_bound(6).items() if p.startswith("third-")}
        assert sorted(third.values()) == sorted(layout[leaves[1]])


def test_restart_pods_on_degraded_moves_a_pod_only_after_the_configured_time(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    after = 3.0
    with cluster.scheduler(degraded_restart_seconds=after) as sched:
        # one 4-GPU pod each: best fit puts both on the same node
        cluster.add_gang("asks", 1, gpus=4, on_fault="restart-pods-on-degraded")
        cluster.wait_bound(1)
        cluster.add_gang("plain", 1, gpus=4, on_fault="restart-pods")
        before = cluster.wait_bound(2)
        node = before["asks-0"]
        assert before["plain-0"] == node
        uid = cluster.pods()["plain-0"]["metadata"]["uid"]

        started = time.monotonic()
        mark_degraded(cluster, node)
        time.sleep(after / 2)
        assert set(cluster.pods()) == {"asks-0", "plain-0"} and sched.evictions._offered == set()
        wait_for("asks-0 evicted", lambda: "asks-0" not in cluster.pods(), timeout=after + 15)
        waited = time.monotonic() - started
        print(f"restart-pods-on-degraded: evicted {waited:.1f}s after the mark (configured {after:.0f}s)")
        assert waited >= after
        assert cluster.placement() == {"plain-0": node}  # restart-pods alone: not moved for a grey failure
        assert cluster.pods()["plain-0"]["metadata"]["uid"] == uid
        # the event is written after the eviction's answer, by the scheduler's event writers: it may
        # reach the API server after the pod is gone
        [event] = cluster.wait_events("FabricFaultEviction")
        assert event["involvedObject"]["name"] == "asks-0" and "degraded" in event["message"]
        assert sched.metrics.failed_nodes._value.get() == 0

        # the owner's replacement avoids the degraded node's leaf, the other being as good
        cluster.add_gang_pods("asks", ["asks-r0"], gpus=4)
        replaced = cluster.wait_bound(2)
        assert leaf_of(layout)[replaced["asks-r0"]] != leaf_of(layout)[node]
