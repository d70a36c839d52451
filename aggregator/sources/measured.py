"""The `measured` source (`run --measured-fabric`): the agents' round trips acting in the live
controller.

What it does, every `--measured-period` seconds on a worker thread beside reconcile, from the
controller's own caches (the HyperNodes and the NodeTopology reports: no API reads of its own):

* plans: each measuring node's row of the probe plan (agent.common.measure_rows), handed to the
  publisher, which writes it into that node's NodeTopology status when it changed; the agents
  read only their own object;
* folds the measurements over the published tree (aggregator.measured) when they or the tree
  changed: per-HyperNode inside and to-sibling p50 (latched, as annotations
  `hypertopo.io/measured-inside-p50-us` / `-sibling-p50-us`, and metrics), the tier profile, and
  the findings (a leaf pair measuring like the spine, a node measuring like another leaf, a lossy
  pair), which `apply` adds to the graph as grey faults: FabricDegraded on the blamed node's
  domains, reason `LatencyDegraded`, the pair and numbers in the message;
* checks the tree against the measured clusters: groups of nodes joined by round trips below the
  tree's own leaf cut, compared with the leaf HyperNodes (a group spanning leaves, a leaf split
  into groups) -> input warnings and `hypertopo_measured_leaf_disagreements`;
* with `--measured-leaves`, infers leaf groups from latency alone for the nodes no other source
  cables (the graph says which, at each build), when the widest gap in their round trips is at
  least `--measured-min-gap` (how sure: the gap and the share of nodes joined, in the warning and
  metrics). Declared groups stay until a new sure guess replaces them, so a tree built from them
  (whose plan no longer crosses the old boundaries as often) does not flap.

Why a source: its faults and leaf groups are facts in the fabric graph like UFM's, rebuilt on a
change (`refresh` compares a generation counter), and the registry adds its options. Pure apart
from the thread loop: the view and the publisher are callables the controller attaches.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prometheus_client.core import GaugeMetricFamily

from agent.common.measure_rows import PlanRow, rows
from agent.common.report import Measurement, NodeReport
from agent.measure_plan import Domain, domains_from_hypernodes, tree_digest
from agent.probes.fabric_rtt import ABSOLUTE_BAND_US, RELATIVE_BAND
from aggregator.graph import FabricFault, FabricGraph
from aggregator.measured import Fold, LeafGuess, fold, infer_leaves, leaf_cut
from aggregator.sources import Cluster, Worker
from aggregator.sources.nodetopology import report_from_object

log = logging.getLogger(__name__)
Obj = Mapping[str, Any]
View = Callable[[], tuple[Mapping[str, Obj], Mapping[str, Obj]]]  # (HyperNodes, NodeTopology records) by name
Publish = Callable[[Mapping[str, PlanRow], Mapping[str, Obj]], int]  # rows, records -> writes
INSIDE = "hypertopo.io/measured-inside-p50-us"
SIBLING = "hypertopo.io/measured-sibling-p50-us"
ROOT = "measured-root"  # the switch above the measured leaves: their nodes keep probing across them


def _moved(old: int | None, new: int | None) -> bool:
    """Whether a published figure should change: the agents' own band (agent.probes.fabric_rtt)."""
    if old is None or new is None:
        return old != new
    return abs(new - old) > max(ABSOLUTE_BAND_US, RELATIVE_BAND * old)


def latched_figures(before: Mapping[str, Mapping[str, int]], folded: Fold) -> dict[str, dict[str, int]]:
    """Per HyperNode its annotation figures, each kept at the published value while within band,
    so jitter does not rewrite HyperNodes every fold."""
    out: dict[str, dict[str, int]] = {}
    for name, d in folded.domains.items():
        old = before.get(name, {})
        figures = {}
        for key, value in ((INSIDE, d.inside_us), (SIBLING, d.sibling_us)):
            if value is not None:
                figures[key] = old[key] if key in old and not _moved(old[key], value) else value
        if figures:
            out[name] = figures
    return out


