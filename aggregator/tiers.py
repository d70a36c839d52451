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

Inference never looks at nodes one by one: nodes alike in everything it reads (the switches they
are cabled to, their NVLink clique, their label path) form a class (`NodeClasses`), and the
candidates, levels and nesting are worked out over classes, each weighing its number of nodes.
A GB200 rack is one class of 18 nodes, so 100,000 nodes are ~5,600 classes. The classes are kept
up to date node by node (`NodeClasses.move`), so a node whose cabling or NVLink clique changes
moves between two classes, inference runs again over the classes, and only the domains whose
classes changed get new node sets (`infer(..., previous=, dirty=)`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aggregator.graph import FabricGraph

NVLINK = "nvlink"
K = TypeVar("K")

# what inference reads of a node: attached switches, NVLink clique, label path
Signature = tuple[frozenset[str], str | None, tuple[tuple[str, str], ...]]


def signature_of(graph: FabricGraph, node: str) -> Signature:
    return (graph.attached_switches(node), graph.nvlink_of(node), graph.label_paths.get(node, ()))


@dataclass
class NodeClasses:
    """The graph's nodes grouped by signature; a class id stands for all its nodes in inference.

    Ids are "c<number>", given when a signature first appears and kept while it has nodes, so an
    unchanged class keeps its id across updates (how `infer` knows what it may reuse)."""

    members: dict[str, set[str]] = field(default_factory=dict)  # class id -> nodes
    signature: dict[str, Signature] = field(default_factory=dict)  # class id -> signature
    of_signature: dict[Signature, str] = field(default_factory=dict)
    of_node: dict[str, str] = field(default_factory=dict)  # node -> class id
    _next: int = 0
    _levels: tuple[Any, _Levels] | None = None

    @classmethod
    def of(cls, graph: FabricGraph) -> NodeClasses:
        classes = cls()
        for node in sorted(graph.nodes):
            classes.move(node, signature_of(graph, node))
        return classes

    def move(self, node: str, signature: Signature | None) -> set[str]:
        """Puts the node in the class of `signature` (None: removes it); returns the class ids
        whose membership changed (empty when the node stays where it was)."""
        old = self.of_node.get(node)
        if old is not None and signature is not None and self.signature[old] == signature:
            return set()
        dirty = set()
        if old is not None:
            dirty.add(old)
            del self.of_node[node]
            members = self.members[old]
            members.discard(node)
            if not members:
                del self.members[old]
                del self.of_signature[self.signature.pop(old)]
        if signature is not None:
            cid = self.of_signature.get(signature)
            if cid is None:
                cid = f"c{self._next}"
                self._next += 1
                self.of_signature[signature] = cid
                self.signature[cid] = signature
                self.members[cid] = set()
            self.members[cid].add(node)
            self.of_node[node] = cid
            dirty.add(cid)
        return dirty

    def weight(self, cid: str) -> int:
        return len(self.members[cid])

    def levels(self, graph: FabricGraph, leaves: frozenset[str]) -> _Levels:
        """The switch levels for these leaves, kept between inferences while the graph's switch
        links and the leaves stay the same (a node moving between classes rarely changes either)."""
        key = (id(graph), len(graph.switch_links), len(graph.uplinks), leaves)
        if self._levels is None or self._levels[0] != key:
            self._levels = (key, _Levels(*_switch_levels(graph, set(leaves))))
        return self._levels[1]

    def switches(self, cid: str) -> frozenset[str]:
        return self.signature[cid][0]


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
    # what the domains were made of, so the next inference can reuse unchanged node sets
    class_sets: Mapping[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)

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


def _nvlink_domains(classes: NodeClasses) -> list[Domain]:
    groups = _group((c, sig[1]) for c, sig in classes.signature.items())
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


def _switch_domains(
    graph: FabricGraph, classes: NodeClasses
) -> tuple[list[Domain], int, dict[str, tuple[str, ...]]]:
    """Leaf domains and the domains of every level above them; also the number of levels and the
    classes cabled to only part of their leaf domain's leaves (see `_leaf_groups`)."""
    attached = {c: sig[0] for c, sig in classes.signature.items()}
    hosts_on: dict[str, int] = defaultdict(int)
    for cid, switches in attached.items():
        weight = classes.weight(cid)
        for switch in switches:
            hosts_on[switch] += weight
    promoted = _promoted(graph, hosts_on)
    # a node's leaf set leaves out spines it is also cabled to; a node only on spines has no leaf
    leaf_groups, uncabled = _leaf_groups(
        {c: (sw - promoted) or sw for c, sw in attached.items() if sw}, classes.weight
    )
    domains = [
        Domain("leaf:" + "+".join(sorted(sw)), "leaf", tuple(sorted(sw)), frozenset(ns))
        for sw, ns in leaf_groups.items()
        if not sw & promoted
    ]
    leaves = {s for sw in leaf_groups for s in sw} - promoted
    levels = classes.levels(graph, frozenset(leaves))
    top = max(levels.height.values(), default=0)
    for level in range(1, top + 1):
        domains.extend(_level_domains(leaf_groups, levels.at_level, level))
    return domains, (top + 1 if leaves else 0), uncabled


@dataclass
class _Levels:
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


def _leaf_groups(
    leaf_sets: Mapping[str, frozenset[str]], weight: Callable[[str], int] = lambda _c: 1
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
    size = {sw: sum(weight(c) for c in members) for sw, members in exact.items()}  # nodes, not classes
    groups: dict[frozenset[str], set[str]] = {}
    holding: dict[str, list[frozenset[str]]] = defaultdict(list)  # leaf -> groups with it
    uncabled: dict[str, tuple[str, ...]] = {}
    for switches in sorted(exact, key=lambda sw: (-size[sw], -len(sw), sorted(sw))):
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
    leaf_groups: Mapping[frozenset[str], set[str]],
    at_level_of: Callable[[frozenset[str], int], list[str]],
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
        at_level = at_level_of(switches, level)
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


def _label_domains(graph: FabricGraph, classes: NodeClasses, first_level: int) -> list[Domain]:
    domains: list[Domain] = []
    depth = len(graph.label_levels)
    paths = {c: sig[2] for c, sig in classes.signature.items() if sig[2]}
    for index in range(depth):
        kind = switch_kind(first_level + depth - 1 - index)  # finest label is the lowest
        groups = _group((c, path[: index + 1]) for c, path in paths.items() if len(path) > index)
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
    """Domains (over classes) accepted smallest rank first; counts are of nodes (class weights)."""

    weight: Callable[[str], int]
    top: dict[str, str] = field(
        default_factory=dict
    )  # class -> key of the largest accepted domain holding it
    accepted: dict[str, Domain] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)  # accepted key -> its number of nodes
    parent: dict[str, str] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    direct: dict[str, list[str]] = field(default_factory=dict)
    merged: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    dropped: list[tuple[str, str]] = field(default_factory=list)

    def offer(self, domain: Domain) -> None:
        inside: dict[str | None, int] = defaultdict(int)
        for node in domain.nodes:
            inside[self.top.get(node)] += self.weight(node)
        overlapped = sorted(k for k, count in inside.items() if k is not None and count != self.size[k])
        if overlapped:  # the first by name, so the reason does not depend on set order
            key = overlapped[0]
            self.dropped.append((domain.key, f"partly overlaps {key}; kept {key}"))
            return
        if len(inside) == 1 and None not in inside:
            (same,) = inside
            assert same is not None
            self.merged[same].append(domain.key)  # same node set: one HyperNode
            return
        self.accepted[domain.key] = domain
        self.size[domain.key] = sum(inside.values())
        self.children[domain.key] = sorted(k for k in inside if k is not None)
        self.direct[domain.key] = sorted(n for n in domain.nodes if n not in self.top)
        for child in self.children[domain.key]:
            self.parent[child] = domain.key
        for node in domain.nodes:
            self.top[node] = domain.key


def candidates(
    graph: FabricGraph, classes: NodeClasses | None = None
) -> tuple[list[Domain], list[str], dict[str, tuple[str, ...]]]:
    """Every candidate domain (over class ids), the cluster's ranked kinds (lowest first), and the
    classes cabled to only part of their leaf domain's leaves."""
    classes = classes if classes is not None else NodeClasses.of(graph)
    switch_domains, switch_levels, uncabled = _switch_domains(graph, classes)
    label_domains = _label_domains(graph, classes, switch_levels)
    found = _nvlink_domains(classes) + switch_domains + label_domains
    return found, _ranked_kinds(found, switch_levels, len(graph.label_levels)), uncabled


def infer(
    graph: FabricGraph,
    classes: NodeClasses | None = None,
    *,
    previous: DomainTree | None = None,
    dirty: Set[str] = frozenset(),
) -> DomainTree:
    """The domain tree of the graph. With the graph's `classes` kept up to date, `previous` (the
    last tree) and `dirty` (the class ids whose members changed since), a domain made of the same
    classes, none of them dirty, keeps its node set from `previous` instead of rebuilding it."""
    classes = classes if classes is not None else NodeClasses.of(graph)
    found, kinds, uncabled = candidates(graph, classes)
    rank = {kind: i for i, kind in enumerate(kinds)}
    nest = _Nesting(classes.weight)
    for domain in sorted(found, key=lambda d: (rank[d.kind], d.key)):
        nest.offer(domain)
    used = [k for k in kinds if any(d.kind == k for d in nest.accepted.values())]
    tier = {kind: i + 1 for i, kind in enumerate(used)}
    expand = _Expansion(classes, previous, dirty)
    domains = {}
    for key, d in nest.accepted.items():
        direct_classes = frozenset(nest.direct[key])
        same = expand.unchanged(key, d.nodes, direct_classes)
        place = (
            tier[d.kind],
            nest.parent.get(key),
            tuple(nest.children[key]),
            tuple(nest.merged.get(key, ())),
        )
        if same is not None and (same.tier, same.parent, same.children, same.merged) == place:
            domains[key] = same  # the very object: comparing trees stays cheap
            continue
        nodes, direct = (
            (same.domain.nodes, same.direct_nodes) if same else expand.nodes(d.nodes, direct_classes)
        )
        domains[key] = TreeDomain(
            domain=Domain(d.key, d.kind, d.identity, nodes),
            tier=place[0],
            parent=place[1],
            children=place[2],
            direct_nodes=direct,
            merged=place[3],
        )
    lowest = _Lowest({c: key for key, cids in nest.direct.items() for c in cids}, dict(classes.of_node))
    node_uncabled = {n: missing for c, missing in uncabled.items() for n in classes.members[c]}
    return DomainTree(domains, tuple(used), lowest, tuple(nest.dropped), node_uncabled, expand.made)


@dataclass
class _Expansion:
    """Class ids -> node sets, reusing the previous tree's where the classes did not change."""

    classes: NodeClasses
    previous: DomainTree | None
    dirty: Set[str]
    made: dict[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)

    def unchanged(self, key: str, cids: frozenset[str], direct: frozenset[str]) -> TreeDomain | None:
        """The previous tree's domain of this key when it was made of the same classes, none of
        which changed members since (its node sets hold as they are); else None."""
        self.made[key] = (cids, direct)
        if self.previous is None or cids & self.dirty:
            return None
        before = self.previous.domains.get(key)
        if before is None or self.previous.class_sets.get(key) != (cids, direct):
            return None
        return before

    def nodes(self, cids: frozenset[str], direct: frozenset[str]) -> tuple[frozenset[str], tuple[str, ...]]:
        members = self.classes.members
        nodes = frozenset().union(*(members[c] for c in cids))
        return nodes, tuple(sorted(n for c in direct for n in members[c]))


class _Lowest(Mapping[str, str]):
    """node -> key of the smallest domain holding it, through the node's class."""

    def __init__(self, by_class: dict[str, str], of_node: dict[str, str]) -> None:
        self._by_class = by_class
        self._of_node = of_node

    def __getitem__(self, node: str) -> str:
        return self._by_class[self._of_node[node]]

    def __iter__(self) -> Iterator[str]:
        return (n for n, c in self._of_node.items() if c in self._by_class)

    def __len__(self) -> int:
        return sum(1 for _ in self)
