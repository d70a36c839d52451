"""`hypertopo-aggregator run`: the live controller.

It keeps four caches fed by list+watch (NodeTopology objects, Nodes, agent Pods, HyperNodes), and
on every change (debounced) and on a short tick (so hold-down timers expire on time, and as a
periodic resync) it recomputes the desired HyperNodes through the pure pipeline and reconciles.
Recomputing is cheap and reconcile writes only real differences, so an idle cluster costs no API
writes. Only the replica holding the Lease writes; the others keep warm caches and take over
within one lease duration. Agent liveness is the agent Pod's readiness on that node, so agents
never write heartbeats.

Caches lag behind our own writes by one watch event; to avoid writing twice, objects returned by
our writes overlay the caches until the watch has caught up (resourceVersion comparison).

Membership follows the Node list: a NodeTopology whose Node no longer exists is not handed to the
pipeline, so a deleted node leaves its HyperNodes at once (it is not an "unknown" member for ever).
Such reports are also deleted: agents set their Node as owner, so the garbage collector removes
them, and the leader sweeps up the rest (written before owners were set, or where no garbage
collector runs) every `report_gc_period`, after a direct read has confirmed the Node is gone.

The fabric sources and their options are `render`'s (the list aggregator.registry.SOURCES):
ibnetdiscover dumps (one per rail or plane), how their hosts meet Node names, which NICs are
fabric NICs, switch LLDP tables, a model, label levels, and live sources that poll a server on a
period of their own (their pollers run as worker threads beside reconcile, and every cycle takes
their latest good facts). What the pipeline could not place (dump hosts matching no Node, Nodes
matching no dump host) and which sources serve stale facts are logged when they change, not on
every reconcile.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.common import c_heap
from agent.common.adapters.endpoints import serve
from agent.common.adapters.informer import Informer
from agent.common.command_line import CommandParser
from agent.common.report import API_GROUP, API_VERSION
from aggregator.adapters import kube as kubeapi
from aggregator.adapters.kai import KaiTopologyClient
from aggregator.adapters.kueue import TopologyClient
from aggregator.adapters.probe_plans import ProbePlanWriter
from aggregator.graph import Finding
from aggregator.live import slim
from aggregator.live.kai_topology import KaiTopologyKeeper
from aggregator.live.kueue_topology import TopologyKeeper
from aggregator.live.metrics import AggregatorMetrics
from aggregator.live.node_marks import LABEL_MANAGER, NodeMarker
from aggregator.live.reconcile import ApiError, Applier, NotLeader, is_owned
from aggregator.live.refusals import Refusals
from aggregator.live.service import Service, add_election_arguments, elector_from
from aggregator.placement.live.events import EventRecorder
from aggregator.registry import add_source_arguments, load_sources
from aggregator.sources import Source
from aggregator.sources.measured import MeasuredFabric
from aggregator.sources.nodetopology import NodeReports
from aggregator.tree.explain import Narrator

log = logging.getLogger(__name__)

Obj = dict[str, Any]
DEFAULT_AGENT_SELECTOR = "app.kubernetes.io/name=hypertopo-agent"


class DesiredState(Protocol):
    """What the pipeline returns (aggregator.pipeline.Desired)."""

    @property
    def hypernodes(self) -> list[dict[str, Any]]: ...
    @property
    def node_labels(self) -> Mapping[str, Mapping[str, str]]: ...
    @property
    def unhealthy_nodes(self) -> frozenset[str]: ...
    @property
    def degraded_nodes(self) -> frozenset[str]: ...  # members with grey findings
    @property
    def warnings(self) -> tuple[str, ...]: ...  # inputs that could not be placed


@dataclass(frozen=True)
class ClusterView:
    """The controller's current knowledge (raw objects by name), handed to the pipeline."""

    topologies: Mapping[str, Obj]
    nodes: Mapping[str, Obj]
    agent_ready: Mapping[str, bool] | None  # None: agent pods not tracked
    # node names whose NodeTopology, Node or agent pod changed since the previous view (the
    # informers' changed keys); None: not known, compare the whole view
    changed: frozenset[str] | None = None