def disagreements(leaf_of: Mapping[str, str], guess: LeafGuess, measured: Mapping[str, Any]) -> list[str]:
    """Where the measured clusters and the leaf HyperNodes part: a group spanning several leaves,
    a leaf whose measured nodes fall into several groups. One line each, sorted."""
    out = []
    group_of: dict[str, int] = {}
    for i, group in enumerate(guess.groups):
        for node in group:
            group_of[node] = i
        if len(group) > 1:
            out.extend(_spanning(group, leaf_of))
    by_leaf: dict[str, set[int]] = {}
    for node in measured:
        if node in leaf_of and node in group_of:
            by_leaf.setdefault(leaf_of[node], set()).add(group_of[node])
    for leaf, groups in sorted(by_leaf.items()):
        if len(groups) > 1:
            out.append(f"measured: the nodes of {leaf} measure as {len(groups)} separate leaf groups")
    return sorted(out)


def _spanning(group: frozenset[str], leaf_of: Mapping[str, str]) -> list[str]:
    """A measured group spanning leaves: the nodes outside its main leaf, named (ten at most)."""
    counts: dict[str, int] = {}
    for n in group:
        if n in leaf_of:
            counts[leaf_of[n]] = counts.get(leaf_of[n], 0) + 1
    if len(counts) < 2:
        return []
    main = max(sorted(counts), key=lambda leaf: counts[leaf])
    strays = sorted(n for n in group if n in leaf_of and leaf_of[n] != main)
    named = ", ".join(f"{n} ({leaf_of[n]})" for n in strays[:10]) + (", ..." if len(strays) > 10 else "")
    verb = "measures" if len(strays) == 1 else "measure"
    return [f"measured: {named} {verb} as one leaf with {counts[main]} nodes of {main}"]


def _leaf_of(domains: Sequence[Domain]) -> dict[str, str]:
    return {c: d.name for d in domains if d.tier == 1 for c in d.children}


def _report(obj: Obj) -> NodeReport | None:
    try:
        return report_from_object(obj)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None  # the controller logs unreadable reports; they measure nothing here


@dataclass
class State:
    """What the last fold found (swapped whole, so readers on other threads see one fold)."""

    faults: Mapping[str, tuple[FabricFault, ...]] = field(default_factory=dict)
    figures: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    tiers: Mapping[int, int] = field(default_factory=dict)
    findings: Mapping[str, int] = field(default_factory=dict)  # kind -> count
    disagreements: tuple[str, ...] = ()
    guess: LeafGuess | None = None  # over the uncabled nodes
    fold_seconds: float = 0.0


