"""Placement of a gang made of sub-groups: every sub-group inside its own network domain, the
whole gang inside the gang's.

How: the core places the whole gang once, which names the lowest domain that can hold it (the
envelope). Inside that domain, each sub-group is placed by the core with its own limits, on the
capacity the earlier sub-groups left; the pods in no sub-group follow. When the sub-groups do
not fit there, the other domains of the envelope's tier and then of the tiers above (up to the
gang's limit) are tried, a bounded number of them. Nothing here is a second algorithm: every
step is `core.place` on a restricted node set. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from aggregator.placement import core
from aggregator.placement.gang import ROOT, Gang, Placement, Unplaceable
from aggregator.placement.resources import Resources
from aggregator.placement.topology import Topology

MAX_DOMAINS = 32  # envelopes tried before giving up: a bound on one decision's cost


@dataclass(frozen=True)
class Part:
    """One sub-group as the core sees it (its pods, limits and running anchors)."""

    name: str
    gang: Gang


def place(topology: Topology, free: Mapping[str, Resources], whole: Gang, parts: Sequence[Part], rest: Gang | None,
          *, required_parts: int, excluded_nodes: frozenset[str] = frozenset(),
          excluded_domains: frozenset[str] = frozenset()) -> Placement:
    """Pods of `parts` and `rest` on nodes, at least `required_parts` whole parts and
    `whole.required` pods, all inside one domain within the whole gang's limit."""
    envelope = core.place(topology, free, whole, excluded_nodes=excluded_nodes, excluded_domains=excluded_domains)
    if not envelope.ok:
        return envelope
    tried = 0
    last = ""
    for domain in _candidates(topology, whole, envelope.domain):
        if tried >= MAX_DOMAINS:
            break
        tried += 1
        outside = excluded_nodes if domain == ROOT else excluded_nodes | (free.keys() - set(topology.nodes_of(domain)))
        assignments, problem = _fill(topology, free, whole, parts, rest, required_parts,
                                     frozenset(outside), excluded_domains)
        if assignments is not None:
            return core.describe(topology, assignments, whole.running.values())
        last = f"in {domain}: {problem}"
    message = f"the gang fits, but its sub-groups do not ({tried} domain(s) tried; {last})"
    return Placement({}, failure=Unplaceable(message, whole.required, best_domain=envelope.domain))


def _candidates(topology: Topology, whole: Gang, first: str | None) -> list[str]:
    """The envelope first, then its tier's other domains and those of the tiers above, up to the limit."""
    limit, _ = core.resolve_limit(topology, whole)
    first = first or ROOT
    start = topology.domains[first].tier if first in topology.domains else topology.top_tier + 1
    out = [first]
    for tier in core.tier_order(topology, limit, whole.mode):
        if tier < start:
            continue
        if tier == topology.top_tier + 1:
            out.append(ROOT)
        else:
            out.extend(sorted(topology.by_tier.get(tier, ())))
    return list(dict.fromkeys(out))  # first occurrence of each, in order


def _fill(topology: Topology, free: Mapping[str, Resources], whole: Gang, parts: Sequence[Part], rest: Gang | None,
          required_parts: int, outside: frozenset[str],
          excluded_domains: frozenset[str]) -> tuple[dict[str, str] | None, str]:
    left = dict(free)
    requests = {p.name: p.request for part in parts for p in part.gang.pods}
    if rest is not None:
        requests.update({p.name: p.request for p in rest.pods})
    assignments: dict[str, str] = {}
    placed_parts, problems = 0, []
    for part in parts:
        if not part.gang.pods:
            placed_parts += 1  # every pod of it already runs
            continue
        result = core.place(topology, left, part.gang, excluded_nodes=outside, excluded_domains=excluded_domains)
        if not result.ok:
            problems.append(f"sub-group {part.name}: {result.failure.message if result.failure else 'no fit'}")
            continue
        placed_parts += 1
        _charge(left, result.assignments, requests, assignments)
    if rest is not None and rest.pods:
        loose = replace(rest, min_member=0)  # loose pods are welcome, not required one by one
        result = core.place(topology, left, loose, excluded_nodes=outside, excluded_domains=excluded_domains)
        if result.ok:
            _charge(left, result.assignments, requests, assignments)
    if placed_parts < required_parts:
        return None, "; ".join(problems) or f"{placed_parts} of {required_parts} sub-groups fit"
    if len(assignments) < whole.required:
        return None, f"{len(assignments)} of the {whole.required} pods needed fit"
    return assignments, ""


def _charge(left: dict[str, Resources], placed: Mapping[str, str], requests: Mapping[str, Resources],
            into: dict[str, str]) -> None:
    for pod, node in placed.items():
        left[node] = left[node] - requests[pod]
        into[pod] = node
