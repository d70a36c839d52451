"""Switch levels: how high each switch sits above the host-carrying switches (aggregator.tiers).

Heights are longest paths up from the leaves over links pointing away from the hosts. Declared
links (a model) carry their direction. A discovered link (a dump, switch LLDP) points from the end
farther from the fabric's centre to the nearer one, a host-carrying switch always being the lower
end; "far from the centre" is the hop count to the farthest host-carrying switch, so a leaf cabled
straight to a core does not pull the core down to the spines, and a leaf without hosts hangs below
its spine instead of ranking above it. Links between peers (equally central, serving some of the
same switches below: MLAG pairs, parallel cores) are lateral and ignored; equally central switches
serving different ones (a core beside a spine, each with leaves of its own) are told apart by their
share of host-carrying neighbours.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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


def _eccentricity(adjacent: Mapping[str, set[str]], leaves: set[str]) -> dict[str, int]:
    """Hops from each switch to the farthest host-carrying switch it is connected to.

    The top of a tree is its centre, the switch no leaf is far from; a dangling switch (a leaf
    without hosts) is farther out than the spine it hangs from. Leaves cabled to the same switches
    are equally far from every other switch, so one of them stands for all (in the searches and
    as a waypoint): a pod, or a rail of a pod, costs one breadth-first search over a graph with
    one leaf per pod, however many leaves it has."""
    standing_for = {frozenset(adjacent.get(leaf, ())): leaf for leaf in sorted(leaves, reverse=True)}
    stand_ins = set(standing_for.values())
    skipped = leaves - stand_ins
    farthest: dict[str, int] = {}
    for start in sorted(stand_ins):
        seen = {start: 0}
        frontier = [start]
        while frontier:
            nxt = []
            for s in frontier:
                for t in adjacent.get(s, ()):
                    if t not in seen and t not in skipped:
                        seen[t] = seen[s] + 1
                        nxt.append(t)
            frontier = nxt
        for s, hops in seen.items():
            if hops > farthest.get(s, -1):
                farthest[s] = hops
    return farthest


def _lower_end(
    a: str, b: str, leaves: set[str], far: Mapping[str, int], adjacent: Mapping[str, set[str]]
) -> str | None:
    """Which end of an undirected switch link is below the other (None: a lateral link).

    Links point away from the hosts, towards the fabric's centre: a host-carrying switch is below
    any other, else the switch farther from the centre (its farthest leaf farther away) is below.
    Two switches equally far from the centre are peers (a lateral link: MLAG peers, parallel spines)
    when they serve some of the same switches below; if they serve different ones (a core and a spine
    whose leaves hang one on each), the one with the larger share of host-carrying neighbours is the
    lower; equal shares leave the link lateral."""
    if a in leaves or b in leaves:
        return None if (a in leaves) == (b in leaves) else (a if a in leaves else b)
    if a not in far or b not in far:
        return None  # no host below either end
    if far[a] != far[b]:
        return a if far[a] > far[b] else b
    if _below(a, leaves, far, adjacent) & _below(b, leaves, far, adjacent):
        return None
    share_a = len(adjacent[a] & leaves) * len(adjacent[b])
    share_b = len(adjacent[b] & leaves) * len(adjacent[a])
    if share_a == share_b:
        return None
    return a if share_a > share_b else b


def _below(s: str, leaves: set[str], far: Mapping[str, int], adjacent: Mapping[str, set[str]]) -> set[str]:
    return {t for t in adjacent[s] if t in leaves or far.get(t, -1) > far[s]}


def switch_levels(graph: FabricGraph, leaves: set[str]) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Height of every switch above the leaves (leaves 0), the longest path up from a leaf over
    links pointing away from the hosts; switches no leaf reaches are left out. Also each switch's
    parents (the links pointing up from it). Declared links (a model) keep their direction;
    discovered ones are oriented by `_lower_end`."""
    down = _downlinks(graph, leaves)
    levels = _heights(down, leaves, {s for link in graph.switch_links for s in link})
    up: dict[str, set[str]] = defaultdict(set)
    for parent, children in down.items():
        for child in children:
            if child in levels and parent in levels and levels[child] < levels[parent]:
                up[child].add(parent)
    return levels, up


def _downlinks(graph: FabricGraph, leaves: set[str]) -> dict[str, set[str]]:
    """Each switch's children: declared links as declared, discovered ones oriented by `_lower_end`."""
    declared = {frozenset(link) for link in graph.uplinks}
    down: dict[str, set[str]] = defaultdict(set)
    for child, parent in graph.uplinks:
        down[parent].add(child)
    undeclared = [link for link in sorted(graph.switch_links) if frozenset(link) not in declared]
    if undeclared:
        adjacent = _adjacency(graph.switch_links)
        far = _eccentricity(adjacent, leaves)
        for a, b in undeclared:
            low = _lower_end(a, b, leaves, far, adjacent)
            if low is not None:
                down[b if low == a else a].add(low)
    return down


def _heights(down: Mapping[str, set[str]], leaves: set[str], linked: set[str]) -> dict[str, int]:
    """Longest path up from a leaf to each switch (cycles broken where a path meets itself)."""
    levels: dict[str, int] = {}
    for s in sorted(linked | set(down) | leaves):
        _height(s, frozenset(), down, leaves, levels)
    return levels


def _height(
    s: str, visiting: frozenset[str], down: Mapping[str, set[str]], leaves: set[str], levels: dict[str, int]
) -> int | None:
    """A module function, not a closure: a closure calling itself is a reference cycle that only
    the collector frees, and it would hold `levels` and `down` until then."""
    if s in levels:
        return levels[s]
    if s in leaves:
        levels[s] = 0
        return 0
    below = [
        h
        for c in down.get(s, ())
        if c not in visiting
        for h in [_height(c, visiting | {s}, down, leaves, levels)]
        if h is not None
    ]
    if not below:
        return None
    levels[s] = 1 + max(below)
    return levels[s]


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
