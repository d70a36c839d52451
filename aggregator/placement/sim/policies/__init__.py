"""Placement policies behind one signature, so the simulator and the benchmarks compare like with like.

`hypertopo` is the core; `first-fit` is topology-blind (what a plain scheduler does); `tier-dry-run`
allocates in every HyperNode of a tier, lowest tier first, as Volcano's allocator does. Each takes
the topology, free resources per node and a gang, and returns a `Placement`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from aggregator.placement.core.gang import Gang, Placement
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology
from aggregator.placement.sim.policies import first_fit, hypertopo, tier_dry_run


class Policy(Protocol):
    def __call__(self, topology: Topology, free: Mapping[str, Resources], gang: Gang, *,
                 excluded_nodes: frozenset[str] = ..., excluded_domains: frozenset[str] = ...) -> Placement: ...


POLICIES: Mapping[str, Policy] = {
    "hypertopo": hypertopo.place,
    "first-fit": first_fit.place,
    "tier-dry-run": tier_dry_run.place,
}


def policy(name: str) -> Policy:
    """The policy called `name` (underscores accepted for dashes); KeyError lists the known ones."""
    key = name.replace("_", "-")
    if key not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    return POLICIES[key]
