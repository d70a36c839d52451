"""Warm spares (issue 25.1) on the real API server with kwok nodes.

A gang asking `hypertopo.io/spare-nodes: 1` fills a leaf with its members and its spare; the
reservation is on its PodGroup and survives a scheduler restart; other gangs are kept off the
spare while preemptible work borrows it; when a member's node fails, the borrower is evicted and
the replacement binds on the spare in the same leaf, unless the fault-storm breaker is open: then
the borrower stays until it closes. The spare gauges follow. The test plays the workload
controller: it creates the replacement once the failed pod is gone, as a Job would."""

from __future__ import annotations

import json
import time

import pytest
from placement_live import Cluster, wait_for

from aggregator.placement.adapters import kube
from aggregator.placement.core import spares
from aggregator.placement.core.breaker import BreakerPolicy
from aggregator.placement.live.breaker_control import CLOSE_ANNOTATION
from aggregator.placement.live.scheduler import Scheduler

pytestmark = pytest.mark.apiserver
CONFIGMAPS = kube.Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)


def leaf_of(layout: dict[str, list[str]]) -> dict[str, str]:
    return {n: leaf for leaf, nodes in layout.items() for n in nodes}


def reserved(cluster: Cluster, gang: str) -> list[str] | None:
    value = (cluster.podgroup(gang)["metadata"].get("annotations") or {}).get(spares.RESERVED)
    return json.loads(value) if value is not None else None


def gauge(sched: Scheduler, name: str, **labels: str) -> float:
    value = sched.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def add_preemptible(cluster: Cluster, name: str) -> None:
    body = cluster.pod_body(name, cluster.scheduler_name, gpus=8)
    body["metadata"]["labels"][spares.PREEMPTIBLE_LABEL] = "true"
    cluster.add_pods([body])


def test_a_replacement_binds_on_the_gangs_spare_in_the_same_full_leaf(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=8)
    where = leaf_of(layout)
    with cluster.scheduler() as sched0:
        cluster.add_gang("train", 3, gpus=8, on_fault="restart-pods", annotations={spares.SPARE_REQUEST: "1"})
        first = cluster.wait_bound(3)
        leaf = {where[n] for n in first.values()}
        assert len(leaf) == 1
        spare_nodes = wait_for("spares on the PodGroup", lambda: reserved(cluster, "train"))
        assert len(spare_nodes) == 1 and where[spare_nodes[0]] in leaf and spare_nodes[0] not in first.values()
        spare = spare_nodes[0]
        assert wait_for("the reserved spare counted", lambda: gauge(sched0, "hypertopo_spare_nodes_reserved") == 1)
        assert gauge(sched0, "hypertopo_spare_gangs") == 1 and gauge(sched0, "hypertopo_spare_nodes_borrowed") == 0

    # a new scheduler (a restart) derives the reservation from the PodGroup: an ordinary gang
    # fills the other leaf and does not get the spare
    with cluster.scheduler() as sched:
        cluster.add_gang("other", 4, gpus=8)
        others = cluster.wait_bound(7)
        assert {where[others[f"other-{i}"]] for i in range(4)} == set(layout) - leaf
        cluster.add_gang("late", 1, gpus=8)
        wait_for("the late gang told why it waits", lambda: [
            e for e in cluster.events("FailedScheduling") if "reserved as another gang's spares" in e["message"]])
        assert "late-0" not in cluster.placement()
        cluster._raw("DELETE", f"/api/v1/namespaces/{cluster.ns}/pods/late-0", query={"gracePeriodSeconds": 0})
        wait_for("late gang gone", lambda: "late-0" not in cluster.pods())

        # preemptible work may borrow the spare
        add_preemptible(cluster, "borrow")
        assert cluster.wait_bound(8)["borrow"] == spare
        assert wait_for("the lent spare counted", lambda: gauge(sched, "hypertopo_spare_nodes_borrowed") == 1)
        assert gauge(sched, "hypertopo_spare_nodes_reserved") == 1  # the restarted scheduler counts it too

        victim = sorted(first)[0]
        failed = first[victim]
        fault = time.monotonic()
        cluster.taint(failed)
        wait_for("the failed node's pod evicted", lambda: victim not in cluster.pods(), timeout=30)
        cluster.add_gang_pods("train", ["train-r0"], gpus=8)
        wait_for("the borrower evicted from the spare", lambda: "borrow" not in cluster.pods(), timeout=30)
        after = wait_for("replacement bound", lambda: cluster.placement().get("train-r0"), timeout=30)
        bound = time.monotonic() - fault
        assert after == spare and where[after] in leaf  # same leaf: the gang's tier did not rise
        gang_nodes = {n for p, n in cluster.placement().items() if p.startswith("train")}
        assert len({where[n] for n in gang_nodes}) == 1
        assert wait_for("no spare left on the PodGroup", lambda: reserved(cluster, "train") == [] or None)
        assert sched._reserved.get((cluster.ns, "train")) is None
        assert wait_for("no spare counted", lambda: gauge(sched, "hypertopo_spare_nodes_reserved") == 0)
        assert gauge(sched, "hypertopo_spare_nodes_borrowed") == 0 and gauge(sched, "hypertopo_spare_gangs") == 0
        print(f"\nspare recovery: fault -> replacement bound on spare {spare} in {bound:.2f}s "
              f"(includes the breaker's settle time and the borrower's eviction)")


