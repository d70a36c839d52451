"""Feeds the pure pipeline from the controller's caches, taking its fast paths when it can.

Why: a full rebuild (graph, inference, render) is right at start-up and for a periodic resync, but
at 10,000 nodes it costs far more than the common event, one node's health changing. So the feed
remembers what it last gave the pipeline, and per cycle hands it only the differences:
`update_report` for a changed NodeTopology, `update_node` for a Node's or an agent's readiness,
`refresh` when a hold-down deadline falls due; anything else (node labels under label levels, many
changes at once, the resync period elapsed) is a full `compute`. Parsed reports are cached by
resourceVersion, so an unchanged NodeTopology is never parsed twice.

Every report passes the structural hold-down (aggregator.live.structural_hold) on its way in: a report
that lost its cabling keeps its previous structural facts for `structural_hold` seconds, so a
restarting agent or a few lost LLDP frames never delete and re-create a HyperNode. The nodes whose
hold runs out are looked at again as if their report had changed, and the hold's deadline is part
of the desired state's `next_deadline`, so the controller wakes for it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agent.common.report import NodeReport
from aggregator.live.structural_hold import DEFAULT_SECONDS, StructuralHold
from aggregator.pipeline import ClusterInputs, Desired, Pipeline, sources_of
from aggregator.sources import Source, nodetopology

log = logging.getLogger(__name__)

Obj = dict[str, Any]
FULL_REBUILD_ABOVE = 64  # changes in one cycle beyond which a rebuild is cheaper than fast paths


def StaticSources(**shorthand: Any) -> tuple[Source, ...]:  # a function: kept for its callers
    """The built-in sources from parsed inputs (`fabric=`, `model=`, ...; pipeline.sources_of)."""
    return sources_of(**shorthand)


def node_readiness(nodes: Mapping[str, Obj]) -> dict[str, bool]:
    """Node -> Ready condition is True; Nodes without a Ready condition yet are left out."""
    ready: dict[str, bool] = {}
    for name, node in nodes.items():
        for cond in (node.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready":
                ready[name] = cond.get("status") == "True"
    return ready


def node_label_map(nodes: Mapping[str, Obj]) -> dict[str, dict[str, str]]:
    """Node -> its labels: the record's own dict, not a copy (records are replaced, never changed;
    a copy was a second 30-entry dict per node)."""
    out: dict[str, dict[str, str]] = {}
    for name, node in nodes.items():
        labels = (node.get("metadata") or {}).get("labels")
        out[name] = labels if type(labels) is dict else dict(labels or {})
    return out


@dataclass
class _Fed:
    reports: dict[str, NodeReport] = field(default_factory=dict)
    node_ready: dict[str, bool] = field(default_factory=dict)
    agent_ready: dict[str, bool] | None = None
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)


class _View(NamedTuple):
    """What the informers hold this cycle (objects by node name; agent pod readiness, None when
    agents are not tracked)."""

    topologies: Mapping[str, Obj]
    nodes: Mapping[str, Obj]
    agent_ready: Mapping[str, bool] | None


class PipelineFeed:
    def __init__(
        self,
        pipeline: Pipeline,
        sources: Sequence[Source],
        *,
        resync: float = 300.0,
        structural_hold: float = DEFAULT_SECONDS,
    ):
        self.pipeline = pipeline
        self.hold = StructuralHold(structural_hold)
        self.sources = tuple(sources)  # in graph-build order (aggregator.registry)
        self._labels_matter = any(s.node_labels_matter for s in self.sources)
        self._stale: tuple[str, ...] = ()
        self.resync = resync
        self.full_rebuilds = 0
        self._parsed: dict[str, tuple[str, NodeReport]] = {}
        self._fed: _Fed | None = None
        self._built_at = 0.0
        self._last: Desired | None = None

    def reports(self, topologies: Mapping[str, Obj], now: float) -> dict[str, NodeReport]:
        """The reports to build from (parsed, through the structural hold-down)."""
        out: dict[str, NodeReport] = {}
        for name, obj in topologies.items():
            report = self.hold.admit(name, self._parsed_report(name, obj), now)
            if report is not None:
                out[name] = report
        for gone in self._parsed.keys() - topologies.keys():
            del self._parsed[gone]
        self.hold.retain(out)
        return out

    def _report(self, name: str, obj: Obj | None, now: float) -> NodeReport | None:
        """The report to build from: parsed, then through the structural hold-down."""
        return self.hold.admit(name, self._parsed_report(name, obj), now)

    def _parsed_report(self, name: str, obj: Obj | None) -> NodeReport | None:
        """The parsed report (cached per resourceVersion); None: no object, or an unreadable one."""
        if obj is None:
            self._parsed.pop(name, None)
            return None
        metadata = obj.get("metadata")
        version = str(metadata.get("resourceVersion", "")) if isinstance(metadata, dict) else ""
        cached = self._parsed.get(name)
        if cached is not None and cached[0] == version and version:
            return cached[1]
        try:
            report = nodetopology.report_from_object(obj)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            log.warning("NodeTopology %s: unreadable, ignored: %s", name, exc)
            self._parsed.pop(name, None)
            return None
        self._parsed[name] = (version, report)
        return report

    def compute(
        self,
        topologies: Mapping[str, Obj],
        nodes: Mapping[str, Obj],
        agent_ready: Mapping[str, bool] | None,
        now: float,
        changed: Collection[str] | None = None,
    ) -> Desired:
        """The desired state for the current view. `changed`: the node names whose NodeTopology,
        Node or agent pod changed since the previous call (the informers' keys); only those are
        looked at. None: unknown, so the whole view is compared with the previous one."""
        try:
            desired = self._compute(_View(topologies, nodes, agent_ready), now, changed)
        except BaseException:
            self._fed = self._last = None  # half-applied changes: the next call starts afresh
            raise
        if self._stale:
            desired = dataclasses.replace(desired, warnings=(*desired.warnings, *self._stale))
        held = self.hold.next_deadline()
        if held is not None and (desired.next_deadline is None or held < desired.next_deadline):
            desired = dataclasses.replace(desired, next_deadline=held)
        return desired

    def _compute(self, view: _View, now: float, changed: Collection[str] | None) -> Desired:
        refreshed = self._refresh_sources(now)  # every source, every cycle: cheap generation checks
        before, last = self._fed, self._last
        agent_ready = view.agent_ready
        tracking = before is not None and (before.agent_ready is None) == (agent_ready is None)
        if before is None or last is None or changed is None or not tracking:
            fed = _Fed(
                self.reports(view.topologies, now), node_readiness(view.nodes), None, node_label_map(view.nodes)
            )
            fed.agent_ready = None if agent_ready is None else dict(agent_ready)
            names = set() if before is None else _names(before) | _names(fed)
            old = {} if before is None else {n: _values(before, n, self._labels_matter) for n in names}
        else:
            fed = before  # patched in place at the changed names only
            changed = {*changed, *self.hold.due(now)}  # held facts that ran out: look again
            old = {n: _values(fed, n, self._labels_matter) for n in changed}
            self._patch(fed, changed, view, now)
        moved = {n for n, was in old.items() if _values(fed, n, self._labels_matter) != was}
        self._fed = fed
        if (
            refreshed
            or last is None
            or before is None
            or not tracking
            or now - self._built_at >= self.resync
            or self._needs_rebuild(old, fed, moved)
        ):
            desired = self._rebuild(fed, now)
        else:
            desired = self._fast(old, fed, moved, last, now)
            if desired.next_deadline is not None and desired.next_deadline <= now:
                desired = self.pipeline.refresh(now)
        self._last = desired
        return desired

    def _patch(self, fed: _Fed, changed: Collection[str], view: _View, now: float) -> None:
        """Brings the fed state up to date at the changed node names only."""
        agent_ready = view.agent_ready
        for name in changed:
            report = self._report(name, view.topologies.get(name), now)
            _put(fed.reports, name, report)
            node = view.nodes.get(name)
            _put(fed.node_ready, name, None if node is None else node_readiness({name: node}).get(name))
            _put(fed.node_labels, name, None if node is None else node_label_map({name: node})[name])
            if fed.agent_ready is not None and agent_ready is not None:
                _put(fed.agent_ready, name, agent_ready.get(name))

    def _refresh_sources(self, now: float) -> bool:
        """Live sources take their latest good facts (True: some changed); stale ones are noted."""
        changed = False
        for source in self.sources:
            changed = source.refresh(now) or changed
        self._stale = tuple(f"source {s.name}: {why}" for s in self.sources for why in [s.stale()] if why)
        return changed

    def _needs_rebuild(self, old: Mapping[str, _Values], fed: _Fed, moved: set[str]) -> bool:
        if len(moved) > FULL_REBUILD_ABOVE:
            return True
        for node in moved:
            was = old[node]
            if (was[1] is None) != (node not in fed.node_ready):
                return True  # a Node joined or left: membership may move
            if self._labels_matter and was[3] != fed.node_labels.get(node):
                return True
        return False

    def _rebuild(self, fed: _Fed, now: float) -> Desired:
        self.full_rebuilds += 1
        self._built_at = now
        inputs = ClusterInputs(
            fed.reports, fed.node_ready, fed.node_labels, fed.agent_ready, sources=self.sources
        )
        return self.pipeline.compute(inputs, now)

    def _fast(
        self, old: Mapping[str, _Values], fed: _Fed, moved: set[str], last: Desired, now: float
    ) -> Desired:
        desired = last
        for node in sorted(moved):
            report, ready, agent, _labels = old[node]
            if report is not fed.reports.get(node):
                desired = self.pipeline.update_report(node, fed.reports.get(node), now)
            agents_now = fed.agent_ready or {}
            if (ready, agent) != (fed.node_ready.get(node), agents_now.get(node)):
                desired = self.pipeline.update_node(
                    node,
                    now,
                    node_ready=fed.node_ready.get(node),
                    agent_ready=None if fed.agent_ready is None else agents_now.get(node, False),
                )
        return desired


_Values = tuple[NodeReport | None, bool | None, bool | None, dict[str, str] | None]


def _values(fed: _Fed, node: str, labels: bool) -> _Values:
    """One node's inputs (the report by identity: reports are cached per resourceVersion); its
    labels only where a source reads them (our own label writes must not count as changes)."""
    agents = fed.agent_ready or {}
    mine = fed.node_labels.get(node) if labels else None
    return (fed.reports.get(node), fed.node_ready.get(node), agents.get(node), mine)


def _names(fed: _Fed) -> set[str]:
    return (
        fed.reports.keys() | fed.node_ready.keys() | (fed.agent_ready or {}).keys() | fed.node_labels.keys()
    )


def _put(values: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        values.pop(key, None)
    else:
        values[key] = value
