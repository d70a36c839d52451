"""Topology-blind baseline: nodes in name order, each pod on the first node it fits, all or nothing.

This is what a gang scheduler without topology does; it shows what the HyperNodes buy."""

from __future__ import annotations

from collections.abc import Mapping

from aggregator.placement.core.capacity import usable_nodes
from aggregator.placement.core.gang import Gang, Placement, Unplaceable
from aggregator.placement.core.place import describe
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology


def place(topology: Topology, free: Mapping[str, Resources], gang: Gang, *,
          excluded_nodes: frozenset[str] = frozenset(),
          excluded_domains: frozenset[str] = frozenset()) -> Placement:
    nodes = usable_nodes(topology, free, excluded_nodes=excluded_nodes, excluded_domains=excluded_domains)
    left = {n: free[n] for n in nodes}
    out: dict[str, str] = {}
    start = 0
    for pod in sorted(gang.pods, key=lambda p: p.name):
        while start < len(nodes) and left[nodes[start]].count(pod.request) == 0 and gang.homogeneous:
            start += 1  # a single-shape gang never comes back to a full node
        node = next((n for n in nodes[start:] if left[n].covers(pod.request)), None)
        if node is None:
            continue
        left[node] = left[node] - pod.request
        out[pod.name] = node
    if len(out) < gang.required:
        return Placement({}, failure=Unplaceable(
            f"gang {gang.name}: only {len(out)} of {gang.required} pods fit", gang.required,
            short_pods=gang.required - len(out)))
    return describe(topology, out, gang.running.values())
