"""`hypertopo-scheduler run`: the live scheduler.

List+watch Nodes, Pods, HyperNodes and PodGroups into one `ClusterState`, owned by one loop
thread; informer, bind, eviction and event threads only talk to it through a queue, so every
decision sees every earlier decision (assumed pods are charged at once: no double booking).

Each cycle: rebuild the HyperNode index if it changed; find fabric faults and queue the evictions
each affected gang's `hypertopo.io/on-fabric-fault` policy asks for; place every gang that has
pending pods (waiting until minMember pods exist) through `decide` (the placement core) and bind
it all or nothing (`binder`); write FailedScheduling events for gangs that do not fit, and PodGroup
status. Leader election is not done here: run one replica (or one per scheduler name).
"""

from __future__ import annotations

import argparse
import gc
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from aggregator.placement import podgroups, rescheduler, topology
from aggregator.placement.binder import Binder, BindItem, BindOutcome
from aggregator.placement.decide import Decision, decide
from aggregator.placement.events import EventRecorder, rfc3339
from aggregator.placement.eviction import EvictionQueue
from aggregator.placement.podgroups import GangView
from aggregator.placement.rescheduler import Eviction, FaultTracker
from aggregator.placement.scheduler_metrics import SchedulerMetrics, serve
from aggregator.placement.state import ClusterState, PodKey, pod_key

log = logging.getLogger("hypertopo.scheduler")
PODGROUP_API = "scheduling.x-k8s.io/v1alpha1"


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


