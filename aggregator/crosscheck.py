"""Cross-checks: a fact two sources speak of is taken from the one a single node cannot forge, and
a disagreement is a finding on the node that disagrees, never a reason to move other nodes.

A NodeTopology report is written by the node's own agent, so a compromised or broken node can say
anything in it. Left unchecked, one report reshaped everyone's tree: a node claiming another rack's
NVLink clique made that rack's domain partly overlap its leaf (dropping every leaf HyperNode), a
node claiming another leaf's LLDP neighbour beside a dump was unioned with the dump's truth (which
turned the leaves into spines), a node copying another's HCA GUIDs took over that node's UFM cable,
and a host announcing another host's name in its LLDP frames pulled that host out of its leaf on a
switch's table. Here, each such claim is checked where a second source exists:

* a report filed under one node's name that says it is another node's is refused
  (`refuse_mismatched`; the admission guard checks the object name, the aggregator keyed on the spec);
* an HCA GUID claimed by two reports is refused for both (`refuse_duplicate_guids`): dumps and UFM
  then place those ports by the host names they know, so neither report decides whose cable it is;
* a switch table entry naming host X on a switch is kept only when X's own report does not
  contradict it (`table_entry_confirmed`): X hears no switch at all, or hears that one;
* a report's LLDP neighbour on a switch that an authoritative source (dump, UFM, model, switch
  tables) knows, and to which that source does not cable the node it covers, is dropped
  (`settle_cabling`): the fabric's own view of the node wins;
* an NVLink clique claim is judged against the model and the clique's other members' cabling
  (aggregator.crosscheck_cliques).

Findings go to `graph.findings` (warnings, metrics) and, where the node's own report is what
disagrees, to the node's fabric faults as a grey failure (FabricDegraded on its domains). Pure: no
I/O, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from agent.common.report import NodeReport
from aggregator.crosscheck_cliques import (
    CAUSE,
    NVLINK_DISPUTED,
    NVLINK_OUTLIER,
    authoritative,
    disagrees,
    forget,
    refuse_undeclared,
    resettle,
    settle_cliques,
)
from aggregator.graph import FabricGraph, Finding, NodeFacts

NODE_NAME_MISMATCH = "node_name_mismatch"
DUPLICATE_GUID = "duplicate_guid"
LLDP_DISPUTED = "lldp_disputed"
SWITCH_TABLE_UNCONFIRMED = "switch_table_unconfirmed"
REASONS = (NODE_NAME_MISMATCH, DUPLICATE_GUID, LLDP_DISPUTED, NVLINK_DISPUTED, NVLINK_OUTLIER, SWITCH_TABLE_UNCONFIRMED)
_NONE: frozenset[str] = frozenset()
__all__ = ["CAUSE", "REASONS", "authoritative", "settle", "settle_node"]


def _some(names: Iterable[str], limit: int = 4) -> str:
    found = sorted(names)
    head = ", ".join(found[:limit])
    return head + (f" and {len(found) - limit} more" if len(found) > limit else "")


# -- reports among themselves ---------------------------------------------------------------------


def refuse_mismatched(reports: Mapping[str, NodeReport]) -> tuple[dict[str, NodeReport], list[Finding]]:
    """The reports whose spec names the node they are filed under, and a finding for each other one.

    Reports are filed under their object's name (the node whose agent may write it); a report whose
    `spec.nodeName` names another node would otherwise stand for that node."""
    kept: dict[str, NodeReport] = {}
    refused: list[Finding] = []
    for name, report in reports.items():
        if report.node_name == name:
            kept[name] = report
        else:
            refused.append(
                Finding(
                    name,
                    NODE_NAME_MISMATCH,
                    f"NodeTopology {name}: spec.nodeName is {report.node_name!r}, not the object's name: "
                    "report ignored",
                )
            )
    return kept, refused


def refuse_duplicate_guids(graph: FabricGraph) -> None:
    """Drops from every report's facts the HCAs carrying a GUID another report carries too.

    Neither report is believed: dumps and UFM then place those ports by the host names they know,
    so a node copying another's GUIDs cannot take over its cables (nor their faults)."""
    owners: dict[str, list[str]] = defaultdict(list)
    for node, facts in graph.facts.items():
        for guid in facts.guids:
            owners[guid].append(node)
    shared = {guid: nodes for guid, nodes in owners.items() if len(nodes) > 1}
    if not shared:
        return
    nodes_with = defaultdict(set)
    for guid, nodes in shared.items():
        for node in nodes:
            nodes_with[node].add(guid)
    for node, guids in sorted(nodes_with.items()):
        facts = graph.facts[node]
        kept = tuple(d for d in facts.hcas if not (NodeFacts(hcas=(d,)).guids & guids))
        graph.facts[node] = facts._replace(hcas=kept)
        others = {n for g in guids for n in shared[g]} - {node}
        graph.findings.append(
            Finding(
                node,
                DUPLICATE_GUID,
                f"node {node}: HCA GUID(s) {_some(guids, 2)} also reported by {_some(others)}: "
                "refused for both, the fabric's host names place those ports",
            )
        )


# -- switch tables --------------------------------------------------------------------------------


