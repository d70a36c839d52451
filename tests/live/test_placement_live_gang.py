"""The live scheduler on the real API server with kwok nodes: gangs land whole inside one leaf,
wait for minMember, and an unsatisfiable hard limit leaves them Pending with a FailedScheduling
event saying why."""

from __future__ import annotations

import pytest
from placement_live import Cluster, wait_for

pytestmark = pytest.mark.apiserver


def leaves_used(layout: dict[str, list[str]], placement: dict[str, str]) -> set[str]:
    leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
    return {leaf_of[n] for n in placement.values()}


def test_gang_of_eight_one_gpu_pods_lands_inside_one_leaf_and_runs(cluster: Cluster) -> None:
    # 2 leaves x 4 nodes x 2 GPUs: 8 one-GPU pods need a whole leaf (4 nodes x 2 = 8); spreading
    # over both leaves would also fit, so only topology-aware placement keeps it in one.
    layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=2)
    with cluster.scheduler():
        cluster.add_gang("train", 8)
        placement = cluster.wait_bound(8)
        assert len(leaves_used(layout, placement)) == 1
        assert len(set(placement.values())) == 4  # 2 pods per 2-GPU node: no node over-booked
        wait_for("pods Running (kwok)", lambda: all(p["status"].get("phase") == "Running" for p in cluster.pods().values()))
        wait_for("PodGroup Running", lambda: cluster.podgroup("train").get("status", {}).get("phase") == "Running")
        status = cluster.podgroup("train")["status"]
        assert status["scheduled"] == 8 and status["running"] == 8
        assert status["scheduleStartTime"]


def test_gang_waits_for_min_member_pods_then_binds_all(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=1, per_leaf=2, gpus=8)
    with cluster.scheduler(gang_wait_event_seconds=0.0):
        cluster.add_gang("wait", 3, min_member=4)
        messages = wait_for("a waiting event", lambda: {e["message"] for e in cluster.events("FailedScheduling")}
                            & {"pod group wait has 3 pods, minMember is 4: waiting for 1 more"})
        assert len(messages) == 1
        assert cluster.placement() == {}  # 3 of 4: nothing is bound early
        cluster.add_gang_pods("wait", ["wait-3"])
        cluster.wait_bound(4)


def test_unsatisfiable_hard_limit_stays_pending_with_failed_scheduling_event(cluster: Cluster) -> None:
    # each leaf holds 4 nodes x 2 GPUs = 8 one-GPU pods; 12 pods under a hard leaf limit cannot fit
    cluster.leaf_spine(leaves=2, per_leaf=4, gpus=2)
    with cluster.scheduler():
        limit = {"volcano.sh/network-topology-mode": "hard", "hypertopo.io/highest-tier-name": "leaf"}
        cluster.add_gang("big", 12, annotations=limit)
        events = cluster.wait_events("FailedScheduling", 12)
        pod_events = [e for e in events if e["involvedObject"]["kind"] == "Pod"]
        assert {e["type"] for e in pod_events} == {"Warning"}
        message = pod_events[0]["message"]
        assert "needs 12 pods" in message and "holds 8" in message and "4 pods (4 GPUs) short" in message
        assert cluster.placement() == {}
        # the status writer's thread writes the PodGroup status, in no order with the event writers
        wait_for("PodGroup status written", lambda: cluster.podgroup("big").get("status", {}).get("phase"))
        assert cluster.podgroup("big").get("status", {}).get("phase") == "Pending"


def test_soft_limit_climbs_to_the_spine_when_one_leaf_is_too_small(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=2)
    with cluster.scheduler():
        cluster.add_gang("soft", 12, annotations={"volcano.sh/network-topology-mode": "soft",
                                                  "volcano.sh/network-topology-highest-tier": "1"})
        placement = cluster.wait_bound(12)
        assert len(leaves_used(layout, placement)) == 2


def test_single_pods_are_best_fit_and_never_double_booked(cluster: Cluster) -> None:
    # one node with 8 GPUs, one with 3; three 3-GPU pods: best fit fills the 3-GPU node first,
    # then two go to the 8-GPU node (3+3 <= 8); a fourth 3-GPU pod cannot fit anywhere (8-6 = 2).
    cluster.add_nodes([f"big-{cluster.tag}"], gpus=8)
    cluster.add_nodes([f"small-{cluster.tag}"], gpus=3)
    with cluster.scheduler() as sched:
        name = sched.options.scheduler_name
        cluster.add_pods([cluster.pod_body(f"solo-{i}", name, gpus=3) for i in range(4)])
        cluster.wait_bound(3)
        events = cluster.wait_events("FailedScheduling")
        placement = cluster.placement()
        assert sorted(placement.values()) == sorted([f"big-{cluster.tag}"] * 2 + [f"small-{cluster.tag}"])
        assert events[0]["involvedObject"]["name"] not in placement
