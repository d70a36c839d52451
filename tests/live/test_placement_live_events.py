"""The live scheduler writes `Scheduled` events as kube-scheduler and Volcano do (issue 23): on the
real API server with kwok nodes, each pod of a bound gang gets a Normal `Scheduled` event
"Successfully assigned NS/POD to NODE" naming the node it was bound to, and its PodGroup
(scheduler-plugins' or Volcano's) a Normal `Scheduled` event "pod group is ready"; a gang that
does not fit gets none."""

from __future__ import annotations

from typing import Any

import pytest
from placement_live import Cluster, wait_for
from test_placement_live_volcano import add_vc_podgroup, queue, vc_pod

from aggregator.placement.adapters import kube

pytestmark = pytest.mark.apiserver


def by_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["involvedObject"]["kind"] == kind]


def check_pod_events(cluster: Cluster, events: list[dict[str, Any]], placement: dict[str, str], scheduler: str) -> None:
    pods = cluster.pods()
    assert sorted(e["involvedObject"]["name"] for e in events) == sorted(placement)
    for event in events:
        name = event["involvedObject"]["name"]
        assert event["type"] == "Normal" and event["source"]["component"] == scheduler
        assert event["message"] == f"Successfully assigned {cluster.ns}/{name} to {placement[name]}"
        assert event["involvedObject"]["uid"] == pods[name]["metadata"]["uid"]


def test_a_bound_gang_has_a_scheduled_event_on_every_pod_and_on_its_podgroup(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=1, per_leaf=2, gpus=2)
    with cluster.scheduler() as sched:
        cluster.add_gang("ev", 4)
        placement = cluster.wait_bound(4)
        events = cluster.wait_events("Scheduled", 5)
    check_pod_events(cluster, by_kind(events, "Pod"), placement, sched.options.scheduler_name)
    [group_event] = by_kind(events, "PodGroup")
    group = cluster.podgroup("ev")
    assert group_event["involvedObject"]["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group_event["involvedObject"]["uid"] == group["metadata"]["uid"]
    assert (group_event["type"], group_event["message"]) == ("Normal", "pod group is ready")


def test_a_volcano_podgroup_gets_volcanos_scheduled_event(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=1, per_leaf=2, gpus=8)
    with cluster.scheduler() as sched, queue(cluster, f"q-{cluster.tag}") as q:
        name = sched.options.scheduler_name
        add_vc_podgroup(cluster, "vev", 2, queue=q)
        cluster.add_pods([vc_pod(cluster, f"vev-{i}", "vev", name) for i in range(2)])
        placement = cluster.wait_bound(2)
        events = cluster.wait_events("Scheduled", 3)
    check_pod_events(cluster, by_kind(events, "Pod"), placement, name)
    [group_event] = by_kind(events, "PodGroup")
    group = cluster.api.get(kube.VC_PODGROUPS, "vev", namespace=cluster.ns)
    assert group_event["involvedObject"]["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group_event["involvedObject"]["uid"] == group["metadata"]["uid"]
    assert (group_event["type"], group_event["message"]) == ("Normal", "pod group is ready")


def test_a_gang_that_does_not_fit_has_no_scheduled_event(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=1, per_leaf=1, gpus=2)
    with cluster.scheduler():
        cluster.add_gang("toobig", 3)
        cluster.wait_events("FailedScheduling", 3)  # decided (and refused) before we look
        wait_for("the PodGroup's FailedScheduling event", lambda: by_kind(cluster.events("FailedScheduling"), "PodGroup"))
    assert cluster.events("Scheduled") == []
    assert cluster.placement() == {}
