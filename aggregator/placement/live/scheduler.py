"""`hypertopo-scheduler run`: the live scheduler.

List+watch Nodes, Pods, HyperNodes, PodGroups (scheduler-plugins', Volcano's and Kubernetes' own), Volcano Queues
and Jobs into one `ClusterState`, owned by one loop thread; informer, bind, eviction and event
threads only talk to it through a queue, so every decision sees every earlier decision (assumed
pods are charged at once: no double booking). Kinds whose CRD is not installed count as empty.

Each cycle: rebuild the HyperNode index if it changed; find fabric faults and act on every gang
there, whoever placed it, as its `hypertopo.io/on-fabric-fault` policy asks (evictions, or a
Volcano `RestartJob` Command); move our Volcano PodGroups from Pending to Inqueue when their queue
is open and their minResources fit (Volcano's job controller creates a Job's pods only then);
place every gang that has pending pods (waiting until minMember pods exist) through `decide` (the
placement core) and bind it all or nothing (`binder`); write FailedScheduling events and
conditions for gangs that do not fit, and PodGroup status. Fault evictions stop while the
fault-storm breaker is open (`breaker.py`, `breaker_control.py`); every gang it schedules or
remediates carries a FabricHealthy condition and its recovery is measured (`gang_watch.py`). With
`remediate_only` it does the fault handling (and gang health) alone (for clusters that place pods
with vc-scheduler).

High availability: run two replicas with a Lease (`aggregator.live.service`, the aggregator's elector).
Both keep warm caches; only the leader runs cycles, so only it decides, binds, evicts and writes
status. A leader that cannot renew stops deciding at its renew deadline, before a standby can
acquire (it waits a whole lease on its own clock); a standby that takes over starts from the API
server's truth (its informers saw every bind the old leader made), so a gang half bound when its
leader died is finished by the new one and no pod is bound twice (the API server refuses a second
binding of a bound pod, and the UID precondition a recreated one).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from agent.common import c_heap
from agent.common.adapters.endpoints import serve
from agent.common.command_line import CommandParser
from aggregator.live import slim
from aggregator.live.service import Service, add_election_arguments, elector_from
from aggregator.placement.core import degraded, ranks, rescheduler, spares, topology
from aggregator.placement.core.breaker import BreakerPolicy
from aggregator.placement.core.decide import Decision, decide_spec
from aggregator.placement.core.rescheduler import Eviction, FaultTracker, JobRestart
from aggregator.placement.kinds import gang_spec, podgroups, upstream, volcano
from aggregator.placement.kinds.podgroups import GangView
from aggregator.placement.live import hostfile
from aggregator.placement.live.admission import Admission
from aggregator.placement.live.binder import Binder, BindItem, BindOutcome
from aggregator.placement.live.breaker_control import BreakerControl
from aggregator.placement.live.events import EventRecorder
from aggregator.placement.live.eviction import EvictionQueue
from aggregator.placement.live.gang_watch import GangWatch
from aggregator.placement.live.scheduler_metrics import SchedulerMetrics
from aggregator.placement.live.spare_hold import ReservedSpares
from aggregator.placement.live.state import GROUP_KINDS, ClusterState, PodKey, pod_key
from aggregator.placement.live.status_writer import StatusWriter

log = logging.getLogger("hypertopo.scheduler")


@dataclass(frozen=True)
class Options:
    scheduler_name: str = "hypertopo-scheduler"
    node_selector: str = ""  # label selector: the nodes this scheduler may use (default all)
    bind_workers: int = 32
    eviction_rate: float = 5.0  # evictions per second
    eviction_burst: int = 10
    eviction_retry_seconds: float = 5.0
    unknown_grace_seconds: float = 60.0  # HyperNode Ready=Unknown counts as failed only after this
    resync_seconds: float = 10.0  # retry unschedulable gangs at least this often
    gang_wait_event_seconds: float = 10.0  # FailedScheduling for a gang still short of minMember
    watch_timeout: int = 60
    event_repeat_seconds: float = 300.0
    remediate_only: bool = False  # fault handling only: no binding, no PodGroup status
    job_restart_hold_seconds: float = 120.0  # a Volcano Job restarted for a fault is not restarted again sooner
    degraded_restart_seconds: float = 600.0  # restart-pods-on-degraded: how long a node stays degraded first
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)  # fault-storm breaker (breaker.py)
    namespace: str = "hypertopo-system"  # of the breaker's ConfigMap (the Lease's namespace)
    health_sweep_seconds: float = 60.0  # every tracked gang's health and whole-time ratio looked at again
    spare_defaults: Mapping[str, str] = field(default_factory=dict)  # namespace -> hypertopo.io/spare-nodes default


class Scheduler:
    """Build with a `KubeApi`-like object; `start()`, then `stop()`."""

    def __init__(self, api: Any, options: Options, *, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic, leading: Callable[[], bool] = lambda: True) -> None:
        from aggregator.placement.adapters import kube

        self.api, self.options, self.clock = api, options, clock
        self.leading, self._was_leading = leading, False
        self.metrics = SchedulerMetrics(registry or CollectorRegistry())
        self.state = ClusterState(options.scheduler_name)
        self.faults = FaultTracker(options.unknown_grace_seconds)
        self.degraded = degraded.DegradedTracker(options.degraded_restart_seconds)
        self._degraded_nodes: frozenset[str] = frozenset()  # for the placement preference
        self._degraded_why: dict[str, str] = {}  # the same nodes -> why (gang health)
        self._marked: dict[str, str] = {}  # nodes annotated degraded -> since (for restart-pods-on-degraded)
        self.events = EventRecorder(api, options.scheduler_name, repeat_seconds=options.event_repeat_seconds, clock=clock)
        self.binder = Binder(api, lambda outcome: self._queue.put(("bound", outcome)), workers=options.bind_workers)
        self.evictions = EvictionQueue(api, lambda ev, outcome, detail: self._queue.put(("evicted", (ev, outcome, detail))),
                                       rate=options.eviction_rate, burst=options.eviction_burst,
                                       retry_seconds=options.eviction_retry_seconds, clock=clock)
        # one writer, in order, coalescing per PodGroup: a later status never loses to an earlier one;
        # a bound gang's status yields to pending binds (status_writer's docstring says why)
        self.status = StatusWriter(api, lambda target: self._queue.put(("status-failed", target)),
                                   busy=self.binder.busy)
        self.admission = Admission(self.state, self.status, self.events, options.scheduler_name)
        self._commands = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commands")
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.gang_watch = GangWatch(self.state, self.status, self.events, self.metrics,
                                    sweep_seconds=options.health_sweep_seconds, clock=clock)
        self.breaker = BreakerControl(api, options.breaker, namespace=options.namespace,
                                      name=f"{options.scheduler_name}-remediation", events=self.events,
                                      metrics=self.metrics, submit=self._commands,
                                      post=lambda what: self._queue.put((what, None)),
                                      withdraw=lambda: len(self.evictions.withdraw()))
        required = [(kube.NODES, options.node_selector), (kube.PODS, ""), (kube.HYPERNODES, "")]
        optional = [(kube.PODGROUPS, ""), (kube.VC_PODGROUPS, ""), (kube.K8S_PODGROUPS, ""), (kube.QUEUES, ""),
                    (kube.VC_JOBS, "")]
        # slim records (aggregator.live.slim): what placement, filters and fault handling read
        slimmers = {"Node": slim.slim_node, "Pod": slim.slim_pod}
        self.informers = [
            kube.Informer(api, res, on_event=self._sink(res.kind), label_selector=sel,
                          watch_timeout=options.watch_timeout, optional=(res, sel) in optional,
                          transform=slimmers.get(res.kind, slim.without_managed_fields))
            for res, sel in required + optional
        ]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._topology = topology.build([])
        self._topology_gen = -1
        self._heap_trimmer = c_heap.HeapTrimmer()
        self._faults_gen = -1
        self._failed_domains: dict[str, str] = {}
        self._scheduled_gen = -1
        self._next_resync = 0.0
        self._in_flight: set[PodKey] = set()
        self._waiting_since: dict[PodKey, float] = {}
        self._failed_nodes: dict[str, str] = {}
        self._failed_basis: tuple[int, dict[str, str]] | None = None  # what _failed_now was computed from
        self._failed_now: dict[str, str] = {}
        self._restarted: dict[PodKey, float] = {}  # Volcano Job -> when we asked Volcano to restart it
        self._filter_cache: dict[Any, dict[str, str]] = {}
        self._unfit: dict[PodKey, tuple[tuple[Any, ...], float]] = {}  # gang -> (why it did not fit, when)
        # warm spares (spares.py): every live gang's, held out of the free index (spare_hold.py),
        # derived again from the PodGroups' hypertopo.io/spares annotations whenever a PodGroup changed
        self._reserved = ReservedSpares(self.state)
        self._spares_stale = True

    # -- lifecycle ----------------------------------------------------------------------------
    def _sink(self, kind: str) -> Callable[[str, Any], None]:
        return lambda event, obj: self._queue.put(("watch", (kind, event, obj)))

    def start(self) -> None:
        warm = getattr(self.api, "warm", None)
        if warm is not None and not self.options.remediate_only:
            # the binders' connections, TLS handshakes included, open while the informers list:
            # the first gangs' binds then go out at once instead of each opening its own
            threading.Thread(target=warm, args=(self.options.bind_workers,), name="warm-connections",
                             daemon=True).start()
        for informer in self.informers:
            informer.start()
        self.evictions.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers:
            informer.stop()
        self.evictions.stop()
        self._queue.put(("stop", None))
        self._thread.join(timeout=10)
        self.binder.shutdown()
        self.events.shutdown()
        self.status.shutdown()
        self._commands.shutdown(wait=True)

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def healthy(self) -> bool:
        return self.synced() and self._thread.is_alive()

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain(timeout=0.5)
                if self._lead() and self.synced():
                    self._cycle()
            except Exception:
                log.exception("scheduling cycle failed")

    def _lead(self) -> bool:
        """Whether this replica may act now; a replica that starts leading looks at everything."""
        leading = self.leading()
        if leading != self._was_leading:
            self._was_leading = leading
            self.metrics.is_leader.set(1 if leading else 0)
            log.info("%s", "leading: scheduling" if leading else "not leading: standing by (caches kept warm)")
            self._scheduled_gen = -1
        return leading

    def _drain(self, timeout: float) -> None:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return

    def _handle(self, what: str, payload: Any) -> None:
        if what == "watch":
            kind, event, obj = payload
            self.gang_watch.touch(kind, event, obj)
            self._spares_stale = self._spares_stale or kind in GROUP_KINDS
            if event == "SYNC":
                self.state.resync(kind, obj)
            elif event == "ABSENT":  # the kind's CRD is not installed
                self.state.resync(kind, [])
                if kind == "Queue":
                    self.state.queues_known = False
            else:
                self.state.apply(kind, event, obj)
        elif what == "bound":
            self._bound(payload)
        elif what == "evicted":
            self._evicted(*payload)
        elif what == "operator-close":
            self.breaker.operator_close(self.clock())
        elif what == "restart-failed":
            self._restarted.pop(payload, None)
        elif what == "status-failed":
            self.status.forget(payload)
            self.state.dirty_gangs.add(payload[1])

    def _cycle(self) -> None:
        now = self.clock()
        if self._topology_gen != self.state.topology_generation:
            self._topology_gen = self.state.topology_generation
            self._topology = topology.build(self.state.hypernodes.values(), topology.node_labels_of(self.state.nodes.values()))
            self._filter_cache.clear()
            self._degraded_why = degraded.degraded_nodes(self.state.nodes, self.state.hypernodes, self._topology)
            self._degraded_nodes = frozenset(self._degraded_why)
            self._marked = degraded.marked_nodes(self.state.nodes)
            # The cluster view is large and long-lived: keep the cyclic GC from rescanning it in the
            # middle of decisions (a full collection over 10,000 nodes' objects took ~40 ms, the
            # whole p99 of a decision). Frozen objects are still freed by reference counting.
            gc.freeze()
            self._heap_trimmer.maybe_release()  # the lists and events decoded for it, back to the system
        if self._faults_gen != self.state.topology_generation or self.faults.unknown_since:
            # a walk over every HyperNode: only when one changed, or one's Unknown grace is running
            # (not after every batch of pod events, which at 1,000 binds/s is hundreds a second)
            self._faults_gen = self.state.topology_generation
            self._failed_domains = self.faults.failed_domains(self.state.hypernodes, now)
        failed_domains = self._failed_domains
        self._degraded_faults(now)  # every cycle, cheap: the few marked nodes; a pod is offered once
        if self._scheduled_gen == self.state.generation and now < self._next_resync and not self.faults.unknown_since:
            return
        self._fabric_faults(failed_domains, now)
        self.gang_watch.refresh(self._topology, self._failed_now, self._degraded_why, now)
        if not self.options.remediate_only:
            self.admission.enqueue_jobs()
            self._schedule(frozenset(rescheduler.own_failures(self._topology, failed_domains)), now)
            self.status.write_dirty(self.state, self._in_flight)
        self._scheduled_gen = self.state.generation
        self._next_resync = now + self.gang_watch.wake_in(now, self.breaker.wake_in(now, self.options.resync_seconds))
        self.metrics.pending.set(len(self.state.pending_keys))

    # -- fault-driven rescheduling ------------------------------------------------------------
    def _fabric_faults(self, failed_domains: Mapping[str, str], now: float) -> None:
        # failed nodes follow from the nodes' taints, the tree and the failed HyperNodes only: a walk
        # over every node, so only when one of those changed (not every cycle: a cycle runs after
        # every bound gang, hundreds a second)
        basis = (self.state.topology_generation, dict(failed_domains))
        if basis != self._failed_basis:
            self._failed_basis = basis
            self._failed_now = rescheduler.failed_nodes(self.state, self._topology, failed_domains)
        failed = self._failed_now
        if failed != self._failed_nodes:
            log.info("fabric-failed nodes: %s", sorted(failed) or "none")
            self._failed_nodes = failed
            self.metrics.failed_nodes.set(len(failed))
        failed = self.breaker.actionable(failed, self._topology, now)  # none in a fault storm (breaker.py)
        if not failed:
            return
        affected = podgroups.gangs_on_nodes(self.state, set(failed))
        for eviction in rescheduler.plan(affected, failed, self.state.vc_jobs):
            if self.evictions.offer(eviction):
                log.info("evicting %s/%s from %s (%s): %s", *eviction.pod, eviction.node, eviction.policy, eviction.reason)
        for restart in rescheduler.job_restarts(affected, failed, self.state.vc_jobs):
            if now - self._restarted.get(restart.job, float("-inf")) >= self.options.job_restart_hold_seconds:
                self._restarted[restart.job] = now
                self._commands.submit(self._restart_job, restart, self.state.vc_jobs[restart.job])

    def _degraded_faults(self, now: float) -> None:
        """restart-pods-on-degraded: pods on nodes degraded for long enough (degraded.py)."""
        due = self.degraded.due(self._marked, now)
        if not due or self.breaker.is_open:
            return
        for eviction in degraded.plan(podgroups.gangs_on_nodes(self.state, set(due)), due):
            if self.evictions.offer(eviction):
                log.info("evicting %s/%s from %s (%s): %s", *eviction.pod, eviction.node, eviction.policy, eviction.reason)

    def _restart_job(self, restart: JobRestart, job: dict[str, Any]) -> None:
        """Asks Volcano's job controller to restart a Job (a `RestartJob` Command); from the pool."""
        from aggregator.placement.adapters import kube

        try:
            self.api.create(kube.COMMANDS, volcano.command_restart_job(job, restart.reason), namespace=restart.job[0])
        except Exception as exc:
            log.warning("RestartJob for Volcano Job %s/%s not created (retried later): %s", *restart.job, exc)
            self._queue.put(("restart-failed", restart.job))
            return
        self.metrics.evictions.labels("job_restarted").inc()
        log.info("asked Volcano to restart Job %s/%s: %s", *restart.job, restart.reason)
        self.events.record(job, reason="FabricFaultRestart", event_type="Normal", kind="Job",
                           api_version=volcano.JOB_API_VERSION, message=f"RestartJob ({restart.reason})")

    def _evicted(self, eviction: Eviction, outcome: str, detail: str) -> None:
        self.metrics.evictions.labels(outcome).inc()
        pod = self.state.pods.get(eviction.pod) or {"metadata": {"namespace": eviction.pod[0], "name": eviction.pod[1], "uid": eviction.uid}}
        if outcome == "evicted":
            self.events.record(pod, reason="FabricFaultEviction", event_type="Normal",
                               message=f"evicted ({eviction.policy}): {eviction.reason}")
        elif outcome == "blocked":
            self.events.record(pod, reason="EvictionBlocked", message=f"eviction refused, will retry: {detail}")

    # -- scheduling ---------------------------------------------------------------------------
    def _schedule(self, excluded_domains: frozenset[str], now: float) -> None:
        if self._spares_stale:
            self._spares_stale = False
            self._reserved.rebuild({**self.state.podgroups, **self.state.vc_podgroups, **self.state.k8s_podgroups})
        seen = set()
        for view in podgroups.collect(self.state):
            seen.add(view.key)
            if view.key in self._in_flight:
                continue
            if not self.leading():  # the lease was lost mid-cycle: the successor decides the rest
                return
            if self._may_decide(view, now):
                self._decide(view, excluded_domains, now)
        for gone in self._unfit.keys() - seen:
            del self._unfit[gone]
        self._count_spares()

    def _may_decide(self, view: GangView, now: float) -> bool:
        """False while the gang waits for members, minTaskMember or its queue's admission."""
        if view.min_member < 0 or view.missing > 0:
            self._wait(view, now)
            return False
        vc_group = self.state.vc_podgroups.get(view.key) if view.is_volcano else None
        if vc_group is not None:
            short = volcano.task_shortfall(vc_group, view.members)
            if short:
                self._wait(view, now, ", ".join(f"task {t} has {h} of minTaskMember {n} pods" for t, (h, n) in short.items()))
                return False
            if not self.admission.admit(view.key, vc_group, view.pending):
                return False
        self._waiting_since.pop(view.key, None)
        return True

    def _decide(self, view: GangView, excluded_domains: frozenset[str], now: float) -> None:
        basis = self._unfit_basis(view, excluded_domains)
        last = self._unfit.get(view.key)
        if last is not None and last[0] == basis and now - last[1] < self.options.resync_seconds:
            return  # it did not fit, and nothing has freed capacity or changed it since
        started = time.perf_counter()
        spec = gang_spec.read(view, default_spares=self._spare_default(view.key[0]), jobs=self.state.vc_jobs,
                              request_of=self.state.request_of)
        decision = decide_spec(self.state, self._topology, spec, excluded_domains=excluded_domains,
                               filter_cache=self._filter_cache, degraded_nodes=self._degraded_nodes,
                               reserved=self._reserved)
        if decision.spares is not None:
            self._keep_spares(view, decision.spares)
        if decision.reclaim and self.breaker.is_open:  # a fault storm: no eviction, these included
            self.metrics.breaker_withheld.inc(len(decision.reclaim))
            log.warning("remediation breaker open: %d preemptible pod(s) kept on the spares of gang %s/%s",
                        len(decision.reclaim), *view.key)
        else:
            for victim in decision.reclaim:  # preemptible pods on the gang's spares: evicted first
                self._reclaim(victim, view)
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        if decision.ok:
            self._unfit.pop(view.key, None)
            if decision.warning:  # soft mode, unknown tier name: said as hard mode says it
                self.events.gang_warning(view.pending, view.podgroup, podgroups.API_VERSIONS.get(view.flavour, ""),
                                         decision.warning)
            self._commit(decision)
        else:
            self._unfit[view.key] = (basis, now)
            self._unschedulable(view, decision.reason)

    def _spare_default(self, namespace: str) -> str:
        defaults = self.options.spare_defaults
        return defaults.get(namespace, defaults.get("*", ""))

    def _keep_spares(self, view: GangView, nodes: tuple[str, ...]) -> None:
        """The gang's spares, in memory at once (the next decision sees them) and on its PodGroup
        (`spares.RESERVED`), so a restarted scheduler keeps the same reservations."""
        if view.podgroup is None:
            return
        self._reserved.keep(view.key, nodes)
        current = ((view.podgroup.get("metadata") or {}).get("annotations") or {}).get(spares.RESERVED)
        if current != (value := spares.annotation(nodes)):
            self.status.annotate(view.flavour, view.key, {spares.RESERVED: value})

    def _count_spares(self) -> None:
        """The spare gauges: nodes reserved, those lent to preemptible pods, gangs holding any."""
        nodes = self._reserved.nodes
        pods = self.state.pods
        lent = sum(1 for n in nodes if any(spares.is_preemptible(pods.get(k) or {}) for k in self.state.on_node.get(n, ())))
        self.metrics.spares_reserved.set(len(nodes))
        self.metrics.spares_borrowed.set(lent)
        self.metrics.spare_gangs.set(sum(1 for held in self._reserved.values() if held))

    def _reclaim(self, key: PodKey, view: GangView) -> None:
        pod = self.state.pods.get(key)
        node = self.state.node_of(key)
        if pod is None or node is None:
            return
        eviction = Eviction(key, str(pod["metadata"].get("uid", "")), node, view.key, "spare-reclaim",
                            f"node {node} is a spare of gang {view.key[1]}, which needs it")
        if self.evictions.offer(eviction):
            log.info("evicting preemptible %s/%s from spare %s of gang %s/%s", *key, node, *view.key)

    def _unfit_basis(self, view: GangView, excluded_domains: frozenset[str]) -> tuple[Any, ...]:
        """What a gang's failure to fit followed from. Binds only take capacity away, so while
        no capacity was freed (`freed_generation`), the tree, the node filters and the failed
        domains are the same, and the gang asks the same, it still cannot fit: retrying it is a
        count over every node for nothing (a gang that waits for capacity would pay it at every
        pass, hundreds a second). It is retried anyway every `resync_seconds`, and when the breaker
        closes (a spare reclaim it held back is planned again then)."""
        state = self.state
        pending = tuple((pod_key(p), (p.get("metadata") or {}).get("resourceVersion")) for p in view.pending)
        spec = (view.podgroup or {}).get("spec")
        return (state.topology_generation, state.freed_generation, excluded_domains, pending, tuple(view.placed),
                view.min_member, spec, tuple(sorted(view.annotations.items())), self.breaker.is_open)

    def _wait(self, view: GangView, now: float, shortfall: str = "") -> None:
        """A gang short of members (or without its PodGroup) waits; after a while it says so."""
        since = self._waiting_since.setdefault(view.key, now)
        limit = view.timeout_seconds if view.timeout_seconds is not None else self.options.gang_wait_event_seconds
        if now - since < min(limit, self.options.gang_wait_event_seconds):
            return
        if shortfall:
            why = f"pod group {view.key[1]} waits for pods: {shortfall}"
        elif view.min_member < 0:
            why = f"pod group {view.key[1]} not found"
        else:
            why = (f"pod group {view.key[1]} has {len(view.members)} pods, minMember is {view.min_member}: "
                   f"waiting for {view.missing} more")
        self.metrics.decisions.labels("waiting").inc()
        for pod in view.pending:
            self.events.record(pod, reason="FailedScheduling", message=why)

    def _commit(self, decision: Decision) -> None:
        gang = decision.gang  # the spec it was decided from
        items = []
        for pod in gang.pending:
            key = pod_key(pod)
            node = decision.assignments.get(key)
            if node is not None:
                self.state.assume(key, node)
                items.append(BindItem(key, str(pod["metadata"].get("uid", "")), node))
        self._in_flight.add(gang.key)
        self.metrics.decisions.labels("scheduled").inc()
        placement = decision.placement
        vc_group = self.state.vc_podgroups.get(gang.key) if gang.is_volcano else None
        if vc_group is not None:
            where = f"{placement.domain} (tier {placement.tier})" if placement else "?"
            self.status.condition(gang.key, vc_group, volcano.SCHEDULED, "tasks in gang are ready to be scheduled",
                                  f"{len(items)} pods placed in {where}")
        log.info("gang %s/%s: %d pods -> %s (tier %s, %s leaves)", *gang.key, len(items),
                 placement.domain if placement else "?", placement.tier if placement else "?",
                 placement.leaves if placement else "?")
        self.binder.submit(gang.key, items)

    def _unschedulable(self, view: GangView, reason: str) -> None:
        self.metrics.decisions.labels("unschedulable").inc()
        vc_group = self.state.vc_podgroups.get(view.key) if view.is_volcano else None
        if vc_group is not None:
            self.admission.unschedulable(view.key, vc_group, view.pending, reason)
            return
        for pod in view.pending:
            self.events.record(pod, reason="FailedScheduling", message=reason)
        if view.podgroup is not None:
            self.events.record(view.podgroup, reason="FailedScheduling", message=reason, kind="PodGroup",
                               api_version=podgroups.API_VERSIONS[view.flavour])
        if view.is_upstream and view.podgroup is not None:  # kube-scheduler's condition, as it writes it
            self.status.k8s_condition(view.key, view.podgroup, upstream.condition(
                upstream.INITIALLY_SCHEDULED, "False", upstream.UNSCHEDULABLE, reason))

    def _bound(self, outcome: BindOutcome) -> None:
        self._in_flight.discard(outcome.gang)
        self.state.generation += 1  # the gang's deferred status (and any waiting gang) gets a cycle
        self.metrics.bind_seconds.observe(outcome.seconds)
        self.metrics.binds.labels("bound").inc(len(outcome.bound))
        if outcome.ok:
            self._scheduled_events(outcome)
            self._publish_ranks(outcome.gang)
            return
        self.metrics.binds.labels("failed").inc(len(outcome.failed))
        self.metrics.binds.labels("rolled_back").inc(len(outcome.rolled_back))
        first = next(iter(outcome.failed.items()))
        message = (f"gang {outcome.gang[1]} not bound: binding {first[0][1]} failed ({first[1]}); "
                   f"{len(outcome.rolled_back)} bound pod(s) rolled back by deletion")
        log.warning("%s", message)
        for item in outcome.items:
            self.state.forget(item.pod)
            pod = self.state.pods.get(item.pod)
            if pod is not None and item.pod not in outcome.rolled_back:
                self.events.record(pod, reason="FailedScheduling", message=message)
        for _, group, api_version in podgroups.groups_of(self.state, outcome.gang):
            self.events.record(group, reason="FailedScheduling", message=message, kind="PodGroup",
                               api_version=api_version)

    def _publish_ranks(self, key: PodKey) -> None:
        """The bound gang's rank -> node map on its PodGroup (`ranks.RANK_MAP_ANNOTATION`) and in
        its hostfile ConfigMap (`hostfile`), when the map changed."""
        value = ranks.rank_map(podgroups.members_of(self.state, key), lambda p: self.state.node_of(pod_key(p)),
                               self.state.vc_jobs)
        for flavour, group, api_version in podgroups.groups_of(self.state, key):
            current = (group.get("metadata") or {}).get("annotations") or {}
            if value and current.get(ranks.RANK_MAP_ANNOTATION) != value:
                self.status.annotate(flavour, key, {ranks.RANK_MAP_ANNOTATION: value})
                if (config_map := hostfile.config_map(group, api_version, value)) is not None:
                    self.status.hostfile(key, config_map)

    def _scheduled_events(self, outcome: BindOutcome) -> None:
        """`Scheduled` on each pod of a gang bound whole and on its PodGroup (events.py)."""
        bound = []
        for item in outcome.items:
            namespace, name = item.pod
            pod = self.state.pods.get(item.pod) or {"metadata": {"namespace": namespace, "name": name, "uid": item.uid}}
            bound.append((pod, item.node))
        self.events.scheduled(bound, [(group, api) for _, group, api in podgroups.groups_of(self.state, outcome.gang)])