class MeasuredFabric:
    """The `measured` source (module docstring)."""

    name: ClassVar[str] = "measured"
    node_labels_matter: ClassVar[bool] = False

    def __init__(self, *, period: float = 60.0, leaves: bool = False, min_gap: float = 2.0):
        self.period, self.leaves, self.min_gap = period, leaves, min_gap
        self.view: View | None = None
        self.publish: Publish | None = None
        self.state = State()
        self.groups: tuple[frozenset[str], ...] = ()  # declared leaf groups (--measured-leaves)
        self.uncabled: frozenset[str] = frozenset()  # as the last graph build found them
        self.generation = self._applied = 0
        self.plan_writes = self.folds = 0
        self._key: Any = None
        self._rows_key: Any = None
        self._rows: Mapping[str, PlanRow] = {}
        self._wake: Callable[[], None] = lambda: None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        if not live:
            return  # files: `hypertopo-aggregator measured` folds them
        add = parser.add_argument
        add("--measured-fabric", action="store_true",
            help="use the agents' fabric measurements (agents run with --measure-fabric): publish each node's probe "
            "plan in its NodeTopology status, annotate HyperNodes with measured p50s, FabricDegraded on pairs "
            "that contradict the tree or are slow or lossy")  # fmt: skip
        add("--measured-period", type=float, default=60.0, metavar="SECONDS",
            help="seconds between folds of the measurements and probe-plan updates (default 60)")  # fmt: skip
        add("--measured-leaves", action="store_true",
            help="with --measured-fabric: leaf groups from latency alone for nodes no cabling source places")
        add("--measured-min-gap", type=float, default=2.0, metavar="RATIO",
            help="how far apart leaf-like and other round trips must be to declare measured leaves (default 2)")

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> MeasuredFabric | None:
        if not live or not getattr(options, "measured_fabric", False):
            return None
        if not 0 < options.measured_period <= 86400 or not options.measured_min_gap > 1:
            from aggregator.sources import OptionError

            raise OptionError("--measured-period must be in (0, 86400] and --measured-min-gap above 1")
        return cls(period=options.measured_period, leaves=options.measured_leaves, min_gap=options.measured_min_gap)

    # -- the graph side -------------------------------------------------------------------------
    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        self._applied = self.generation
        self.uncabled = frozenset(n for n in graph.nodes if not _cabled(graph, n))
        for node, faults in self.state.faults.items():
            if node in graph.nodes:
                graph.add_fabric_faults(node, faults)
        graph.warnings.extend(self.state.disagreements)
        if not self.leaves:
            return
        placed = [(min(g), g & self.uncabled) for g in self.groups]  # named by the whole group: stable
        placed = [(name, g) for name, g in placed if len(g) >= 2]
        for name, group in placed:
            switch = f"measured-{name}"
            graph.declare_block(sorted(group), switch)
            if len(placed) > 1:
                graph.add_uplink(switch, ROOT)
        guess = self.state.guess
        if placed and guess is not None:
            graph.warnings.append(
                f"measured: {len(placed)} leaf groups of {sum(len(g) for _, g in placed)} uncabled nodes from latency alone "
                f"(gap x{guess.gap:.1f} at {guess.cut_us:.0f} us, {guess.coverage:.0%} of them joined)"
            )

    def refresh(self, now: float) -> bool:
        return self.generation != self._applied

    def stale(self) -> str | None:
        return None

    def ready(self) -> bool:
        return True

    def annotate(self, objects: Sequence[Obj]) -> list[Obj]:
        """The desired HyperNodes with their measured figures added to their annotations (copies:
        the pipeline's objects are shared)."""
        figures = self.state.figures
        out: list[Obj] = []
        for obj in objects:
            mine = figures.get(obj["metadata"]["name"])
            if mine:
                meta = obj["metadata"]
                obj = {**obj, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                                   **{k: str(v) for k, v in mine.items()}}}}
            out.append(obj)
        return out

    # -- the worker side ------------------------------------------------------------------------
    def attach(self, view: View, publish: Publish | None) -> None:
        """The controller's caches and the plan publisher (None: plan nothing, a standby's case is
        the publisher's own `may_write`)."""
        self.view, self.publish = view, publish

    def workers(self, *, registry: Any = None, wake: Callable[[], None] = lambda: None) -> Sequence[Worker]:
        self._wake = wake
        if registry is not None:
            registry.register(MeasuredMetrics(self))
        return (("measured", self.loop),)

    def loop(self, stop: threading.Event) -> None:
        """Plans and folds every period; every few seconds until the caches hold a report."""
        while not stop.wait(self.period if self._rows_key is not None and self._rows_key[1] else min(self.period, 2.0)):
            try:
                self.step()
            except Exception:  # one failed fold is logged; the next one tries again
                log.exception("measured fabric: fold failed")

    def step(self) -> bool:
        """One plan-and-fold; True when the graph's facts changed (the controller is woken)."""
        if self.view is None:
            return False
        hypernodes, records = self.view()
        reports = {n: r for n, obj in records.items() if (r := _report(obj)) is not None}
        domains = domains_from_hypernodes(hypernodes.values())
        if self.publish is not None:
            self.plan_writes += self.publish(self._plan(domains, reports), records)
        measured = {n: r.measurements for n, r in reports.items() if r.measurements}
        key = (tree_digest(domains), measured, self.uncabled)
        if key == self._key:
            return False
        self._key = key
        changed = self._fold(domains, measured)
        if changed:
            self.generation += 1
            self._wake()
        return changed

    def _plan(self, domains: Sequence[Domain], reports: Mapping[str, NodeReport]) -> Mapping[str, PlanRow]:
        addresses = {n: r.probe_address for n, r in reports.items() if r.probe_address}
        key = (tree_digest(domains), addresses)
        if key != self._rows_key:
            self._rows_key, self._rows = key, rows(domains, addresses)
        return self._rows

    def _fold(self, domains: Sequence[Domain], measured: Mapping[str, Sequence[Measurement]]) -> bool:
        started = time.perf_counter()
        folded = fold(domains, measured)
        leaf_of = _leaf_of(domains)
        cut = leaf_cut(folded.tiers)
        checked = infer_leaves(measured, cut) if cut is not None else None
        lines = tuple(disagreements(leaf_of, checked, measured)) if checked is not None else ()
        loose = {n: ms for n, ms in measured.items() if n in self.uncabled}
        guess = infer_leaves({n: [m for m in ms if m.peer in loose] for n, ms in loose.items()}) if loose else None
        groups = self.groups
        if self.leaves and guess is not None and guess.gap >= self.min_gap:
            groups = tuple(g for g in guess.groups if len(g) >= 2)
        kinds: dict[str, int] = {}
        for f in folded.findings:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        faults = folded.fabric_faults()
        changed = faults != self.state.faults or lines != self.state.disagreements or groups != self.groups
        self.state = State(faults, latched_figures(self.state.figures, folded), folded.tiers, kinds, lines, guess,
                           time.perf_counter() - started)  # fmt: skip
        self.groups = groups
        self.folds += 1
        return changed


