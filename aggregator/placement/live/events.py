"""Events the scheduler writes, shaped as kube-scheduler's and Volcano's: `FailedScheduling`
(Warning) on each pod that cannot be placed, with the reason; `Scheduled` (Normal) on each pod once
bound ("Successfully assigned NS/POD to NODE", kube-scheduler's and vc-scheduler's words) and on its
PodGroup once the gang is bound ("pod group is ready", Volcano's `PodGroupReady`);
`FabricFaultEviction`-style notes for fault evictions.

Why de-duplicated: a pending gang is retried whenever the cluster changes; the same message on
the same pod is written once per `repeat_seconds`, so a stuck gang does not flood etcd. What an
entry remembers is dropped once it is older than that (it suppresses nothing more), so a scheduler
that binds pods for months does not keep one entry per pod it ever placed.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

log = logging.getLogger(__name__)

SCHEDULED = "Scheduled"
PODGROUP_READY = "pod group is ready"  # Volcano's PodGroupReady, the message of its Scheduled event


class EventApi(Protocol):
    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None: ...


def rfc3339(when: dt.datetime | None = None) -> str:
    return (when or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(obj: Mapping[str, Any], *, kind: str, api_version: str, reason: str, message: str,
               event_type: str, component: str, now: str) -> dict[str, Any]:
    """A core/v1 Event about `obj` (a Pod or PodGroup dict)."""
    meta = obj.get("metadata") or {}
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", "default"))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": api_version, "kind": kind, "name": name, "namespace": namespace,
                           "uid": meta.get("uid", "")},
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class EventRecorder:
    """Posts events from a small pool (never blocks the scheduling loop), de-duplicated."""

    def __init__(self, api: EventApi, component: str, *, repeat_seconds: float = 300.0,
                 clock: Callable[[], float], workers: int = 2) -> None:
        self.api, self.component, self.repeat, self.clock = api, component, repeat_seconds, clock
        self._last: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()  # the scheduler loop and the command pool both record
        self._next_prune = clock() + repeat_seconds
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="events")

    def record(self, obj: Mapping[str, Any], *, reason: str, message: str, event_type: str = "Warning",
               kind: str = "Pod", api_version: str = "v1") -> bool:
        """Queues the event unless the same (object, reason, message) went out recently."""
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        key, now = (uid, reason, message), self.clock()
        with self._lock:
            if now - self._last.get(key, float("-inf")) < self.repeat:
                return False
            self._last[key] = now
            if now >= self._next_prune:  # once per repeat interval: one pass over what is remembered
                self._next_prune = now + self.repeat
                self._last = {k: t for k, t in self._last.items() if now - t < self.repeat}
        body = event_body(obj, kind=kind, api_version=api_version, reason=reason, message=message,
                          event_type=event_type, component=self.component, now=rfc3339())
        self._pool.submit(self._post, body)
        return True

    def remembered(self) -> int:
        """How many (object, reason, message) entries suppress a repeat now (bounded by pruning)."""
        with self._lock:
            return len(self._last)

    def scheduled(self, bound: Iterable[tuple[Mapping[str, Any], str]],
                  podgroups: Iterable[tuple[Mapping[str, Any], str]]) -> None:
        """`Scheduled` (Normal) on each bound (pod, node) and on each (PodGroup, its apiVersion) of
        the gang, with kube-scheduler's and Volcano's messages."""
        for pod, node in bound:
            meta = pod.get("metadata") or {}
            self.record(pod, reason=SCHEDULED, event_type="Normal",
                        message=f"Successfully assigned {meta.get('namespace', '')}/{meta.get('name', '')} to {node}")
        for group, api_version in podgroups:
            self.record(group, reason=SCHEDULED, event_type="Normal", kind="PodGroup", api_version=api_version,
                        message=PODGROUP_READY)

    def gang_warning(self, pods: Iterable[Mapping[str, Any]], podgroup: Mapping[str, Any] | None, api_version: str,
                     message: str) -> None:
        """A placed gang's limit that could not be applied (a soft limit naming an unknown tier): the
        `FailedScheduling` Warning hard mode writes for it, with the same words, on each pod and
        the PodGroup, though the gang is placed."""
        for pod in pods:
            self.record(pod, reason="FailedScheduling", message=message)
        if podgroup is not None:
            self.record(podgroup, reason="FailedScheduling", message=message, kind="PodGroup", api_version=api_version)

    def _post(self, body: dict[str, Any]) -> None:
        try:
            self.api.create_event(body["metadata"]["namespace"], body)
        except Exception as exc:
            log.warning("event %s on %s not written: %s", body["reason"], body["involvedObject"]["name"], exc)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
