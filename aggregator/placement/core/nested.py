"""Placement of a gang made of sub-groups: every sub-group inside its own network domain, the
whole gang inside the gang's.

How: the core places the whole gang once, which names the lowest domain that can hold it (the
envelope). Inside that domain, each sub-group is placed by the core with its own limits, on the
capacity the earlier sub-groups left, largest first: all of its pods in one domain where they fit,
else as many as fit in one domain but never fewer than its minimum (Volcano's subGroupSize); a
sub-group that cannot reach its minimum places nothing. The pods of the default sub-group follow,
each welcome, none required. The gang fits there when it has its minMember pods and every policy
its minSubGroups sub-groups at their minimum. When it does not, the other domains of the
envelope's tier and then of the tiers above (up to the gang's limit) are tried, a bounded number
of them. Nothing here is a second algorithm: every step is `core.place` on a restricted node set.
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from aggregator.placement.core import place as core
from aggregator.placement.core.gang import ROOT, Gang, Placement, Unplaceable
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology

MAX_DOMAINS = 32  # envelopes tried before giving up: a bound on one decision's cost


@dataclass(frozen=True)
class Part:
    """One sub-group as the core sees it: its pending pods (`gang.pods`, with the sub-group's limits
    and running anchors), its policy, its minimum and how many of its members run already."""

    name: str
    gang: Gang
    policy: str = ""
    minimum: int = 1
    members: int = 0  # pending and running
    running: int = 0

    @property
    def needs(self) -> int:
        """Pending pods it must place now to reach its minimum."""
        return max(0, self.minimum - self.running)


def place(topology: Topology, free: Mapping[str, Resources], whole: Gang, parts: Sequence[Part], rest: Gang | None,
          *, required_parts: Mapping[str, int], excluded_nodes: frozenset[str] = frozenset(),
          excluded_domains: frozenset[str] = frozenset()) -> Placement:
    """Pods of `parts` and `rest` on nodes: at least `whole.required` pods and, per policy in
    `required_parts`, that many parts at their minimum, all inside one domain within the whole
    gang's limit."""
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
          required_parts: Mapping[str, int], outside: frozenset[str],
          excluded_domains: frozenset[str]) -> tuple[dict[str, str] | None, str]:
    """Sub-groups whole first (each all its pods, largest first), else every sub-group's minimum
    first and the rest after (what a gang that needs fewer than all its pods may start with)."""
    problem = ""
    for whole_first in (True, False):
        fill = _Fill(topology, free, parts, rest, outside, excluded_domains)
        assignments, problem = fill.run(whole, required_parts, whole_first=whole_first)
        if assignments is not None:
            return assignments, ""
    return None, problem


class _Fill:
    """One attempt to fill a domain: the capacity left, what is placed, which parts reached their minimum."""

    def __init__(self, topology: Topology, free: Mapping[str, Resources], parts: Sequence[Part], rest: Gang | None,
                 outside: frozenset[str], excluded_domains: frozenset[str]) -> None:
        self.topology, self.outside, self.excluded_domains = topology, outside, excluded_domains
        self.left = dict(free)
        self.parts = sorted(parts, key=lambda p: (-p.needs, -len(p.gang.pods), p.name))
        self.rest = rest
        self.requests = {p.name: p.request for part in parts for p in part.gang.pods}
        if rest is not None:
            self.requests.update({p.name: p.request for p in rest.pods})
        self.assignments: dict[str, str] = {}
        self.problems: list[str] = []

    def _place(self, gang: Gang) -> Placement:
        return core.place(self.topology, self.left, gang, excluded_nodes=self.outside,
                          excluded_domains=self.excluded_domains)

    def _take(self, placement: Placement) -> None:
        _charge(self.left, placement.assignments, self.requests, self.assignments)

    def _grow(self, gang: Gang) -> None:
        """As many of `gang`'s pods as fit, one domain at a time, each next to those placed before
        (inside the gang's limit): all at once where they fit together."""
        result = self._place(replace(gang, min_member=None))
        if result.ok:
            self._take(result)
            return
        pods = list(gang.pods)
        running = dict(gang.running)
        while pods:
            result = self._place(replace(gang, pods=tuple(pods), min_member=1, running=running))
            if not result.ok or not result.assignments:
                return
            self._take(result)
            running.update(result.assignments)
            pods = [p for p in pods if p.name not in result.assignments]

    def _minimum(self, part: Part, *, whole: bool) -> bool:
        """The part's pods to its minimum (all of them first when `whole`); False when it cannot."""
        if part.members < part.minimum:
            self.problems.append(f"sub-group {part.name} has {part.members} pod(s), fewer than its minimum {part.minimum}")
            return False
        if not part.gang.pods or not part.needs:
            return True  # its running pods reach the minimum
        if whole:
            result = self._place(replace(part.gang, min_member=None))
            if result.ok:
                self._take(result)
                return True
        result = self._place(replace(part.gang, min_member=part.needs))
        if not result.ok:
            self.problems.append(f"sub-group {part.name}: {result.failure.message if result.failure else 'no fit'}")
            return False
        self._take(result)
        return True

    def _remainder(self, part: Part) -> None:
        pods = tuple(p for p in part.gang.pods if p.name not in self.assignments)
        if pods:
            placed = {p.name: self.assignments[p.name] for p in part.gang.pods if p.name in self.assignments}
            self._grow(replace(part.gang, pods=pods, running={**part.gang.running, **placed}))

    def _required_first(self, required_parts: Mapping[str, int]) -> list[Part]:
        """Per policy, its minSubGroups smallest parts first (as Volcano allocates the sub-jobs a
        policy's count needs before the others), then the others largest first."""
        first: list[Part] = []
        for policy, need in sorted(required_parts.items()):
            mine = sorted((p for p in self.parts if p.policy == policy and p.members >= p.minimum),
                          key=lambda p: (p.needs, p.name))
            first += mine[:need]
        return first + [p for p in self.parts if p not in first]

    def run(self, whole: Gang, required_parts: Mapping[str, int], *, whole_first: bool) -> tuple[dict[str, str] | None, str]:
        at_minimum: dict[str, int] = {}
        reached = []
        for part in self.parts if whole_first else self._required_first(required_parts):
            if self._minimum(part, whole=whole_first):
                at_minimum[part.policy] = at_minimum.get(part.policy, 0) + 1
                reached.append(part)
                if whole_first:
                    self._remainder(part)
        if not whole_first:
            for part in reached:
                self._remainder(part)
        if self.rest is not None and self.rest.pods:
            self._grow(self.rest)  # the default sub-group: welcome, none required one by one
        found = "; ".join(self.problems)
        for policy, need in sorted(required_parts.items()):
            if at_minimum.get(policy, 0) < need:
                return None, (f"{at_minimum.get(policy, 0)} of the {need} sub-groups of {policy!r} minSubGroups "
                              f"reach their minimum ({found or 'no more fit'})")
        if len(self.assignments) < whole.required:
            return None, f"{len(self.assignments)} of the {whole.required} pods needed fit" + (f" ({found})" if found else "")
        return dict(self.assignments), ""


def _charge(left: dict[str, Resources], placed: Mapping[str, str], requests: Mapping[str, Resources],
            into: dict[str, str]) -> None:
    for pod, node in placed.items():
        left[node] = left[node] - requests[pod]
        into[pod] = node
