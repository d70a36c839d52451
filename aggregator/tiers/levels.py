"""Switch levels: how high each switch sits above the host-carrying switches (aggregator.tiers.infer).

Levels are peeled from the leaves upward, by what most of a switch's neighbours are:

* the leaves (level 0) are the switches hosts are cabled to: every host the fabric sources know
  (every CA of a dump, every port UFM lists), not only the cluster's Nodes, so which hosts are
  Nodes never moves a level (`fabric_hosts_on`). A switch without hosts that hangs from a single
  other switch (a management or storage leaf on one spine, and whatever hangs from it only) is a
  leaf too: it is set aside before peeling and can never re-rank the switches it hangs from;
* level k is made of the switches next to level k-1 that are not above one another: of two such
  switches cabled together, the one with fewer switches of level k-1 below it (as many: the one
  with the smaller share of its cables going down) is above the other and waits for a later
  level, unless they share most of their lower switches (peers: an MLAG pair, parallel spines).
  So a core with a leaf of its own (a rack cabled straight to the core) waits above the spines
  beside it, because most leaves go up to spines, not to it. A switch whose only leaves hang from
  it alone and make under a third of its cables (a management leaf on a core) waits too, and a
  declared link (a model) keeps its direction.

Every rule reads what most of a switch's neighbours are, never a distance to the farthest switch,
so a dead switch, a missing cable or a stray leaf changes the levels of the switches it touches
at most (tests/fuzz/test_tiers_under_damage.py proves it over perturbed fabrics).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from aggregator.graph import FabricGraph


def switch_kind(level: int) -> str:
    """0 leaf, 1 spine, 2 core, then core2, core3, ... on deeper fabrics."""
    return ("leaf", "spine", "core")[level] if level < 3 else f"core{level - 1}"


def _adjacency(links: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    adjacent: dict[str, set[str]] = defaultdict(set)
    for a, b in links:
        adjacent[a].add(b)
        adjacent[b].add(a)
    return adjacent


def fabric_hosts_on(graph: FabricGraph) -> dict[str, int]:
    """Hosts the fabric sources cable to each switch, whether or not they are Nodes: hosts named by
    a dump or UFM, else (a CA whose description names no host) its GUIDs. Node-independent, so the
    leaves, and with them every level, are the same whichever hosts are Nodes."""
    named: dict[str, int] = defaultdict(int)
    for switches in graph.attached_by_host.values():
        for s in switches:
            named[s] += 1
    by_guid: dict[str, int] = defaultdict(int)
    for switches in graph.attached_by_guid.values():
        for s in switches:
            by_guid[s] += 1
    for s, count in by_guid.items():
        if s not in named:
            named[s] = count
    return dict(named)


def _hanging(adjacent: Mapping[str, set[str]], leaves: set[str]) -> set[str]:
    """Switches without hosts reachable only through one other switch (repeatedly: a chain of
    them): stray leaves, which must not count for the switch they hang from."""
    degree = {s: len(n) for s, n in adjacent.items()}
    stack = [s for s, d in degree.items() if d <= 1 and s not in leaves]
    hanging: set[str] = set()
    while stack:
        s = stack.pop()
        if s in hanging:
            continue
        hanging.add(s)
        for t in adjacent[s]:
            if t not in hanging and t not in leaves:
                degree[t] -= 1
                if degree[t] <= 1:
                    stack.append(t)
    return hanging


def _peel(
    adjacent: Mapping[str, set[str]], leaves: set[str], declared_down: Mapping[str, set[str]]
) -> dict[str, int]:
    """Levels peeled from the leaves upward (see the module docstring)."""
    level = dict.fromkeys(leaves, 0)
    pendant = {s for s in leaves if len(adjacent.get(s, ())) == 1}
    frontier = {t for s in leaves for t in adjacent.get(s, ()) if t not in level}
    k = 1
    while frontier:
        below = {s: {t for t in adjacent[s] if level.get(t) == k - 1} for s in frontier}
        weight = {s: (len(b), Fraction(len(b), len(adjacent[s]))) for s, b in below.items()}
        waiting = {
            s
            for s in frontier
            if any(c in frontier for c in declared_down.get(s, ()))
            or any(t in frontier and _above(s, t, below, weight) for t in adjacent[s])
            or (k == 1 and below[s] <= pendant and 3 * len(below[s]) < len(adjacent[s]))
        }
        placed = frontier - waiting or frontier  # a cycle of declared links: all of them here
        for s in placed:
            level[s] = k
        frontier = {t for s in placed for t in adjacent[s] if t not in level}
        k += 1
    return level


def _above(s: str, t: str, below: Mapping[str, set[str]], weight: Mapping[str, tuple[int, Fraction]]) -> bool:
    """Whether s sits above t, both next to the level below: s has fewer switches of that level
    below it, and they do not share most of them (peers)."""
    if weight[s] >= weight[t]:
        return False
    shared = len(below[s] & below[t])
    return 2 * shared <= max(len(below[s]), len(below[t]))


def switch_levels(graph: FabricGraph, leaves: set[str]) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Level of every switch (leaves 0; see the module docstring) and each switch's parents (the
    switches cabled to it one or more levels up); switches no leaf reaches are left out, and a
    hanging switch without hosts is a leaf with no parent (it is in no domain)."""
    adjacent = _adjacency(graph.switch_links)
    hanging = _hanging(adjacent, leaves)
    core = {
        s: (n - hanging if hanging and not n.isdisjoint(hanging) else n)
        for s, n in adjacent.items()
        if s not in hanging
    }
    declared_down: dict[str, set[str]] = defaultdict(set)
    for child, parent in graph.uplinks:
        if child not in hanging and parent not in hanging:
            declared_down[parent].add(child)
    levels = _peel(core, set(leaves), declared_down)
    up: dict[str, set[str]] = defaultdict(set)
    for a, b in graph.switch_links:
        if a in levels and b in levels and levels[a] != levels[b]:
            low, high = (a, b) if levels[a] < levels[b] else (b, a)
            up[low].add(high)
    _behind_leaves(core, leaves, levels, up)
    levels.update((s, 0) for s in hanging if any(t in levels for t in adjacent[s]) or s in leaves)
    return levels, up


