"""PodGroup status as the scheduler writes it, for both kinds of PodGroup.

scheduler-plugins PodGroups get phase and counts through their `/status` subresource, as
coscheduling writes them. Volcano PodGroups (whose CRD has no status subresource) get a merge
patch of `status`: the phase Volcano's job controller waits for (Pending -> Inqueue -> Running ->
Completed), the counts, and the `Unschedulable` / `Scheduled` conditions with the reason.
Kubernetes' own PodGroups get their conditions (`upstream.py`: `PodGroupInitiallyScheduled` as
kube-scheduler writes it, and `FabricHealthy`) through `/status` with a strategic merge patch,
one condition per write, so the other conditions on the object stay as they are.

Why a writer of its own: writes leave the scheduling loop (one thread, in order), coalesce per
PodGroup (a later status never loses to an earlier one) and a failed write is retried on a later
cycle, never blocks a decision.

Priority: a gang's status after its binds (phase, counts: `write_dirty`) yields to binds still
pending. It waits while `busy()` (the binder has binds queued or in flight), up to `max_delay`
seconds, then goes anyway; everything else (Volcano admission to Inqueue, which Volcano's job
controller waits for before it creates pods, and conditions) goes at once, ahead of the deferred
writes. Why: a PodGroup status write costs the API server more than a pods/binding call (a
custom resource: a JSON merge patch on an unstructured object, measured ~2.5 ms of kube-apiserver
plus etcd CPU against ~1.9 ms per bind), one per gang, and nothing waits on a bound gang's counts,
while every pending bind holds a gang's pods back. The writes are not dropped or merged across
PodGroups: each gang's status is still written once, with the same content, a little later (at
most `max_delay` while binds keep coming); `shutdown()` writes what is left.

A bound gang's rank map (an annotation of its PodGroup) and its hostfile ConfigMap (`hostfile`)
go the same deferred way; one that fails is queued again by the next `write_dirty` at least
`retry_seconds` later (nothing else would rewrite it: they are written once per bound gang).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from aggregator.placement.kinds import podgroups, upstream, volcano
from aggregator.placement.live.events import rfc3339
from aggregator.placement.live.state import K8S, VOLCANO, XK8S, ClusterState, PodKey

log = logging.getLogger("hypertopo.scheduler")
Target = tuple[str, PodKey]  # (flavour, PodGroup key); flavour + ANNOTATIONS: its annotations
ANNOTATIONS = "+annotations"
HOSTFILE = "hostfile"  # (HOSTFILE, PodGroup key): the gang's hostfile ConfigMap (the whole object)
CONDITION = ":"  # (K8S + CONDITION + type, key): one condition of a Kubernetes PodGroup
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class StatusWriter:
    """Owned by the scheduling loop; `on_failure(target)` is called from the writer thread.
    `busy()`: whether binds are pending (deferred writes wait while it is true, up to `max_delay`)."""

    def __init__(self, api: Any, on_failure: Callable[[Target], None], *, busy: Callable[[], bool] = lambda: False,
                 max_delay: float = 5.0, poll: float = 0.02, clock: Callable[[], float] = time.monotonic,
                 retry_seconds: float = 10.0) -> None:
        self.api, self.on_failure = api, on_failure
        self.busy, self.max_delay, self.poll, self.clock = busy, max_delay, poll, clock
        self.retry_seconds = retry_seconds
        self._failed: dict[Target, tuple[float, dict[str, Any]]] = {}  # rank map / hostfile writes to retry
        self._urgent: dict[Target, dict[str, Any]] = {}  # insertion order: the order they were queued
        self._deferred: dict[Target, tuple[float, dict[str, Any]]] = {}  # target -> (first queued, status)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.written: dict[Target, dict[str, Any]] = {}  # what was queued last, per PodGroup
        self.completed = 0  # writes the API server accepted (benchmarks, tests)
        self.status_completed = 0  # of which PodGroup status writes (not rank maps or hostfiles)

    def shutdown(self) -> None:
        """Writes everything still queued (deferred writes included), then stops the writer."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def forget(self, target: Target) -> None:
        self.written.pop(target, None)

    def write_dirty(self, state: ClusterState, in_flight: set[PodKey]) -> None:
        """Writes status for the PodGroups whose pods changed (a gang being bound waits: one write)."""
        self._retry_failed()
        dirty, state.dirty_gangs = state.dirty_gangs, set()
        for key in dirty:
            if key in in_flight:
                state.dirty_gangs.add(key)
                continue
            pods = podgroups.members_of(state, key)
            if not pods:
                continue  # not one of our gangs (or gone): its own scheduler writes its status
            if (podgroup := state.podgroups.get(key)) is not None:
                self._write_xk8s(key, podgroup, pods)
            if (vc_group := state.vc_podgroups.get(key)) is not None:
                self._write_volcano(key, vc_group, pods)
            if (k8s_group := state.k8s_podgroups.get(key)) is not None:
                self._write_k8s(key, k8s_group, pods)

    def pending(self) -> int:
        """Writes queued and not yet started (tests, metrics)."""
        with self._cond:
            return len(self._urgent) + len(self._deferred)

    def _write_xk8s(self, key: PodKey, podgroup: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        scheduled = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))
        wanted = podgroups.group_status(podgroup, pods, scheduled)
        if self.written.get((XK8S, key)) == wanted:
            return
        patch = podgroups.status_patch(podgroup, wanted, rfc3339())
        self.written[(XK8S, key)] = wanted
        if patch:
            self.queue((XK8S, key), patch["status"], defer=True)

    def _write_volcano(self, key: PodKey, podgroup: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        wanted = volcano.status(podgroup, pods)
        current = podgroup.get("status") or {}
        changed = {k: v for k, v in wanted.items() if current.get(k, 0 if k != "phase" else None) != v}
        if self.written.get((VOLCANO, key)) == wanted or not changed:
            self.written[(VOLCANO, key)] = wanted
            return
        self.written[(VOLCANO, key)] = wanted
        self.set_volcano(key, podgroup, changed, defer=True)

    def _write_k8s(self, key: PodKey, podgroup: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """`PodGroupInitiallyScheduled` True once minCount members are bound (kube-scheduler sets
        it when it places the group; hypertopo once the binds landed, so a rolled-back gang never
        says True). A failed write makes the gang dirty again, so it is retried here."""
        scheduled = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))
        if scheduled >= upstream.min_count(podgroup) and not upstream.initially_scheduled(podgroup):
            self.k8s_condition(key, podgroup, upstream.condition(
                upstream.INITIALLY_SCHEDULED, "True", upstream.SCHEDULED, f"{scheduled} pods scheduled"), defer=True)

    def k8s_condition(self, key: PodKey, podgroup: Mapping[str, Any], cond: dict[str, Any], *,
                      defer: bool = False) -> None:
        """Queues one condition of a Kubernetes PodGroup (`upstream.to_write`: none when the
        object carries it already or it would undo an initial schedule); a condition already
        queued, and not yet seen on the object, is not queued twice."""
        target = (K8S + CONDITION + str(cond["type"]), key)
        entry = upstream.to_write(podgroup, cond, rfc3339())
        if entry is None:
            self.written.pop(target, None)
            return
        if self.written.get(target) == cond:
            return
        self.written[target] = dict(cond)
        self.queue(target, {"conditions": [entry]}, defer=defer)

    def set_volcano(self, key: PodKey, podgroup: dict[str, Any], status: dict[str, Any], *, defer: bool = False) -> None:
        """Queues a Volcano status change and applies it to our view at once, so the next cycle
        reads what we decided even before the watch event comes back."""
        podgroup.setdefault("status", {}).update(status)
        self.queue((VOLCANO, key), status, defer=defer)

    def condition(self, key: PodKey, podgroup: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Sets the Unschedulable or Scheduled condition of a Volcano PodGroup (no write when the
        same condition already stands)."""
        conditions = volcano.with_condition(podgroup, volcano.condition(kind, reason, message, rfc3339()))
        if conditions is not None:
            self.set_volcano(key, podgroup, {"conditions": conditions})

    def annotate(self, flavour: str, key: PodKey, annotations: dict[str, str]) -> None:
        """Queues a merge patch of the PodGroup's annotations (the rank -> node map), deferred like
        a bound gang's status: nothing waits on it."""
        self.queue((flavour + ANNOTATIONS, key), annotations, defer=True)

    def hostfile(self, key: PodKey, config_map: dict[str, Any]) -> None:
        """Queues the create-or-update of a gang's hostfile ConfigMap (`hostfile.config_map`),
        deferred like the rank map."""
        self.queue((HOSTFILE, key), config_map, defer=True)

    def _retry_failed(self) -> None:
        with self._cond:
            now = self.clock()
            due = [(t, body) for t, (since, body) in self._failed.items() if now - since >= self.retry_seconds]
            for target, _ in due:
                del self._failed[target]
        for target, body in due:
            self.queue(target, body, defer=True)

    def queue(self, target: Target, status: dict[str, Any], *, defer: bool = False) -> None:
        """Queues a write; one still queued for the same PodGroup takes the new fields over its own
        (an urgent one absorbs a deferred one, which then goes at once)."""
        with self._cond:
            if target in self._urgent:
                self._urgent[target] = {**self._urgent[target], **status}
            elif target in self._deferred:
                since, earlier = self._deferred[target]
                if defer:
                    self._deferred[target] = (since, {**earlier, **status})
                else:
                    del self._deferred[target]
                    self._urgent[target] = {**earlier, **status}
            elif defer:
                self._deferred[target] = (self.clock(), status)
            else:
                self._urgent[target] = status
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="status", daemon=True)
                self._thread.start()
            if not defer or (len(self._deferred) == 1 and not self._urgent):
                # a deferred write joining others needs no wake-up: the writer already looks
                # every `poll` seconds while deferred writes wait (one wake-up per bound gang
                # handed the loop thread's time to a writer that would only wait again)
                self._cond.notify()

    def _next(self) -> tuple[Target, dict[str, Any]] | None:
        """The next write: urgent ones first, in order; then the oldest deferred one once no bind
        is pending or it has waited `max_delay`; None when stopping with nothing left."""
        with self._cond:
            while True:
                if self._urgent:
                    target = next(iter(self._urgent))
                    return target, self._urgent.pop(target)
                if self._deferred:
                    target, (since, status) = next(iter(self._deferred.items()))
                    if self._stopping or self.clock() - since >= self.max_delay or not self.busy():
                        del self._deferred[target]
                        return target, status
                    self._cond.wait(self.poll)  # binds pending: look again soon
                elif self._stopping:
                    return None
                else:
                    self._cond.wait()

    def _run(self) -> None:
        while (item := self._next()) is not None:
            self._patch(*item)

    def _patch(self, target: Target, status: dict[str, Any]) -> None:
        from aggregator.placement.adapters import kube

        flavour, (namespace, name) = target
        try:
            if flavour == HOSTFILE:
                self._write_hostfile(status)
            elif flavour.endswith(ANNOTATIONS):
                resource = {VOLCANO: kube.VC_PODGROUPS, K8S: kube.K8S_PODGROUPS}.get(flavour[:-len(ANNOTATIONS)], kube.PODGROUPS)
                self.api.patch(resource, namespace, name, {"metadata": {"annotations": status}})
            elif flavour.startswith(K8S + CONDITION):
                self.api.request("PATCH", kube.K8S_PODGROUPS.path(namespace=namespace, name=name, sub="status"),
                                 body={"status": status}, content_type=STRATEGIC_MERGE_PATCH)
            elif flavour == VOLCANO:
                self.api.patch(kube.VC_PODGROUPS, namespace, name, {"status": status})
            else:
                self.api.patch_status(kube.PODGROUPS, namespace, name, {"status": status})
        except Exception as exc:
            status_write = flavour in (XK8S, VOLCANO) or flavour.startswith(K8S + CONDITION)
            what = "status" if status_write else "rank map" if flavour.endswith(ANNOTATIONS) else "hostfile"
            log.warning("PodGroup %s/%s %s not written (retried on a later cycle): %s", namespace, name, what, exc)
            if not status_write:  # written once per bound gang: queued again later
                with self._cond:
                    self._failed[target] = (self.clock(), status)
            self.on_failure(target)
        else:
            self.completed += 1
            if flavour in (XK8S, VOLCANO) or flavour.startswith(K8S + CONDITION):
                self.status_completed += 1

    def _write_hostfile(self, config_map: dict[str, Any]) -> None:
        """Creates the ConfigMap, or updates it when it exists and is ours (`hostfile.update_patch`:
        the API server refuses the patch of a ConfigMap without our label, which is then left alone)."""
        from aggregator.placement.adapters import kube
        from aggregator.placement.live import hostfile

        meta = config_map["metadata"]
        try:
            self.api.create(kube.CONFIGMAPS, config_map, namespace=meta["namespace"])
            return
        except kube.ApiError as exc:
            if exc.status != 409:
                raise
        path = kube.CONFIGMAPS.path(namespace=meta["namespace"], name=meta["name"])
        try:
            self.api.request("PATCH", path, body=hostfile.update_patch(config_map), content_type=kube.JSON_PATCH)
        except kube.ApiError as exc:
            if exc.status not in (409, 422):  # 422: the test for our label failed
                raise
            log.warning("ConfigMap %s/%s exists and is not hypertopo-scheduler's (no label %s=%s): left alone",
                        meta["namespace"], meta["name"], *hostfile.MANAGED_BY)
