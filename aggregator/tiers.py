"""Tier inference: `infer(graph) -> DomainTree`, the nested performance domains of a fabric.

Candidate domains come from the graph:

* `nvlink`: nodes sharing a multi-node NVLink clique;
* `leaf`: nodes cabled to the same SET of switches (on a rail-optimised fabric every node of a
  scalable unit touches the same leaf in each rail, so the rail group is one domain); a node
  cabled to most of a bigger group's leaves (one rail cable down) belongs to that group, and its
  missing cables are listed (`DomainTree.uncabled`) as a fault of the node;
* `spine`, `core` (and `core2`, ... on deeper fabrics): switches one, two, ... levels above the
  leaves; leaf domains whose uplinks reach a common switch of a level share that level's domain;
* label levels (sources.labels): above the highest switch level, finest label first.

Switch levels are longest-path heights from the host-carrying switches over links pointing away
from the hosts. Declared links (a model) carry their direction. A discovered link (a dump, switch
LLDP) points from the end farther from the fabric's centre to the nearer one, a host-carrying
switch always being the lower end; "far from the centre" is the hop count to the farthest
host-carrying switch, so a leaf cabled straight to a core does not pull the core down to the
spines, and a leaf without hosts hangs below its spine instead of ranking above it. Links between
peers (equally central, serving some of the same switches below: MLAG pairs, parallel cores) are
lateral and ignored; equally central switches serving different ones (a core beside a spine, each
with leaves of its own) are told apart by their share of host-carrying neighbours.

Domains nest by containment of node sets, not by a fixed order of kinds: an NVLink domain sits
below the leaves when it fits inside them and above them when it spans several (a multi-rack
domain). Kinds are ranked once for the whole cluster so every tier has one tier name; domains are
then accepted smallest rank first, and a domain whose node set equals an accepted one merges into
it (an NVL72 rack that is exactly one leaf is one HyperNode, named after its lowest kind), while one
that partly overlaps an accepted domain would break the tree and is dropped, with the reason.
Nodes without a domain at some level simply join the next level up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from aggregator.graph import FabricGraph

NVLINK = "nvlink"
K = TypeVar("K")


def switch_kind(level: int) -> str:
    """0 leaf, 1 spine, 2 core, then core2, core3, ... on deeper fabrics."""
    return ("leaf", "spine", "core")[level] if level < 3 else f"core{level - 1}"


@dataclass(frozen=True)
class Domain:
    key: str  # unique: kind + identity
    kind: str
    identity: tuple[str, ...]  # switch IDs, the clique, or the label path
    nodes: frozenset[str]


@dataclass(frozen=True)
class TreeDomain:
    domain: Domain
    tier: int
    parent: str | None
    children: tuple[str, ...]  # keys of child domains, sorted
    direct_nodes: tuple[str, ...]  # nodes not inside any child, sorted
    merged: tuple[str, ...] = ()  # keys of domains with the same node set, merged into this one

    @property
    def key(self) -> str:
        return self.domain.key

    @property
    def tier_name(self) -> str:
        return self.domain.kind


@dataclass(frozen=True)
class DomainTree:
    domains: Mapping[str, TreeDomain]
    tiers: tuple[str, ...]  # tier name of tier 1, 2, ...
    lowest: Mapping[str, str]  # node -> key of the smallest domain holding it
    dropped: tuple[tuple[str, str], ...] = ()  # (key, reason)
    # node -> leaves of its leaf domain it has no cable to (a cable down, an HCA out): a fault of
    # that node, not a domain of its own
    uncabled: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def ancestors(self, key: str) -> list[str]:
        """The key itself and every domain above it, innermost first."""
        chain: list[str] = []
        current: str | None = key
        while current is not None:
            chain.append(current)
            current = self.domains[current].parent
        return chain

    def domains_of(self, node: str) -> list[str]:
        lowest = self.lowest.get(node)
        return self.ancestors(lowest) if lowest else []


# --- candidates ----------------------------------------------------------------------------------


def _group(pairs: Iterable[tuple[str, K | None]]) -> dict[K, set[str]]:
    """Nodes grouped by a value; nodes whose value is empty belong to no group."""
    groups: dict[K, set[str]] = defaultdict(set)
    for node, value in pairs:
        if value:
            groups[value].add(node)
    return groups


def _nvlink_domains(graph: FabricGraph) -> list[Domain]:
    groups = _group((n, graph.nvlink_of(n)) for n in graph.nodes)
    return [Domain(f"{NVLINK}:{d}", NVLINK, (str(d),), frozenset(ns)) for d, ns in groups.items()]


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


def _switch_levels(graph: FabricGraph, leaves: set[str]) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Height of every switch above the leaves (leaves 0), the longest path up from a leaf over
    links pointing away from the hosts; switches no leaf reaches are left out. Also each switch's
    parents (the links pointing up from it). Declared links (a model) keep their direction;
    discovered ones are oriented by `_lower_end`."""
    adjacent = _adjacency(graph.switch_links)
    declared = {frozenset(link) for link in graph.uplinks}
    down: dict[str, set[str]] = defaultdict(set)
    for child, parent in graph.uplinks:
        down[parent].add(child)
    undeclared = [link for link in sorted(graph.switch_links) if frozenset(link) not in declared]
    if undeclared:
        far = _eccentricity(adjacent, leaves)
        for a, b in undeclared:
            low = _lower_end(a, b, leaves, far, adjacent)
            if low is not None:
                down[b if low == a else a].add(low)
    levels: dict[str, int] = {}

    def height(s: str, visiting: frozenset[str]) -> int | None:
        if s in levels:
            return levels[s]
        if s in leaves:
            levels[s] = 0
            return 0
        below = [
            h for c in down[s] if c not in visiting for h in [height(c, visiting | {s})] if h is not None
        ]
        if not below:
            return None
        levels[s] = 1 + max(below)
        return levels[s]

    for s in sorted(set(adjacent) | set(down) | leaves):
        height(s, frozenset())
    up: dict[str, set[str]] = defaultdict(set)
    for parent, children in down.items():
        for child in children:
            if child in levels and parent in levels and levels[child] < levels[parent]:
                up[child].add(parent)
    return levels, up