def _behind_leaves(
    adjacent: Mapping[str, set[str]],
    leaves: Iterable[str],
    levels: Mapping[str, int],
    up: dict[str, set[str]],
) -> None:
    """A leaf cabled to other leaves only (daisy-chained behind a leaf, as small fabrics are) goes
    up through them: its parents are theirs, nearest first, so its hosts join the spines the
    leaf in front reaches instead of making a root of their own."""
    frontier = [s for s in leaves if up.get(s)]
    seen = set(frontier)
    while frontier:
        nxt: dict[str, None] = {}  # this round's, in order
        for s in frontier:
            for t in adjacent.get(s, ()):
                if t in nxt:
                    up[t] |= up[s]
                elif t not in seen and levels.get(t) == 0 and not up.get(t):
                    seen.add(t)
                    up[t] = set(up[s])
                    nxt[t] = None
        frontier = list(nxt)


def promoted_switches(graph: FabricGraph, hosts_on: Mapping[str, int]) -> set[str]:
    """Switches with a few hosts on them that are really spines: cabled to at least two switches
    that carry hosts, and to more of those than to hosts (a storage host on a spine). A pair of
    leaves joined by a peer link stays two leaves."""
    neighbours: dict[str, set[str]] = defaultdict(set)
    for a, b in graph.switch_links:
        if a in hosts_on and b in hosts_on:
            neighbours[a].add(b)
            neighbours[b].add(a)
    return {s for s, peers in neighbours.items() if len(peers) >= 2 and len(peers) > hosts_on[s]}


@dataclass
class SwitchLevels:
    """Switch heights over the leaves, and what each leaf set reaches at each level: a function of
    the switch links and of which switches carry hosts only, so kept while those stay the same."""

    height: dict[str, int]
    up: dict[str, set[str]]
    reach: dict[str, frozenset[str]] = field(default_factory=dict)
    reached: dict[tuple[frozenset[str], int], list[str]] = field(default_factory=dict)

    def above(self, s: str) -> frozenset[str]:
        if s not in self.reach:
            self.reach[s] = frozenset()  # cycle guard
            self.reach[s] = frozenset({s}).union(*(self.above(p) for p in self.up[s]))
        return self.reach[s]

    def at_level(self, switches: frozenset[str], level: int) -> list[str]:
        """The switches of `level` above any of these leaves, sorted."""
        key = (switches, level)
        found = self.reached.get(key)
        if found is None:
            height = self.height
            found = sorted({s for leaf in switches for s in self.above(leaf) if height.get(s) == level})
            self.reached[key] = found
        return found
