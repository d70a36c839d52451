"""Volcano-style baseline: for each tier from the lowest, a full dry-run allocation in every
HyperNode of that tier; the best scored success wins.

This is the cost the core avoids: every HyperNode is tried with a per-pod, per-node allocation,
so a decision grows with (HyperNodes x nodes below each x pods). Scoring is binpack-like: fewest
nodes used, then least free GPU left on them, then the name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aggregator.placement.core.capacity import blocked_domains, usable_nodes
from aggregator.placement.core.gang import ROOT, Gang, Placement, Unplaceable
from aggregator.placement.core.place import describe, resolve_limit, tier_order
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology


def _dry_run(nodes: Sequence[str], free: Mapping[str, Resources], gang: Gang) -> dict[str, str] | None:
    """Each pod (largest first) on the usable node that leaves it the fewest free GPUs."""
    left = {n: free[n] for n in nodes}
    out: dict[str, str] = {}
    for pod in sorted(gang.pods, key=lambda p: (p.request, p.name), reverse=True):
        best: tuple[int, str] | None = None
        for node in nodes:
            if left[node].covers(pod.request):
                score = (left[node].gpus - pod.request.gpus, node)
                if best is None or score < best:
                    best = score
        if best is None:
            continue
        left[best[1]] = left[best[1]] - pod.request
        out[pod.name] = best[1]
    return out if len(out) >= gang.required else None


def _score(out: Mapping[str, str], free: Mapping[str, Resources], gang: Gang) -> tuple[int, int]:
    used = set(out.values())
    taken = sum(p.request.gpus for p in gang.pods if p.name in out)
    return len(used), sum(free[n].gpus for n in used) - taken


def place(topology: Topology, free: Mapping[str, Resources], gang: Gang, *,
          excluded_nodes: frozenset[str] = frozenset(),
          excluded_domains: frozenset[str] = frozenset()) -> Placement:
    blocked = blocked_domains(topology, excluded_domains)
    usable = usable_nodes(topology, free, excluded_nodes=excluded_nodes, excluded_domains=excluded_domains)
    limit, problem = resolve_limit(topology, gang)
    if problem:
        return Placement({}, failure=Unplaceable(problem, gang.required))
    anchors = set(gang.running.values())
    usable_set = set(usable)
    for tier in tier_order(topology, limit, gang.mode):
        domains = [ROOT] if tier > topology.top_tier else [d for d in topology.by_tier[tier] if d not in blocked]
        best: tuple[tuple[int, int], str, dict[str, str]] | None = None
        for domain in domains:
            below = usable if domain == ROOT else [n for n in topology.nodes_of(domain) if n in usable_set]
            if anchors and domain != ROOT and not anchors <= set(topology.nodes_of(domain)):
                continue
            out = _dry_run(below, free, gang)
            if out is not None and (best is None or (_score(out, free, gang), domain) < best[:2]):
                best = (_score(out, free, gang), domain, out)
        if best is not None:
            return describe(topology, best[2], anchors)
    return Placement({}, failure=Unplaceable(f"gang {gang.name}: no HyperNode dry run succeeded", gang.required))