# -- command line -----------------------------------------------------------------------------
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    d = Options()
    parser.add_argument("--kubeconfig",
                        help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--scheduler-name", default=d.scheduler_name, help="schedule pods whose spec.schedulerName is this")
    parser.add_argument("--listen", default=":9732", help="HOST:PORT for /metrics and /healthz (default :9732)")
    parser.add_argument("--node-selector", default="", help="label selector of the nodes this scheduler may use")
    parser.add_argument("--bind-workers", type=int, default=d.bind_workers, help="parallel pods/binding calls")
    parser.add_argument("--eviction-rate", type=float, default=d.eviction_rate, help="fault evictions per second")
    parser.add_argument("--eviction-burst", type=int, default=d.eviction_burst, help="eviction rate burst")
    parser.add_argument("--unknown-grace", type=float, default=d.unknown_grace_seconds,
                        help="seconds a HyperNode may stay Ready=Unknown (stale agent) before it counts as failed")
    parser.add_argument("--degraded-restart-after", type=float, default=d.degraded_restart_seconds,
                        help="seconds a node must stay degraded (annotation hypertopo.io/fabric-degraded) before the "
                             "pods of gangs annotated hypertopo.io/on-fabric-fault=restart-pods-on-degraded are "
                             f"evicted from it (default {d.degraded_restart_seconds:.0f})")
    b = d.breaker
    parser.add_argument("--breaker-window", type=float, default=b.window_seconds,
                        help="fault-storm breaker: seconds over which newly failed nodes are counted "
                             f"(default {b.window_seconds:.0f})")
    parser.add_argument("--breaker-threshold", type=int, default=b.threshold_nodes,
                        help="fault-storm breaker: nodes failing within the window that stop fault evictions; 0 "
                             "(default) derives it from the tree: a whole spine's worth of nodes or --breaker-fraction "
                             "of all nodes, whichever is fewer, but always more than the largest leaf")
    parser.add_argument("--breaker-fraction", type=float, default=b.fraction,
                        help=f"fault-storm breaker: the share of the nodes in the tree (default {b.fraction:g})")
    parser.add_argument("--breaker-hold", type=float, default=b.hold_seconds,
                        help="fault-storm breaker: seconds the failures must stay below the threshold before fault "
                             f"evictions resume (default {b.hold_seconds:.0f}); or annotate the ConfigMap "
                             "<scheduler-name>-remediation hypertopo.io/remediation-breaker=close")
    parser.add_argument("--breaker-settle", type=float, default=b.settle_seconds,
                        help="fault-storm breaker: seconds a node must have been failed before its pods are evicted, so "
                             "that a storm's failures, which arrive one watch event at a time, are counted first "
                             f"(default {b.settle_seconds:g})")
    parser.add_argument("--no-breaker", action="store_true",
                        help="never stop fault evictions for a fault storm (and act on failed nodes at once)")
    parser.add_argument("--health-sweep", type=float, default=d.health_sweep_seconds,
                        help="seconds between looks at every tracked gang's FabricHealthy condition and whole-time "
                             f"ratio besides those its changes trigger (default {d.health_sweep_seconds:.0f})")
    parser.add_argument("--spare-nodes-default", action="append", default=[], metavar="NAMESPACE=N|P%",
                        type=spare_default,
                        help="hypertopo.io/spare-nodes for the gangs of NAMESPACE that do not say (repeatable; "
                             "`*` for every namespace)")
    parser.add_argument("--resync", type=float, default=d.resync_seconds, help="retry unschedulable gangs every N seconds")
    parser.add_argument("--remediate-only", action="store_true",
                        help="only act on fabric faults (evictions, Volcano RestartJob) for gangs that opted in with "
                             "hypertopo.io/on-fabric-fault, whichever scheduler placed them, and keep their "
                             "FabricHealthy condition; bind nothing and write no other PodGroup status (for clusters "
                             "that place pods with vc-scheduler)")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "hypertopo-system"),
                        help="namespace of the leader-election Lease (default $POD_NAMESPACE, else hypertopo-system)")
    add_election_arguments(parser, lease_name="hypertopo-scheduler")  # one Lease per scheduler name
    parser.add_argument("--log-level", default="INFO")