def _promoted(graph: FabricGraph, hosts_on: Mapping[str, int]) -> set[str]:
    """Switches with a few hosts on them that are really spines: cabled to at least two switches
    that carry hosts, and to more of those than to hosts (a storage host on a spine). A pair of
    leaves joined by a peer link stays two leaves."""
    neighbours: dict[str, set[str]] = defaultdict(set)
    for a, b in graph.switch_links:
        if a in hosts_on and b in hosts_on:
            neighbours[a].add(b)
            neighbours[b].add(a)
    return {s for s, peers in neighbours.items() if len(peers) >= 2 and len(peers) > hosts_on[s]}


def _switch_domains(graph: FabricGraph) -> tuple[list[Domain], int, dict[str, tuple[str, ...]]]:
    """Leaf domains and the domains of every level above them; also the number of levels and the
    nodes cabled to only part of their leaf domain's leaves (see `_leaf_groups`)."""
    attached = {n: graph.attached_switches(n) for n in graph.nodes}
    hosts_on: dict[str, int] = defaultdict(int)
    for switches in attached.values():
        for switch in switches:
            hosts_on[switch] += 1
    promoted = _promoted(graph, hosts_on)
    # a node's leaf set leaves out spines it is also cabled to; a node only on spines has no leaf
    leaf_groups, uncabled = _leaf_groups({n: (sw - promoted) or sw for n, sw in attached.items() if sw})
    domains = [
        Domain("leaf:" + "+".join(sorted(sw)), "leaf", tuple(sorted(sw)), frozenset(ns))
        for sw, ns in leaf_groups.items()
        if not sw & promoted
    ]
    leaves = {s for sw in leaf_groups for s in sw} - promoted
    levels, up = _switch_levels(graph, leaves)
    reach: dict[str, frozenset[str]] = {}

    def above(s: str) -> frozenset[str]:
        if s not in reach:
            reach[s] = frozenset()  # cycle guard
            reach[s] = frozenset({s}).union(*(above(p) for p in up[s]))
        return reach[s]

    top = max(levels.values(), default=0)
    for level in range(1, top + 1):
        domains.extend(_level_domains(leaf_groups, above, levels, level))
    return domains, (top + 1 if leaves else 0), uncabled


