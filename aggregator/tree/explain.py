"""Why the HyperNode tree is empty or leaves nodes out, in words a person can act on.

An empty tree used to say nothing: no HyperNode, no log line, `tree` printing "0 HyperNodes". The
usual causes are plain once named: no fabric source is configured and the agents hear no LLDP; the
agents run but their reports carry no neighbours; a dump is given but its host names do not match
the Nodes'. This module names them, per node, from what the pipeline was given and what it placed:

* `report_refused`: the node's report was set aside by the cross-checks (another node's GUIDs, ...);
* `no_report`: no NodeTopology report (and no fabric source that could place it anyway);
* `no_lldp_neighbours`: a report without any LLDP neighbour (and no fabric source);
* `neighbours_not_on_fabric_nics`: LLDP neighbours, but none on a fabric NIC or none a switch;
* `not_in_fabric_source`: fabric sources are configured, the node is in none of them (host names
  that do not match) and its own report names no switch;
* `cabled_but_in_no_domain`: the node is cabled, but the domain it would be in was dropped.

`empty_reason` says why a tree has no HyperNode at all: `no_nodes`, `no_fabric_source` (nothing but
the agents' LLDP, and no report names a switch), else the commonest reason above. The controller
logs it and exports it as metrics (hypertopo_aggregator_tree_empty_reason, hypertopo_aggregator_nodes_unplaced); `render`
and `tree` print it. Pure: no I/O, and only the unplaced nodes are looked at, so a healthy tree of
100,000 nodes costs one set difference.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agent.common.command_line import summarise
from agent.common.report import NodeReport
from aggregator.sources.nodetopology import cabled_switches, report_from_object

log = logging.getLogger(__name__)

REFUSED = "report_refused"
NO_REPORT = "no_report"
NO_NEIGHBOURS = "no_lldp_neighbours"
NOT_FABRIC = "neighbours_not_on_fabric_nics"
NOT_IN_SOURCE = "not_in_fabric_source"
NO_DOMAIN = "cabled_but_in_no_domain"
NODE_REASONS = (REFUSED, NO_REPORT, NO_NEIGHBOURS, NOT_FABRIC, NOT_IN_SOURCE, NO_DOMAIN)
NO_NODES = "no_nodes"
NO_FABRIC_SOURCE = "no_fabric_source"
EMPTY_REASONS = (NO_NODES, NO_FABRIC_SOURCE, *NODE_REASONS)

FABRIC_OPTIONS = "--ibnetdiscover, --ufm-url or --ufm-json, --switch-lldp, --model, --label-levels"
TEXT = {
    NO_NODES: "no node at all: no Node, no NodeTopology report, no host in a fabric dump",
    NO_FABRIC_SOURCE: f"no fabric source is configured ({FABRIC_OPTIONS}) and no NodeTopology report "
    "names a switch, so nothing says where any node is cabled",
    REFUSED: "claims of their NodeTopology reports were refused by the cross-checks (see the warnings)",
    NO_REPORT: "no NodeTopology report (is the agent DaemonSet running there?) and no fabric source to place them",
    NO_NEIGHBOURS: "their reports carry no LLDP neighbour (switches not sending LLDP, or NIC firmware "
    "consuming it: see the agent's --lldpd-socket), and no fabric source places them",
    NOT_FABRIC: "their LLDP neighbours are on no fabric NIC or are no switch (see --fabric-interfaces)",
    NOT_IN_SOURCE: "in no fabric source (no dump host, UFM system or model node has their name: see "
    "--strip-domain, --dump-host-regex) and their reports name no switch",
    NO_DOMAIN: "cabled, but the domain they would be in was dropped (see the warnings)",
}


@dataclass(frozen=True)
class Explanation:
    """Why nodes are in no HyperNode, by reason; `empty_reason` when there is no HyperNode at all."""

    nodes: int
    hypernodes: int
    unplaced: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # reason -> nodes, sorted
    empty_reason: str | None = None
    fabric_sources: tuple[str, ...] | None = ()  # None: not known (the `tree` command)

    @property
    def unplaced_count(self) -> int:
        return sum(len(nodes) for nodes in self.unplaced.values())

    def lines(self) -> list[str]:
        """One line for the empty tree's reason, then one per reason nodes are left out."""
        out = []
        if self.empty_reason is not None:
            out.append(f"no HyperNodes: {TEXT[self.empty_reason]}")
        for reason in NODE_REASONS:
            nodes = self.unplaced.get(reason)
            if nodes:
                out.append(f"{len(nodes)} of {self.nodes} nodes in no HyperNode: {TEXT[reason]}: {summarise(nodes)}")
        if out and self.fabric_sources is None:
            out.append("(which fabric sources the aggregator has is not known here: its log and the "
                       "hypertopo_aggregator_tree_empty_reason metric say what it sees)")  # fmt: skip
        return out


def explain(
    *,
    nodes: Collection[str],
    placed: Collection[str],
    hypernodes: int,
    reports: Mapping[str, NodeReport | Heard],
    fabric_sources: Sequence[str] | None,
    refused: Collection[str] = (),
    fabric_pattern: str | None = None,
) -> Explanation:
    """Reasons for every node of `nodes` not in `placed`. `fabric_sources`: the configured sources
    besides the agents' reports (ibnetdiscover, ufm, switch-lldp, model, labels); None when not known."""
    unplaced = [n for n in nodes if n not in placed]  # `placed`: a set or a mapping, as the caller has it
    sources = tuple(fabric_sources) if fabric_sources is not None else None
    by_reason: dict[str, list[str]] = {}
    for node in unplaced:
        reason = _reason(node, reports.get(node), sources, refused, fabric_pattern)
        by_reason.setdefault(reason, []).append(node)
    grouped = {reason: tuple(sorted(found)) for reason, found in by_reason.items()}
    empty = None
    if hypernodes == 0:
        empty = _empty_reason(nodes, grouped, sources)
    return Explanation(len(nodes), hypernodes, grouped, empty, sources)