def options_from(args: argparse.Namespace) -> Options:
    return Options(scheduler_name=args.scheduler_name, node_selector=args.node_selector, bind_workers=args.bind_workers,
                   eviction_rate=args.eviction_rate, eviction_burst=args.eviction_burst,
                   unknown_grace_seconds=args.unknown_grace, resync_seconds=args.resync,
                   degraded_restart_seconds=args.degraded_restart_after,
                   remediate_only=args.remediate_only, namespace=args.namespace,
                   health_sweep_seconds=args.health_sweep, spare_defaults=dict(args.spare_nodes_default),
                   breaker=BreakerPolicy(enabled=not args.no_breaker, window_seconds=args.breaker_window,
                                         hold_seconds=args.breaker_hold, fraction=args.breaker_fraction,
                                         threshold_nodes=args.breaker_threshold, settle_seconds=args.breaker_settle))


def spare_default(item: str) -> tuple[str, str]:
    """One `--spare-nodes-default NAMESPACE=VALUE` (`*`: every namespace not named); a bad one is
    one line and exit 2, as argparse reports any option."""
    namespace, _, value = item.partition("=")
    if not namespace.strip() or not value.strip():
        raise argparse.ArgumentTypeError("expected NAMESPACE=N or NAMESPACE=P%")
    try:
        spares.parse_request(value, 100)
    except spares.SpareRequestError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return namespace.strip(), value.strip()


