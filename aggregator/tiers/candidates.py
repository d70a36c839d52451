"""Candidate domains of tier inference (aggregator.tiers.infer), over node classes (aggregator.tiers.classes).

* `nvlink`: nodes sharing a multi-node NVLink clique;
* `leaf`: nodes cabled to the same SET of switches (on a rail-optimised fabric every node of a
  scalable unit touches the same leaf in each rail, so the rail group is one domain); a node
  cabled to most of a bigger group's leaves (one rail cable down) belongs to that group, and its
  missing cables are listed as a fault of the node;
* `spine`, `core` (and `core2`, ... on deeper fabrics): switches one, two, ... levels above the
  leaves (aggregator.tiers.levels); leaf domains whose uplinks reach a common switch of a level
  share that level's domain;
* label levels (sources.labels): above the highest switch level, finest label first.

The domains are built, and kept per part between inferences, by aggregator.tiers.parts.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import NamedTuple, TypeVar

from aggregator.graph import FabricGraph
from aggregator.tiers.classes import NodeClasses
from aggregator.tiers.levels import switch_kind

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


def switch_domain(kind: str, switches: frozenset[str], classes: Iterable[str]) -> Domain:
    key, identity = _switch_identity(kind, switches)
    return Domain(key, kind, identity, frozenset(classes))


def _group(pairs: Iterable[tuple[str, K | None]]) -> dict[K, set[str]]:
    """Nodes grouped by a value; nodes whose value is empty belong to no group."""
    groups: dict[K, set[str]] = defaultdict(set)
    for node, value in pairs:
        if value:
            groups[value].add(node)
    return groups


def settle_leaf_sets(
    sets: Iterable[frozenset[str]], size: Mapping[frozenset[str], int]
) -> tuple[dict[frozenset[str], frozenset[str]], dict[frozenset[str], tuple[str, ...]]]:
    """Leaf groups: each exact leaf set (the leaves some classes are cabled to exactly, weighing
    `size` nodes) -> the group it belongs to, and the leaves of that group it lacks.

    A set is a group of its own (every node of a rail-optimised scalable unit touches the same leaf
    in each rail) unless it shares most of a bigger group's leaves, with most of its own leaves
    among them (more than half each way): one rail cable down, or one cable in the wrong unit, is a
    fault of the node, not a domain of its own, and must not shrink the unit. Sets are settled
    biggest first (most nodes, then most leaves, then by name), so the answer does not depend on
    input order. A node dual-homed to two leaves shares only half its leaves with either leaf's
    nodes, and they half of theirs with it, so it stays a group of its own, as does a node with
    half its rails down. A set's fate reads only the groups sharing a leaf with it, so sets that
    share no leaf, directly or through others, can be settled apart (aggregator.tiers.parts)."""
    grown: dict[frozenset[str], int] = {}  # group -> nodes so far
    holding: dict[str, list[frozenset[str]]] = defaultdict(list)  # leaf -> groups with it
    group_of: dict[frozenset[str], frozenset[str]] = {}
    missing: dict[frozenset[str], tuple[str, ...]] = {}
    for switches in sorted(sets, key=lambda sw: (-size[sw], -len(sw), _switch_identity("leaf", sw)[1])):
        shared: dict[frozenset[str], int] = defaultdict(int)
        for leaf in switches:
            for group in holding[leaf]:
                shared[group] += 1
        best = min(shared, key=lambda g: (-shared[g], -grown[g], sorted(g)), default=None)
        if best is not None and 2 * shared[best] > max(len(switches), len(best)):
            group_of[switches] = best
            grown[best] += size[switches]
            missing[switches] = tuple(sorted(best - switches))
            continue
        group_of[switches] = switches
        grown[switches] = size[switches]
        missing[switches] = ()
        for leaf in switches:
            holding[leaf].append(switches)
    return group_of, missing


def label_domains(graph: FabricGraph, classes: NodeClasses, first_level: int) -> list[Domain]:
    """Label levels' domains (sources.labels): above the highest switch level, finest label first."""
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
