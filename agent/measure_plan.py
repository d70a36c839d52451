"""Which peers each node probes to measure the fabric, so that traffic grows with the node count,
not its square.

Why a plan at all: measuring every pair of 10,000 nodes is 10^8 probes a round, which is traffic a
fabric notices. What the aggregator needs is coarser: for every HyperNode, a few round trips
inside it and a few to each of its siblings (a leaf against the other leaves of its spine), so
that it can tell whether a leaf is faster than a spine and whether a node measures like the leaf
its cabling says. So each node probes

* `inside` peers: up to `k_inside` members of its own lowest domain, as a ring in hash order (each
  node probes the next ones), so every member of a leaf is probed exactly as often as it probes;
* `sibling` peers: at every tier, up to `k_sibling` nodes in sibling domains (the other children
  of its domain's parent), the siblings taken in a ring from a position that moves with the
  node's rank, so a domain's members together cover its siblings.

Bounded in-degree: a sibling domain `s` accepts at most `2 * k_sibling * |s|` probes at a tier,
dealt to its members in turn, so no member is probed more than `k_inside + 2 * k_sibling * tiers`
times a round however lopsided the tree (one one-node leaf beside a 500-node one). A probe whose
chosen sibling is full goes to the next sibling in the ring; a domain's siblings can always take
one more, because the other domains ask for at most half of their capacity, so every domain with
a sibling gets a between-sibling sample.

Deterministic: the orders come from a hash of the names and `seed`, never from Python's set order
or a random generator, so every agent computes the same plan from the same tree and a node's
peers do not change until the tree does (`tree_digest` tells an agent when to re-plan). Pure: the
tree is a parameter (the agent reads it from the HyperNodes), nothing here touches the network.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INSIDE = "inside"
SIBLING = "sibling"


@dataclass(frozen=True, slots=True)
class Domain:
    """One HyperNode: `tier` 1 is the lowest, `children` are HyperNode names at tier > 1 and node
    names at tier 1 (Volcano's member kinds)."""

    name: str
    tier: int
    children: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Probe:
    """One peer a node probes and why: `domain` is the prober's own domain at `tier`, `peer_domain`
    the peer's (the same for an inside probe)."""

    peer: str
    scope: str  # INSIDE | SIBLING
    tier: int
    domain: str
    peer_domain: str


class TreeError(ValueError):
    """A tree the plan cannot be made from (a cycle, a node in two leaves), in one line."""


@dataclass(frozen=True)
class Tree:
    """The domains with their member nodes resolved and each domain's parent."""

    domains: Mapping[str, Domain]
    nodes: Mapping[str, tuple[str, ...]]  # domain -> member nodes (sorted by hash)
    parent: Mapping[str, str]
    leaf_of: Mapping[str, str]  # node -> its lowest domain

    @property
    def tiers(self) -> int:
        return max((d.tier for d in self.domains.values()), default=0)


def _rank(seed: str, name: str) -> bytes:
    return hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest()


def _ordered(names: Iterable[str], seed: str) -> tuple[str, ...]:
    return tuple(sorted(names, key=lambda n: (_rank(seed, n), n)))


def build_tree(domains: Iterable[Domain], *, seed: str = "", order: bool = True) -> Tree:
    """Resolves member nodes bottom-up (a domain's nodes are its children's nodes), each domain's
    in hash order (`order`: the plan needs it; a fold, which only looks nodes up, does not)."""
    by_name = {d.name: d for d in domains}
    parent: dict[str, str] = {}
    leaf_of: dict[str, str] = {}
    for d in by_name.values():
        for child in d.children:
            if d.tier == 1:
                if child in leaf_of:
                    raise TreeError(f"node {child} is in two leaves: {leaf_of[child]} and {d.name}")
                leaf_of[child] = d.name
            elif child in by_name and by_name[child].tier < d.tier:
                parent.setdefault(child, d.name)
    nodes: dict[str, tuple[str, ...]] = {}
    for d in sorted(by_name.values(), key=lambda d: d.tier):
        if d.tier == 1:
            members: Iterable[str] = d.children
        else:
            members = [n for c in d.children if c in nodes and parent.get(c) == d.name for n in nodes[c]]
        nodes[d.name] = _ordered(set(members), seed) if order else tuple(set(members))
    return Tree(by_name, nodes, parent, leaf_of)


def domains_from_hypernodes(objects: Iterable[Mapping[str, Any]]) -> list[Domain]:
    """Volcano HyperNode objects -> domains: `spec.tier`, members by exact name (a regex or label
    selector member is not followed: the plan needs names). Shapes that are not a HyperNode's are
    skipped, not raised: the objects come from the API server, already schema-checked."""
    out = []
    for obj in objects:
        spec, meta = obj.get("spec") or {}, obj.get("metadata") or {}
        tier, name = spec.get("tier"), meta.get("name")
        if not isinstance(tier, int) or not isinstance(name, str):
            continue
        kind = "Node" if tier == 1 else "HyperNode"
        children = [
            (m.get("selector") or {}).get("exactMatch", {}).get("name")
            for m in spec.get("members") or []
            if isinstance(m, Mapping) and m.get("type") == kind
        ]
        out.append(Domain(name, tier, tuple(c for c in children if isinstance(c, str))))
    return out


def tree_digest(domains: Iterable[Domain]) -> str:
    """A short fingerprint of the tree: an agent re-plans when it changes, and only then."""
    h = hashlib.blake2b(digest_size=12)
    for d in sorted(domains, key=lambda d: d.name):
        h.update(f"{d.name}\0{d.tier}\0{chr(1).join(sorted(d.children))}\n".encode())
    return h.hexdigest()


def _inside(tree: Tree, k: int, out: dict[str, list[Probe]]) -> None:
    for leaf, members in tree.nodes.items():
        if tree.domains[leaf].tier != 1:
            continue
        m = len(members)
        for i, node in enumerate(members):
            for step in range(1, min(k, m - 1) + 1):
                out[node].append(Probe(members[(i + step) % m], INSIDE, 1, leaf, leaf))


@dataclass
class _Sibling:
    """One sibling domain's intake at one tier: `taken` probes dealt so far, `cap` the most."""

    name: str
    members: tuple[str, ...]
    cap: int
    taken: int = 0

    def take(self) -> str | None:
        if self.taken >= self.cap or not self.members:
            return None
        peer = self.members[self.taken % len(self.members)]
        self.taken += 1
        return peer


def _children_by_parent(tree: Tree) -> Mapping[str, list[str]]:
    kids: dict[str, list[str]] = defaultdict(list)
    for child, parent in tree.parent.items():
        if tree.nodes.get(child):
            kids[parent].append(child)
    return kids


def _siblings(tree: Tree, k: int, seed: str, out: dict[str, list[Probe]]) -> None:
    for _parent, kids in sorted(_children_by_parent(tree).items()):
        ring = _ordered(kids, seed)
        if len(ring) < 2:
            continue
        intake = [_Sibling(c, tree.nodes[c], 2 * k * len(tree.nodes[c])) for c in ring]
        for a, child in enumerate(ring):
            tier = tree.domains[child].tier
            for i, node in enumerate(tree.nodes[child]):
                for r in range(min(k, len(ring) - 1)):
                    _one_sibling(intake, a, i * k + r, node, child, tier, out)


def _one_sibling(
    intake: Sequence[_Sibling],
    a: int,
    turn: int,
    node: str,
    child: str,
    tier: int,
    out: dict[str, list[Probe]],
) -> None:
    """The `turn`-th sibling probe of `node` (in domain `intake[a]`): the sibling at that turn in
    the ring, or the next one with room."""
    q = len(intake)
    start = turn % (q - 1)
    taken = {p.peer_domain for p in out[node] if p.tier == tier and p.scope == SIBLING}
    for step in range(q - 1):
        s = intake[(a + 1 + (start + step) % (q - 1)) % q]
        if s.name in taken:
            continue
        peer = s.take()
        if peer is not None:
            out[node].append(Probe(peer, SIBLING, tier, child, s.name))
            return


def plan(
    domains: Iterable[Domain], *, k_inside: int = 3, k_sibling: int = 2, seed: str = ""
) -> Mapping[str, tuple[Probe, ...]]:
    """Every node's probes (node -> its peers), computed from the whole tree so that every agent
    agrees on it: an agent keeps its own row. O(nodes * (k_inside + tiers * k_sibling))."""
    tree = build_tree(domains, seed=seed)
    out: dict[str, list[Probe]] = defaultdict(list)
    _inside(tree, k_inside, out)
    _siblings(tree, k_sibling, seed, out)
    return {node: tuple(probes) for node, probes in out.items()}


def in_degree(plans: Mapping[str, Sequence[Probe]]) -> Mapping[str, int]:
    """How many probers each node answers a round (what the bound above is about)."""
    count: dict[str, int] = defaultdict(int)
    for probes in plans.values():
        for p in probes:
            count[p.peer] += 1
    return count


def max_in_degree(k_inside: int, k_sibling: int, tiers: int) -> int:
    """The bound on `in_degree` the plan keeps (module docstring)."""
    return k_inside + 2 * k_sibling * max(tiers - 1, 0)
