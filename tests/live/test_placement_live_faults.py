"""Fault-driven rescheduling on the real API server with kwok nodes.

The test plays the workload controller for bare pods: when the scheduler evicts a pod (Eviction
API; kwok finishes the deletion as a kubelet would), the test creates a replacement with the same
gang label, as a Job/JobSet would; the scheduler then re-places it next to the rest of the gang."""

from __future__ import annotations

import time
from typing import Any

import pytest
from placement_live import Cluster, wait_for

pytestmark = pytest.mark.apiserver


def leaf_of(layout: dict[str, list[str]]) -> dict[str, str]:
    return {n: leaf for leaf, nodes in layout.items() for n in nodes}


def uids(cluster: Cluster) -> dict[str, str]:
    return {name: p["metadata"]["uid"] for name, p in cluster.pods().items()}


def gone(cluster: Cluster, names: set[str]) -> bool:
    return not names & set(cluster.pods())


def evictions(sched: Any, outcome: str) -> float | None:
    """The scheduler's eviction counter for `outcome` (None where never counted)."""
    value: float | None = sched.metrics.registry.get_sample_value("hypertopo_scheduler_evictions_total",
                                                                  {"outcome": outcome})
    return value


def test_restart_pods_moves_only_the_failed_nodes_pods_next_to_the_rest_of_the_gang(cluster: Cluster) -> None:
    # 2 leaves x 4 nodes x 8 GPUs; 6 pods x 4 GPUs fill 3 nodes of one leaf (2 per node).
    layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=8)
    with cluster.scheduler() as sched:
        cluster.add_gang("train", 6, gpus=4, on_fault="restart-pods")
        before = cluster.wait_bound(6)
        leaf = {leaf_of(layout)[n] for n in before.values()}
        assert len(leaf) == 1
        before_uids = uids(cluster)
        failed = sorted(before.values())[0]
        victims = {p for p, n in before.items() if n == failed}
        assert len(victims) == 2

        cluster.taint(failed)
        wait_for("evicted pods gone", lambda: gone(cluster, victims))
        # the others were left alone: same pods (UIDs), same nodes
        survivors = {p: n for p, n in cluster.placement().items()}
        assert survivors == {p: n for p, n in before.items() if p not in victims}
        assert all(uids(cluster)[p] == before_uids[p] for p in survivors)

        cluster.add_gang_pods("train", [f"train-r{i}" for i in range(2)], gpus=4)
        after = cluster.wait_bound(6)
        replacements = {p: n for p, n in after.items() if p.startswith("train-r")}
        # the leaf's free 4th node holds both (2 x 4 GPUs = 8); the other leaf is all free but farther
        assert {leaf_of(layout)[n] for n in replacements.values()} == leaf
        assert failed not in replacements.values()
        # the eviction thread reports each outcome after its API call returns; the scheduler thread
        # then counts it and hands the event to the event writers: no ordering with the pods' fate
        # on the API server, so wait for both before reading them
        wait_for("both evictions counted", lambda: (evictions(sched, "evicted") or 0) >= 2)
        assert evictions(sched, "evicted") == 2
        messages = {e["involvedObject"]["name"] for e in cluster.wait_events("FabricFaultEviction", 2)}
        assert messages == victims


def test_restart_gang_evicts_every_pod_of_the_gang(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    with cluster.scheduler():
        cluster.add_gang("whole", 4, gpus=4, on_fault="restart-gang")
        before = cluster.wait_bound(4)
        cluster.taint(sorted(before.values())[0])
        wait_for("the whole gang gone", lambda: gone(cluster, set(before)))
        cluster.add_gang_pods("whole", [f"whole-r{i}" for i in range(4)], gpus=4)
        after = cluster.wait_bound(4)
        assert sorted(before.values())[0] not in after.values()


def test_policy_none_leaves_the_gang_on_a_failed_node(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=1, per_leaf=2, gpus=8)
    with cluster.scheduler() as sched:
        cluster.add_gang("stay", 2, gpus=4)  # no annotation: policy none
        before = cluster.wait_bound(2)
        cluster.taint(next(iter(before.values())))
        # the cycle that counts the failed node is the one that would have queued evictions; it sets
        # the gauge first and offers evictions after, so wait for that cycle to finish (it ends by
        # recording the state generation it scheduled, which is below `seen` until it is done)
        wait_for("the fault seen", lambda: sched.metrics.failed_nodes._value.get() == 1)
        seen = sched.state.generation
        wait_for("the cycle that saw the fault finished", lambda: sched._scheduled_gen >= seen)
        assert sched.evictions._offered == set()
        assert cluster.placement() == before


def test_hypernode_unknown_is_followed_only_after_the_grace_period(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    grace = 2.0
    with cluster.scheduler(unknown_grace_seconds=grace) as sched:
        cluster.add_gang("a", 2, gpus=8, on_fault="restart-pods")
        first = cluster.wait_bound(2)
        leaf = leaf_of(layout)[next(iter(first.values()))]
        assert {leaf_of(layout)[n] for n in first.values()} == {leaf}

        started = time.monotonic()
        cluster.set_hypernode_ready(leaf, "Unknown", reason="AgentStale")
        wait_for("Unknown leaf's pods evicted after the grace", lambda: gone(cluster, set(first)), timeout=grace + 15)
        assert time.monotonic() - started >= grace
        assert sched.metrics.failed_nodes._value.get() == 2

        # replacements avoid the leaf that is still Unknown (past its grace)
        cluster.add_gang_pods("a", [f"b-{i}" for i in range(2)], gpus=8)
        second = cluster.wait_bound(2)
        assert {leaf_of(layout)[n] for n in second.values()} == set(layout) - {leaf}


def test_hypernode_ready_false_is_followed_at_once_and_its_nodes_avoided(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    # a grace far longer than the test: only Ready=False (no grace) can explain the eviction
    with cluster.scheduler(unknown_grace_seconds=3600) as sched:
        cluster.add_gang("a", 2, gpus=8, on_fault="restart-pods")
        first = cluster.wait_bound(2)
        leaf = leaf_of(layout)[next(iter(first.values()))]
        cluster.set_hypernode_ready(leaf, "False", reason="SwitchDown")
        wait_for("Ready=False leaf's pods evicted", lambda: gone(cluster, set(first)))
        cluster.add_gang_pods("a", [f"b-{i}" for i in range(2)], gpus=8)
        second = cluster.wait_bound(2)
        assert {leaf_of(layout)[n] for n in second.values()} == set(layout) - {leaf}
        assert sched.faults.unknown_since == {}