def _cabled(graph: FabricGraph, node: str) -> bool:
    """Whether a source other than this one placed the node under a switch."""
    facts = graph.facts.get(node)
    if facts is not None and (facts.switches or any(g in graph.attached_by_guid for g in facts.guids)):
        return True
    return node in graph.declared or node in graph.attached_by_host or node in graph.label_paths


class MeasuredMetrics:
    """hypertopo_measured_*: per-HyperNode and per-tier p50s, findings, the tree check, the leaf
    guess, the fold's time and the probe-plan writes."""

    def __init__(self, source: MeasuredFabric) -> None:
        self._source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._source.state
        p50 = GaugeMetricFamily("hypertopo_measured_hypernode_p50_seconds",
                                "median of the measured p50 round trips inside a HyperNode or to its siblings",
                                labels=["hypernode", "scope"])  # fmt: skip
        for name, figures in sorted(s.figures.items()):
            for key, scope in ((INSIDE, "inside"), (SIBLING, "sibling")):
                if key in figures:
                    p50.add_metric([name, scope], figures[key] / 1e6)
        yield p50
        tiers = GaugeMetricFamily("hypertopo_measured_tier_p50_seconds",
                                  "median p50 of the pairs meeting at each tier", labels=["tier"])  # fmt: skip
        for tier, us in sorted(s.tiers.items()):
            tiers.add_metric([str(tier)], us / 1e6)
        yield tiers
        found = GaugeMetricFamily("hypertopo_measured_findings", "measured pairs contradicting the tree, slow "
                                  "or lossy, by kind", labels=["kind"])  # fmt: skip
        for kind in ("slow-in-leaf", "other-leaf", "loss", "slow-uplink", "slow-downlink"):
            found.add_metric([kind], s.findings.get(kind, 0))
        yield found
        yield GaugeMetricFamily("hypertopo_measured_leaf_disagreements",
                                "places where the measured leaf groups and the leaf HyperNodes part",
                                value=len(s.disagreements))  # fmt: skip
        guess = s.guess
        yield GaugeMetricFamily("hypertopo_measured_leaf_gap_ratio", "gap between leaf-like and other round "
                                "trips of the uncabled nodes (2 or more: clear)", value=guess.gap if guess else 0)
        yield GaugeMetricFamily("hypertopo_measured_fold_seconds", "time of the last fold", value=s.fold_seconds)
        yield GaugeMetricFamily("hypertopo_measured_probe_plan_writes", "probe-plan rows written since start",
                                value=self._source.plan_writes)  # fmt: skip
