"""The fault-storm breaker (`breaker.py`) in the live scheduler: where its state shows, how an
operator closes it, what happens to evictions already queued.

Where it shows: a ConfigMap `<scheduler-name>-remediation` in the scheduler's namespace (the
Lease's), whose data hold the state (`state`: Open or Closed, `reason`, `message`,
`lastTransitionTime`, the counts and the threshold, and `condition`: the same as one Kubernetes
condition of type `RemediationBreakerOpen`, JSON); an Event on that ConfigMap at each transition
(Warning `RemediationBreakerOpen`, Normal `RemediationBreakerClosed`); the metric
`hypertopo_remediation_breaker_open`; a log line saying why. A ConfigMap because the breaker is one
fact about the whole cluster that an operator must see and act on with kubectl, and no object the
scheduler already owns has room for a condition.

How an operator closes it: `kubectl -n <ns> annotate configmap <scheduler-name>-remediation
hypertopo.io/remediation-breaker=close`. While open, the scheduler reads the ConfigMap every
`poll_seconds`; on that annotation it closes the breaker (forgetting the failures counted so far)
and removes the annotation as it writes the Closed state.

A leader that starts reads the ConfigMap once: an Open breaker stays open across a restart or a
failover. When it opens, evictions queued and not yet attempted are withdrawn (`EvictionQueue.
withdraw`); once it closes, the pods still on failed nodes are planned again like any other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from aggregator.placement.core.breaker import OPEN, Breaker, BreakerPolicy, Change, threshold
from aggregator.placement.core.topology import Topology
from aggregator.placement.live.events import EventRecorder, rfc3339
from aggregator.placement.live.scheduler_metrics import SchedulerMetrics

log = logging.getLogger("hypertopo.scheduler")
CLOSE_ANNOTATION = "hypertopo.io/remediation-breaker"
CONDITION = "RemediationBreakerOpen"


def _configmaps() -> Any:
    from aggregator.placement.adapters import kube

    return kube.Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)


class BreakerControl:
    """Owned by the scheduler loop. `submit` runs API calls off the loop (the commands pool);
    `post(what)` hands a result back to the loop (`operator-close`); `withdraw()` takes back the
    queued evictions and returns how many."""

    def __init__(self, api: Any, policy: BreakerPolicy, *, namespace: str, name: str, events: EventRecorder,
                 metrics: SchedulerMetrics, submit: Executor, post: Callable[[str], None],
                 withdraw: Callable[[], int], poll_seconds: float = 5.0) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.breaker = Breaker(policy)
        self.events, self.metrics, self.pool, self.post, self.withdraw = events, metrics, submit, post, withdraw
        self.poll_seconds = poll_seconds
        self._limit: tuple[Topology, int] | None = None
        self._next_poll = 0.0
        self._restored = False

    @property
    def is_open(self) -> bool:
        return self.breaker.is_open

    def actionable(self, failed: Mapping[str, str], topology: Topology, now: float) -> dict[str, str]:
        """Looks at the failed nodes; those remediation may act on now (none while open, and only
        settled ones while closed: `Breaker.ripe`)."""
        if not self._restored:
            self._restored = True
            self._restore(now)
        if self._limit is None or self._limit[0] is not topology:
            self._limit = (topology, threshold(topology, self.breaker.policy))
        change = self.breaker.observe(failed, self._limit[1], now)
        recent, _, limit = self.breaker.last
        self.metrics.breaker_recent.set(recent)
        self.metrics.breaker_threshold.set(limit)
        if change is not None:
            self._changed(change)
        if self.breaker.is_open and now >= self._next_poll:
            self._next_poll = now + self.poll_seconds
            self.pool.submit(self._poll)
        return self.breaker.ripe(failed, now)

    def wake_in(self, now: float, default: float) -> float:
        """Seconds until the scheduler should look again for the breaker's sake (at most `default`)."""
        wait = self.breaker.next_look(now)
        return default if wait is None else min(default, wait)

    def operator_close(self, now: float) -> None:
        change = self.breaker.operator_close(now)
        if change is not None:
            self._changed(change, clear_annotation=True)

    def _changed(self, change: Change, *, clear_annotation: bool = False) -> None:
        opened = change.state == OPEN
        self.metrics.breaker_open.set(1 if opened else 0)
        if opened:
            self.metrics.breaker_trips.inc()
            withheld = self.withdraw()
            self.metrics.breaker_withheld.inc(withheld)
            log.warning("remediation breaker open: %s; %d queued evictions withdrawn", change.message, withheld)
        else:
            log.warning("remediation breaker closed (%s): %s", change.reason, change.message)
        data = self._data(change)
        self.pool.submit(self._write, data, clear_annotation)
        target = {"metadata": {"name": self.name, "namespace": self.namespace, "uid": ""}}
        self.events.record(target, reason=CONDITION if opened else "RemediationBreakerClosed",
                           event_type="Warning" if opened else "Normal", kind="ConfigMap", message=change.message)

    def _data(self, change: Change) -> dict[str, str]:
        recent, current, limit = self.breaker.last
        policy, now = self.breaker.policy, rfc3339()
        condition = {"type": CONDITION, "status": "True" if change.state == OPEN else "False",
                     "reason": change.reason, "message": change.message, "lastTransitionTime": now}
        return {"state": change.state, "reason": change.reason, "message": change.message, "lastTransitionTime": now,
                "failedInWindow": str(recent), "failedNow": str(current), "threshold": str(limit),
                "windowSeconds": f"{policy.window_seconds:.0f}", "holdSeconds": f"{policy.hold_seconds:.0f}",
                "condition": json.dumps(condition, separators=(",", ":"))}

    # -- API calls, from the pool ---------------------------------------------------------------
    def _write(self, data: dict[str, str], clear_annotation: bool) -> None:
        resource = _configmaps()
        patch: dict[str, Any] = {"data": data}
        if clear_annotation:
            patch["metadata"] = {"annotations": {CLOSE_ANNOTATION: None}}
        try:
            try:
                self.api.patch(resource, self.namespace, self.name, patch)
            except Exception as exc:
                if int(getattr(exc, "status", 0) or 0) != 404:
                    raise
                body = {"apiVersion": "v1", "kind": "ConfigMap", "data": data,
                        "metadata": {"name": self.name, "namespace": self.namespace,
                                     "labels": {"app.kubernetes.io/part-of": "hypertopo"}}}
                self.api.create(resource, body, namespace=self.namespace)
        except Exception as exc:
            log.warning("ConfigMap %s/%s (remediation breaker %s) not written: %s", self.namespace, self.name,
                        data["state"], exc)

    def _read(self) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.api.get(_configmaps(), self.name, namespace=self.namespace)
        except Exception as exc:
            if int(getattr(exc, "status", 0) or 0) != 404:
                log.warning("ConfigMap %s/%s (remediation breaker) not read: %s", self.namespace, self.name, exc)
            return None
        return obj

    def _poll(self) -> None:
        obj = self._read() or {}
        if ((obj.get("metadata") or {}).get("annotations") or {}).get(CLOSE_ANNOTATION) == "close":
            self.post("operator-close")

    def _restore(self, now: float) -> None:
        """A leader that starts keeps an Open breaker open (one read, on the loop thread)."""
        obj = self._read() or {}
        if (obj.get("data") or {}).get("state") == OPEN and self.breaker.policy.enabled:
            self.breaker.state, self.breaker.opened_at = OPEN, now
            self.metrics.breaker_open.set(1)
            log.warning("remediation breaker open since before this leader started (ConfigMap %s/%s): fault "
                        "evictions stay stopped", self.namespace, self.name)

