"""Grey failures in placement: steer new gangs away from degraded nodes, and, for gangs that ask
for it, move pods off nodes that stay degraded.

A degraded node still works, only slower (a port trained at half rate, climbing symbol errors, a
flapping link, a PCIe link below its maximum). So it is never a failed node here: it is not
excluded, not evicted for, and it never makes a domain unusable. Two soft effects only:

* **Preference.** When a gang's placement would use a leaf (immediate HyperNode) with a degraded
  member, the same placement is tried again without those leaves' nodes, then without the
  degraded nodes alone; the first answer as good by the core's own objective (the same tier of
  the lowest common HyperNode, no more leaves, as many pods placed) is taken. So of two equal
  leaves the one without degraded members wins, but a gang never climbs a tier, spreads over more
  leaves or goes unplaced to avoid a slow link. It runs outside the core, which stays untouched:
  the retries cost a decision only when a degraded leaf was chosen.
* **`restart-pods-on-degraded`.** A gang whose `hypertopo.io/on-fabric-fault` annotation says so
  is treated as `restart-pods` on failures, and besides has its pods on a node evicted once the
  node has stayed degraded for `after_seconds` (the scheduler's `--degraded-restart-after`); its
  owner recreates them and the preference above re-places them on a healthy node when one is as
  good. Gangs without that value are never moved for a grey failure.

How the scheduler learns which nodes are degraded:

* a Node annotated `hypertopo.io/fabric-degraded` (the aggregator's `--mark-degraded`; the value
  is the time the node was first seen degraded) is degraded, exactly;
* a HyperNode whose `FabricDegraded` condition is True, and whose degradation is its own (not
  carried up from a degraded HyperNode below it) and not explained by an annotated node inside
  it, makes all its nodes degraded for the preference: without node marks the domain is all the
  scheduler knows. Evictions act on annotated nodes only, never on such a guess.

The time a node has been degraded counts from when this scheduler first saw its annotation (the
scheduler's own clock; a restarted scheduler starts counting again, so it never moves pods
sooner than configured). Pure: dicts in, plain values out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aggregator.live.node_marks import DEGRADED_ANNOTATION
from aggregator.placement.core.gang import Placement
from aggregator.placement.core.rescheduler import Eviction
from aggregator.placement.core.topology import Topology
from aggregator.placement.kinds.podgroups import RESTART_ON_DEGRADED, GangView

FABRIC_DEGRADED = "FabricDegraded"  # aggregator.health.FABRIC_DEGRADED
ON_DEGRADED = RESTART_ON_DEGRADED


def marked_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Node -> the since-time of its degraded annotation (the aggregator's node mark)."""
    out = {}
    for name, node in nodes.items():
        since = ((node.get("metadata") or {}).get("annotations") or {}).get(DEGRADED_ANNOTATION)
        if since is not None:
            out[name] = str(since)
    return out


def degraded_domains(hypernodes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """HyperNode -> its FabricDegraded message, for those where the condition is True."""
    out = {}
    for name, obj in hypernodes.items():
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == FABRIC_DEGRADED and cond.get("status") == "True":
                out[name] = str(cond.get("message", ""))
    return out


def degraded_nodes(
    nodes: Mapping[str, Mapping[str, Any]], hypernodes: Mapping[str, Mapping[str, Any]], topology: Topology
) -> dict[str, str]:
    """Node -> why it counts as degraded for placement (see the module docstring)."""
    out = {name: f"node {name} fabric degraded since {since}" for name, since in marked_nodes(nodes).items()}
    domains = {d: why for d, why in degraded_domains(hypernodes).items() if d in topology.domains}
    carried = {up for d in domains for up in topology.chains.get(d, (d,))[1:]}
    for domain in sorted(d for d in domains if d not in carried):
        inside = topology.nodes_of(domain)
        if any(node in out for node in inside):
            continue
        for node in inside:
            out.setdefault(node, f"HyperNode {domain} FabricDegraded: {domains[domain]}")
    return out


def _rank(placement: Placement) -> tuple[int, int, int]:
    return (placement.tier if placement.tier is not None else 1 << 30, placement.leaves, -len(placement.assignments))


def avoid_levels(topology: Topology, degraded: Iterable[str]) -> tuple[frozenset[str], ...]:
    """What to avoid, most first: every node of a leaf (immediate HyperNode) with a degraded
    member, then the degraded nodes alone."""
    nodes = frozenset(degraded)
    if not nodes:
        return ()
    leaves = {topology.node_leaf[n] for n in nodes if n in topology.node_leaf}
    mates = frozenset(m for leaf in sorted(leaves) for m in topology.domains[leaf].nodes) | nodes
    return (mates, nodes) if mates != nodes else (nodes,)


def prefer_healthy(
    first: Placement, levels: Sequence[frozenset[str]], again: Callable[[frozenset[str]], Placement]
) -> Placement:
    """`first`, or the first `again(avoid)` (the same placement with those nodes excluded), for
    `avoid` in `levels` (`avoid_levels`), that is as good: same or lower tier, no more leaves, as
    many pods placed. No retry when `first` touches none of the nodes to avoid."""
    if not first.ok or not levels or levels[0].isdisjoint(first.assignments.values()):
        return first
    for avoid in levels:
        if avoid.isdisjoint(first.assignments.values()):
            break
        retry = again(avoid)
        if retry.ok and retry.assignments and _rank(retry) <= _rank(first):
            return retry
    return first


@dataclass
class DegradedTracker:
    """Since when (this scheduler's clock) each node has carried the degraded mark; which nodes
    have carried it for at least `after_seconds`."""

    after_seconds: float
    since: dict[str, float] = field(default_factory=dict)

    def due(self, marked: Mapping[str, str], now: float) -> dict[str, str]:
        """Node -> why its pods may move now (degraded for at least `after_seconds`)."""
        for gone in [n for n in self.since if n not in marked]:
            del self.since[gone]
        out = {}
        for node, stamp in sorted(marked.items()):
            first = self.since.setdefault(node, now)
            if now - first >= self.after_seconds:
                out[node] = (f"node {node} fabric degraded since {stamp} "
                             f"(seen for {now - first:.0f}s, restart-pods-on-degraded after {self.after_seconds:.0f}s)")
        return out

    def next_due(self, now: float) -> float | None:
        """Seconds until the next node falls due (None: none waiting)."""
        waits = [first + self.after_seconds - now for first in self.since.values() if now - first < self.after_seconds]
        return max(0.0, min(waits)) if waits else None


def plan(gangs: Iterable[GangView], due: Mapping[str, str]) -> list[Eviction]:
    """Evictions of the pods of `restart-pods-on-degraded` gangs that sit on nodes due to move
    (bound pods only, as for failures)."""
    evictions = []
    for gang in gangs:
        if gang.fault_policy != ON_DEGRADED:
            continue
        for pod in gang.members:
            meta, node = pod.get("metadata") or {}, (pod.get("spec") or {}).get("nodeName")
            if node and node in due:
                key = (str(meta.get("namespace")), str(meta.get("name")))
                evictions.append(Eviction(key, str(meta.get("uid", "")), node, gang.key, ON_DEGRADED, due[node]))
    return evictions
