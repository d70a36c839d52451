"""The fault-storm breaker live, on the real API server with kwok nodes: every node of one spine
fails at once (the fabric taint on all of them in parallel, as an aggregator that lost its feed
would write). The breaker opens, nothing is evicted, the ConfigMap, the event and the metric say
so; it closes after a clear hold-down when the nodes heal (still nothing evicted), or at once when
an operator annotates the ConfigMap, and then the pods still on failed nodes are evicted. A single
leaf failing on the same fabric is remediated as before."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from placement_live import Cluster, parallel, wait_for

from aggregator.placement.adapters import kube
from aggregator.placement.core.breaker import BreakerPolicy
from aggregator.placement.live.breaker_control import CLOSE_ANNOTATION
from aggregator.placement.live.scheduler import Scheduler

pytestmark = pytest.mark.apiserver
CONFIGMAPS = kube.Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)


def two_spines(cluster: Cluster) -> dict[str, list[str]]:
    """core -> 2 spines -> 2 leaves each -> 2 nodes each (8 nodes): spine -> its nodes. The
    derived threshold is 3 (a tenth is 1, a spine 4, a leaf 2: always more than a leaf)."""
    spines: dict[str, list[str]] = {}
    for s in range(2):
        leaves = []
        for leaf in range(2):
            nodes = [f"n-{cluster.tag}-{s}{leaf}{i}" for i in range(2)]
            cluster.add_nodes(nodes)
            name = f"leaf-{cluster.tag}-{s}{leaf}"
            cluster.add_hypernode(name, 1, "leaf", nodes=nodes)
            leaves.append(name)
            spines.setdefault(f"spine-{cluster.tag}-{s}", []).extend(nodes)
        cluster.add_hypernode(f"spine-{cluster.tag}-{s}", 2, "spine", children=leaves)
    cluster.add_hypernode(f"core-{cluster.tag}", 3, "core", children=list(spines))
    return spines


def untaint(cluster: Cluster, node: str) -> None:
    cluster._raw("PATCH", kube.NODES.path(name=node), body={"spec": {"taints": None}}, content_type=kube.MERGE_PATCH)


def breaker_map(cluster: Cluster, sched: Scheduler) -> dict[str, Any] | None:
    with contextlib.suppress(kube.ApiError):
        obj: dict[str, Any] = cluster.api.get(CONFIGMAPS, f"{sched.options.scheduler_name}-remediation",
                                              namespace=cluster.ns)
        return obj
    return None


def state_is(cluster: Cluster, sched: Scheduler, state: str) -> dict[str, Any] | None:
    obj = breaker_map(cluster, sched)
    return obj if obj and obj.get("data", {}).get("state") == state else None


def is_open(sched: Scheduler) -> float | None:
    value: float | None = sched.metrics.registry.get_sample_value("hypertopo_remediation_breaker_open")
    return value


@contextlib.contextmanager
def storm_setup(cluster: Cluster, **policy: Any) -> Iterator[tuple[Scheduler, dict[str, list[str]], dict[str, str]]]:
    """Two spines, one restart-pods gang of 4 pods filling each spine's 4 nodes, all bound."""
    spines = two_spines(cluster)
    with cluster.scheduler(namespace=cluster.ns, breaker=BreakerPolicy(**policy)) as sched:
        for s in range(2):
            cluster.add_gang(f"g{s}", 4, gpus=8, on_fault="restart-pods")
        placed = cluster.wait_bound(8)
        yield sched, spines, placed