def _leaf_groups(
    leaf_sets: Mapping[str, frozenset[str]],
) -> tuple[dict[frozenset[str], set[str]], dict[str, tuple[str, ...]]]:
    """Nodes grouped by the leaves they share, and the leaves each grouped node lacks.

    Nodes cabled to the same set of leaves are a group (every node of a rail-optimised scalable
    unit touches the same leaf in each rail). A node that shares most of a bigger group's leaves,
    with most of its own leaves among them (more than half each way), belongs to that group: one
    rail cable down, or one cable in the wrong unit, is a fault of the node, not a domain of its
    own, and must not shrink the unit. Groups are settled biggest first (most nodes, then most
    leaves, then by name), so the answer does not depend on input order. A node dual-homed to two
    leaves shares only half its leaves with either leaf's nodes, and they half of theirs with it,
    so it stays a group of its own, as does a node with half its rails down."""
    exact = _group(leaf_sets.items())
    groups: dict[frozenset[str], set[str]] = {}
    holding: dict[str, list[frozenset[str]]] = defaultdict(list)  # leaf -> groups with it
    uncabled: dict[str, tuple[str, ...]] = {}
    for switches in sorted(exact, key=lambda sw: (-len(exact[sw]), -len(sw), sorted(sw))):
        shared: dict[frozenset[str], int] = defaultdict(int)
        for leaf in switches:
            for group in holding[leaf]:
                shared[group] += 1
        best = min(shared, key=lambda g: (-shared[g], -len(groups[g]), sorted(g)), default=None)
        if best is not None and 2 * shared[best] > max(len(switches), len(best)):
            groups[best] |= exact[switches]
            missing = tuple(sorted(best - switches))
            if missing:
                uncabled.update(dict.fromkeys(exact[switches], missing))
            continue
        groups[switches] = set(exact[switches])
        for leaf in switches:
            holding[leaf].append(switches)
    return groups, uncabled


def _level_domains(
    leaf_groups: Mapping[frozenset[str], set[str]],
    above: Callable[[str], frozenset[str]],
    levels: Mapping[str, int],
    level: int,
) -> list[Domain]:
    """Domains of one switch level: leaf groups reaching a common switch of the level share one."""
    parent: dict[str, str] = {}

    def find(s: str) -> str:
        while parent.setdefault(s, s) != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    reached: list[tuple[set[str], list[str]]] = []
    for switches, nodes in leaf_groups.items():
        at_level = sorted({s for leaf in switches for s in above(leaf) if levels.get(s) == level})
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
    kind = switch_kind(level)
    return [
        Domain(
            f"{kind}:" + "+".join(sorted(members[r])),
            kind,
            tuple(sorted(members[r])),
            frozenset(node_sets[r]),
        )
        for r in members
    ]


def _label_domains(graph: FabricGraph, first_level: int) -> list[Domain]:
    domains: list[Domain] = []
    depth = len(graph.label_levels)
    for index in range(depth):
        kind = switch_kind(first_level + depth - 1 - index)  # finest label is the lowest
        groups = _group((n, path[: index + 1]) for n, path in graph.label_paths.items() if len(path) > index)
        for path, nodes in groups.items():
            identity = tuple(f"{k}={v}" for k, v in path)
            domains.append(Domain(f"{kind}:label:" + "/".join(identity), kind, identity, frozenset(nodes)))
    return domains


# --- ranking and nesting -------------------------------------------------------------------------


