"""The aggregator's pure pipeline: cluster inputs -> desired HyperNodes, node labels, unhealthy nodes.

This is the controller's one entry point (aggregator.live.controller feeds it what it lists and
watches; the `render` command feeds it files): sources -> fabric graph -> tier inference ->
member health -> Ready conditions with hold-down -> HyperNode objects. It keeps the last result so
that

* `compute(inputs, now)` rebuilds everything (start-up, resync, a changed fabric dump), and
* `update_report(node, report, now)` / `update_node(...)` take the fast path for the common event,
  one node's health changing: only that node's domains are re-evaluated and re-rendered, and
  `Desired.changed` names the HyperNodes whose objects differ, so only those are written.
  A report that changes where the node is cabled (or a node that is new) falls back to a full
  rebuild, since it can move domain boundaries.

No I/O and no clock: time is `now` (seconds since the epoch), passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.cluster_model import ClusterModel
from agent.common.report import NodeReport
from aggregator import crosscheck
from aggregator import render as hypernodes
from aggregator.collector import collector_paused
from aggregator.graph import FabricGraph, Finding
from aggregator.health import (
    HEALTHY,
    Condition,
    DegradedConditions,
    HoldDown,
    MemberHealth,
    MemberState,
    Threshold,
    all_clear,
    judge,
    member_health,
    with_fabric_faults,
)
from aggregator.layered import Layered
from aggregator.sources import Source
from aggregator.sources.ibnetdiscover import Dumps, Fabric, HostNames
from aggregator.sources.labels import LabelLevels
from aggregator.sources.model import ModelFile
from aggregator.sources.nodetopology import NodeReports
from aggregator.sources.switch_lldp import SwitchTable, SwitchTables
from aggregator.tiers.infer import DomainTree, NodeClasses, infer, signature_of

NODE_LABEL_PREFIX = "hypertopo.io/"
CABLING = "Cabling"  # member health cause: a node lacks cables its leaf domain's other nodes have


# the ClusterInputs fields that stand for the built-in sources (the keywords of `sources_of`)
SHORTHAND = ("fabric", "switch_tables", "label_levels", "model", "fabric_interfaces", "host_names")


@dataclass(frozen=True)
class ClusterInputs:
    """The cluster (reports, Nodes, agents, labels) and the fabric sources, in graph-build order
    (aggregator.registry). The keyword fields `fabric` ... `host_names` are a shorthand for the
    built-in sources (tests, benchmarks, the simulator); `sources` and the shorthand do not mix."""

    reports: Mapping[str, NodeReport]  # NodeTopology reports by node name
    node_ready: Mapping[str, bool] = field(default_factory=dict)  # Nodes known to the API: Ready?
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    agent_ready: Mapping[str, bool] | None = None  # agent pod readiness by node; None: not tracked
    fabric: Fabric | None = None  # a parsed ibnetdiscover dump
    switch_tables: Sequence[SwitchTable] = ()
    label_levels: Sequence[str] = ()
    model: ClusterModel | None = None
    include_fabric_hosts: bool = False  # make hosts named in the dump nodes (render without a cluster)
    # regex of the interfaces whose LLDP neighbours are fabric cabling; None: the RDMA-capable ones
    # (sources.nodetopology)
    fabric_interfaces: str | None = None
    host_names: HostNames = field(default_factory=HostNames)  # dump hosts -> node names
    sources: Sequence[Source] = ()  # loaded sources (aggregator.registry.load_sources)

    def __post_init__(self) -> None:
        shorthand = (self.fabric, self.switch_tables, self.label_levels, self.model, self.fabric_interfaces)
        if self.sources and (any(shorthand) or self.host_names != HostNames()):
            raise ValueError("ClusterInputs: give either `sources` or the source shorthand fields, not both")

    def all_sources(self) -> tuple[Source, ...]:
        """The sources in graph-build order; node reports become facts even when none is named."""
        found = tuple(self.sources) or sources_of(**{name: getattr(self, name) for name in SHORTHAND})
        if not any(isinstance(s, NodeReports) for s in found):
            found = (NodeReports(), *found)
        return found


def sources_of(
    *,
    fabric: Fabric | None = None,
    switch_tables: Sequence[SwitchTable] = (),
    label_levels: Sequence[str] = (),
    model: ClusterModel | None = None,
    fabric_interfaces: str | None = None,
    host_names: HostNames | None = None,
) -> tuple[Source, ...]:
    """The built-in sources from already parsed inputs (what aggregator.registry loads from options)."""
    found: list[Source] = [NodeReports(fabric_interfaces)]
    if model is not None:
        found.append(ModelFile(model))
    if fabric is not None:
        found.append(Dumps(fabric, host_names))
    if switch_tables:
        found.append(SwitchTables(switch_tables))
    if label_levels:
        found.append(LabelLevels(tuple(label_levels)))
    return tuple(found)


@dataclass(frozen=True)
class Desired:
    hypernodes: list[dict[str, Any]]  # full objects, sorted by name
    node_labels: Mapping[str, dict[str, str]]  # node -> {hypertopo.io/<tierName>: HyperNode name}
    unhealthy_nodes: frozenset[str]
    degraded_nodes: frozenset[str] = frozenset()  # members with grey findings (FabricDegraded)
    changed: frozenset[str] = frozenset()  # HyperNode names added, changed or removed since last time
    tree: DomainTree | None = None
    next_deadline: float | None = None  # when a held-down condition change falls due
    warnings: tuple[str, ...] = ()  # inputs that could not be placed (dump hosts matching no node, ...)
    findings: tuple[Finding, ...] = ()  # reports' claims refused by the cross-checks (aggregator.crosscheck)


# sources that never join on HCA GUIDs: duplicate GUIDs need refusing only before one that does
_GUIDLESS = (NodeReports, ModelFile, SwitchTables, LabelLevels)


def build_graph(inputs: ClusterInputs, refused: Sequence[Finding] = ()) -> FabricGraph:
    """Every node the cluster knows, then each source's facts in order (aggregator.sources), then
    the cross-checks of the reports against each other and the fabric (aggregator.crosscheck).
    `refused`: findings about reports already set aside (`crosscheck.refuse_mismatched`)."""
    graph = FabricGraph()
    graph.nodes.update(inputs.reports, inputs.node_ready, inputs.node_labels)
    graph.findings.extend(refused)
    guids_checked = False
    for source in inputs.all_sources():
        if not guids_checked and not isinstance(source, _GUIDLESS):
            crosscheck.refuse_duplicate_guids(graph)  # before dumps and UFM join on them
            guids_checked = True
        source.apply(graph, inputs)
    crosscheck.settle(graph)
    return graph


class Pipeline:
    def __init__(
        self,
        *,
        ready_threshold: float = 0.0,
        hold_down_seconds: float = 0.0,
        degraded_threshold: float = 0.0,
        freeze_built_state: bool = False,
    ) -> None:
        """`freeze_built_state`: a long-running process (the controller) keeps what a full build
        made out of the cyclic collector's sight (aggregator.collector); a one-shot one need not."""
        self.freeze_built_state = freeze_built_state
        self.threshold = Threshold(ready_threshold)
        self.hold = HoldDown(hold_down_seconds)
        self.degraded = DegradedConditions(Threshold(degraded_threshold), HoldDown(hold_down_seconds))
        self._inputs: ClusterInputs | None = None
        self._graph = FabricGraph()
        self._classes = NodeClasses()
        self.full_computes = 0  # how often everything was rebuilt (the fast paths avoid it)
        self._tree: DomainTree | None = None
        self._names: dict[str, str] = {}
        self._health: dict[str, MemberHealth] = {}
        self._objects: dict[str, dict[str, Any]] = {}
        self._node_labels: Mapping[str, dict[str, str]] = {}
        self._order: list[str] = []  # HyperNode names, sorted
        self._unhealthy: set[str] = set()
        self._unknown: set[str] = set()
        self._refused: dict[str, NodeReport] = {}  # reports filed under another node's name

    # -- full rebuild ---------------------------------------------------------------------------
    def compute(self, inputs: ClusterInputs, now: float) -> Desired:
        """Everything from the inputs: graph, classes, tree, health, objects and labels (the
        collector paused meanwhile: the build makes ~2 million acyclic objects at 100,000 nodes)."""
        with collector_paused(freeze=self.freeze_built_state):
            return self._compute(inputs, now)

    def _compute(self, inputs: ClusterInputs, now: float) -> Desired:
        raw = dict(inputs.reports)
        if inputs is self._inputs:  # a rebuild of our own: the refused reports are still there
            raw.update((n, r) for n, r in self._refused.items() if n not in raw)
        reports, refused = crosscheck.refuse_mismatched(raw)
        self._refused = {f.node: raw[f.node] for f in refused}
        self._inputs = dataclasses.replace(
            inputs,
            reports=reports,
            node_ready=dict(inputs.node_ready),
            agent_ready=None if inputs.agent_ready is None else dict(inputs.agent_ready),
        )
        self.full_computes += 1
        self._graph = build_graph(self._inputs, refused)
        self._classes = NodeClasses.of(self._graph)
        tree = self._tree = infer(self._graph, self._classes)
        self._names = hypernodes.names(tree)
        self._judge_members()
        self.hold.forget(tree.domains)
        self.degraded.reset(self._health, tree.domains)
        previous = self._objects
        self._objects = {self._names[key]: self._object(key, now) for key in tree.domains}
        self._order = sorted(self._objects)
        self._node_labels = self._labels(tree)
        changed = {
            n for n in previous.keys() | self._objects.keys() if previous.get(n) != self._objects.get(n)
        }
        return self._desired(frozenset(changed))

    def refresh(self, now: float) -> Desired:
        """Re-evaluates every condition (hold-down deadlines) without rebuilding the tree."""
        if self._tree is None:
            raise RuntimeError("refresh() before compute()")
        return self._rerender(list(self._tree.domains), now)

    # -- fast paths -----------------------------------------------------------------------------
    def update_report(self, node: str, report: NodeReport | None, now: float) -> Desired:
        """One node's NodeTopology changed (None: deleted).

        Health alone: only the node's domains are re-evaluated. Its cabling or NVLink clique: the
        node moves to the class of its new signature, inference runs over the classes again, and
        only domains whose classes changed are rebuilt and re-rendered (`_restructure`). A new
        node, a deleted report or changed HCA GUIDs (what dumps and UFM join on) rebuild all."""
        inputs = self._require_inputs()
        reports = inputs.reports
        assert isinstance(reports, dict)  # compute() took a copy of its own
        mismatched = report is not None and report.node_name != node
        if mismatched or self._refused.pop(node, None) is not None:  # filed under another's name, or was
            reports.pop(node, None)
            if report is not None:
                (self._refused if mismatched else reports)[node] = report
            return self.compute(inputs, now)
        if report is None:
            reports.pop(node, None)
        else:
            reports[node] = report
        old = self._graph.facts.get(node)
        new = self._reports_source().facts(report) if report is not None else None
        if node not in self._graph.nodes or new is None:
            return self.compute(inputs, now)
        settled = crosscheck.settle_node(self._graph, node, new)  # as a full build would
        if settled is None:
            return self.compute(inputs, now)  # a claim to check against the rest: the full checks
        new, partners = settled
        if old == new:
            return self._refresh_node(node, now)
        if (old.guids if old is not None else frozenset()) != new.guids:
            return self.compute(inputs, now)
        self._graph.set_node_facts(node, new)
        dirty = self._classes.move(node, signature_of(self._graph, node))
        for partner in partners:  # the other of a clique of two, formed or broken up
            dirty |= self._classes.move(partner, signature_of(self._graph, partner))
        if not dirty:
            return self._refresh_node(node, now)
        return self._restructure(dirty, {node, *partners}, now)

    def update_node(
        self, node: str, now: float, *, node_ready: bool | None = None, agent_ready: bool | None = None
    ) -> Desired:
        """A Node's Ready condition or its agent pod's readiness changed."""
        inputs = self._require_inputs()
        if node_ready is not None:
            assert isinstance(inputs.node_ready, dict)  # compute() took a copy of its own
            inputs.node_ready[node] = node_ready
        if agent_ready is not None:
            if inputs.agent_ready is None:
                self._inputs = inputs = dataclasses.replace(inputs, agent_ready={})
            assert isinstance(inputs.agent_ready, dict)
            inputs.agent_ready[node] = agent_ready
        if node not in self._graph.nodes:
            return self.compute(inputs, now)
        return self._refresh_node(node, now)

    # -- internals ------------------------------------------------------------------------------
    def _reports_source(self) -> NodeReports:
        return next(s for s in self._require_inputs().all_sources() if isinstance(s, NodeReports))

    def _require_inputs(self) -> ClusterInputs:
        if self._inputs is None:
            raise RuntimeError("call compute() once before the fast-path updates")
        return self._inputs

    def _member(self, node: str) -> MemberHealth:
        inputs = self._require_inputs()
        agents = inputs.agent_ready
        health = member_health(
            inputs.reports.get(node),
            node_ready=inputs.node_ready.get(node),
            agent_alive=None if agents is None else agents.get(node, False),
        )
        health = with_fabric_faults(health, self._graph.fabric_faults.get(node, ()))  # UFM's port state
        missing = self._tree.uncabled.get(node) if self._tree is not None else None
        if not missing or health.state is MemberState.UNKNOWN:
            return health
        problem = f"not cabled to {', '.join(missing)} (the rest of its leaf domain is)"
        return MemberHealth(MemberState.UNHEALTHY, (*health.problems, problem), health.causes | {CABLING})

    def _judge_members(self) -> None:
        """Every member's health, and which are unhealthy or unknown (most members share the one
        HEALTHY value, so the identity check settles them)."""
        inputs = self._require_inputs()
        reports, ready, agents = inputs.reports, inputs.node_ready, inputs.agent_ready
        special = self._graph.fabric_faults.keys() | (self._tree.uncabled.keys() if self._tree else set())
        health: dict[str, MemberHealth] = {}
        for n in self._graph.nodes_in_order():  # `_member` unrolled for the members with no fabric fault
            if n in special:
                health[n] = self._member(n)
                continue
            report, node_ready = reports.get(n), ready.get(n)
            alive = None if agents is None else agents.get(n, False)
            if report is not None and node_ready is not False and alive is not False and all_clear(report):
                health[n] = HEALTHY  # `member_health`'s first answer, without the call
            else:
                health[n] = member_health(report, node_ready=node_ready, agent_alive=alive)
        self._health = health
        bad = [(n, h.state) for n, h in health.items() if h is not HEALTHY]
        self._unhealthy = {n for n, state in bad if state is MemberState.UNHEALTHY}
        self._unknown = {n for n, state in bad if state is MemberState.UNKNOWN}

    def _refresh_node(self, node: str, now: float) -> Desired:
        self._note(node, self._member(node))
        assert self._tree is not None
        return self._rerender(self._tree.domains_of(node), now)

    def _note(self, node: str, health: MemberHealth) -> None:
        self._health[node] = health
        self.degraded.note(node, health)
        for state, members in (
            (MemberState.UNHEALTHY, self._unhealthy),
            (MemberState.UNKNOWN, self._unknown),
        ):
            if health.state is state:
                members.add(node)
            else:
                members.discard(node)

    def _restructure(self, dirty: set[str], moved: set[str], now: float) -> Desired:
        """Re-infers after `moved` nodes changed classes (`dirty`), reusing what did not change."""
        old = self._tree
        assert old is not None
        tree = self._tree = infer(self._graph, self._classes, previous=old, dirty=dirty, moved=moved)
        before = old.domains.get
        maybe = tree.domains.keys() if tree.rebuilt is None else tree.rebuilt  # others: the same objects
        changed_keys = {k for k in maybe if before(k) != tree.domains[k]}
        removed = old.domains.keys() - tree.domains.keys()
        names: set[str] = set()
        for key in removed:
            names.add(self._names[key])
            self._objects.pop(self._names.pop(key), None)
        for key in changed_keys - self._names.keys():
            td = tree.domains[key]
            self._names[key] = hypernodes.domain_name(td.domain.kind, td.domain.identity)
        # members whose health may have moved: the nodes, and those whose missing cables changed
        members = moved | {
            n
            for n in old.uncabled.keys() | tree.uncabled.keys()
            if old.uncabled.get(n) != tree.uncabled.get(n)
        }
        for member in members:
            self._note(member, self._member(member))
        self.hold.forget(tree.domains)
        self.degraded.hold.forget(tree.domains)
        keys = set(changed_keys)
        for member in members:
            keys.update(tree.domains_of(member))
        names |= self._render(sorted(keys), now)
        if removed or changed_keys - old.domains.keys():
            self._order = sorted(self._objects)
        self._relabel(old, tree, changed_keys, removed, members)
        return self._desired(frozenset(names))

    def _relabel(
        self, old: DomainTree, tree: DomainTree, changed: set[str], removed: set[str], members: set[str]
    ) -> None:
        """Node labels of the nodes whose chain of domains may have changed (a new version of the
        map that shares the rest with the last one: aggregator.layered)."""
        touched = set(members)
        for key in changed:
            before = old.domains.get(key)
            now_nodes = tree.domains[key].domain.nodes
            if before is None or before.domain.nodes is not now_nodes:
                touched |= now_nodes if before is None else now_nodes ^ before.domain.nodes
            if before is not None and before.parent != tree.domains[key].parent:
                touched |= now_nodes
        for key in removed:
            touched |= old.domains[key].domain.nodes
        labels: dict[str, dict[str, str]] = {}
        for n in touched:
            keys = tree.domains_of(n)
            if keys:
                labels[n] = {NODE_LABEL_PREFIX + tree.domains[k].tier_name: self._names[k] for k in keys}
        last = self._node_labels  # shared with the Desired handed out: never written
        layered = last if isinstance(last, Layered) else Layered(last)
        self._node_labels = layered.changed(labels, touched - labels.keys())

    def _rerender(self, keys: list[str], now: float) -> Desired:
        return self._desired(frozenset(self._render(keys, now)))

    def _render(self, keys: list[str], now: float) -> set[str]:
        """Re-renders these domains; returns the names whose objects changed."""
        changed = set()
        for key in keys:
            name = self._names[key]
            obj = self._object(key, now)
            if obj != self._objects.get(name):
                self._objects[name] = obj
                changed.add(name)
        return changed

    def _condition(self, key: str, now: float) -> tuple[Condition, Condition]:
        """Ready and FabricDegraded."""
        assert self._tree is not None
        nodes = self._tree.domains[key].domain.nodes  # set intersections: cost of the few bad nodes
        wanted = judge(
            len(nodes),
            [(n, self._health[n]) for n in nodes & self._unhealthy],
            [(n, self._health[n]) for n in nodes & self._unknown],
            self.threshold,
        )
        return self.hold.observe(key, wanted, now), self.degraded.condition(key, nodes, self._health, now)

    def _object(self, key: str, now: float) -> dict[str, Any]:
        assert self._tree is not None
        return hypernodes.hypernode(self._tree.domains[key], self._names, self._condition(key, now))

    def _labels(self, tree: DomainTree) -> dict[str, dict[str, str]]:
        """Every node's labels; the nodes of one class share their chain of domains, so each
        chain is worked out once per class, and its nodes share the one map (read, never written:
        a copy per node was ~0.2 kB a node held for as long as the tree stands)."""
        out: dict[str, dict[str, str]] = {}
        for members in self._classes.members.values():
            keys = tree.domains_of(next(iter(members)))
            if keys:
                labels = {NODE_LABEL_PREFIX + tree.domains[k].tier_name: self._names[k] for k in keys}
                out.update(dict.fromkeys(members, labels))
        return out

    def _desired(self, changed: frozenset[str]) -> Desired:
        return Desired(
            hypernodes=[self._objects[n] for n in self._order],
            node_labels=self._node_labels,
            unhealthy_nodes=frozenset(self._unhealthy),
            degraded_nodes=frozenset(self.degraded.members),
            changed=changed,
            tree=self._tree,
            next_deadline=min(
                (d for d in (self.hold.next_deadline(), self.degraded.hold.next_deadline()) if d is not None),
                default=None,
            ),
            warnings=(*self._graph.warnings, *(f.text for f in self._graph.findings)),
            findings=tuple(self._graph.findings),
        )