def test_an_open_breaker_keeps_the_borrower_on_the_spare_until_it_closes(cluster: Cluster) -> None:
    """A fault storm (here: the breaker's threshold is one node) holds every eviction back, the
    reclaim of a spare from preemptible work too; once an operator closes the breaker, the borrower
    is evicted and the replacement binds on the spare."""
    layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=8)
    where = leaf_of(layout)
    policy = BreakerPolicy(threshold_nodes=1, settle_seconds=0.5)
    with cluster.scheduler(namespace=cluster.ns, breaker=policy) as sched:
        cluster.add_gang("train", 3, gpus=8, on_fault="restart-pods", annotations={spares.SPARE_REQUEST: "1"})
        first = cluster.wait_bound(3)
        spare = wait_for("spares on the PodGroup", lambda: reserved(cluster, "train"))[0]
        add_preemptible(cluster, "borrow")
        assert cluster.wait_bound(4)["borrow"] == spare
        victim = sorted(first)[0]
        cluster.taint(first[victim])
        wait_for("the breaker open", lambda: gauge(sched, "hypertopo_remediation_breaker_open") == 1, timeout=15)
        # the workload controller replaces the pod of the failed node: the gang needs its spare
        cluster._raw("DELETE", f"/api/v1/namespaces/{cluster.ns}/pods/{victim}", query={"gracePeriodSeconds": 0})
        wait_for("the failed pod gone", lambda: victim not in cluster.pods())
        cluster.add_gang_pods("train", ["train-r0"], gpus=8)
        wait_for("the reclaim held back", lambda: gauge(sched, "hypertopo_remediation_breaker_withheld_evictions_total")
                 or None, timeout=15)
        time.sleep(2.0)  # several passes with the breaker open
        assert cluster.placement().get("borrow") == spare and "train-r0" not in cluster.placement()
        assert gauge(sched, "hypertopo_scheduler_evictions_total", outcome="evicted") == 0

        cluster.api.patch(CONFIGMAPS, cluster.ns, f"{sched.options.scheduler_name}-remediation",
                          {"metadata": {"annotations": {CLOSE_ANNOTATION: "close"}}})
        wait_for("the borrower evicted once closed", lambda: "borrow" not in cluster.pods(), timeout=30)
        after = wait_for("replacement bound", lambda: cluster.placement().get("train-r0"), timeout=30)
        assert after == spare and where[after] == where[first[sorted(first)[1]]]


def test_a_gangs_spare_is_released_when_its_podgroup_goes(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=1, per_leaf=3, gpus=8)
    assert len(layout) == 1
    with cluster.scheduler():
        cluster.add_gang("train", 2, gpus=8, annotations={spares.SPARE_REQUEST: "50%"})  # 50% of 2 = 1
        cluster.wait_bound(2)
        spare = wait_for("spares on the PodGroup", lambda: reserved(cluster, "train"))[0]
        cluster.add_gang("next", 1, gpus=8)
        wait_for("the next gang told why it waits", lambda: [
            e for e in cluster.events("FailedScheduling") if "reserved as another gang's spares" in e["message"]])
        cluster._raw("DELETE", f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{cluster.ns}/podgroups/train")
        assert wait_for("next bound once train ended", lambda: cluster.placement().get("next-0"), timeout=30) == spare
