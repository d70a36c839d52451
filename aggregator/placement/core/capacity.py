"""Aggregate capacity per domain: how many of the gang's pods each node, leaf and HyperNode could hold.

This is what lets the core avoid a dry-run allocation in every HyperNode (Volcano's cost): one
pass over the nodes counts the pods of the gang's shape each node fits, one pass over the leaves
adds those counts up the ancestor chains. A domain whose count is below the gang size cannot
host it; for a single-shape gang the count is exact, so the first allocation tried succeeds.
Mixed-shape gangs use an upper bound (the most of the gang's pods a node holds alone, smallest
first), so pruning stays safe and the allocation itself confirms.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from aggregator.placement.core.gang import ROOT, Gang
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology

LOOSE = "node/"  # prefix of the pseudo-leaf of a node that belongs to no HyperNode


def leaf_key(topology: Topology, node: str) -> str:
    return topology.node_leaf.get(node) or LOOSE + node


@dataclass
class Capacity:
    """Per-decision counts (mutable while built, then only read)."""

    node_cap: dict[str, int]  # usable node -> pods of the gang's shape it fits (> 0 only)
    leaf_cap: dict[str, int]  # leaf (or pseudo-leaf) -> sum over its usable nodes
    domain_cap: dict[str, int]  # HyperNode (and ROOT) -> sum over its leaves
    leaf_nodes: dict[str, list[str]]  # leaf -> its nodes with capacity, sorted by name
    blocked: frozenset[str]  # HyperNodes that cannot host (not Ready, excluded, or below such)


def _mixed_count(free: Resources, requests: Sequence[Resources]) -> int:
    """Most pods of the (ascending) requests one node can hold alone: an upper bound per node."""
    count = 0
    left = free
    for request in requests:
        if not left.covers(request):
            break
        left = left - request
        count += 1
    return count


def count_fits(have: Resources, want: Resources) -> int:
    """Pods asking `want` that `have` holds: the counting core's count of a node (once per node
    per decision, the hot loop), which `FreeIndex.request_shape` keeps as well."""
    fits = have.gpus // want.gpus if want.gpus > 0 else 1 << 62
    if fits > 0 and want.cpu_milli > 0:
        fits = min(fits, have.cpu_milli // want.cpu_milli)
    if fits > 0 and want.memory > 0:
        fits = min(fits, have.memory // want.memory)
    if fits > 0 and want.pods > 0:
        fits = min(fits, have.pods // want.pods)
    return max(fits, 0)


def usable_nodes(topology: Topology, free: Mapping[str, Resources], *,
                 excluded_nodes: frozenset[str] = frozenset(),
                 excluded_domains: frozenset[str] = frozenset()) -> list[str]:
    """The nodes a placement may use, sorted: not excluded, and not under an unusable or excluded
    HyperNode (the one rule every policy shares)."""
    blocked = blocked_domains(topology, excluded_domains)
    return sorted(n for n in free if n not in excluded_nodes and topology.node_leaf.get(n) not in blocked)


def blocked_domains(topology: Topology, excluded_domains: frozenset[str]) -> frozenset[str]:
    if not excluded_domains:
        return frozenset(d for d, ok in topology.usable.items() if not ok)
    return frozenset(d for d, chain in topology.chains.items()
                     if not topology.usable[d] or any(up in excluded_domains for up in chain))


def _node_caps(free: Mapping[str, Resources], shape: Resources | None, requests: Sequence[Resources],
               skip: Callable[[str], bool] | None) -> dict[str, int]:
    """Usable node -> pods of the gang it fits (> 0 only): the loop every counting decision runs
    over all nodes. A CPU-only shape (no GPU index serves it) counts with `count_fits` inlined: the
    same arithmetic, so the same counts, without a call per node."""
    node_cap: dict[str, int] = {}
    if shape is not None and shape.gpus == 0 and shape.cpu_milli > 0 and shape.memory > 0 and shape.pods > 0:
        cpu, memory, pods = shape.cpu_milli, shape.memory, shape.pods
        for node, have in free.items():
            if skip is not None and skip(node):
                continue
            fits = min(have.cpu_milli // cpu, have.memory // memory, have.pods // pods)
            if fits > 0:
                node_cap[node] = fits
        return node_cap
    for node, have in free.items():
        if skip is not None and skip(node):
            continue
        fits = count_fits(have, shape) if shape is not None else _mixed_count(have, requests)
        if fits > 0:
            node_cap[node] = fits
    return node_cap


def measure(topology: Topology, free: Mapping[str, Resources], gang: Gang, *,
            excluded_nodes: frozenset[str] = frozenset(),
            excluded_domains: frozenset[str] = frozenset()) -> Capacity:
    """Count, bottom-up, the gang's pods every node/leaf/domain can hold."""
    blocked = blocked_domains(topology, excluded_domains)
    requests = sorted(p.request for p in gang.pods)
    shape = requests[0] if gang.homogeneous and requests else None
    node_leaf = topology.node_leaf
    skip = (lambda node: node in excluded_nodes or node_leaf.get(node) in blocked) if excluded_nodes or blocked else None
    node_cap = _node_caps(free, shape, requests, skip)
    leaf_cap: dict[str, int] = {}
    leaf_nodes: dict[str, list[str]] = {}
    for node in sorted(node_cap):
        key = node_leaf.get(node) or LOOSE + node
        leaf_cap[key] = leaf_cap.get(key, 0) + node_cap[node]
        leaf_nodes.setdefault(key, []).append(node)
    domain_cap: dict[str, int] = {ROOT: 0}
    chains = topology.chains
    for key, cap in leaf_cap.items():
        domain_cap[ROOT] += cap
        for up in chains.get(key, ()):
            domain_cap[up] = domain_cap.get(up, 0) + cap
    return Capacity(node_cap, leaf_cap, domain_cap, leaf_nodes, blocked)


def leaves_in(topology: Topology, capacity: Capacity, domain: str) -> list[str]:
    """Leaves below `domain` (every leaf and pseudo-leaf for ROOT) that can hold a pod."""
    if domain == ROOT:
        return sorted(capacity.leaf_cap)
    return [leaf for leaf in topology.leaves_below[domain] if leaf in capacity.leaf_cap]


def cover(items: Iterable[tuple[str, int, bool]], need: int) -> list[tuple[str, int]]:
    """Pick (key, share) from (key, capacity, preferred) items to hold `need`: repeatedly the smallest
    item that covers what is left, else the largest; ties go to preferred items, then names.
    This uses the fewest items (the largest-first count) and fits the last one best."""
    order = sorted(items, key=lambda it: (it[1], not it[2], it[0]))
    caps = [cap for _, cap, _ in order]
    chosen: list[tuple[str, int]] = []
    while need > 0 and order:
        i = bisect_left(caps, need)
        if i == len(caps):
            i = bisect_left(caps, caps[-1])
        share = min(need, caps[i])
        chosen.append((order[i][0], share))
        need -= share
        del order[i], caps[i]
    return chosen
