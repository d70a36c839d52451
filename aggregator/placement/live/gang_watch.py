"""The scheduler's gang watch: keeps every gang's FabricHealthy verdict (`gang_health`), its
recovery and whole-time account (`recovery`) current, writes what changed on its PodGroup and
counts the metrics.

Which gangs: every named gang (a PodGroup of either flavour) that hypertopo schedules (its pods
name this scheduler) or remediates (its `hypertopo.io/on-fabric-fault` policy is not `none`),
once it has had minMember members placed. Why not rescan them all: a cycle runs after every
bound gang, hundreds a second. A gang is looked at again when the failed, degraded or unknown
nodes under it change (at once), when one of its pods changes node, phase or deletion or its
PodGroup changes (`touch`, from the watch events; at most every `look_seconds`, 0.2, so a gang
bound pod by pod is looked at once or twice, not per pod), and every `sweep_seconds` (its
whole-time ratio annotation). Writes go through the
scheduler's StatusWriter (one writer, ordered, coalescing per PodGroup): a verdict that is not
True goes at once, a True one and the ratio wait behind pending binds; events through its
EventRecorder. Runs on the scheduler loop thread; only `ratios()` is read from elsewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.placement.core import gang_health
from aggregator.placement.core.gang_health import Verdict
from aggregator.placement.core.topology import Topology
from aggregator.placement.kinds import podgroups, upstream
from aggregator.placement.kinds.podgroups import GangView
from aggregator.placement.live.events import EventRecorder, rfc3339
from aggregator.placement.live.scheduler_metrics import SchedulerMetrics
from aggregator.placement.live.state import (
    GROUP_KINDS,
    K8S,
    SINGLE,
    VOLCANO,
    ClusterState,
    PodKey,
    gang_ref,
    pod_key,
)
from aggregator.placement.live.status_writer import ANNOTATIONS, StatusWriter
from aggregator.placement.sim.recovery import GangClock, Look

log = logging.getLogger("hypertopo.scheduler")
RATIO_ANNOTATION = "hypertopo.io/whole-time-ratio"
RATIO_STEP = 0.01  # the annotation is rewritten when the ratio moved at least this much
ENDED = ("Completed", "Finished", "Failed")  # Volcano's and scheduler-plugins' last phases


@dataclass
class _Tracked:
    flavour: str
    verdict: Verdict | None = None  # last written
    ratio: float | None = None  # last written


class GangWatch:
    def __init__(self, state: ClusterState, status: StatusWriter, events: EventRecorder, metrics: SchedulerMetrics,
                 *, sweep_seconds: float = 60.0, look_seconds: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state, self.status, self.events, self.metrics = state, status, events, metrics
        self.sweep_seconds, self.look_seconds = sweep_seconds, look_seconds
        self.tracked: dict[PodKey, _Tracked] = {}
        self.clocks: dict[PodKey, GangClock] = {}
        self._lock = threading.Lock()  # clocks: the loop thread writes, a metrics scrape reads
        self._touched: set[PodKey] = set()
        self._problems: dict[str, str] = {}
        self._unknown: dict[str, str] = {}
        self._unknown_basis: Topology | None = None
        self._next_sweep = 0.0
        self._next_touch = 0.0
        self._counts = {"True": 0, "False": 0, "Unknown": 0}  # tracked gangs by verdict (a gauge)
        metrics.watch_gangs(lambda: self.ratios(clock()))

    # -- input ----------------------------------------------------------------------------------
    def touch(self, kind: str, event: str, obj: Any) -> None:
        """A watch event (before the state applies it): the gang of a pod whose node, phase or
        deletion changed, or of a changed PodGroup, is looked at on a coming refresh."""
        for item in (obj if event == "SYNC" else [obj]) if kind == "Pod" or kind in GROUP_KINDS else ():
            if kind == "Pod":
                key, flavour = gang_ref(item)
                if flavour != SINGLE and (event == "DELETED" or _pod_moved(self.state.pods.get(pod_key(item)), item)):
                    self._touched.add(key)
            else:
                self._touched.add(pod_key(item))
        if event == "SYNC" and kind in GROUP_KINDS:
            self._touched.update(self.tracked)  # a fresh list: some PodGroups may be gone

    def refresh(self, topology: Topology, failed: Mapping[str, str], degraded: Mapping[str, str], now: float) -> None:
        """Looks again at the gangs that may have changed (module docstring)."""
        if self._unknown_basis is not topology:
            self._unknown_basis = topology
            self._unknown = gang_health.unknown_nodes(self.state.hypernodes, topology)
        problems = {**{n: "u" for n in self._unknown}, **{n: "d" for n in degraded}, **{n: "f" for n in failed}}
        if now >= self._next_touch:  # at most every `look_seconds`: a gang being bound changes pod by pod
            keys, self._touched = self._touched, set()
            self._next_touch = now + self.look_seconds
        else:
            keys = set()
        if problems != self._problems:
            moved = {n for n in problems.keys() | self._problems.keys() if problems.get(n) != self._problems.get(n)}
            keys |= self._gangs_on(moved)
            self._problems = problems
        if now >= self._next_sweep:
            self._next_sweep = now + self.sweep_seconds
            keys |= set(self.tracked)
        for key in sorted(keys):
            self._look(key, topology, failed, degraded, now)

    def wake_in(self, now: float, default: float) -> float:
        """Seconds until the touched gangs are due a look (at most `default`)."""
        return min(default, max(0.0, self._next_touch - now)) if self._touched else default

    def _gangs_on(self, nodes: set[str]) -> set[PodKey]:
        out = set()
        for node in nodes:
            for key in self.state.on_node.get(node, ()):
                pod = self.state.pods.get(key)
                if pod is not None and (ref := gang_ref(pod))[1] != SINGLE:
                    out.add(ref[0])
        return out

    # -- one gang -------------------------------------------------------------------------------
    def _eligible(self, view: GangView | None) -> bool:
        if view is None or view.podgroup is None or not view.is_group:
            return False
        return view.key in self.state.gangs or view.fault_policy != "none" or view.key in self.tracked

    def _look(self, key: PodKey, topology: Topology, failed: Mapping[str, str], degraded: Mapping[str, str],
              now: float) -> None:
        view = podgroups.view_of(self.state, key)
        if not self._eligible(view) or _ended(view, self.clocks.get(key)):
            self.end(key)
            return
        assert view is not None
        if key not in self.tracked:
            if len(view.placed) < max(view.min_member, 1):
                return  # not placed yet: nothing to say about its fabric
            self.tracked[key] = _Tracked(view.flavour)
            with self._lock:
                self.clocks[key] = GangClock()
        clock = self.clocks[key]
        base = gang_health.verdict(view, failed, degraded, self._unknown, topology)
        look = self._look_at(view, failed, topology, healthy=base.status == "True")
        for seen in clock.update(look, now):
            self.metrics.recovery_seconds.labels(seen.stage).observe(seen.seconds)
            if seen.stage == "bound":
                self.metrics.tier_after_recovery.labels(_tier(seen.tier_before), _tier(seen.tier_after)).inc()
            log.info("gang %s/%s recovery: %s after %.1fs (tier %s -> %s)", *key, seen.stage, seen.seconds,
                     seen.tier_before, seen.tier_after)
        found = gang_health.verdict(view, failed, degraded, self._unknown, topology, waiting=clock.waiting(look))
        self._publish(view, found, clock.ratio(now))

    @staticmethod
    def _look_at(view: GangView, failed: Mapping[str, str], topology: Topology, *, healthy: bool) -> Look:
        ok = {pod: node for pod, node in view.placed.items() if node not in failed}
        running = sum(1 for p in view.members if pod_key(p) in ok and (p.get("status") or {}).get("phase") == "Running")
        domain = topology.lca(view.placed.values()) if view.placed else None
        return Look(placed_ok=len(ok), running_ok=running, hit=len(ok) < len(view.placed), healthy=healthy,
                    want=max(len(view.members), view.min_member), tier=topology.domains[domain].tier if domain else None)

    def _publish(self, view: GangView, found: Verdict, ratio: float | None) -> None:
        """Writes the verdict when the PodGroup does not carry it (a change, or someone else's write
        dropped it), with an event when it changed; and the ratio when it moved."""
        tracked = self.tracked[view.key]
        podgroup: dict[str, Any] = view.podgroup  # type: ignore[assignment]  # the state's own object
        is_volcano = view.flavour == VOLCANO
        before = gang_health.current(podgroup, volcano=view.flavour in (VOLCANO, K8S))  # a status condition
        annotations: dict[str, str] = {}
        if not gang_health.same(before, found):
            cond = gang_health.condition(found, before, rfc3339())
            if is_volcano:
                self.status.set_volcano(view.key, podgroup, {"conditions": gang_health.volcano_conditions(podgroup, cond)},
                                        defer=found.status == "True")
            elif view.flavour == K8S:  # beside kube-scheduler's condition (a strategic merge by type)
                self.status.k8s_condition(view.key, podgroup, upstream.condition(
                    gang_health.CONDITION, found.status, found.reason, found.message), defer=found.status == "True")
            else:
                annotations[gang_health.ANNOTATION] = gang_health.annotation(cond)
        if tracked.verdict != found and (tracked.verdict is not None or found.status != "True"):
            reason, kind = gang_health.event(found)
            self.events.record(podgroup, reason=reason, event_type=kind, kind="PodGroup",
                               api_version=podgroups.API_VERSIONS[view.flavour],
                               message=f"FabricHealthy={found.status} ({found.reason}): {found.message}")
            log.info("gang %s/%s FabricHealthy=%s (%s): %s", *view.key, found.status, found.reason, found.message)
        self._count(tracked.verdict, -1)
        self._count(found, 1)
        tracked.verdict = found
        if ratio is not None and (tracked.ratio is None or abs(ratio - tracked.ratio) >= RATIO_STEP):
            tracked.ratio = ratio
            annotations[RATIO_ANNOTATION] = f"{ratio:.3f}"
        if annotations:
            # our view carries it at once (as set_volcano does), so the next look does not write it again
            podgroup.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
            self.status.queue((view.flavour + ANNOTATIONS, view.key), annotations,
                              defer=gang_health.ANNOTATION not in annotations or found.status == "True")

    def _count(self, found: Verdict | None, step: int) -> None:
        if found is not None:
            self._counts[found.status] += step
            self.metrics.gang_health.labels(found.status).set(self._counts[found.status])

    def end(self, key: PodKey) -> None:
        """The gang ended (its PodGroup is gone, or it is no longer ours to watch): its account
        and per-gang metrics go."""
        if (tracked := self.tracked.pop(key, None)) is not None:
            self._count(tracked.verdict, -1)
            with self._lock:
                self.clocks.pop(key, None)

    def ratios(self, now: float) -> dict[PodKey, float]:
        """Every tracked gang's whole-time ratio (from the metrics scrape's thread)."""
        with self._lock:
            return {key: r for key, clock in self.clocks.items() if (r := clock.ratio(now)) is not None}


def _pod_moved(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether what gang health reads of a pod changed: its node, phase or deletion."""
    if old is None:
        return True
    return any((old.get(part) or {}).get(name) != (new.get(part) or {}).get(name)
               for part, name in (("spec", "nodeName"), ("status", "phase"), ("metadata", "deletionTimestamp")))


def _ended(view: GangView | None, clock: GangClock | None) -> bool:
    """The gang is over: its PodGroup says so, or no member is left and no recovery waits for one."""
    if view is None:
        return True
    if str(((view.podgroup or {}).get("status") or {}).get("phase")) in ENDED:
        return True
    return not view.members and (clock is None or clock.recovery is None)


def _tier(tier: int | None) -> str:
    return "none" if tier is None else str(tier)