Compute = Callable[[ClusterView, float], DesiredState]
Annotate = Callable[[Sequence[Mapping[str, Any]]], Sequence[Mapping[str, Any]]]


def _rv(obj: Mapping[str, Any]) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion", ""))
    except ValueError:
        return None


@dataclass
class Overlay:
    """Objects we wrote (or deleted) that the watch has not delivered yet."""

    written: dict[str, Obj] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)

    def view(self, snapshot: dict[str, Obj]) -> dict[str, Obj]:
        for name, obj in list(self.written.items()):
            seen, ours = _rv(snapshot.get(name, {})), _rv(obj)
            if ours is not None and (name not in snapshot or seen is None or seen < ours):
                snapshot[name] = obj
            else:
                del self.written[name]
        for name, version in list(self.deleted.items()):
            seen = _rv(snapshot.get(name, {}))
            if name in snapshot and seen is not None and seen <= version:
                del snapshot[name]
            else:
                del self.deleted[name]
        return snapshot


def agent_readiness(pods: Mapping[str, Obj]) -> dict[str, bool]:
    """Node name -> whether an agent pod on it is Ready (and not being deleted)."""
    ready: dict[str, bool] = {}
    for pod in pods.values():
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        is_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        is_ready = is_ready and not (pod.get("metadata") or {}).get("deletionTimestamp")
        ready[node] = ready.get(node, False) or is_ready
    return ready


@dataclass(frozen=True)
class Options:
    node_labels: bool = False
    taint_unhealthy: bool = False
    agent_selector: str = DEFAULT_AGENT_SELECTOR
    debounce: float = 0.2
    period: float = 1.0
    agent_namespace: str | None = None  # where the agent pods run (None: every namespace)
    report_gc_period: float = 60.0  # seconds between sweeps for reports of deleted Nodes (0: never)
    mark_degraded: bool = False  # annotate degraded Nodes (node_marks.DEGRADED_ANNOTATION)
    # the configured sources besides the reports, and --fabric-interfaces: what explains an empty tree
    fabric_sources: tuple[str, ...] = ()
    fabric_pattern: str | None = None
    # the Node labels the sources read besides hypertopo's own (slim.labels_read); None: every label
    node_label_keys: frozenset[str] | None = None


def reports_of_members(topologies: Mapping[str, Obj], nodes: Mapping[str, Obj]) -> dict[str, Obj]:
    """The NodeTopology objects whose Node exists: only those make a node a member of anything."""
    return {name: obj for name, obj in topologies.items() if name in nodes}


def orphaned_reports(topologies: Mapping[str, Obj], nodes: Mapping[str, Obj]) -> list[str]:
    """Names of NodeTopology objects whose Node is not in the cache (candidates for the sweep)."""
    return sorted(name for name in topologies if name not in nodes)


def _slim_nodes(written: Mapping[str, Obj], record: Callable[[Obj], Obj]) -> dict[str, Obj]:
    """Nodes our writes returned, kept as the informer keeps them until its watch catches up."""
    return {name: record(node) for name, node in written.items()}


def freeze_start_up_heap() -> bool:
    """Moves every object alive now out of the garbage collector's sight (`gc.freeze`); True.

    Called once, after the informers' initial lists and the first full compute: at 100,000 nodes
    the cached objects, the parsed reports and the pipeline's state are ~9 million tracked
    objects, and every full (generation 2) collection, which the allocations of a compute set off
    every few computes, walks them all again: 3.5-7 s of CPU each time, for nothing, since the
    reports are immutable and acyclic (refcounting frees them when replaced). One collection
    first, so the start-up's own cyclic garbage is freed rather than frozen."""
    gc.collect()
    gc.freeze()
    c_heap.release_free_heap()  # what decoding the initial lists' pages took, back to the system
    return True