def test_a_whole_spine_failing_at_once_opens_the_breaker_and_nothing_is_evicted_until_an_operator_closes_it(
        cluster: Cluster) -> None:
    with storm_setup(cluster) as (sched, spines, placed):
        spine = sorted(spines)[0]
        started = time.monotonic()
        parallel(cluster.taint, spines[spine])  # the whole spine at once
        opened = wait_for("the breaker's ConfigMap says Open", lambda: state_is(cluster, sched, "Open"), timeout=15)
        opened_s = time.monotonic() - started
        data = opened["data"]
        assert data["reason"] == "StormDetected" and data["threshold"] == "3"
        assert int(data["failedInWindow"]) >= 3
        assert json.loads(data["condition"])["type"] == "RemediationBreakerOpen"
        assert is_open(sched) == 1
        event = wait_for("a RemediationBreakerOpen event", lambda: cluster.events("RemediationBreakerOpen"))
        assert event[0]["type"] == "Warning" and event[0]["involvedObject"]["kind"] == "ConfigMap"
        wait_for("all 4 nodes seen failed", lambda: sched.metrics.failed_nodes._value.get() == 4)
        time.sleep(2.0)  # several cycles with 4 failed nodes under restart-pods gangs
        assert cluster.placement() == placed  # nothing evicted
        assert sched.metrics.registry.get_sample_value("hypertopo_scheduler_evictions_total",
                                                       {"outcome": "evicted"}) is None

        cluster.api.patch(CONFIGMAPS, cluster.ns, f"{sched.options.scheduler_name}-remediation",
                          {"metadata": {"annotations": {CLOSE_ANNOTATION: "close"}}})
        closed = wait_for("the breaker closed by the operator", lambda: state_is(cluster, sched, "Closed"), timeout=15)
        assert closed["data"]["reason"] == "OperatorClosed"
        assert CLOSE_ANNOTATION not in (closed["metadata"].get("annotations") or {})  # taken away with the close
        victims = {p for p, n in placed.items() if n in spines[spine]}
        wait_for("the failed spine's pods evicted once closed", lambda: not victims & set(cluster.pods()), timeout=20)
        assert {p: n for p, n in cluster.placement().items()} == {p: n for p, n in placed.items() if p not in victims}
        assert is_open(sched) == 0
        print(f"breaker: whole spine tainted -> Open in {opened_s:.2f}s")


def test_a_storm_that_heals_closes_the_breaker_after_the_hold_down_without_any_eviction(cluster: Cluster) -> None:
    with storm_setup(cluster, hold_seconds=2.0) as (sched, spines, placed):  # the window stays 300 s
        nodes = spines[sorted(spines)[0]]
        parallel(cluster.taint, nodes)
        wait_for("Open", lambda: state_is(cluster, sched, "Open"), timeout=15)
        parallel(lambda n: untaint(cluster, n), nodes)
        healed = time.monotonic()
        closed = wait_for("Closed after the hold-down", lambda: state_is(cluster, sched, "Closed"), timeout=30)
        assert time.monotonic() - healed >= 2.0
        assert closed["data"]["reason"] == "StormCleared"
        wait_for("a RemediationBreakerClosed event", lambda: cluster.events("RemediationBreakerClosed"))
        assert cluster.placement() == placed  # the false alarm cost no pod
        assert sched.evictions._offered == set()


def test_one_leaf_failing_on_the_same_fabric_is_still_remediated(cluster: Cluster) -> None:
    with storm_setup(cluster) as (sched, spines, placed):
        leaf_nodes = spines[sorted(spines)[0]][:2]  # the first leaf of the first spine
        parallel(cluster.taint, leaf_nodes)
        victims = {p for p, n in placed.items() if n in leaf_nodes}
        wait_for("the leaf's pods evicted", lambda: not victims & set(cluster.pods()), timeout=20)
        assert is_open(sched) in (None, 0.0) and sched.breaker.breaker.last[2] == 3


def test_a_spine_hypernode_going_not_ready_opens_the_breaker_too(cluster: Cluster) -> None:
    """The same storm as the aggregator reports a dead spine switch: one HyperNode condition, every
    node below it failed at once; nothing is evicted."""
    with storm_setup(cluster) as (sched, spines, placed):
        spine = sorted(spines)[0]
        cluster.set_hypernode_ready(spine, "False", reason="SpineDown")
        opened = wait_for("Open", lambda: state_is(cluster, sched, "Open"), timeout=15)
        assert opened["data"]["failedNow"] == "4" and opened["data"]["reason"] == "StormDetected"
        time.sleep(sched.options.breaker.settle_seconds + 1.0)  # past the settle time: still no eviction
        assert cluster.placement() == placed and sched.evictions._offered == set()
