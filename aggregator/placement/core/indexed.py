"""The core's decision read from a `FreeIndex`: the same objective and the same answer as the
counting path in `core`, in time proportional to the domains and leaves the gang can use.

Why a second reading and not a second algorithm: every step below is the counting path's step
computed from aggregates instead of from a fresh count. `core.ranked` sorts a tier's domains by
(cannot hold all, leaves needed, spare, name); here the tier's domains come sorted by (count,
name) from the index, so the first domain that holds the whole gang with the fewest leaves
possible ends the walk. `core._leaves_needed` sorts leaf counts; here the domain's histogram of
leaf counts gives the same number. `capacity.cover` takes "the smallest leaf that covers what is
left, else the largest, by name"; here the index lists a domain's leaves per count by name.

It answers a single-shape gang with no running pods and no preferred nodes: from the index of
its GPU size when GPUs bind first (`FreeIndex.gpu_bound`), else from the index of its exact
request (CPU-only pods among them). Everything else returns None and `core` counts the classic
way. Excluded nodes and domains are taken out of the index for
the decision and put back after it. Pods take the chosen slots in rank order (`ranks`). Pure.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from aggregator.placement.core import ranks
from aggregator.placement.core.capacity import cover
from aggregator.placement.core.free_index import FreeIndex, ShapeIndex
from aggregator.placement.core.gang import ROOT, Gang
from aggregator.placement.core.topology import Topology

__all__ = ["EXCLUDED_LIMIT", "lowest_tier", "place"]

EXCLUDED_LIMIT = 4096  # excluded nodes taken out for one decision; beyond, counting is cheaper


def _shape(index: FreeIndex, gang: Gang) -> ShapeIndex | None:
    if not gang.pods or gang.running or gang.preferred_nodes or not gang.homogeneous:
        return None
    request = gang.pods[0].request
    return index.shape(request.gpus) if index.gpu_bound(request) else index.request_shape(request)


def _excluded(index: FreeIndex, shape: ShapeIndex, nodes: frozenset[str], domains: frozenset[str]) -> set[str] | None:
    """Nodes holding a pod that the decision must not use; None when too many to take out. Held
    nodes (`FreeIndex.hold`: other gangs' spares) hold none already, and are set aside in one
    set difference rather than looked at one by one."""
    topology = index.topology
    out = {n for n in index.unheld(nodes) if n in shape.node_cap}
    for domain in domains:
        if shape.domain_cap.get(domain, 0) > 0:
            out.update(n for n in topology.nodes_of(domain) if n in shape.node_cap)
        if len(out) > EXCLUDED_LIMIT:
            return None
    return out


@contextmanager
def _without(index: FreeIndex, shape: ShapeIndex, nodes: set[str]) -> Iterator[None]:
    """The shape index as if `nodes` held no pod, for the length of one decision."""
    taken = {n: shape.node_cap[n] for n in nodes}
    leaf = index.leaf_of
    for node, cap in taken.items():
        shape.update(node, leaf(node), cap, 0)
    try:
        yield
    finally:
        for node, cap in taken.items():
            shape.update(node, leaf(node), 0, cap)


def place(topology: Topology, index: FreeIndex, gang: Gang, tiers: Iterable[int], *,
          excluded_nodes: frozenset[str], excluded_domains: frozenset[str]) -> dict[str, str] | None:
    """Pod -> node as `core.place` would choose; None when the index cannot answer exactly or
    nothing fits (the caller then counts, which also explains the failure)."""
    shape = _shape(index, gang)
    if shape is None:
        return None
    out = _excluded(index, shape, excluded_nodes, excluded_domains)
    if out is None:
        return None
    total, required = len(gang.pods), max(1, gang.required)
    with _without(index, shape, out):
        for tier in tiers:
            best = _best(shape, tier, total, required)
            if best is not None:
                found = _allocate(shape, best, gang, min(shape.domain_cap[best], total))
                return ranks.in_fabric_order(topology, found, gang.pods)
    return None


def lowest_tier(topology: Topology, index: FreeIndex, gang: Gang, tiers: Iterable[int], *,
                excluded_nodes: frozenset[str], excluded_domains: frozenset[str]) -> tuple[bool, int | None]:
    """(answered, the first of `tiers` with a domain holding `gang.required` pods)."""
    shape = _shape(index, gang)
    out = None if shape is None else _excluded(index, shape, excluded_nodes, excluded_domains)
    if shape is None or out is None:
        return False, None
    required = max(1, gang.required)
    with _without(index, shape, out):
        for tier in tiers:
            if tier not in shape.topology.by_tier:
                if shape.domain_cap.get(ROOT, 0) >= required:
                    return True, tier
                continue
            ranked = shape.by_tier.get(tier, [])
            if bisect_left(ranked, (required, "")) < len(ranked):
                return True, tier
    return True, None


def _best(shape: ShapeIndex, tier: int, total: int, required: int) -> str | None:
    """The domain `core.ranked` puts first in `tier`, or None when none holds `required` pods."""
    if tier not in shape.topology.by_tier:  # the virtual root above the top tier
        return ROOT if shape.domain_cap.get(ROOT, 0) >= required else None
    ranked = shape.by_tier.get(tier, [])
    whole = bisect_left(ranked, (max(total, required), ""))
    if whole < len(ranked):
        widest = max(shape.leaf_hist[ROOT], default=1)
        fewest = -(-total // widest)  # no domain needs fewer leaves than this
        best: tuple[int, str] | None = None
        for _, domain in ranked[whole:]:  # by (count, name): spare, then name, as core ranks
            needed = leaves_needed(shape, domain, total)
            if best is None or needed < best[0]:
                best = (needed, domain)
                if needed <= fewest:
                    break
        return best[1] if best else None
    part = bisect_left(ranked, (required, ""))
    options = [(sum(shape.leaf_hist[d].values()), d) for _, d in ranked[part:whole]]
    return min(options)[1] if options else None


def leaves_needed(shape: ShapeIndex, domain: str, target: int) -> int:
    """Fewest leaves of `domain` holding `target` pods, largest first (`core._leaves_needed`)."""
    hist = shape.leaf_hist[domain]
    if sum(hist.values()) == 1:
        return 1
    used = 0
    for cap in sorted(hist, reverse=True):
        if target <= 0:
            break
        take = min(hist[cap], -(-target // cap))
        used += take
        target -= take * cap
    return used


def _allocate(shape: ShapeIndex, domain: str, gang: Gang, target: int) -> dict[str, str]:
    """`core._slots` without anchors or preferences: `cover` over leaves, then over nodes."""
    left = {cap: n for cap, n in shape.leaf_hist[domain].items() if n > 0}
    lists: dict[int, Iterator[str]] = {}
    picks: list[tuple[str, int]] = []
    need = target
    while need > 0 and left:
        caps = sorted(left)
        cap = caps[bisect_left(caps, need)] if need <= caps[-1] else caps[-1]
        leaf = next(lists.setdefault(cap, shape.leaves_of(domain, cap)))
        picks.append((leaf, min(need, cap)))
        need -= min(need, cap)
        left[cap] -= 1
        if not left[cap]:
            del left[cap]
    pods = iter(gang.pods)  # which pod takes which slot: `ranks.in_fabric_order`, in `place`
    out: dict[str, str] = {}
    for leaf, share in picks:
        for node, count in cover(((n, shape.node_cap[n], False) for n in shape.nodes_of(leaf)), share):
            for _ in range(count):
                out[next(pods).name] = node
    return out
