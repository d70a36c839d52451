"""Tier inference: `infer(graph) -> DomainTree`, the nested performance domains of a fabric.

The parts: node classes (aggregator.tiers.classes), switch levels (aggregator.tiers.levels),
candidate domains (aggregator.tiers.candidates); ranking, nesting and the tree are here.

Candidate domains come from the graph:

* `nvlink`: nodes sharing a multi-node NVLink clique;
* `leaf`: nodes cabled to the same SET of switches (on a rail-optimised fabric every node of a
  scalable unit touches the same leaf in each rail, so the rail group is one domain); a node
  cabled to most of a bigger group's leaves (one rail cable down) belongs to that group, and its
  missing cables are listed (`DomainTree.uncabled`) as a fault of the node;
* `spine`, `core` (and `core2`, ... on deeper fabrics): switches one, two, ... levels above the
  leaves; leaf domains whose uplinks reach a common switch of a level share that level's domain;
* label levels (sources.labels): above the highest switch level, finest label first.

Switch levels are peeled from the leaves upward by what most of a switch's neighbours are
(aggregator.tiers.levels): the leaves are every switch any host the fabric sources know is cabled
to, Nodes or not, so which hosts are Nodes never moves a level; a switch next to the leaves is a
spine unless a spine it is cabled to has more leaves below it (a core with a rack of its own);
a hostless switch hanging from one other switch is a leaf that ranks nothing. Declared links (a
model) keep their direction; links between peers (MLAG pairs, parallel spines) are lateral.

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
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass, field
from operator import attrgetter

from aggregator.graph import FabricGraph
from aggregator.layered import Layered
from aggregator.tiers.candidates import NVLINK, Domain
from aggregator.tiers.classes import NodeClasses, Signature, signature_of
from aggregator.tiers.levels import switch_kind
from aggregator.tiers.nesting import Nesting, nest, renest
from aggregator.tiers.parts import CandidateParts

__all__ = [
    "NVLINK",
    "Domain",
    "DomainTree",
    "NodeClasses",
    "Signature",
    "TreeDomain",
    "infer",
    "signature_of",
    "switch_kind",
]


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
    # how the domains nested, so the next inference re-nests only what a change reaches
    nesting: Nesting | None = field(default=None, compare=False, repr=False)
    # keys whose TreeDomain is a new object since `previous` (None: built from scratch); every other
    # domain is the previous tree's very object
    rebuilt: frozenset[str] | None = field(default=None, compare=False, repr=False)
    # the candidates kept per part, and this tree's claim on them (aggregator.tiers.parts)
    parts: tuple[CandidateParts, object] | None = field(default=None, compare=False, repr=False)

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


# --- ranking and nesting -------------------------------------------------------------------------


def _nvlink_position(nvlink: list[Domain], base: list[str], by_kind: Mapping[str, list[Domain]]) -> int:
    """How many base kinds (from the bottom) every NVLink domain strictly contains: the NVLink
    tier goes right above them. The least over all domains, so no domain sits above a container:
    the first kind that some NVLink domain does not strictly contain (the kinds above it are not
    looked at; a rack inside a leaf stops at the leaves)."""
    for position, kind in enumerate(base):
        owner = {n: d for d in by_kind.get(kind, ()) for n in d.nodes}
        for domain in nvlink:
            touched = {owner[n] for n in domain.nodes if n in owner}
            if any(not (d.nodes < domain.nodes) for d in touched):
                return position
    return len(base)


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


_key = attrgetter("key")


_Nesting = Nesting  # the name the nesting tests know it by


def infer(
    graph: FabricGraph,
    classes: NodeClasses | None = None,
    *,
    previous: DomainTree | None = None,
    dirty: Set[str] = frozenset(),
    moved: Set[str] | None = None,
) -> DomainTree:
    """The domain tree of the graph. With the graph's `classes` kept up to date, `previous` (the
    last tree) and `dirty` (the class ids whose members changed since), a domain made of the same
    classes, none of them dirty, keeps its node set from `previous` instead of rebuilding it.
    With `moved` (every node whose class changed since `previous`), a domain whose classes did
    change gets its node set by patching the previous one (a core's 100,000 nodes are not
    gathered again from thousands of classes)."""
    classes = classes if classes is not None else NodeClasses.of(graph)
    parts = CandidateParts.take(previous.parts if previous is not None else None, graph, classes)
    if parts is None or not parts.update(dirty):
        parts = CandidateParts(graph, classes)
    claim = parts.owner = object()
    found = parts.found()
    kinds = tuple(_ranked_kinds(found, parts.switch_levels, len(graph.label_levels)))
    by_kind: dict[str, list[Domain]] = defaultdict(list)
    for domain in found:
        by_kind[domain.kind].append(domain)
    order = [domain for kind in kinds for domain in sorted(by_kind[kind], key=_key)]  # lowest rank first
    before = previous.nesting if previous is not None else None
    nesting = renest(order, before) if before is not None and before.kinds == kinds else nest(order)
    nesting.kinds = kinds
    present = {d.kind for d in nesting.accepted.values()}
    used = [k for k in kinds if k in present]
    tier = {kind: i + 1 for i, kind in enumerate(used)}
    expand = _Expansion(classes, previous, dirty, moved)
    patch = previous is not None and nesting.touched is not None and previous.tiers == tuple(used)
    keys = expand.start_from_previous(nesting) if patch else nesting.accepted.keys()
    domains = expand.domains
    for key in keys:
        d = nesting.accepted[key]
        direct_classes = nesting.direct[key]
        same = expand.unchanged(key, d.nodes, direct_classes)
        place = (
            tier[d.kind],
            nesting.parent.get(key),
            tuple(nesting.children[key]),
            tuple(nesting.merged.get(key, ())),
        )
        if same is not None and (same.tier, same.parent, same.children, same.merged) == place:
            domains[key] = same  # the very object: comparing trees stays cheap
            continue
        nodes, direct = (
            (same.domain.nodes, same.direct_nodes) if same else expand.nodes(key, d.nodes, direct_classes)
        )
        expand.rebuilt.add(key)
        domains[key] = TreeDomain(
            domain=Domain(d.key, d.kind, d.identity, nodes),
            tier=place[0],
            parent=place[1],
            children=place[2],
            direct_nodes=direct,
            merged=place[3],
        )
    if patch:
        domains = {key: domains[key] for key in nesting.accepted}  # nesting order, as from scratch
    lowest = _Lowest(nesting.owner, _class_of_node(classes, previous, moved))
    rebuilt = frozenset(expand.rebuilt) if previous is not None else None
    return DomainTree(
        domains,
        tuple(used),
        lowest,
        tuple(nesting.dropped),
        parts.node_uncabled(),
        expand.made,
        nesting,
        rebuilt,
        (parts, claim),
    )


@dataclass
class _Expansion:
    """Class ids -> node sets, reusing the previous tree's where the classes did not change."""

    classes: NodeClasses
    previous: DomainTree | None
    dirty: Set[str]
    moved: Set[str] | None = None  # every node whose class changed since `previous` (None: unknown)
    made: dict[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    rebuilt: set[str] = field(default_factory=set)
    domains: dict[str, TreeDomain] = field(default_factory=dict)

    def start_from_previous(self, nesting: Nesting) -> set[str]:
        """Starts from the previous tree's domains and returns the keys to look at again: those
        re-nesting touched, and every domain holding a class whose members changed (up the
        classes' chains). Any other domain kept its classes, children, direct classes, parent,
        merges and tier, and its classes their members: it is the previous tree's very object."""
        assert self.previous is not None
        self.domains = dict(self.previous.domains)
        self.made = dict(self.previous.class_sets)
        for gone in self.domains.keys() - nesting.accepted.keys():
            del self.domains[gone]
            self.made.pop(gone, None)
        chains: set[str] = set()
        for c in self.dirty:
            key = nesting.owner.get(c)
            while key is not None and key not in chains:
                chains.add(key)
                key = nesting.parent.get(key)
        return (chains | (nesting.touched or set())) & nesting.accepted.keys()

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

    def nodes(
        self, key: str, cids: frozenset[str], direct: frozenset[str]
    ) -> tuple[frozenset[str], tuple[str, ...]]:
        members = self.classes.members
        patched = self._patched(key, cids)
        nodes = patched if patched is not None else frozenset().union(*(members[c] for c in cids))
        return nodes, tuple(sorted(n for c in direct for n in members[c]))

    def _patched(self, key: str, cids: frozenset[str]) -> frozenset[str] | None:
        """The previous node set of `key`, less the moved nodes and the members of classes it
        lost, plus the members of classes it gained and the moved nodes now in its classes (a
        class that kept its place changed members only by moved nodes); None: no previous set."""
        if self.moved is None or self.previous is None:
            return None
        before, sets = self.previous.domains.get(key), self.previous.class_sets.get(key)
        if before is None or sets is None:
            return None
        members, of_node = self.classes.members, self.classes.of_node
        gone, came = sets[0] - cids, cids - sets[0]
        gained = {m for m in self.moved if of_node.get(m) in cids}.union(*(members[c] for c in came))
        lost = set(self.moved).union(*(members[c] for c in gone if c in members)) - gained
        old = before.domain.nodes
        if lost.isdisjoint(old) and gained <= old:
            return old  # the same nodes (a move inside the domain): the very object, not a copy
        return old.difference(lost).union(gained)


def _class_of_node(
    classes: NodeClasses, previous: DomainTree | None, moved: Set[str] | None
) -> Layered[str, str]:
    """node -> class id as it is now, for the tree to keep (the classes change on): the previous
    tree's map with the moved nodes changed when they are known, else a copy."""
    if moved is not None and previous is not None and isinstance(previous.lowest, _Lowest):
        of_node = classes.of_node
        return previous.lowest.of_node.changed(
            {n: of_node[n] for n in moved if n in of_node}, {n for n in moved if n not in of_node}
        )
    return Layered(dict(classes.of_node))


class _Lowest(Mapping[str, str]):
    """node -> key of the smallest domain holding it, through the node's class."""

    def __init__(self, by_class: dict[str, str], of_node: Layered[str, str]) -> None:
        self._by_class = by_class
        self._of_node = of_node

    @property
    def of_node(self) -> Layered[str, str]:
        return self._of_node

    def __getitem__(self, node: str) -> str:
        return self._by_class[self._of_node[node]]

    def __iter__(self) -> Iterator[str]:
        return (n for n, c in self._of_node.items() if c in self._by_class)

    def __len__(self) -> int:
        return sum(1 for _ in self)
