"""The findings of a fold of measured round trips (aggregator.measured): a pair inside one leaf
that measures like the spine, a node that measures like another leaf, a lossy pair, a domain
whose bandwidth trains are slow; each with the pair and the numbers, blaming one node (or, for a
slow link, the domain's nodes).

Why apart from the fold: each finding looks at the transport's grouped rows
(aggregator.measured_rows) first and at single rows only where a group shows something, so a
healthy fabric costs no pass of its own; and the order and texts are the findings' contract
(the first MAX_FINDINGS are kept, the rest never written out).

Pure: plain values in and out.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aggregator.measured_rows import Judged

# a domain's trains out of (or into) it at under a quarter of its siblings' median rate: trains
# through busy hubs and NICs vary by 3x (195 against 540 Mbit/s between two healthy lab leaves)
SLOW_LINK_RATIO = 0.25


@dataclass(frozen=True, slots=True)
class MeasuredFinding:
    node: str  # the node it blames
    kind: str  # "slow-in-leaf" | "other-leaf" | "loss" | "slow-uplink" | "slow-downlink"
    text: str


def tier_cut(tiers: Mapping[int, int], low: int) -> float | None:
    """Halfway (geometrically) between a tier's profile and the next measured tier's."""
    above = [t for t in tiers if t > low]
    if low not in tiers or not above:
        return None
    return math.sqrt(max(tiers[low], 1) * max(tiers[min(above)], 1))


def _excess(j: Judged, tiers: Mapping[int, int], nodes: set[str]) -> dict[str, float]:
    """Per node of `nodes`, the median of its pairs' p50 over their tier's profile: a node behind a
    slow link or NIC is slow towards everyone (well above 1), its healthy partner only towards it."""
    ratios: dict[str, list[float]] = defaultdict(list)
    for a, b, us, loss, mine, theirs in j.each:
        if loss < 100 and (a in nodes or b in nodes):
            tier = j.places(mine, theirs)[1]
            if tier in tiers:
                ratio = us / max(tiers[tier], 1)
                ratios[a].append(ratio)
                ratios[b].append(ratio)
    return {node: statistics.median(r) for node, r in ratios.items() if node in nodes}


def _slow_in_leaf(j: Judged, tiers: Mapping[int, int], room: int) -> list[MeasuredFinding]:
    """Pairs inside one leaf above the leaf cut (the first `room`), each blamed on the end that is
    slower towards everyone."""
    cut = tier_cut(tiers, 1)
    if cut is None:
        return []
    keys = j.places_where(lambda tier, us: tier == 1 and max(us) > cut)
    if not keys:
        return []
    slow = [
        (a, b, us, mine)
        for a, b, us, loss, mine, theirs in j.each
        if loss < 100 and us > cut and j.places(mine, theirs) in keys
    ]
    slow = slow[:room]
    excess = _excess(j, tiers, {end for a, b, _, _ in slow for end in (a, b)})
    up = min((t for t in tiers if t > 1), default=1)
    out = []
    for a, b, us, leaf in slow:
        node = a if excess.get(a, 0) >= excess.get(b, 0) else b
        out.append(
            MeasuredFinding(
                node,
                "slow-in-leaf",
                f"{a} -> {b} in leaf {leaf}: p50 {us} us, like tier {up} ({tiers[up]} us) "
                f"rather than the leaf tier ({tiers[1]} us)",
            )
        )
    return out


def _per_node_leaf_latency(j: Judged, cut: float) -> dict[str, dict[str, list[int]]]:
    """Per node, its p50s grouped by the other end's leaf: only for nodes with a leaf-like round
    trip to another leaf (no other node can measure like another leaf); none when no group of
    pairs between leaves has one, so a healthy fabric looks at no row."""
    keys = j.places_where(lambda tier, us: tier > 1 and min(us) < cut)
    if not keys:
        return {}
    suspects = {
        end
        for a, b, us, loss, mine, theirs in j.each
        if loss < 100 and us < cut and j.places(mine, theirs) in keys
        for end in (a, b)
    }
    by: dict[str, dict[str, list[int]]] = {node: defaultdict(list) for node in suspects}
    for a, b, us, loss, mine, theirs in j.each:
        if loss >= 100 or not (a in by or b in by):
            continue
        if theirs and a in by:
            by[a][theirs].append(us)
        if mine and b in by:
            by[b][mine].append(us)
    return by


def _other_leaf(j: Judged, tiers: Mapping[int, int], room: int) -> list[MeasuredFinding]:
    cut = tier_cut(tiers, 1)
    if cut is None:
        return []
    out: list[MeasuredFinding] = []
    for node, by_leaf in sorted(_per_node_leaf_latency(j, cut).items()):
        if len(out) >= room:
            break
        own = j.tree.leaf_of.get(node)
        medians = {leaf: statistics.median(v) for leaf, v in by_leaf.items()}
        best = min(medians, key=lambda leaf: (medians[leaf], leaf))
        own_us = medians.get(own) if own else None
        if best != own and medians[best] < cut and (own_us is None or own_us > cut):
            own_text = f"{round(own_us)} us" if own_us is not None else "not measured"
            out.append(
                MeasuredFinding(
                    node,
                    "other-leaf",
                    f"{node} measures like leaf {best} (p50 {round(medians[best])} us) but is in {own} ({own_text})",
                )
            )
    return out


def _lossy(j: Judged, room: int) -> list[MeasuredFinding]:
    return [
        MeasuredFinding(b, "loss", f"{a} -> {b}: {loss:g} % of probes lost")
        for a, b, loss in j.rows.lossy[:room]
    ]


def _rates(
    trains: Sequence[tuple[str, str, str, int]], skip: set[str], into: bool
) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Per domain, the train rates of the sibling pairs leaving it (or entering it, `into`), trains
    from the `skip` domains left out; and each domain's parent."""
    rates: dict[str, list[int]] = defaultdict(list)
    parent: dict[str, str] = {}
    for a_child, b_child, meet, mbps in trains:
        if a_child not in skip:
            rates[b_child if into else a_child].append(mbps)
            parent[a_child] = parent[b_child] = meet
    return rates, parent


