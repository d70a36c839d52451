"""Candidate domains kept per part (aggregator.tiers.parts): after any sequence of nodes moving
between classes (new cabling, another NVLink clique), the kept candidates equal the candidates
worked out from scratch over the whole cluster. The whole-cluster computation they replaced is
kept here as the oracle (`reference`): exact leaf sets settled biggest first in one pass, and a
union-find over every leaf group per switch level.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.graph import FabricGraph
from aggregator.tiers.candidates import NVLINK, Domain, _switch_identity, label_domains, switch_domain
from aggregator.tiers.classes import NodeClasses
from aggregator.tiers.levels import promoted_switches, switch_kind
from aggregator.tiers.parts import CandidateParts

# a small rail-optimised fabric: 4 units of 3 rails, 2 pods of 2 units, one core per rail
UNITS, RAILS = 4, 3
LEAVES = [[f"su{u}-r{r}" for r in range(RAILS)] for u in range(UNITS)]
SPINE = "storage-spine"  # a switch that carries a few hosts but is cabled to leaves: promoted


def _graph() -> FabricGraph:
    graph = FabricGraph()
    for u, leaves in enumerate(LEAVES):
        for r, leaf in enumerate(leaves):
            graph.add_uplink(leaf, f"pod{u // 2}-r{r}")
    for p in range(UNITS // 2):
        for r in range(RAILS):
            graph.add_uplink(f"pod{p}-r{r}", f"core-r{r}")
    graph.add_switch_link(SPINE, LEAVES[0][0])
    graph.add_switch_link(SPINE, LEAVES[1][0])
    return graph


def _cablings() -> list[frozenset[str]]:
    """Whole units, units with one rail down, one cable in the next unit, dual-homed, a spine."""
    found = [frozenset()]
    for u, leaves in enumerate(LEAVES):
        nxt = LEAVES[(u + 1) % UNITS]
        found += [frozenset(leaves), frozenset(leaves[1:]), frozenset([*leaves[1:], nxt[0]])]
        found += [frozenset(leaves) | frozenset(nxt), frozenset([leaves[0]])]
    return [*found, frozenset({SPINE}), frozenset({SPINE, LEAVES[0][0]})]


CABLINGS = _cablings()
CLIQUES = [None, "a", "b", "c"]
NODES = [f"n{i}" for i in range(16)]


# -- the oracle: candidates over the whole cluster in one go ---------------------------------------
def _leaf_groups(
    leaf_sets: Mapping[str, frozenset[str]], weight: Callable[[str], int]
) -> tuple[dict[frozenset[str], set[str]], dict[str, tuple[str, ...]]]:
    exact: dict[frozenset[str], set[str]] = defaultdict(set)
    for c, sw in leaf_sets.items():
        exact[sw].add(c)
    size = {sw: sum(weight(c) for c in members) for sw, members in exact.items()}
    groups: dict[frozenset[str], set[str]] = {}
    holding: dict[str, list[frozenset[str]]] = defaultdict(list)
    uncabled: dict[str, tuple[str, ...]] = {}
    for switches in sorted(exact, key=lambda sw: (-size[sw], -len(sw), _switch_identity("leaf", sw)[1])):
        shared: dict[frozenset[str], int] = defaultdict(int)
        for leaf in switches:
            for group in holding[leaf]:
                shared[group] += 1
        best = min(shared, key=lambda g: (-shared[g], -size[g], sorted(g)), default=None)
        if best is not None and 2 * shared[best] > max(len(switches), len(best)):
            groups[best] |= exact[switches]
            size[best] += size[switches]
            missing = tuple(sorted(best - switches))
            if missing:
                uncabled.update(dict.fromkeys(exact[switches], missing))
            continue
        groups[switches] = set(exact[switches])
        for leaf in switches:
            holding[leaf].append(switches)
    return groups, uncabled


def _level_domains(
    leaf_groups: Mapping[frozenset[str], set[str]], at: Callable[[frozenset[str], int], list[str]], level: int
) -> list[Domain]:
    parent: dict[str, str] = {}

    def find(s: str) -> str:
        while parent.setdefault(s, s) != s:
            s = parent[s]
        return s

    reached = []
    for switches, nodes in leaf_groups.items():
        at_level = at(switches, level)
        if at_level:
            for s in at_level[1:]:
                parent[find(s)] = find(at_level[0])
            reached.append((nodes, at_level))
    members: dict[str, set[str]] = defaultdict(set)
    node_sets: dict[str, set[str]] = defaultdict(set)
    for nodes, at_level in reached:
        root = find(at_level[0])
        members[root].update(at_level)
        node_sets[root].update(nodes)
    return [switch_domain(switch_kind(level), frozenset(members[r]), node_sets[r]) for r in members]


def reference(
    graph: FabricGraph, classes: NodeClasses
) -> tuple[set[Domain], int, dict[str, tuple[str, ...]]]:
    cliques: dict[str, set[str]] = defaultdict(set)
    for c, sig in classes.signature.items():
        if sig[1]:
            cliques[sig[1]].add(c)
    domains = [Domain(f"{NVLINK}:{d}", NVLINK, (d,), frozenset(ns)) for d, ns in cliques.items()]
    attached = {c: sig[0] for c, sig in classes.signature.items()}
    hosts_on: dict[str, int] = defaultdict(int)
    for cid, switches in attached.items():
        for switch in switches:
            hosts_on[switch] += classes.weight(cid)
    promoted = promoted_switches(graph, hosts_on)
    leaf_sets = {c: (sw - promoted) or sw for c, sw in attached.items() if sw}
    groups, uncabled = _leaf_groups(leaf_sets, classes.weight)
    domains += [switch_domain("leaf", sw, ns) for sw, ns in groups.items() if not sw & promoted]
    leaves = {s for sw in groups for s in sw} - promoted
    levels = classes.levels(graph, frozenset(leaves))
    top = max(levels.height.values(), default=0)
    for level in range(1, top + 1):
        domains += _level_domains(groups, levels.at_level, level)
    depth = top + 1 if leaves else 0
    return set(domains) | set(label_domains(graph, classes, depth)), depth, uncabled


def _kept(parts: CandidateParts) -> tuple[set[Domain], int, dict[str, tuple[str, ...]]]:
    found = parts.found()
    assert len(found) == len(set(found))  # no domain twice
    return set(found), parts.switch_levels, dict(parts.uncabled)


# -- the property -----------------------------------------------------------------------------
signatures = st.tuples(st.sampled_from(CABLINGS), st.sampled_from(CLIQUES))
moves = st.lists(st.tuples(st.sampled_from(NODES), signatures | st.none()), min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(st.lists(signatures, min_size=len(NODES), max_size=len(NODES)), moves)
def test_kept_candidates_equal_candidates_from_scratch_after_any_moves(
    start: list[tuple[frozenset[str], str | None]],
    sequence: list[tuple[str, tuple[frozenset[str], str | None] | None]],
) -> None:
    """Nodes change cabling (whole units, a rail down, a cable in the next unit, dual-homed, a
    storage spine that is promoted or not), NVLink clique, or leave; classes appear and vanish.
    After every move the kept candidates, switch levels and partly cabled classes equal the
    whole-cluster computation (a fresh state is built only when the promoted spines change)."""
    graph = _graph()
    classes = NodeClasses()
    for node, (switches, clique) in zip(NODES, start, strict=True):
        classes.move(node, (switches, clique, ()))
    parts = CandidateParts(graph, classes)
    assert _kept(parts) == reference(graph, classes)
    for node, signature in sequence:
        dirty = classes.move(node, None if signature is None else (signature[0], signature[1], ()))
        if not parts.update(dirty):
            parts = CandidateParts(graph, classes)
        assert _kept(parts) == reference(graph, classes)


def test_a_node_recabled_between_units_rebuilds_only_the_domains_it_reaches() -> None:
    """Every unit has 3 nodes; a node of the first is cabled to the second unit's leaves too: its
    rack's NVLink domain gains its new class, a leaf group of its own appears, and the pod's
    spine domain and the core gain that class. Every other domain keeps its very object: the units'
    leaf domains (their classes stay the same), the other pod's spine, the other racks."""
    graph = _graph()
    classes = NodeClasses()
    for u in range(UNITS):
        for i in range(3):
            classes.move(f"u{u}n{i}", (frozenset(LEAVES[u]), f"rack{u}", ()))
    parts = CandidateParts(graph, classes)
    before = {d.key: d for d in parts.found()}
    dirty = classes.move("u0n0", (frozenset(LEAVES[0]) | frozenset(LEAVES[1]), "rack0", ()))
    assert parts.update(dirty)
    after = {d.key: d for d in parts.found()}
    kept = {k for k in before.keys() & after.keys() if before[k] is after[k]}
    changed = (before.keys() | after.keys()) - kept
    (pod0,) = (k for k in after if k.startswith("spine:pod0-r0"))
    assert changed == {
        "nvlink:rack0",
        "leaf:" + "+".join(sorted(LEAVES[0] + LEAVES[1])),
        pod0,
        "core:core-r0+core-r1+core-r2",
    }
    assert len(after) == len(before) + 1
    assert _kept(parts) == reference(graph, classes)


def test_a_state_handed_on_by_an_older_tree_is_not_taken() -> None:
    """The inference that advances the state takes it over; the tree it came from cannot hand it on
    again (its view is gone), nor can a tree of another graph."""
    graph = _graph()
    classes = NodeClasses()
    classes.move("n1", (frozenset(LEAVES[0]), None, ()))
    parts = CandidateParts(graph, classes)
    first = parts.owner = object()
    assert CandidateParts.take((parts, first), graph, classes) is parts
    parts.owner = object()
    assert CandidateParts.take((parts, first), graph, classes) is None
    assert CandidateParts.take((parts, parts.owner), _graph(), classes) is None