class Scheduler:
    """Build with a `KubeApi`-like object; `start()`, then `stop()`."""

    def __init__(self, api: Any, options: Options, *, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from aggregator.placement.adapters import kube

        self.api, self.options, self.clock = api, options, clock
        self.metrics = SchedulerMetrics(registry or CollectorRegistry())
        self.state = ClusterState(options.scheduler_name)
        self.faults = FaultTracker(options.unknown_grace_seconds)
        self.events = EventRecorder(api, options.scheduler_name, repeat_seconds=options.event_repeat_seconds, clock=clock)
        self.binder = Binder(api, lambda outcome: self._queue.put(("bound", outcome)), workers=options.bind_workers)
        self.evictions = EvictionQueue(api, lambda ev, outcome, detail: self._queue.put(("evicted", (ev, outcome, detail))),
                                       rate=options.eviction_rate, burst=options.eviction_burst,
                                       retry_seconds=options.eviction_retry_seconds, clock=clock)
        # one writer, in order, coalescing per PodGroup: a later status never loses to an earlier one
        self._writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="status")
        self._unwritten: dict[PodKey, dict[str, Any]] = {}
        self._unwritten_lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        sources = [(kube.NODES, options.node_selector), (kube.PODS, ""), (kube.HYPERNODES, ""), (kube.PODGROUPS, "")]
        self.informers = [
            kube.Informer(api, res, self._sink(res.kind), label_selector=sel, watch_timeout=options.watch_timeout)
            for res, sel in sources
        ]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._topology = topology.build([])
        self._topology_gen = -1
        self._scheduled_gen = -1
        self._next_resync = 0.0
        self._in_flight: set[PodKey] = set()
        self._waiting_since: dict[PodKey, float] = {}
        self._status_written: dict[PodKey, dict[str, Any]] = {}
        self._failed_nodes: dict[str, str] = {}
        self._filter_cache: dict[Any, dict[str, str]] = {}

    # -- lifecycle ----------------------------------------------------------------------------
    def _sink(self, kind: str) -> Callable[[str, Any], None]:
        return lambda event, obj: self._queue.put(("watch", (kind, event, obj)))

    def start(self) -> None:
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
        self._writes.shutdown(wait=True)

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def healthy(self) -> bool:
        return self.synced() and self._thread.is_alive()

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain(timeout=0.5)
                if self.synced():
                    self._cycle()
            except Exception:
                log.exception("scheduling cycle failed")

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
            if event == "SYNC":
                self.state.resync(kind, obj)
            else:
                self.state.apply(kind, event, obj)
        elif what == "bound":
            self._bound(payload)
        elif what == "evicted":
            self._evicted(*payload)
        elif what == "status-failed":
            self._status_written.pop(payload, None)
            self.state.dirty_gangs.add(payload)

    def _cycle(self) -> None:
        now = self.clock()
        if self._topology_gen != self.state.topology_generation:
            self._topology_gen = self.state.topology_generation
            self._topology = topology.build(self.state.hypernodes.values(), topology.node_labels_of(self.state.nodes.values()))
            self._filter_cache.clear()
            # The cluster view is large and long-lived: keep the cyclic GC from rescanning it in the
            # middle of decisions (a full collection over 10,000 nodes' objects took ~40 ms, the
            # whole p99 of a decision). Frozen objects are still freed by reference counting.
            gc.freeze()
        failed_domains = self.faults.failed_domains(self.state.hypernodes, now)
        if self._scheduled_gen == self.state.generation and now < self._next_resync and not self.faults.unknown_since:
            return
        self._fabric_faults(failed_domains)
        self._schedule(frozenset(rescheduler.own_failures(self._topology, failed_domains)), now)
        self._write_podgroup_status()
        self._scheduled_gen = self.state.generation
        self._next_resync = now + self.options.resync_seconds
        self.metrics.pending.set(len(self.state.pending_keys))

    # -- fault-driven rescheduling ------------------------------------------------------------
    def _fabric_faults(self, failed_domains: Mapping[str, str]) -> None:
        failed = rescheduler.failed_nodes(self.state, self._topology, failed_domains)
        if failed != self._failed_nodes:
            log.info("fabric-failed nodes: %s", sorted(failed) or "none")
            self._failed_nodes = failed
            self.metrics.failed_nodes.set(len(failed))
        if not failed:
            return
        affected = podgroups.gangs_on_nodes(self.state, set(failed))
        for eviction in rescheduler.plan(affected, failed):
            if self.evictions.offer(eviction):
                log.info("evicting %s/%s from %s (%s): %s", *eviction.pod, eviction.node, eviction.policy, eviction.reason)

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
        for view in podgroups.collect(self.state):
            if view.key in self._in_flight:
                continue
            if view.min_member < 0 or view.missing > 0:
                self._wait(view, now)
                continue
            self._waiting_since.pop(view.key, None)
            started = time.perf_counter()
            decision = decide(self.state, self._topology, view, excluded_domains=excluded_domains,
                              filter_cache=self._filter_cache)
            self.metrics.decision_seconds.observe(time.perf_counter() - started)
            if decision.ok:
                self._commit(decision)
            else:
                self._unschedulable(view, decision.reason)

    def _wait(self, view: GangView, now: float) -> None:
        """A gang short of members (or without its PodGroup) waits; after a while it says so."""
        since = self._waiting_since.setdefault(view.key, now)
        limit = view.timeout_seconds if view.timeout_seconds is not None else self.options.gang_wait_event_seconds
        if now - since < min(limit, self.options.gang_wait_event_seconds):
            return
        if view.min_member < 0:
            why = f"pod group {view.key[1]} not found"
        else:
            why = (f"pod group {view.key[1]} has {len(view.members)} pods, minMember is {view.min_member}: "
                   f"waiting for {view.missing} more")
        self.metrics.decisions.labels("waiting").inc()
        for pod in view.pending:
            self.events.record(pod, reason="FailedScheduling", message=why)

    def _commit(self, decision: Decision) -> None:
        view = decision.gang
        items = []
        for pod in view.pending:
            key = pod_key(pod)
            node = decision.assignments.get(key)
            if node is not None:
                self.state.assume(key, node)
                items.append(BindItem(key, str(pod["metadata"].get("uid", "")), node))
        self._in_flight.add(view.key)
        self.metrics.decisions.labels("scheduled").inc()
        placement = decision.placement
        log.info("gang %s/%s: %d pods -> %s (tier %s, %s leaves)", *view.key, len(items),
                 placement.domain if placement else "?", placement.tier if placement else "?",
                 placement.leaves if placement else "?")
        self.binder.submit(view.key, items)

    def _unschedulable(self, view: GangView, reason: str) -> None:
        self.metrics.decisions.labels("unschedulable").inc()
        for pod in view.pending:
            self.events.record(pod, reason="FailedScheduling", message=reason)
        if view.podgroup is not None:
            self.events.record(view.podgroup, reason="FailedScheduling", message=reason, kind="PodGroup",
                               api_version=PODGROUP_API)

    def _bound(self, outcome: BindOutcome) -> None:
        self._in_flight.discard(outcome.gang)
        self.state.generation += 1  # the gang's deferred status (and any waiting gang) gets a cycle
        self.metrics.bind_seconds.observe(outcome.seconds)
        self.metrics.binds.labels("bound").inc(len(outcome.bound))
        if outcome.ok:
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
        podgroup = self.state.podgroups.get(outcome.gang)
        if podgroup is not None:
            self.events.record(podgroup, reason="FailedScheduling", message=message, kind="PodGroup",
                               api_version=PODGROUP_API)

    # -- PodGroup status ----------------------------------------------------------------------
    def _write_podgroup_status(self) -> None:
        """Writes status for the PodGroups whose pods changed (a gang being bound waits: one write)."""
        dirty, self.state.dirty_gangs = self.state.dirty_gangs, set()
        for key in dirty:
            podgroup = self.state.podgroups.get(key)
            if podgroup is None:
                continue
            if key in self._in_flight:
                self.state.dirty_gangs.add(key)
                continue
            pods = podgroups.members_of(self.state, key)
            scheduled = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))
            wanted = podgroups.group_status(podgroup, pods, scheduled)
            if self._status_written.get(key) == wanted or not pods:
                continue
            patch = podgroups.status_patch(podgroup, wanted, rfc3339())
            self._status_written[key] = wanted
            if patch:
                self._queue_status(key, patch["status"])

    def _queue_status(self, key: PodKey, status: dict[str, Any]) -> None:
        with self._unwritten_lock:
            queued = key in self._unwritten
            self._unwritten[key] = {**self._unwritten.get(key, {}), **status}
        if not queued:
            self._writes.submit(self._patch_status, key)

    def _patch_status(self, key: PodKey) -> None:
        from aggregator.placement.adapters import kube

        with self._unwritten_lock:
            status = self._unwritten.pop(key, None)
        if not status:
            return
        try:
            self.api.patch_status(kube.PODGROUPS, key[0], key[1], {"status": status})
        except Exception as exc:
            log.warning("PodGroup %s/%s status not written (retried on the next cycle): %s", *key, exc)
            self._queue.put(("status-failed", key))