class Heard(NamedTuple):
    """What the reasons need of a report: did it hear any LLDP neighbour, and does one of them
    name a switch on a fabric NIC (nodetopology.cabled_switches)."""

    neighbours: bool
    cabled: bool


def heard(report: NodeReport, pattern: str | None = None) -> Heard:
    return Heard(bool(report.lldp), bool(report.lldp) and bool(cabled_switches(report, pattern)))


def _reason(
    node: str,
    report: NodeReport | Heard | None,
    sources: tuple[str, ...] | None,
    refused: Collection[str],
    pattern: str | None,
) -> str:
    if node in refused:
        return REFUSED
    found = heard(report, pattern) if isinstance(report, NodeReport) else report
    if found is not None and found.cabled:
        return NO_DOMAIN
    if sources:  # a fabric source could have placed it, and did not
        return NOT_IN_SOURCE
    if found is None:
        return NO_REPORT
    return NOT_FABRIC if found.neighbours else NO_NEIGHBOURS


def _empty_reason(nodes: Collection[str], grouped: Mapping[str, tuple[str, ...]], sources: tuple[str, ...] | None) -> str:
    if not nodes:
        return NO_NODES
    if sources == () and not grouped.get(NO_DOMAIN) and not grouped.get(REFUSED):
        return NO_FABRIC_SOURCE  # nothing but the agents' LLDP, and no unplaced report names a switch
    counts = Counter({reason: len(found) for reason, found in grouped.items()})
    if not counts:
        return NO_DOMAIN  # every node placed, yet no HyperNode: nothing else to blame
    return max(NODE_REASONS, key=lambda reason: (counts[reason], -NODE_REASONS.index(reason)))


class HeardReports(Mapping[str, Heard]):
    """Raw NodeTopology objects (the controller's cache) as `Heard`, worked out on first use and
    again only when a node's object is replaced, so explaining the same unplaced nodes every
    reconcile parses nothing; a report without any LLDP neighbour is not parsed at all, and only
    the two answers are kept (not the report: at 100,000 nodes the feed holds those already). An
    object that cannot be read counts as no report."""

    def __init__(self, fabric_pattern: str | None = None) -> None:
        self.fabric_pattern = fabric_pattern
        self._raw: Mapping[str, Any] = {}
        self._known: dict[str, tuple[Any, Heard | None]] = {}

    def over(self, raw: Mapping[str, Any]) -> HeardReports:
        self._raw = raw
        if len(self._known) > 2 * len(raw) + 64:  # nodes went away: forget them
            self._known = {n: entry for n, entry in self._known.items() if n in raw}
        return self

    def __getitem__(self, node: str) -> Heard:
        obj = self._raw[node]
        known = self._known.get(node)
        if known is None or known[0] is not obj:
            known = self._known[node] = (obj, self._heard(obj))
        if known[1] is None:
            raise KeyError(node)
        return known[1]

    def _heard(self, obj: Any) -> Heard | None:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if isinstance(spec, Mapping) and not spec.get("lldp"):
            return Heard(False, False)
        try:
            return heard(report_from_object(obj), self.fabric_pattern)
        except (TypeError, ValueError, KeyError, AttributeError):
            return None

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


class Narrator:
    """The controller's side: explains each reconcile's tree and logs the explanation when it
    changes (not every reconcile). A tree holding every node costs one length comparison."""

    def __init__(self, fabric_sources: Sequence[str], fabric_pattern: str | None = None) -> None:
        self.fabric_sources = tuple(fabric_sources)
        self.fabric_pattern = fabric_pattern
        self._reports = HeardReports(fabric_pattern)
        self.latest = Explanation(0, 0)
        self._said: list[str] = []
        self._placed: Collection[str] | None = None  # what the last explanation was of
        self._key: tuple[int, int, frozenset[str]] | None = None

    def observe(self, *, nodes: Collection[str], placed: Collection[str], hypernodes: int,
                topologies: Mapping[str, Any], refused: Collection[str] = (),
                changed: Collection[str] | None = None) -> Explanation:  # fmt: skip
        """`nodes`: the cluster's Nodes (every report's node is one); `placed`: nodes in a HyperNode
        (the tree's own mapping: the same object while the tree is); `changed`: the nodes whose
        report or Node changed since the last call (None: not known). Nothing changed, the last
        explanation stands: an empty tree of 100,000 nodes is not explained again every reconcile."""
        key = (len(nodes), hypernodes, frozenset(refused))
        if placed is self._placed and key == self._key and changed is not None and not changed:
            return self.latest
        self._placed, self._key = placed, key
        if hypernodes and len(placed) >= len(nodes):
            found = Explanation(len(nodes), hypernodes)
        else:
            found = explain(nodes=nodes, placed=placed, hypernodes=hypernodes, reports=self._reports.over(topologies),
                            fabric_sources=self.fabric_sources, refused=refused, fabric_pattern=self.fabric_pattern)  # fmt: skip
        self.latest = found
        lines = found.lines()
        if lines != self._said:
            for line in lines:
                log.warning("tree: %s", line)
            if not lines and self._said:
                log.info("tree: every node is in a HyperNode again")
            self._said = lines
        return found
