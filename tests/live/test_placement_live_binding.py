"""All-or-nothing binding and PDB-respecting evictions on the real API server.

The race a gang binder must survive is real here: between the scheduler's decision and its
Binding, another actor binds one pod elsewhere, or deletes and recreates it under the same name.
The API server refuses that Binding (409: already assigned / UID precondition); the scheduler
must then leave no part of the gang bound and release what it had assumed."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from placement_live import Cluster, wait_for

from aggregator.placement.adapters import kube
from aggregator.placement.core.resources import Resources

pytestmark = pytest.mark.apiserver


class Interloper(kube.KubeClient):
    """The scheduler's API, except that just before binding `victim`, `interfere(victim)` runs
    (another actor acting on the pod through the real API), and the victim's bind waits until
    every other bind of the gang has gone through, so the rollback has real work to do."""

    def __init__(self, inner: kube.KubeClient, victim: str, interfere: Any, others: int) -> None:
        super().__init__(inner.api, timeout=inner.timeout)
        self.victim, self.interfere, self.others = victim, interfere, others
        self.done = 0
        self.lock = threading.Condition()

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        if name != self.victim:
            super().bind(namespace, name, uid, node)
            with self.lock:
                self.done += 1
                self.lock.notify_all()
            return
        with self.lock:
            self.lock.wait_for(lambda: self.done >= self.others, timeout=10)
        self.interfere(namespace, name, node)
        super().bind(namespace, name, uid, node)


def bind_counts(sched: Any) -> dict[str, float | None]:
    """The scheduler's bind counters by result (None where never counted)."""
    return {r: sched.metrics.registry.get_sample_value("hypertopo_scheduler_binds_total", {"result": r})
            for r in ("bound", "failed", "rolled_back")}


def gang_of_eight(cluster: Cluster, scheduler: str) -> None:
    cluster.add_podgroup("g", 8)
    cluster.add_pods([cluster.pod_body(f"g-{i}", scheduler, gang="g") for i in range(8)])


def test_a_pod_bound_by_someone_else_mid_gang_rolls_the_gang_back(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=2)
    elsewhere = layout[sorted(layout)[1]][-1]

    def bind_elsewhere(namespace: str, name: str, node: str) -> None:
        target = elsewhere if node != elsewhere else layout[sorted(layout)[0]][0]
        cluster.api.bind(namespace, name, cluster.pods()[name]["metadata"]["uid"], target)

    api = Interloper(cluster.api, "g-3", bind_elsewhere, others=7)
    with cluster.scheduler(api=api) as sched:
        gang_of_eight(cluster, sched.options.scheduler_name)
        wait_for("7 pods rolled back", lambda: set(cluster.pods()) == {"g-3"})
        placement = cluster.placement()
        assert list(placement) == ["g-3"]  # only the interloper's own binding is left
        # the rollback's deletions are visible before the scheduler thread counts the outcome
        wait_for("the outcome counted", lambda: bind_counts(sched)["rolled_back"])  # counted last (non-zero)
        assert bind_counts(sched) == {"bound": 0, "failed": 1, "rolled_back": 7}
        message = cluster.wait_events("FailedScheduling")[0]["message"]
        assert "binding g-3 failed" in message and "7 bound pod(s) rolled back" in message
        # the assumptions are released and the deletions seen: every node is free again but the
        # interloper's. The scheduler's view lags the API server: it uncharges a rolled-back pod
        # when its informer delivers the DELETED event, which may come after the outcome is counted
        taken = placement["g-3"]
        whole = Resources(2, 64000, 512 * 2**30, 110)
        wait_for("the rollback released in the scheduler's view (assumptions dropped, deletions seen)",
                 lambda: not sched.state.assumed and all(r == whole for n, r in sched.state.free().items() if n != taken))
        free = sched.state.free()
        assert all(r == whole for n, r in free.items() if n != taken)


def test_a_pod_recreated_under_the_same_name_is_refused_by_the_uid_precondition(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=2, per_leaf=4, gpus=2)

    def recreate(namespace: str, name: str, node: str) -> None:
        old = cluster.pods()[name]
        cluster.api.delete_pod(namespace, name, old["metadata"]["uid"], grace_seconds=0)
        wait_for("old pod gone", lambda: name not in cluster.pods())
        cluster.add_pods([cluster.pod_body(name, old["spec"]["schedulerName"], gang="g")])

    api = Interloper(cluster.api, "g-5", recreate, others=7)
    with cluster.scheduler(api=api) as sched:
        gang_of_eight(cluster, sched.options.scheduler_name)
        wait_for("rolled back to the recreated pod alone", lambda: set(cluster.pods()) == {"g-5"})
        assert cluster.placement() == {}  # the new g-5 (new UID) was not bound by the stale decision
        wait_for("the outcome counted", lambda: bind_counts(sched)["rolled_back"])  # counted last (non-zero)
        assert bind_counts(sched) == {"bound": 0, "failed": 1, "rolled_back": 7}


def test_eviction_blocked_by_a_pod_disruption_budget_is_retried_not_forced(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=1, per_leaf=2, gpus=8)
    with cluster.scheduler(eviction_retry_seconds=0.2) as sched:
        name = sched.options.scheduler_name
        cluster.add_podgroup("pdb", 2, annotations={"hypertopo.io/on-fabric-fault": "restart-pods"})
        cluster.add_pods([cluster.pod_body(f"pdb-{i}", name, gang="pdb", gpus=8) for i in range(2)])
        before = cluster.wait_bound(2)
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "keep-all", "namespace": cluster.ns},
               "spec": {"minAvailable": 2, "selector": {"matchLabels": {"scheduling.x-k8s.io/pod-group": "pdb"}}}}
        cluster._raw("POST", f"/apis/policy/v1/namespaces/{cluster.ns}/poddisruptionbudgets", body=pdb)
        victim = next(p for p, n in before.items())
        cluster.taint(before[victim])

        def blocked() -> float:
            value = sched.metrics.registry.get_sample_value("hypertopo_scheduler_evictions_total", {"outcome": "blocked"})
            return value if value and value >= 3 else 0.0

        wait_for("3 refused eviction attempts (429)", blocked)
        assert cluster.placement() == before  # the budget held
        cluster._raw("DELETE", f"/apis/policy/v1/namespaces/{cluster.ns}/poddisruptionbudgets/keep-all")
        wait_for("evicted once the budget is gone", lambda: victim not in cluster.pods())
        assert set(cluster.pods()) == set(before) - {victim}
