"""Live gang health and recovery on the real API server with kwok nodes: the FabricHealthy
condition follows HyperNode conditions and node taints within seconds, on scheduler-plugins
PodGroups (annotation) and Volcano PodGroups (status condition, validated by Volcano's CRD), with
an event at each change; a fault recovery is measured (seconds to bound and to Running, tier before
and after) and the whole-time ratio shows as a metric and an annotation, gone with the gang."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from controlplane.harness import ControlPlane
from placement_live import Cluster, wait_for

from aggregator.placement.adapters import kube
from aggregator.placement.core import gang_health
from aggregator.placement.live.gang_watch import RATIO_ANNOTATION

pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module", autouse=True)
def default_queue(apiserver: ControlPlane) -> None:
    """Volcano's `default` queue (vc-scheduler creates it at start): Volcano PodGroups need it."""
    body = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "default"},
            "spec": {"weight": 1, "reclaimable": True}}
    apiserver.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=json.dumps(body))


def health(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The FabricHealthy condition on scheduler-plugins PodGroup `name` (its annotation)."""
    return gang_health.current(cluster.podgroup(name), volcano=False)


def status_of(cluster: Cluster, name: str, status: str) -> dict[str, Any] | None:
    cond = health(cluster, name)
    return cond if cond and cond["status"] == status else None


def set_conditions(cluster: Cluster, hypernode: str, ready: str = "True", degraded: str = "False") -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conds = [{"type": "Ready", "status": ready, "reason": "Test", "message": "test", "lastTransitionTime": now},
             {"type": "FabricDegraded", "status": degraded, "reason": "RDMADegraded" if degraded == "True" else "None",
              "message": "1 port at half rate", "lastTransitionTime": now}]
    cluster.api.patch_status(kube.HYPERNODES, None, hypernode, {"status": {"conditions": conds}})


def events_of(cluster: Cluster, reason: str, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(reason) if e["involvedObject"]["name"] == name]


def sample(sched: Any, name: str, labels: dict[str, str] | None = None) -> float | None:
    value: float | None = sched.metrics.registry.get_sample_value(name, labels or {})
    return value


def test_fabric_healthy_follows_a_hypernode_failing_degrading_and_healing_within_seconds(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    with cluster.scheduler() as sched:
        cluster.add_gang("job", 2, gpus=8)  # policy none: its pods stay where they are
        placed = cluster.wait_bound(2)
        leaf = next(leaf for leaf, nodes in layout.items() if set(nodes) == set(placed.values()))
        healthy = wait_for("FabricHealthy=True on the placed gang", lambda: status_of(cluster, "job", "True"))
        assert healthy["reason"] == "FabricHealthy"
        assert events_of(cluster, "FabricHealthy", "job") == []  # the first True is no change

        started = time.monotonic()
        set_conditions(cluster, leaf, ready="False")
        failed = wait_for("FabricHealthy=False", lambda: status_of(cluster, "job", "False"), timeout=10)
        failed_s = time.monotonic() - started
        assert failed["reason"] == "FabricFailed"
        for pod, node in placed.items():  # every member named with its node and the HyperNode's reason
            assert f"{node} (HyperNode {leaf} Ready=False" in failed["message"] and pod in failed["message"]
        event = wait_for("a FabricUnhealthy event", lambda: events_of(cluster, "FabricUnhealthy", "job"))
        assert event[0]["type"] == "Warning" and event[0]["involvedObject"]["kind"] == "PodGroup"

        started = time.monotonic()
        set_conditions(cluster, leaf, ready="True", degraded="True")
        degraded = wait_for("FabricDegraded", lambda: (c := health(cluster, "job")) and c["reason"] == "FabricDegraded"
                            and c, timeout=10)
        degraded_s = time.monotonic() - started
        assert degraded["status"] == "False" and "FabricDegraded: 1 port at half rate" in degraded["message"]

        started = time.monotonic()
        set_conditions(cluster, leaf)
        wait_for("FabricHealthy=True again", lambda: status_of(cluster, "job", "True"), timeout=10)
        healed_s = time.monotonic() - started
        wait_for("a FabricHealthy event", lambda: events_of(cluster, "FabricHealthy", "job"))
        assert sample(sched, "hypertopo_gang_fabric_healthy", {"status": "True"}) == 1
        print(f"FabricHealthy follows the HyperNode: failed {failed_s:.2f}s, degraded {degraded_s:.2f}s, "
              f"healed {healed_s:.2f}s")


def test_a_stale_hypernode_makes_the_gang_unknown(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=1, per_leaf=2, gpus=8)
    with cluster.scheduler(unknown_grace_seconds=3600):  # never failed within the test: only Unknown
        cluster.add_gang("job", 2, gpus=8)
        cluster.wait_bound(2)
        wait_for("FabricHealthy=True", lambda: status_of(cluster, "job", "True"))
        set_conditions(cluster, next(iter(layout)), ready="Unknown")
        unknown = wait_for("FabricHealthy=Unknown", lambda: status_of(cluster, "job", "Unknown"), timeout=10)
        assert unknown["reason"] == "FabricUnknown" and "Ready=Unknown" in unknown["message"]
        wait_for("a FabricHealthUnknown event", lambda: events_of(cluster, "FabricHealthUnknown", "job"))


def add_vc_gang(cluster: Cluster, name: str, pods: int, scheduler: str) -> None:
    meta = {"name": name, "namespace": cluster.ns, "labels": {"hypertopo.io/test": cluster.tag}}
    cluster.api.create(kube.VC_PODGROUPS, {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                                           "metadata": meta, "spec": {"minMember": pods}})
    cluster.add_pods([cluster.pod_body(f"{name}-{i}", scheduler, gpus=8,
                                       annotations={"scheduling.k8s.io/group-name": name}) for i in range(pods)])


def vc_health(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return gang_health.current(cluster.api.get(kube.VC_PODGROUPS, name, namespace=cluster.ns), volcano=True)


def test_a_volcano_podgroup_carries_fabric_healthy_as_a_status_condition(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    with cluster.scheduler():
        add_vc_gang(cluster, "vc", 2, cluster.scheduler_name)
        placed = cluster.wait_bound(2)
        wait_for("FabricHealthy=True in the Volcano status",
                 lambda: (c := vc_health(cluster, "vc")) and c["status"] == "True")
        node = sorted(placed.values())[0]
        cluster.taint(node)
        cond = wait_for("FabricHealthy=False in the Volcano status",
                        lambda: (c := vc_health(cluster, "vc")) and c["status"] == "False" and c, timeout=10)
        assert cond["reason"] == "FabricFailed" and f"{node} (node {node} has taint" in cond["message"]
        group = cluster.api.get(kube.VC_PODGROUPS, "vc", namespace=cluster.ns)
        types = [c["type"] for c in group["status"]["conditions"]]
        assert types.count("FabricHealthy") == 1 and "Scheduled" in types  # Volcano's own kept
        assert group["status"]["phase"] == "Running"


def test_remediate_only_keeps_fabric_healthy_on_a_gang_another_scheduler_placed(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=1, per_leaf=2, gpus=8)
    nodes = layout[f"leaf-{cluster.tag}-0"]
    add_vc_gang(cluster, "other", 2, "volcano")
    cluster.api.patch(kube.VC_PODGROUPS, cluster.ns, "other",
                      {"metadata": {"annotations": {"hypertopo.io/on-fabric-fault": "restart-pods"}}})
    for i, node in enumerate(nodes):  # the test plays vc-scheduler
        cluster._raw("POST", kube.PODS.path(namespace=cluster.ns, name=f"other-{i}", sub="binding"),
                     body={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": f"other-{i}"},
                           "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    with cluster.scheduler(remediate_only=True):
        wait_for("FabricHealthy=True", lambda: (c := vc_health(cluster, "other")) and c["status"] == "True")
        cluster.taint(nodes[1])
        event = wait_for("a FabricUnhealthy event naming the member on the failed node",
                         lambda: [e for e in events_of(cluster, "FabricUnhealthy", "other")
                                  if f"{nodes[1]} (node {nodes[1]} has taint" in e["message"]], timeout=10)
        assert "other-1" in event[0]["message"]
        wait_for("the failed node's pod evicted", lambda: "other-1" not in cluster.pods())
        cond = wait_for("Recovering: a member is gone and not back",
                        lambda: (c := vc_health(cluster, "other")) and c["reason"] == "Recovering" and c, timeout=10)
        assert cond["status"] == "False" and "waiting for 1 of 2" in cond["message"]


def test_a_recovery_is_timed_to_bound_and_running_with_its_tier_and_the_whole_time_ratio(cluster: Cluster) -> None:
    # 2 leaves x 3 nodes: the gang fills 2 nodes of one leaf, its replacement fits on the third
    layout = cluster.leaf_spine(leaves=2, per_leaf=3, gpus=8)
    with cluster.scheduler(health_sweep_seconds=0.5) as sched:
        cluster.add_gang("train", 2, gpus=8, on_fault="restart-pods")
        before = cluster.wait_bound(2)
        wait_for("both members Running", lambda: all(p["status"].get("phase") == "Running"
                                                     for p in cluster.pods().values()))
        wait_for("FabricHealthy=True", lambda: status_of(cluster, "train", "True"))
        ratio = wait_for("the whole-time ratio annotation",
                         lambda: cluster.podgroup("train")["metadata"].get("annotations", {}).get(RATIO_ANNOTATION))
        assert ratio == "1.000"
        victim = sorted(before)[0]
        fault = time.monotonic()
        cluster.taint(before[victim])
        wait_for("the member evicted", lambda: victim not in cluster.pods())
        wait_for("Recovering", lambda: (c := health(cluster, "train")) and c["reason"] == "Recovering")
        cluster.add_gang_pods("train", ["train-r0"], gpus=8)  # the owner's replacement
        after = cluster.wait_bound(2)
        assert {n for leaf, nodes in layout.items() for n in nodes if set(after.values()) <= set(nodes)}
        wait_for("the recovery seen Running", lambda: sample(sched, "hypertopo_gang_recovery_seconds_count",
                                                             {"stage": "running"}))
        wall = time.monotonic() - fault
        bound = sample(sched, "hypertopo_gang_recovery_seconds_sum", {"stage": "bound"})
        running = sample(sched, "hypertopo_gang_recovery_seconds_sum", {"stage": "running"})
        assert bound is not None and running is not None and 0 < bound <= running <= wall
        assert sample(sched, "hypertopo_gang_tier_after_recovery_total", {"tier_before": "1", "tier_after": "1"}) == 1
        wait_for("FabricHealthy=True again", lambda: status_of(cluster, "train", "True"))
        gauge = sample(sched, "hypertopo_gang_whole_time_ratio", {"namespace": cluster.ns, "podgroup": "train"})
        assert gauge is not None and 0 < gauge < 1
        wait_for("the ratio annotation below 1", lambda: float(cluster.podgroup("train")["metadata"]["annotations"]
                                                              [RATIO_ANNOTATION]) < 1)
        print(f"recovery: fault -> bound {bound:.2f}s, -> Running {running:.2f}s (test wall {wall:.2f}s); "
              f"whole-time ratio {gauge:.3f}")

        cluster._raw("DELETE", kube.PODGROUPS.path(namespace=cluster.ns, name="train"))
        wait_for("the per-gang series gone with the gang",
                 lambda: sample(sched, "hypertopo_gang_whole_time_ratio",
                                {"namespace": cluster.ns, "podgroup": "train"}) is None)
        assert ("ns", "train") not in sched.gang_watch.clocks and (cluster.ns, "train") not in sched.gang_watch.tracked