def run(args: argparse.Namespace) -> int:
    """Runs until SIGTERM/SIGINT; stops deciding, then hands the Lease back; returns the exit code."""
    from aggregator.adapters.kube import LeaseClient
    from aggregator.placement.adapters import kube

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    c_heap.limit_arenas()  # before any thread allocates (agent.common.c_heap says why)
    try:
        api = kube.connect(args.kubeconfig, pool_size=args.bind_workers + 8, timeout=30.0)
    except kube.ApiError as exc:
        log.error("hypertopo-scheduler run: %s", exc)
        return 1
    lease = LeaseClient(api, namespace=args.namespace, name=args.lease_name, field_manager="hypertopo-scheduler")
    elector = elector_from(args, lease)
    registry = CollectorRegistry()
    scheduler = Scheduler(api, options_from(args), registry=registry,
                          leading=elector.is_leader if elector else (lambda: True))
    server = serve(registry, args.listen, {"/healthz": scheduler.healthy})

    def work(stop: threading.Event) -> None:
        scheduler.start()
        stop.wait()
        scheduler.stop()  # no decision starts after this; binds in flight finish first

    mode = "fault handling only (--remediate-only)" if args.remediate_only else "scheduling and fault handling"
    log.info("hypertopo-scheduler %s running (%s, %s); metrics on %s", args.scheduler_name, mode,
             f"Lease {args.namespace}/{args.lease_name}" if elector else "no leader election", args.listen)
    return Service([("scheduler", work)], elector, cleanup=(server.shutdown,)).run()


def build_parser() -> argparse.ArgumentParser:
    """`hypertopo-scheduler run`'s options on their own (`python -m aggregator.placement.live.scheduler`)."""
    parser = CommandParser(prog="hypertopo-scheduler run", description=__doc__.splitlines()[0] if __doc__ else None)
    add_run_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
