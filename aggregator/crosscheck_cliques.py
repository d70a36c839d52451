"""NVLink clique claims cross-checked (aggregator.crosscheck): a clique is one multi-node domain only
where its members' cabling agrees, so one report claiming a clique can move only its own node.

A clique's nodes must nest with the leaf groups: an NVL72 rack sits inside a leaf, a multi-rack
domain spans whole leaf groups. One node claiming another rack's clique made that clique partly
overlap its leaf, and tier inference then dropped the leaf HyperNodes of every other node. So:

* a claim the model contradicts is refused (`refuse_undeclared`);
* a clique only one report names is no multi-node domain (set aside, no finding: a rack's first
  agent to report);
* a member whose cabling does not fit the others (`clique_outliers`) has its stray LLDP claims
  refused when those alone set it apart, else its clique claim;
* a node cabled like two or more members of a clique spread over several leaf groups, all its
  leaf peers in that clique but it, is left out of the tree (`_gaps`): it alone would make the
  clique partly overlap its group.

The settlement is kept in `graph.cliques` (a CliqueBook), so the fast path (`resettle`) re-judges
only the cliques one node leaves and joins, from their members' facts before the checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from aggregator.graph import CliqueBook, FabricFault, FabricGraph, Finding, NodeFacts

CAUSE = "Crosscheck"  # the health cause of a node whose report the fabric contradicts
NVLINK_DISPUTED = "nvlink_disputed"  # the model puts the node in another clique
NVLINK_OUTLIER = "nvlink_outlier"  # the node's cabling does not fit its clique's


def _some(names: Iterable[str], limit: int = 4) -> str:
    found = sorted(names)
    head = ", ".join(found[:limit])
    return head + (f" and {len(found) - limit} more" if len(found) > limit else "")


def disagrees(graph: FabricGraph, node: str, reason: str, text: str) -> None:
    """A finding on a node whose own report the fabric contradicts: reported, and a grey failure of
    the node (its domains show FabricDegraded; placement may avoid it)."""
    graph.findings.append(Finding(node, reason, text, degrades=True))
    graph.add_fabric_faults(node, [FabricFault(False, CAUSE, text)])


def forget(graph: FabricGraph, node: str, reasons: Iterable[str] | None = None) -> None:
    """Drops the node's findings (of these reasons; None: all) and the faults they put on it."""
    wanted = None if reasons is None else set(reasons)
    gone = {f.text for f in graph.findings if f.node == node and (wanted is None or f.reason in wanted)}
    if not gone:
        return
    graph.findings[:] = [f for f in graph.findings if not (f.node == node and f.text in gone)]
    faults = [f for f in graph.fabric_faults.pop(node, []) if not (f.cause == CAUSE and f.text in gone)]
    if faults:
        graph.fabric_faults[node] = faults


def authoritative(graph: FabricGraph, node: str, facts: NodeFacts | None) -> frozenset[str]:
    """The switches the fabric sources (dumps, UFM, switch tables, a model) cable the node to."""
    found: set[str] = set(graph.attached_by_host.get(node, ())) | graph.declared.get(node, set())
    if graph.attached_by_guid and facts is not None:
        by_guid = graph.attached_by_guid
        for guid in facts.guids:
            found.update(by_guid.get(guid, ()))
    return frozenset(found)


def _firm_set(switches: Mapping[str, frozenset[str]]) -> frozenset[str] | None:
    """The set of switches more than half the members share even were one of them to lie."""
    if not switches:
        return None
    firm, most = Counter(switches.values()).most_common(1)[0]
    return firm if 2 * most > len(switches) + 2 else None


def clique_outliers(switches: Mapping[str, frozenset[str]]) -> set[str]:
    """The members of one clique (node -> the switches it is cabled to) whose cabling does not fit.
    With a firm majority set (`_firm_set`): the members not sharing most of it, with most of their
    own switches in it (one cable down or astray is a fault of the node, as tier inference counts
    it). Else, in a clique spread over two or more leaf groups of two or more members each: the
    members whose cabling no other member shares, or who have none. Fewer than three: not judged."""
    if len(switches) < 3:
        return set()
    firm = _firm_set(switches)
    if firm is not None:
        return {n for n, sw in switches.items() if not (2 * len(sw & firm) > max(len(firm), len(sw)))}
    if not _is_spread(switches):
        return set()  # no firm majority and not a real spread: too few to tell who strays
    count = Counter(s for sw in switches.values() for s in sw)
    return {node for node, sw in switches.items() if not any(count[s] > 1 for s in sw)}