def _slow_side(rates: Mapping[str, list[int]], parent: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    """The domains whose median rate is under SLOW_LINK_RATIO of the median of their siblings':
    domain -> (its median, the siblings')."""
    medians = {d: statistics.median(v) for d, v in rates.items()}
    by_parent: dict[str, list[str]] = defaultdict(list)
    for d in medians:
        by_parent[parent[d]].append(d)
    slow = {}
    for siblings in by_parent.values():
        for d in siblings if len(siblings) > 1 else ():
            others = statistics.median(medians[s] for s in siblings if s != d)
            if medians[d] < SLOW_LINK_RATIO * others:
                slow[d] = (medians[d], others)
    return slow


def _slow_links(j: Judged) -> list[MeasuredFinding]:
    """A domain whose bandwidth trains to its siblings (its uplink) or, apart from trains of slow
    uplinks, from them (its downlink) arrive at under SLOW_LINK_RATIO of its siblings' median:
    every node of it is blamed (the link is the domain's, not one node's), the numbers in the
    text. Between two siblings a slow uplink and a slow downlink of the other are one path; it is
    named as the uplink."""
    trains = []
    for mine, theirs, mbps in j.rows.trains:
        meet, _, a_child, b_child = j.places(mine, theirs)
        if a_child:
            trains.append((a_child, b_child, meet, mbps))
    if not trains:
        return []
    up = _slow_side(*_rates(trains, set(), into=False))
    down = _slow_side(*_rates(trains, set(up), into=True))
    findings = []
    for kind, slow, verb in (("slow-uplink", up, "from it to"), ("slow-downlink", down, "into it from")):
        for d, (mine_mbps, theirs_mbps) in sorted(slow.items()):
            text = (
                f"{d}: bandwidth trains {verb} its siblings at {round(mine_mbps)} Mbit/s, "
                f"theirs at {round(theirs_mbps)} Mbit/s"
            )
            findings += [MeasuredFinding(n, kind, text) for n in j.tree.nodes.get(d, ())]
    return findings


def transport_findings(j: Judged, tiers: Mapping[int, int], room: int) -> list[MeasuredFinding]:
    """The transport's findings in their order (leaf pairs like the spine, nodes like another
    leaf, lossy pairs, slow links), the first `room` of them: past MAX_FINDINGS none is kept, so
    none is written out."""
    out: list[MeasuredFinding] = []
    for find in (_slow_in_leaf, _other_leaf):
        if len(out) < room:
            out += find(j, tiers, room - len(out))
    if len(out) < room:
        out += _lossy(j, room - len(out))
    if len(out) < room:
        out += _slow_links(j)[: room - len(out)]
    return out