def table_entry_confirmed(graph: FabricGraph, switch: str, port: str, host: str) -> bool:
    """Whether a switch's LLDP table entry naming `host` on `port` may cable that host there.

    Anyone on a port can announce any system name, so an entry stands only when the named node's own
    report does not say otherwise: it has no report, hears no switch on its fabric NICs, or hears
    this one. Else the entry is a finding (about the switch port, not a fault of the node)."""
    facts = graph.facts.get(host)
    if facts is None or not facts.switches or switch in facts.switches:
        return True
    graph.findings.append(
        Finding(
            host,
            SWITCH_TABLE_UNCONFIRMED,
            f"switch {switch} port {port} names {host}, whose own report hears {_some(facts.switches)}: "
            "entry ignored",
        )
    )
    return False


# -- reports against the fabric -------------------------------------------------------------------


def fabric_switches(graph: FabricGraph) -> frozenset[str]:
    """Every switch a fabric source knows (as a cable end or as a host's switch)."""
    known: set[str] = {s for link in graph.switch_links for s in link}
    for table in (graph.attached_by_guid, graph.attached_by_host, graph.declared):
        known.update(*table.values())
    return frozenset(known)


def disputed_switches(
    graph: FabricGraph, node: str, facts: NodeFacts, known: frozenset[str] | None = None
) -> frozenset[str]:
    """The LLDP neighbours of the node's report that the fabric contradicts: switches a fabric
    source knows, which the source covering the node does not cable it to. A switch no fabric
    source knows (another plane, a dump of one rail) is no contradiction."""
    if not facts.switches:
        return frozenset()
    auth = authoritative(graph, node, facts)
    extra = facts.switches - auth
    if not extra or not (auth or _contested(graph, node)):
        return frozenset()
    return extra & (fabric_switches(graph) if known is None else known)


def _contested(graph: FabricGraph, node: str) -> bool:
    """Whether a switch table named the node somewhere its report contradicts (the entry refused):
    the tables cover the node, so its report's claims on their switches are no more believed."""
    return any(f.node == node and f.reason == SWITCH_TABLE_UNCONFIRMED for f in graph.findings)


def settle_cabling(graph: FabricGraph) -> None:
    """Drops the LLDP claims the fabric contradicts from every report's facts (a finding each)."""
    if not (graph.attached_by_guid or graph.attached_by_host or graph.declared):
        return
    known: frozenset[str] | None = None
    contested = {f.node for f in graph.findings if f.reason == SWITCH_TABLE_UNCONFIRMED}
    declared, only_declared = graph.declared, not (graph.attached_by_guid or graph.attached_by_host)
    for node, facts in list(graph.facts.items()):
        if not facts.switches or (only_declared and facts.switches <= declared.get(node, _NONE)):
            continue  # nothing to say (the model's own view: the common case, no set to build)
        auth = authoritative(graph, node, facts)
        if not (auth or node in contested) or facts.switches <= auth:
            continue
        if known is None:
            known = fabric_switches(graph)
        _drop_disputed(graph, node, (facts.switches - auth) & known, auth)


def _drop_disputed(graph: FabricGraph, node: str, disputed: frozenset[str], auth: frozenset[str]) -> None:
    if disputed:
        facts = graph.facts[node]
        graph.facts[node] = facts._replace(switches=facts.switches - disputed)
        disagrees(graph, node, LLDP_DISPUTED,
                   f"node {node}: its report hears {_some(disputed)}, the fabric cables it to "
                   f"{_some(auth) or 'none of them'}: the report's claim is ignored")  # fmt: skip


def settle(graph: FabricGraph) -> None:
    """Every check against the fabric, once all sources are in the graph (cabling first: a clique's
    members are judged by the cabling that stands)."""
    settle_cabling(graph)
    settle_cliques(graph)


# findings whose settling reads other nodes' or sources' facts: a node with one is rebuilt in full
_GLOBAL = frozenset({NODE_NAME_MISMATCH, DUPLICATE_GUID, SWITCH_TABLE_UNCONFIRMED})


def settle_node(graph: FabricGraph, node: str, facts: NodeFacts) -> tuple[NodeFacts, dict[str, NodeFacts]] | None:
    """The fast path's checks of one node's new facts (the fabric and every other report unchanged):
    sets them in the graph with the node's findings as a full build would settle them, and returns
    them with the facts of the other nodes that change with them (members of the cliques it leaves
    or joins, judged again). None: they need a full build (a finding that reads other reports or
    sources, a switch table its report now denies, a clique spread over several leaf groups)."""
    mine = [f for f in graph.findings if f.node == node]
    if not mine and graph.facts.get(node) == facts:
        return facts, {}  # as before, and nothing of it refused
    if any(f.reason in _GLOBAL for f in mine) or node not in graph.nodes or _denies_tables(graph, node, facts):
        return None
    old = graph.cliques.claim.get(node)
    forget(graph, node)
    graph.set_node_facts(node, facts)
    _drop_disputed(graph, node, disputed_switches(graph, node, facts), authoritative(graph, node, facts))
    refuse_undeclared(graph, node)
    changed = resettle(graph, node, old)
    return None if changed is None else (graph.facts[node], changed)


def _denies_tables(graph: FabricGraph, node: str, facts: NodeFacts) -> bool:
    """Whether the node's new report hears switches but not every one a host name cables it to:
    a switch table's entry the full build would now refuse (`table_entry_confirmed`)."""
    named = graph.attached_by_host.get(node)
    return bool(named and facts.switches and not named <= facts.switches)
