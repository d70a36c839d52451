"""Leader election on a `coordination.k8s.io/v1` Lease, so two aggregator replicas never both write.

The rules are client-go's leaderelection, reduced to what the aggregator needs:
- Expiry is judged on this replica's own monotonic clock: a holder's lease counts as expired when
  its record (holder, renewTime) has not changed for `lease_duration` since *we* last saw it change.
  Wall-clock skew between replicas cannot make two leaders.
- Every acquire and renew is an update carrying the Lease's resourceVersion: of two replicas racing
  for an expired lease, exactly one update succeeds, the other gets 409 and stays a follower.
- A leader that cannot renew for `renew_deadline` (< lease_duration) stops writing at once:
  `is_leader()` turns False on the clock, without waiting for the renew loop to notice, so writes
  stop before a successor can possibly acquire (it waits a full lease_duration).
- On shutdown the leader releases the lease (empty holder, 1 s duration): a successor takes over
  on its next retry instead of waiting out the lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from aggregator.live.reconcile import ApiError

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class LeaseStore(Protocol):
    """Get / create / replace (with resourceVersion precondition) of one Lease object."""

    def get(self) -> Obj: ...
    def create(self, lease: Obj) -> Obj: ...
    def replace(self, lease: Obj) -> Obj: ...


@dataclass(frozen=True)
class ElectionConfig:
    identity: str
    namespace: str = "hypertopo-system"
    name: str = "hypertopo-aggregator"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < retry period < renew deadline < lease duration")


def micro_time(at: datetime | None = None) -> str:
    """metav1.MicroTime in RFC 3339 with microseconds."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Obj) -> tuple[Any, ...]:
    spec = lease.get("spec") or {}
    return (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))


class LeaderElector:
    """Acquire / renew / release one Lease. Call `step()` every retry period (or `run()`)."""

    def __init__(
        self,
        store: LeaseStore,
        config: ElectionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ):
        self.store = store
        self.config = config
        self.clock = clock
        self.on_change = on_change or (lambda leading: None)
        self._lock = threading.Lock()
        self._renewed_at: float | None = None  # our clock, when we last held the lease for sure
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._was_leading = False
        self._waiting_logged = False

    # -- queries ---------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        """True only while our last successful renew is younger than the renew deadline."""
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and self.clock() - renewed < self.config.renew_deadline

    # -- one round -------------------------------------------------------------------------------
    def step(self) -> bool:
        """Try to acquire or renew once; returns whether we lead afterwards."""
        try:
            self._try_acquire_or_renew()
        except ApiError as exc:
            log.warning("leader election: %s", exc)
        leading = self.is_leader()
        if leading != self._was_leading:
            self._was_leading = leading
            log.info("leader election: %s %s", self.config.identity, "leads" if leading else "stopped leading")
            self.on_change(leading)
        return leading

    def _try_acquire_or_renew(self) -> None:
        now = self.clock()
        try:
            lease = self.store.get()
        except ApiError as exc:
            if not exc.not_found:
                raise
            self._won(self.store.create(self._lease_body(None, transitions=0)), now)
            return
        record = _record(lease)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        mine = holder == self.config.identity
        duration = float((lease.get("spec") or {}).get("leaseDurationSeconds") or self.config.lease_duration)
        if holder and not mine and now < self._observed_at + duration:
            return  # someone else holds a live lease
        transitions = int((lease.get("spec") or {}).get("leaseTransitions") or 0) + (0 if mine else 1)
        body = self._lease_body(lease, transitions=transitions, acquired=not mine)
        try:
            self._won(self.store.replace(body), now)
        except ApiError as exc:
            if not exc.conflict:
                raise
            log.info("leader election: lost the race for the lease (%s)", exc.reason)

    def _won(self, lease: Obj, now: float) -> None:
        with self._lock:
            self._renewed_at = now
        self._observed, self._observed_at = _record(lease), now

    def _lease_body(self, current: Obj | None, *, transitions: int, acquired: bool = True) -> Obj:
        stamp = micro_time()
        spec = dict((current or {}).get("spec") or {})
        spec.update(
            holderIdentity=self.config.identity,
            leaseDurationSeconds=max(1, round(self.config.lease_duration)),
            renewTime=stamp,
            leaseTransitions=transitions,
        )
        if acquired or "acquireTime" not in spec:
            spec["acquireTime"] = stamp
        meta: Obj = {"name": self.config.name, "namespace": self.config.namespace}
        if current is not None:
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    # -- release and loop ------------------------------------------------------------------------
    def release(self) -> bool:
        """Hands the lease back (empty holder) if we hold it; a successor acquires at once."""
        if not self.is_leader():
            return False
        with self._lock:
            self._renewed_at = None
        try:
            lease = self.store.get()
            if (lease.get("spec") or {}).get("holderIdentity") != self.config.identity:
                return False
            spec = dict(lease.get("spec") or {})
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time())
            self.store.replace({**lease, "spec": spec})
        except ApiError as exc:
            log.warning("leader election: could not release the lease: %s", exc)
            return False
        finally:
            self._was_leading = False
            self.on_change(False)
        log.info("leader election: %s released the lease", self.config.identity)
        return True

    def bid(self, ready: Callable[[], bool]) -> bool:
        """One round of `run`: a leader renews; a candidate bids only once `ready()` (its caches
        synced, its live sources' first facts in). Why: a replica still loading that took the
        lease (a leader killed while the other replica starts, a rollout that does not wait for
        /readyz) would hold it for minutes without writing, while a loaded one stands by; at
        5,000 nodes a soak saw two minutes of no HyperNode writes that way."""
        if not self.is_leader() and not ready():
            if not self._waiting_logged:
                self._waiting_logged = True
                log.info("leader election: %s waits for its caches before bidding for the lease", self.config.identity)
            return False
        self._waiting_logged = False
        return self.step()

    def run(self, stop: threading.Event, ready: Callable[[], bool] = lambda: True) -> None:
        """Renew loop until `stop` is set (the caller releases afterwards); bids only when `ready()`."""
        while not stop.is_set():
            self.bid(ready)
            stop.wait(self.config.retry_period)