class Controller:
    def __init__(
        self,
        kube: kubeapi.KubeClient,
        compute: Compute,
        *,
        options: Options,
        metrics: AggregatorMetrics,
        may_write: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        sources_ready: Callable[[], bool] = lambda: True,  # live sources have their first facts
        annotate: Annotate = lambda objects: objects,  # adds the measured figures (sources.measured)
    ):
        self.kube = kube
        self.sources_ready = sources_ready
        self.annotate = annotate
        self.compute = compute
        self.options = options
        self.metrics = metrics
        self.may_write = may_write
        self.clock = clock
        self.changed = threading.Event()
        self.cycles = 0
        self.next_wake: float | None = None  # seconds until a hold-down deadline falls due
        self.last_beat = time.monotonic()
        wake = self.changed.set
        # the changed keys of these three drive the feed (`view().changed`)
        # slim records (aggregator.live.slim): the parsed report, the Node and agent pod fields read
        self.topologies = Informer(kube, kubeapi.NODETOPOLOGIES, on_change=wake, track_changes=True,
                                   transform=slim.slim_topology)
        self._node_record = slim.aggregator_node(options.node_label_keys)
        self.nodes = Informer(kube, kubeapi.NODES, on_change=wake, track_changes=True, transform=self._node_record)
        self.pods = Informer(
            kube,
            kubeapi.PODS,
            label_selector=options.agent_selector or None,
            namespace=options.agent_namespace,
            on_change=wake,
            track_changes=True,
            transform=slim.slim_agent_pod,
        )
        self.hypernodes = Informer(kube, kubeapi.HYPERNODES, on_change=wake, transform=slim.slim_hypernode)
        self.applier = Applier(kubeapi.HyperNodeClient(kube), may_write=may_write)
        self.marker = NodeMarker(kubeapi.NodeClient(kube, label_manager=LABEL_MANAGER), may_write=may_write)
        # with --node-labels, Kueue's Topology names those labels (aggregator.live.kueue_topology)
        self.kueue = TopologyKeeper(TopologyClient(kube), may_write=may_write) if options.node_labels else None
        # and so does KAI's (aggregator.live.kai_topology); each is left out where its CRD is not served
        self.kai = KaiTopologyKeeper(KaiTopologyClient(kube), may_write=may_write) if options.node_labels else None
        self._hn_overlay = Overlay()
        self._pod_nodes: dict[str, str] = {}  # agent pod key -> its node, for pods that go away
        self._node_overlay = Overlay()
        self._next_sweep = 0.0  # time.monotonic() of the next report sweep
        self._clashes = 0
        self.reports_collected = 0
        self.warnings: tuple[str, ...] = ()  # the pipeline's warnings, as last logged
        self.narrator = Narrator(options.fabric_sources, options.fabric_pattern)  # why nodes are left out
        self.heap_frozen = False  # freeze_start_up_heap() ran after the first cycle
        self.heap_trimmer = c_heap.HeapTrimmer()
        self.events = EventRecorder(kube, "hypertopo-aggregator", clock=time.monotonic)
        self.refusals = Refusals(metrics.registry, on_new=self._refused)  # claims the cross-checks refused

    @property
    def informers(self) -> tuple[Informer, ...]:
        tracked = (self.topologies, self.nodes, self.hypernodes)
        return (*tracked, self.pods) if self.options.agent_selector else tracked

    def start(self) -> Controller:
        for informer in self.informers:
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
        self.events.shutdown()

    def _refused(self, finding: Finding) -> None:
        """A Warning event on the NodeTopology whose claim was refused (`kubectl describe` shows why)."""
        obj = self.topologies.snapshot().get(finding.node) or {"metadata": {"name": finding.node}}
        self.events.record(obj, reason="ReportRefused", message=finding.text, kind="NodeTopology",
                           api_version=f"{API_GROUP}/{API_VERSION}")  # fmt: skip

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers) and self.sources_ready()

    def view(self) -> ClusterView:
        changed = self._drain_changed()  # before the snapshots: a change in between is seen twice, not lost
        nodes = self._node_overlay.view(self.nodes.snapshot())
        agents = agent_readiness(self.pods.snapshot()) if self.options.agent_selector else None
        return ClusterView(reports_of_members(self.topologies.snapshot(), nodes), nodes, agents, changed)

    def _drain_changed(self) -> frozenset[str]:
        """Node names touched since the last drain: changed NodeTopology and Node keys (a node's
        name), and the nodes an agent pod left or landed on."""
        names = self.topologies.drain_changed() | self.nodes.drain_changed()
        if self.options.agent_selector:
            pods = self.pods.snapshot()
            for key in self.pods.drain_changed():
                before = self._pod_nodes.pop(key, None)
                now = ((pods.get(key) or {}).get("spec") or {}).get("nodeName")
                names.update(n for n in (before, now) if n)
                if now:
                    self._pod_nodes[key] = now
        return frozenset(names)

    def live_hypernodes(self) -> dict[str, Obj]:
        return self._hn_overlay.view(self.hypernodes.snapshot())

    # -- one reconcile ---------------------------------------------------------------------------
    def cycle(self) -> int:
        """Recompute and reconcile once; returns the number of API writes made."""
        started = time.perf_counter()
        view = self.view()
        now = self.clock()
        desired = self.compute(view, now)
        self._log_warnings(desired.warnings)
        if self.may_write():  # the leader's count (a standby computes the same findings)
            self.refusals.observe(getattr(desired, "findings", ()))
        self._explain(desired, view)
        deadline = getattr(desired, "next_deadline", None)
        self.next_wake = None if deadline is None else max(0.05, deadline - now + 0.01)
        agents = view.agent_ready
        stale = 0 if agents is None else sum(1 for n in view.topologies if not agents.get(n, False))
        writes = 0
        if self.may_write():
            writes = self._write(desired, view)
            writes += self._sweep_reports(view.nodes)
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        if self.may_write():  # still: a lease lost meanwhile withdraws the state gauges instead
            owned = [o for o in self.live_hypernodes().values() if is_owned(o)]
            self.metrics.publish_state(owned, stale_agents=stale, clashes=self._clashes)
        else:
            self.metrics.withdraw_state()
        self.cycles += 1
        return writes

    def _log_warnings(self, warnings: tuple[str, ...]) -> None:
        """Logs the inputs' warnings (dump hosts matching no node, ...) when they change, not every
        cycle: each is a standing fact about the inputs until a Node joins or leaves."""
        if warnings == self.warnings:
            return
        for warning in warnings:
            log.warning("inputs: %s", warning)
        if not warnings:
            log.info("inputs: the earlier warnings no longer apply")
        self.warnings = warnings

    def _explain(self, desired: DesiredState, view: ClusterView) -> None:
        """Logs (when it changes) and exports why the tree is empty or leaves nodes out."""
        tree = getattr(desired, "tree", None)
        refused = {f.node for f in getattr(desired, "findings", ())}
        explanation = self.narrator.observe(nodes=view.nodes.keys(), placed=tree.lowest if tree is not None else {},
                                            hypernodes=len(desired.hypernodes), topologies=view.topologies,
                                            refused=refused, changed=view.changed)  # fmt: skip
        self.metrics.publish_explanation(explanation)

    def _sweep_reports(self, nodes: Mapping[str, Obj]) -> int:
        """Deletes NodeTopology objects of Nodes that are gone (at most every report_gc_period)."""
        period = self.options.report_gc_period
        if period <= 0 or time.monotonic() < self._next_sweep:
            return 0
        self._next_sweep = time.monotonic() + period
        topologies = self.topologies.snapshot()
        deleted = 0
        for name in orphaned_reports(topologies, nodes):
            try:
                deleted += self._collect_report(name, topologies[name])
            except ApiError as exc:
                self.metrics.reconcile_errors.labels(kind="report-gc").inc()
                log.warning("NodeTopology %s of a deleted Node not removed, retrying later: %s", name, exc)
                if exc.status == 0:
                    raise
        return deleted

    def _collect_report(self, name: str, report: Mapping[str, Any]) -> int:
        try:
            self.kube.get(kubeapi.NODES, name)
            return 0  # the Node exists after all (the cache is behind): keep its report
        except ApiError as exc:
            if not exc.not_found:
                raise
        if not self.may_write():
            raise NotLeader("lease lost; not deleting reports")
        version = str((report.get("metadata") or {}).get("resourceVersion", ""))
        try:  # the precondition keeps a report rewritten meanwhile (a Node that came back)
            self.kube.delete(kubeapi.NODETOPOLOGIES, name, resource_version=version or None)
        except ApiError as exc:
            if exc.not_found or exc.conflict:
                return 0
            raise
        log.info("deleted NodeTopology %s: its Node no longer exists", name)
        self.reports_collected += 1
        return 1

    def _write(self, desired: DesiredState, view: ClusterView) -> int:
        outcome = self.applier.apply(self.annotate(desired.hypernodes), self.live_hypernodes())
        self._hn_overlay.written.update((n, slim.slim_hypernode(o)) for n, o in outcome.written.items())
        for name in outcome.deleted:
            self._hn_overlay.deleted[name] = _rv(self.hypernodes.snapshot().get(name, {})) or 0
        self._clashes = len(outcome.clashes)
        if outcome.errors:
            self.metrics.reconcile_errors.labels(kind="hypernode").inc(len(outcome.errors))
        writes = outcome.total_writes
        if self.options.node_labels:
            marks = self.marker.apply_labels(desired.node_labels, view.nodes)
            self._node_overlay.written.update(_slim_nodes(marks.written, self._node_record))
            writes += sum(marks.writes.values())
        if self.kueue is not None:
            writes += self.kueue.sync(desired.hypernodes, self.clock())
        if self.kai is not None:
            writes += self.kai.sync(desired.hypernodes, self.clock())
        if self.options.taint_unhealthy:
            nodes = self._node_overlay.view(self.nodes.snapshot())
            marks = self.marker.apply_taints(desired.unhealthy_nodes, nodes)
            self._node_overlay.written.update(_slim_nodes(marks.written, self._node_record))
            writes += sum(marks.writes.values())
        if self.options.mark_degraded:
            nodes = self._node_overlay.view(self.nodes.snapshot())
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
            marks = self.marker.apply_degraded(desired.degraded_nodes, nodes, since)
            self._node_overlay.written.update(_slim_nodes(marks.written, self._node_record))
            writes += sum(marks.writes.values())
        if writes:
            log.info("reconcile: %d API writes (%s)", writes, dict(outcome.writes))
        return writes

    def run(self, stop: threading.Event) -> None:
        """Reconcile on change (debounced) and every `period` seconds, until `stop` is set."""
        while not stop.is_set():
            self.last_beat = time.monotonic()
            self.changed.wait(min(self.options.period, self.next_wake or self.options.period))
            if stop.is_set():
                return
            if self.changed.is_set():
                stop.wait(self.options.debounce)
                self.changed.clear()
            if not self.synced():
                continue
            if not self.heap_frozen:  # the start-up's cyclic garbage, freed before a full build
                gc.collect()  # freezes what is alive (Pipeline freeze_built_state) rather than kept
            self._guarded_cycle()
            if not self.heap_frozen:
                self.heap_frozen = freeze_start_up_heap()
            else:  # what a compute and its writes decoded and dropped, back to the system now and then
                self.heap_trimmer.maybe_release()

    def _guarded_cycle(self) -> None:
        try:
            self.cycle()
        except NotLeader as exc:
            log.info("reconcile stopped: %s", exc)
        except ApiError as exc:
            self.metrics.reconcile_errors.labels(kind="api").inc()
            log.warning("reconcile failed, retrying next cycle: %s", exc)
        except Exception:
            self.metrics.reconcile_errors.labels(kind="internal").inc()
            log.exception("reconcile failed, retrying next cycle")


