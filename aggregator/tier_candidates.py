"""Candidate domains of tier inference (aggregator.tiers), over node classes (aggregator.tier_classes).

* `nvlink`: nodes sharing a multi-node NVLink clique;
* `leaf`: nodes cabled to the same SET of switches (on a rail-optimised fabric every node of a
  scalable unit touches the same leaf in each rail, so the rail group is one domain); a node
  cabled to most of a bigger group's leaves (one rail cable down) belongs to that group, and its
  missing cables are listed as a fault of the node;
* `spine`, `core` (and `core2`, ... on deeper fabrics): switches one, two, ... levels above the
  leaves (aggregator.tier_levels); leaf domains whose uplinks reach a common switch of a level
  share that level's domain;
* label levels (sources.labels): above the highest switch level, finest label first.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, TypeVar

from aggregator.graph import FabricGraph
from aggregator.tier_classes import NodeClasses
from aggregator.tier_levels import promoted_switches, switch_kind

NVLINK = "nvlink"
K = TypeVar("K")


class Domain(NamedTuple):
    """A candidate domain: its nodes are class ids in inference, node names in the tree (a named
    tuple: thousands are made per inference)."""

    key: str  # unique: kind + identity
    kind: str
    identity: tuple[str, ...]  # switch IDs, the clique, or the label path
    nodes: frozenset[str]


@functools.lru_cache(maxsize=1 << 16)
def _switch_identity(kind: str, switches: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    """Key and identity of a domain named by its switches (the same sets recur every inference)."""
    identity = tuple(sorted(switches))
    return f"{kind}:" + "+".join(identity), identity


def _switch_domain(kind: str, switches: frozenset[str], classes: Iterable[str]) -> Domain:
    key, identity = _switch_identity(kind, switches)
    return Domain(key, kind, identity, frozenset(classes))


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
    promoted = promoted_switches(graph, hosts_on)
    # a node's leaf set leaves out spines it is also cabled to; a node only on spines has no leaf
    leaf_sets = {c: (sw - promoted) or sw for c, sw in attached.items() if sw} if promoted else attached
    leaf_groups, uncabled = _leaf_groups({c: sw for c, sw in leaf_sets.items() if sw}, classes.weight)
    domains = [_switch_domain("leaf", sw, ns) for sw, ns in leaf_groups.items() if not sw & promoted]
    leaves = {s for sw in leaf_groups for s in sw} - promoted
    levels = classes.levels(graph, frozenset(leaves))
    top = max(levels.height.values(), default=0)
    for level in range(1, top + 1):
        domains.extend(_level_domains(leaf_groups, levels.at_level, level))
    return domains, (top + 1 if leaves else 0), uncabled


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
    return [_switch_domain(kind, frozenset(members[r]), node_sets[r]) for r in members]


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


def candidates(
    graph: FabricGraph, classes: NodeClasses
) -> tuple[list[Domain], int, dict[str, tuple[str, ...]]]:
    """Every candidate domain (over class ids), the number of switch levels, and the classes
    cabled to only part of their leaf domain's leaves."""
    switch_domains, switch_levels, uncabled = _switch_domains(graph, classes)
    label_domains = _label_domains(graph, classes, switch_levels)
    return _nvlink_domains(classes) + switch_domains + label_domains, switch_levels, uncabled