def _nvlink_position(nvlink: list[Domain], base: list[str], by_kind: Mapping[str, list[Domain]]) -> int:
    """How many base kinds (from the bottom) every NVLink domain strictly contains: the NVLink
    tier goes right above them. The least over all domains, so no domain sits above a container."""
    owner: dict[str, dict[str, Domain]] = {}
    for kind in base:
        owner[kind] = {n: d for d in by_kind.get(kind, ()) for n in d.nodes}
    position = len(base)
    for domain in nvlink:
        count = 0
        for kind in base:
            touched = {owner[kind][n].key: owner[kind][n] for n in domain.nodes if n in owner[kind]}
            if any(not (d.nodes < domain.nodes) for d in touched.values()):
                break
            count += 1
        position = min(position, count)
    return position


def _ranked_kinds(candidates: list[Domain], switch_levels: int, label_levels: int) -> list[str]:
    base = [switch_kind(level) for level in range(switch_levels + label_levels)]
    nvlink = [d for d in candidates if d.kind == NVLINK]
    if not nvlink:
        return base
    by_kind: dict[str, list[Domain]] = defaultdict(list)
    for d in candidates:
        by_kind[d.kind].append(d)
    position = _nvlink_position(nvlink, base, by_kind)
    return [*base[:position], NVLINK, *base[position:]]


@dataclass
class _Nesting:
    top: dict[str, str]  # node -> key of the largest accepted domain holding it
    accepted: dict[str, Domain]
    parent: dict[str, str]
    children: dict[str, list[str]]
    direct: dict[str, list[str]]
    merged: dict[str, list[str]]
    dropped: list[tuple[str, str]]

    def offer(self, domain: Domain) -> None:
        inside: dict[str | None, int] = defaultdict(int)
        for node in domain.nodes:
            inside[self.top.get(node)] += 1
        for key, count in inside.items():
            if key is not None and count != len(self.accepted[key].nodes):
                self.dropped.append((domain.key, f"partly overlaps {key}; kept {key}"))
                return
        if len(inside) == 1 and None not in inside:
            (same,) = inside
            assert same is not None
            self.merged[same].append(domain.key)  # same node set: one HyperNode
            return
        self.accepted[domain.key] = domain
        self.children[domain.key] = sorted(k for k in inside if k is not None)
        self.direct[domain.key] = sorted(n for n in domain.nodes if n not in self.top)
        for child in self.children[domain.key]:
            self.parent[child] = domain.key
        for node in domain.nodes:
            self.top[node] = domain.key


def candidates(graph: FabricGraph) -> tuple[list[Domain], list[str], dict[str, tuple[str, ...]]]:
    """Every candidate domain, the cluster's ranked kinds (lowest first), and the nodes cabled to
    only part of their leaf domain's leaves."""
    switch_domains, switch_levels, uncabled = _switch_domains(graph)
    label_domains = _label_domains(graph, switch_levels)
    found = _nvlink_domains(graph) + switch_domains + label_domains
    return found, _ranked_kinds(found, switch_levels, len(graph.label_levels)), uncabled


def infer(graph: FabricGraph) -> DomainTree:
    found, kinds, uncabled = candidates(graph)
    rank = {kind: i for i, kind in enumerate(kinds)}
    nest = _Nesting({}, {}, {}, {}, {}, defaultdict(list), [])
    for domain in sorted(found, key=lambda d: (rank[d.kind], d.key)):
        nest.offer(domain)
    used = [k for k in kinds if any(d.kind == k for d in nest.accepted.values())]
    tier = {kind: i + 1 for i, kind in enumerate(used)}
    domains = {
        key: TreeDomain(
            domain=d,
            tier=tier[d.kind],
            parent=nest.parent.get(key),
            children=tuple(nest.children[key]),
            direct_nodes=tuple(nest.direct[key]),
            merged=tuple(nest.merged.get(key, ())),
        )
        for key, d in nest.accepted.items()
    }
    lowest = {n: key for key, td in domains.items() for n in td.direct_nodes}
    return DomainTree(domains, tuple(used), lowest, tuple(nest.dropped), uncabled)