# -- command line ------------------------------------------------------------------------------------


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG)")
    add("--namespace", default=os.environ.get("POD_NAMESPACE", "hypertopo-system"), help="namespace of the Lease")
    add(
        "--agent-namespace",
        default=os.environ.get("POD_NAMESPACE", "hypertopo-system"),
        help="namespace of the agent pods (the DaemonSet's); empty: all namespaces (needs cluster-wide pod access)",
    )
    add_election_arguments(parser, lease_name="hypertopo-aggregator")  # --identity, --lease-*, ...
    add("--agent-selector", default=DEFAULT_AGENT_SELECTOR,
        help="label selector of the agent pods (empty: agent liveness not tracked)")
    add_source_arguments(parser, live=True)  # aggregator.registry: every source's options, as `render`'s
    add("--ready-threshold", type=float, default=0.0, help="unhealthy members a HyperNode tolerates")
    add(
        "--degraded-threshold",
        type=float,
        default=0.0,
        help="degraded members (grey failures: error rates, links below their speed, flapping, PCIe "
        "downtrained, NVLink fabric degraded) a HyperNode tolerates before FabricDegraded=True: a fraction "
        "below 1 or a count (default 0: any degraded member); Ready stays about failures",
    )
    add(
        "--hold-down",
        type=float,
        default=5.0,
        help="seconds a new Ready or FabricDegraded state must last before it is published (flap damping; default 5)",
    )
    add(
        "--structural-hold-down",
        type=float,
        default=120.0,
        help="seconds a node's report may lack its cabling (LLDP neighbours, RDMA devices, NVLink domain) "
        "before the tree is reshaped without them: an agent restart or lost LLDP frames never delete and "
        "re-create a HyperNode (default 120, one LLDP TTL; 0: reshape at once)",
    )
    add("--node-labels", action="store_true", help="label Nodes with hypertopo.io/<tierName>=<HyperNode>; "
        "also keeps Kueue's and KAI's Topology 'hypertopo' of those labels where their CRDs are served")
    add("--taint-unhealthy", action="store_true", help="taint Nodes whose fabric failed (NoSchedule)")
    add(
        "--mark-degraded",
        action="store_true",
        help="annotate Nodes with grey fabric failures hypertopo.io/fabric-degraded=<since, RFC 3339> "
        "(the scheduler's restart-pods-on-degraded policy acts on it)",
    )
    add("--listen", default=":9731", help="address of /metrics, /healthz and /readyz (default :9731)")
    add("--period", type=float, default=None, help="seconds between periodic reconciles (default: from --hold-down)")
    add("--resync", type=float, default=300.0, help="seconds between full pipeline rebuilds (default 300)")
    add("--debounce", type=float, default=0.2, help="seconds to gather changes before reconciling")
    add(
        "--report-gc-period",
        type=float,
        default=60.0,
        help="seconds between sweeps that delete NodeTopology objects of deleted Nodes (0: never; default 60)",
    )