def _is_spread(judged: Mapping[str, frozenset[str]]) -> bool:
    """Whether the clique spans two or more leaf groups of two or more members each, no one of
    them a firm majority (a multi-rack domain)."""
    groups = sum(1 for n in Counter(judged.values()).values() if n >= 2)
    return len(judged) >= 3 and groups >= 2 and _firm_set(judged) is None


def refuse_undeclared(graph: FabricGraph, node: str) -> None:
    """The node's clique claim refused where the model puts it in another clique."""
    facts = graph.facts.get(node)
    claim = facts.nvlink if facts is not None else None
    declared = graph.nvlink_declared.get(node) if claim else None
    if declared and declared != claim:
        _set_clique(graph, node, None)
        disagrees(graph, node, NVLINK_DISPUTED,
                  f"node {node}: its report names NVLink clique {claim}, the model {declared}: "
                  "the report's claim is ignored")  # fmt: skip


def settle_cliques(graph: FabricGraph) -> None:
    """Every clique claim judged (see the module docstring); the outcome kept in `graph.cliques`."""
    declared_of = graph.nvlink_declared
    if declared_of:
        for node, facts in list(graph.facts.items()):
            if facts.nvlink and declared_of.get(node, facts.nvlink) != facts.nvlink:
                refuse_undeclared(graph, node)
    book = graph.cliques = _claims(graph)
    declared = set(graph.nvlink_declared.values())
    for clique, nodes in book.claimants.items():
        judged = _judge(graph, clique, nodes, clique in declared)
        if _is_spread(judged):
            book.spread.add(clique)
            for shared, n in Counter(judged.values()).items():
                if n >= 2:
                    book.spread_sets[shared] = clique if book.spread_sets.get(shared, clique) == clique else None
    if book.spread_sets:
        _gaps(graph, book.spread_sets)


def _claims(graph: FabricGraph) -> CliqueBook:
    """Who claims which clique: by their reports, or by the model where a report names none."""
    book = CliqueBook()
    declared, claim, before = graph.nvlink_declared, book.claim, book.before
    for node, facts in graph.facts.items():
        clique = facts.nvlink or declared.get(node)
        if clique:
            claim[node] = clique
            before[node] = facts
    claim.update((n, c) for n, c in declared.items() if n not in claim and n in graph.nodes)
    claimants = book.claimants
    for node, clique in claim.items():
        found = claimants.get(clique)
        if found is None:
            claimants[clique] = {node}
        else:
            found.add(node)
    return book


def _judge(graph: FabricGraph, clique: str, nodes: Iterable[str], declared: bool) -> dict[str, frozenset[str]]:
    """One clique judged: a lone claim set aside, outliers refused (`_refuse_outlier`); returns the
    members that stay, with their cabling as it stands."""
    nodes = sorted(nodes)
    if not nodes:
        return {}
    if len(nodes) == 1 and not declared:
        _set_clique(graph, nodes[0], None)  # a clique of one is no multi-node domain
        return {}
    same = _cabled_alike(graph, nodes)
    if same is not None:
        return dict.fromkeys(nodes, same)  # one set of switches: nobody strays, no spread
    judged = {node: graph.attached_switches(node) for node in nodes}
    for node in sorted(clique_outliers(judged)):
        _refuse_outlier(graph, node, clique, judged)
        if graph.nvlink_of(node) == clique:
            judged[node] = graph.attached_switches(node)  # its stray cabling refused instead
        else:
            del judged[node]
    return judged


def _cabled_alike(graph: FabricGraph, nodes: list[str]) -> frozenset[str] | None:
    """The one set of switches every member is cabled to, when their reports all name it and no
    fabric source adds another (a rack as it should be, the common case: no set per member to
    build); else None."""
    facts, declared = graph.facts, graph.declared
    if graph.attached_by_guid or graph.attached_by_host or nodes[0] not in facts:
        return None
    first = facts[nodes[0]].switches
    for node in nodes:
        found = facts.get(node)
        if found is None or found.switches != first or not declared.get(node, first) <= first:
            return None
    return first


