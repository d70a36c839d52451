"""Feeds the pure pipeline from the controller's caches, taking its fast paths when it can.

Why: a full rebuild (graph, inference, render) is right at start-up and for a periodic resync, but
at 10,000 nodes it costs far more than the common event, one node's health changing. So the feed
remembers what it last gave the pipeline, and per cycle hands it only the differences:
`update_report` for a changed NodeTopology, `update_node` for a Node's or an agent's readiness,
`refresh` when a hold-down deadline falls due; anything else (node labels under label levels, many
changes at once, the resync period elapsed) is a full `compute`. Parsed reports are cached by
resourceVersion, so an unchanged NodeTopology is never parsed twice.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.report import NodeReport
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
    return {name: dict((n.get("metadata") or {}).get("labels") or {}) for name, n in nodes.items()}


@dataclass
class _Fed:
    reports: dict[str, NodeReport] = field(default_factory=dict)
    node_ready: dict[str, bool] = field(default_factory=dict)
    agent_ready: dict[str, bool] | None = None
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)


class PipelineFeed:
    def __init__(self, pipeline: Pipeline, sources: Sequence[Source], *, resync: float = 300.0):
        self.pipeline = pipeline
        self.sources = tuple(sources)  # in graph-build order (aggregator.registry)
        self._labels_matter = any(s.node_labels_matter for s in self.sources)
        self._stale: tuple[str, ...] = ()
        self.resync = resync
        self.full_rebuilds = 0
        self._parsed: dict[str, tuple[str, NodeReport]] = {}
        self._fed: _Fed | None = None
        self._built_at = 0.0
        self._last: Desired | None = None

    def reports(self, topologies: Mapping[str, Obj]) -> dict[str, NodeReport]:
        out: dict[str, NodeReport] = {}
        for name, obj in topologies.items():
            metadata = obj.get("metadata")
            version = str(metadata.get("resourceVersion", "")) if isinstance(metadata, dict) else ""
            cached = self._parsed.get(name)
            if cached is not None and cached[0] == version and version:
                out[name] = cached[1]
                continue
            try:
                report = nodetopology.report_from_object(obj)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                log.warning("NodeTopology %s: unreadable, ignored: %s", name, exc)
                continue
            self._parsed[name] = (version, report)
            out[name] = report
        for gone in self._parsed.keys() - topologies.keys():
            del self._parsed[gone]
        return out

    def compute(
        self,
        topologies: Mapping[str, Obj],
        nodes: Mapping[str, Obj],
        agent_ready: Mapping[str, bool] | None,
        now: float,
    ) -> Desired:
        fed = _Fed(self.reports(topologies), node_readiness(nodes), None, node_label_map(nodes))
        fed.agent_ready = None if agent_ready is None else dict(agent_ready)
        last, before = self._last, self._fed
        refreshed = self._refresh_sources(now)  # every source, every cycle: cheap generation checks
        if (
            refreshed
            or last is None
            or before is None
            or now - self._built_at >= self.resync
            or self._needs_rebuild(before, fed)
        ):
            desired = self._rebuild(fed, now)
        else:
            desired = self._fast(before, fed, now)
            if desired.next_deadline is not None and desired.next_deadline <= now:
                desired = self.pipeline.refresh(now)
        self._fed, self._last = fed, desired
        if self._stale:
            desired = dataclasses.replace(desired, warnings=(*desired.warnings, *self._stale))
        return desired

    def _refresh_sources(self, now: float) -> bool:
        """Live sources take their latest good facts (True: some changed); stale ones are noted."""
        changed = False
        for source in self.sources:
            changed = source.refresh(now) or changed
        self._stale = tuple(f"source {s.name}: {why}" for s in self.sources for why in [s.stale()] if why)
        return changed

    def _needs_rebuild(self, before: _Fed, now: _Fed) -> bool:
        if (before.agent_ready is None) != (now.agent_ready is None):
            return True
        if self._labels_matter and before.node_labels != now.node_labels:
            return True
        if before.node_ready.keys() != now.node_ready.keys():
            return True  # a Node joined or left: membership may move
        return len(_changed(before, now)) > FULL_REBUILD_ABOVE

    def _rebuild(self, fed: _Fed, now: float) -> Desired:
        self.full_rebuilds += 1
        self._built_at = now
        inputs = ClusterInputs(
            reports=fed.reports,
            node_ready=fed.node_ready,
            node_labels=fed.node_labels,
            agent_ready=fed.agent_ready,
            sources=self.sources,
        )
        return self.pipeline.compute(inputs, now)

    def _fast(self, before: _Fed, fed: _Fed, now: float) -> Desired:
        desired = self._last
        assert desired is not None
        for node in sorted(_changed(before, fed)):
            if before.reports.get(node) is not fed.reports.get(node):
                desired = self.pipeline.update_report(node, fed.reports.get(node), now)
            agents_before, agents_now = before.agent_ready or {}, fed.agent_ready or {}
            if (before.node_ready.get(node), agents_before.get(node)) != (
                fed.node_ready.get(node),
                agents_now.get(node),
            ):
                desired = self.pipeline.update_node(
                    node,
                    now,
                    node_ready=fed.node_ready.get(node),
                    agent_ready=None if fed.agent_ready is None else agents_now.get(node, False),
                )
        return desired


def _changed(before: _Fed, now: _Fed) -> set[str]:
    """Nodes whose report (by identity: reports are cached per resourceVersion) or readiness moved."""
    names = before.reports.keys() | now.reports.keys() | before.node_ready.keys() | now.node_ready.keys()
    agents_before, agents_now = before.agent_ready or {}, now.agent_ready or {}
    names |= agents_before.keys() | agents_now.keys()
    return {
        n
        for n in names
        if before.reports.get(n) is not now.reports.get(n)
        or before.node_ready.get(n) != now.node_ready.get(n)
        or agents_before.get(n) != agents_now.get(n)
    }