def pipeline_compute(
    args: argparse.Namespace, sources: Sequence[Source] | None = None, metrics: AggregatorMetrics | None = None
) -> Compute:
    """The pure pipeline (aggregator.pipeline) fed with the live view plus the sources (loaded from
    the options, as `render` loads them, unless given); `metrics` get the structural hold-down's
    count of held nodes after each compute."""
    from aggregator.live.feed import PipelineFeed
    from aggregator.pipeline import Pipeline

    pipeline = Pipeline(
        ready_threshold=args.ready_threshold,
        hold_down_seconds=args.hold_down,
        degraded_threshold=args.degraded_threshold,
        freeze_built_state=True,  # its full builds live until the next one: out of the collector's sight
    )
    if sources is None:
        sources = load_sources(args, live=True)
    feed = PipelineFeed(pipeline, sources, resync=args.resync, structural_hold=args.structural_hold_down)

    def compute(view: ClusterView, now: float) -> DesiredState:
        desired = feed.compute(view.topologies, view.nodes, view.agent_ready, now, view.changed)
        if metrics is not None:
            metrics.structure_held_nodes.set(feed.hold.holding)
        return desired

    return compute


def _period(args: argparse.Namespace) -> float:
    if args.period:
        return float(args.period)
    return min(10.0, max(0.25, float(args.hold_down) / 4))  # hold-down expiries show up on time


