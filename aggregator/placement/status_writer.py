"""PodGroup status as the scheduler writes it, for both kinds of PodGroup.

scheduler-plugins PodGroups get phase and counts through their `/status` subresource, as
coscheduling writes them. Volcano PodGroups (whose CRD has no status subresource) get a merge
patch of `status`: the phase Volcano's job controller waits for (Pending -> Inqueue -> Running ->
Completed), the counts, and the `Unschedulable` / `Scheduled` conditions with the reason.

Why a writer of its own: writes leave the scheduling loop (one thread, in order), coalesce per
PodGroup (a later status never loses to an earlier one) and a failed write is retried on a later
cycle, never blocks a decision.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aggregator.placement import podgroups, volcano
from aggregator.placement.events import rfc3339
from aggregator.placement.state import VOLCANO, XK8S, ClusterState, PodKey

log = logging.getLogger("hypertopo.scheduler")
Target = tuple[str, PodKey]  # (flavour, PodGroup key)


class StatusWriter:
    """Owned by the scheduling loop; `on_failure(target)` is called from the writer thread."""

    def __init__(self, api: Any, on_failure: Callable[[Target], None]) -> None:
        self.api, self.on_failure = api, on_failure
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="status")
        self._unwritten: dict[Target, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.written: dict[Target, dict[str, Any]] = {}

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def forget(self, target: Target) -> None:
        self.written.pop(target, None)

    def write_dirty(self, state: ClusterState, in_flight: set[PodKey]) -> None:
        """Writes status for the PodGroups whose pods changed (a gang being bound waits: one write)."""
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

    def _write_xk8s(self, key: PodKey, podgroup: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        scheduled = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))
        wanted = podgroups.group_status(podgroup, pods, scheduled)
        if self.written.get((XK8S, key)) == wanted:
            return
        patch = podgroups.status_patch(podgroup, wanted, rfc3339())
        self.written[(XK8S, key)] = wanted
        if patch:
            self.queue((XK8S, key), patch["status"])

    def _write_volcano(self, key: PodKey, podgroup: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        wanted = volcano.status(podgroup, pods)
        current = podgroup.get("status") or {}
        changed = {k: v for k, v in wanted.items() if current.get(k, 0 if k != "phase" else None) != v}
        if self.written.get((VOLCANO, key)) == wanted or not changed:
            self.written[(VOLCANO, key)] = wanted
            return
        self.written[(VOLCANO, key)] = wanted
        self.set_volcano(key, podgroup, changed)

    def set_volcano(self, key: PodKey, podgroup: dict[str, Any], status: dict[str, Any]) -> None:
        """Queues a Volcano status change and applies it to our view at once, so the next cycle
        reads what we decided even before the watch event comes back."""
        podgroup.setdefault("status", {}).update(status)
        self.queue((VOLCANO, key), status)

    def condition(self, key: PodKey, podgroup: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Sets the Unschedulable or Scheduled condition of a Volcano PodGroup (no write when the
        same condition already stands)."""
        conditions = volcano.with_condition(podgroup, volcano.condition(kind, reason, message, rfc3339()))
        if conditions is not None:
            self.set_volcano(key, podgroup, {"conditions": conditions})

    def queue(self, target: Target, status: dict[str, Any]) -> None:
        with self._lock:
            queued = target in self._unwritten
            self._unwritten[target] = {**self._unwritten.get(target, {}), **status}
        if not queued:
            self._pool.submit(self._patch, target)

    def _patch(self, target: Target) -> None:
        from aggregator.placement.adapters import kube

        with self._lock:
            status = self._unwritten.pop(target, None)
        if not status:
            return
        flavour, (namespace, name) = target
        try:
            if flavour == VOLCANO:
                self.api.patch(kube.VC_PODGROUPS, namespace, name, {"status": status})
            else:
                self.api.patch_status(kube.PODGROUPS, namespace, name, {"status": status})
        except Exception as exc:
            log.warning("PodGroup %s/%s status not written (retried on the next cycle): %s", namespace, name, exc)
            self.on_failure(target)