# -- command line -----------------------------------------------------------------------------
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    d = Options()
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--scheduler-name", default=d.scheduler_name, help="schedule pods whose spec.schedulerName is this")
    parser.add_argument("--listen", default=":9732", help="HOST:PORT for /metrics and /healthz (default :9732)")
    parser.add_argument("--node-selector", default="", help="label selector of the nodes this scheduler may use")
    parser.add_argument("--bind-workers", type=int, default=d.bind_workers, help="parallel pods/binding calls")
    parser.add_argument("--eviction-rate", type=float, default=d.eviction_rate, help="fault evictions per second")
    parser.add_argument("--eviction-burst", type=int, default=d.eviction_burst, help="eviction rate burst")
    parser.add_argument("--unknown-grace", type=float, default=d.unknown_grace_seconds,
                        help="seconds a HyperNode may stay Ready=Unknown (stale agent) before it counts as failed")
    parser.add_argument("--resync", type=float, default=d.resync_seconds, help="retry unschedulable gangs every N seconds")
    parser.add_argument("--log-level", default="INFO")


def options_from(args: argparse.Namespace) -> Options:
    return Options(scheduler_name=args.scheduler_name, node_selector=args.node_selector, bind_workers=args.bind_workers,
                   eviction_rate=args.eviction_rate, eviction_burst=args.eviction_burst,
                   unknown_grace_seconds=args.unknown_grace, resync_seconds=args.resync)


def run(args: argparse.Namespace) -> int:
    """Runs until SIGTERM/SIGINT; returns the exit code."""
    from aggregator.placement.adapters import kube

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = kube.KubeApi(kube.load_client(args.kubeconfig, pool_size=args.bind_workers + 8))
    registry = CollectorRegistry()
    scheduler = Scheduler(api, options_from(args), registry=registry)
    host, _, port = args.listen.rpartition(":")
    server = serve(registry, host or "0.0.0.0", int(port), scheduler.healthy)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    scheduler.start()
    log.info("hypertopo-scheduler %s running; metrics on %s", args.scheduler_name, args.listen)
    done.wait()
    scheduler.stop()
    server.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hypertopo-scheduler run", description=__doc__.splitlines()[0] if __doc__ else None)
    add_run_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