def run(args: argparse.Namespace) -> int:
    """Runs the controller until SIGTERM/SIGINT; releases the lease on the way out; returns 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    c_heap.limit_arenas()  # before any thread allocates (agent.common.c_heap says why)
    metrics = AggregatorMetrics()
    try:
        sources = load_sources(args, live=True)
        compute = pipeline_compute(args, sources, metrics)
    except (OSError, ValueError) as exc:  # the sources' errors name the file and line
        from aggregator.inputs import exit_code_of  # 1: a file, 2: an option's value

        log.error("hypertopo-aggregator run: %s", exc)
        return exit_code_of(exc)
    try:
        kube = kubeapi.connect(args.kubeconfig, on_write=metrics.count_write)
    except ApiError as exc:
        log.error("hypertopo-aggregator run: %s", exc)
        return 1
    lease = kubeapi.LeaseClient(kube, namespace=args.namespace, name=args.lease_name)
    elector = elector_from(args, lease, on_change=metrics.set_leader)
    may_write = elector.is_leader if elector else (lambda: True)
    options = Options(
        args.node_labels,
        args.taint_unhealthy,
        args.agent_selector,
        args.debounce,
        _period(args),
        agent_namespace=args.agent_namespace or None,
        report_gc_period=args.report_gc_period,
        mark_degraded=args.mark_degraded,
        fabric_sources=tuple(s.name for s in sources if not isinstance(s, NodeReports)),
        fabric_pattern=next((s.fabric_interfaces for s in sources if isinstance(s, NodeReports)), None),
        node_label_keys=slim.labels_read(sources),
    )
    measured = next((s for s in sources if isinstance(s, MeasuredFabric)), None)
    controller = Controller(kube, compute, options=options, metrics=metrics, may_write=may_write,
                            sources_ready=lambda: all(s.ready() for s in sources),
                            annotate=measured.annotate if measured else lambda objects: objects)  # fmt: skip
    if measured is not None:  # folds the controller's caches; writes probe plans when leading
        measured.attach(lambda: (controller.live_hypernodes(), controller.topologies.snapshot()),
                        ProbePlanWriter(kube, may_write=may_write))  # fmt: skip
    if elector is None:
        metrics.set_leader(True)

    def healthy() -> bool:
        return time.monotonic() - controller.last_beat < max(30.0, 5 * options.period)

    readyz = lambda: readiness(controller.synced(), sources)  # noqa: E731
    server = serve(metrics.registry, args.listen, {"/healthz": healthy, "/readyz": readyz})
    controller.start()
    wake = controller.changed.set  # a live source's new facts reconcile at once
    pollers = [w for source in sources for w in source.workers(registry=metrics.registry, wake=wake)]
    service = Service([("reconcile", controller.run), *pollers], elector, on_stop=controller.changed.set,
                      cleanup=(controller.stop, server.shutdown), ready_to_lead=controller.synced)
    return service.run()


def build_parser() -> argparse.ArgumentParser:
    """`hypertopo-aggregator run`'s options on their own (`python -m aggregator.live.controller`)."""
    parser = CommandParser(prog="hypertopo-aggregator run", description=__doc__)
    add_run_arguments(parser)
    return parser


def readiness(synced: bool, sources: Iterable[Source]) -> tuple[bool, str]:
    """/readyz: ready once the informers synced and every live source has its first facts. A
    source gone stale after that keeps the pod ready (its last good facts still build the tree, and
    an unready pod would stop reconciling and drop out of its Service exactly when it matters), but
    the answer names it and why, as `hypertopo_source_stale` does."""
    stale = [f"{source.name} stale: {why}" for source in sources if (why := source.stale())]
    return synced, "; ".join(["ok" if synced else "not ready: informers syncing or a live source has no facts yet", *stale])


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