def _refuse_outlier(graph: FabricGraph, node: str, clique: str, judged: Mapping[str, frozenset[str]]) -> None:
    """An outlier's report is refused where it stands alone: its LLDP neighbours beyond what a fabric
    source cables it to, when those alone set it apart; else its clique claim."""
    facts = graph.facts.get(node)
    auth = authoritative(graph, node, facts)
    extra = facts.switches - auth if facts is not None else frozenset()
    if facts is not None and auth and extra and node not in clique_outliers({**judged, node: auth}):
        graph.facts[node] = facts._replace(switches=facts.switches & auth)
        disagrees(graph, node, NVLINK_OUTLIER,
                  f"node {node}: its report hears {_some(extra)}, which neither the fabric nor its NVLink "
                  "clique's other members know: the report's claim is ignored")  # fmt: skip
        return
    _set_clique(graph, node, None)
    disagrees(graph, node, NVLINK_OUTLIER,
              f"node {node}: its report names NVLink clique {clique}, but its cabling "
              f"({_some(judged[node]) or 'none'}) does not fit the clique's other members: the claim is ignored")  # fmt: skip


def _gaps(graph: FabricGraph, spread: Mapping[frozenset[str], str | None]) -> None:
    """A node cabled like two or more members of a clique spread over several leaf groups, all its
    other leaf peers in that clique and it not, would alone make the clique partly overlap its leaf
    group (and so move where the NVLink tier ranks, for every node): it is left out of the tree."""
    groups: dict[frozenset[str], list[str]] = {}
    for node in graph.nodes:
        switches = graph.attached_switches(node)
        if switches in spread:
            groups.setdefault(switches, []).append(node)
    for switches, nodes in groups.items():
        clique = spread[switches]
        outside = [n for n in nodes if graph.nvlink_of(n) != clique]
        if clique is None or len(outside) != 1 or len(nodes) < 3:
            continue
        (node,) = outside
        graph.remove_node(node)
        disagrees(graph, node, NVLINK_OUTLIER,
                  f"node {node}: cabled like the members of NVLink clique {clique} ({_some(switches)}) but not "
                  "in it, the only one: left out of the tree")  # fmt: skip


def _set_clique(graph: FabricGraph, node: str, clique: str | None) -> None:
    facts = graph.facts.get(node)
    if facts is not None:
        graph.facts[node] = facts._replace(nvlink=clique)


def resettle(graph: FabricGraph, node: str, old: str | None) -> dict[str, NodeFacts] | None:
    """The fast path: the node's new facts are in the graph (cabling settled, the model's word
    applied), its claim was `old`. Re-judges the cliques it leaves and joins from their members'
    facts before the checks; returns the other members whose facts changed. None: a spread clique
    or a gap is involved, which reaches other nodes' leaf groups (a full build settles it)."""
    book = graph.cliques
    new = graph.nvlink_of(node)
    if old is not None:
        book.claimants.get(old, set()).discard(node)
        book.claim.pop(node, None)
        book.before.pop(node, None)
    if new is not None:
        book.claim[node] = new
        book.claimants.setdefault(new, set()).add(node)
        if node in graph.facts:
            book.before[node] = graph.facts[node]
    switches = graph.attached_switches(node)
    if book.spread & {old, new} or (switches in book.spread_sets and book.spread_sets[switches] != new):
        return None
    changed: dict[str, NodeFacts] = {}
    for clique in sorted(c for c in {old, new} if c is not None):
        members = book.claimants.get(clique, set())
        previous = {m: graph.facts.get(m) for m in members}
        for member in members:
            if member in book.before:
                graph.facts[member] = book.before[member]
            forget(graph, member, (NVLINK_OUTLIER,))
        lone_declared = len(members) == 1 and clique in graph.nvlink_declared.values()
        if _is_spread(_judge(graph, clique, members, lone_declared)):
            return None
        changed.update((m, f) for m in members if m != node and (f := graph.facts.get(m)) != previous[m] and f)
    return changed
