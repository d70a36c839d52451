"""The fold of measured round trips as it was before it was made faster (issue 27's benchmark):
the reference that tests/unit/test_measured_fold_reference.py and tests/bench/bench_measure.py compare the
fold in aggregator/measured.py with, on the same inputs, in one run.

Why a copy: the new fold groups round trips by pair of leaves and never builds a per-pair object;
its results must stay equal to these, pair for pair, finding for finding (the order and the
texts included). This is the code of aggregator/measured.py at commit 3e98b74, unchanged but for
the result types, which are the new module's so that results compare equal.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.common.report import MAX_MEASUREMENTS, Measurement
from agent.measure_plan import Domain, Tree, build_tree
from aggregator.measured import MAX_FINDINGS, DomainFigures, Fold, LeafGuess, MeasuredFinding
from aggregator.measured_findings import SLOW_LINK_RATIO
from aggregator.measured_rows import LOSS_FINDING_PERCENT


@dataclass(frozen=True, slots=True)
class Pair:
    """One measured pair, the prober first, with the domain where the two meet."""

    a: str
    b: str
    p50_us: int
    loss_percent: float
    meet: str  # lowest common domain ("" when the tree does not join them)
    tier: int  # its tier (0 when not joined)
    a_child: str = ""  # the child of `meet` each end is in ("" inside one leaf): sibling samples
    b_child: str = ""
    mbps: int | None = None  # the bandwidth train's rate, a to b, when one was sent


def _chains(tree: Tree) -> dict[str, tuple[str, ...]]:
    """Every node's domains from the root down (computed once: a fold touches each pair's two)."""
    out = {}
    for node, leaf in tree.leaf_of.items():
        chain: list[str] = []
        here: str | None = leaf
        while here is not None and here not in chain:
            chain.append(here)
            here = tree.parent.get(here)
        out[node] = tuple(reversed(chain))
    return out


def _meet(mine: tuple[str, ...], theirs: tuple[str, ...]) -> tuple[str, str, str]:
    """(lowest common domain, the child of it each chain goes on to): chains from the root down."""
    meet = ""
    for x, y in zip(mine, theirs, strict=False):
        if x != y:
            return meet, x, y
        meet = x
    return meet, "", ""


def pairs(tree: Tree, measured: Mapping[str, Sequence[Measurement]]) -> list[Pair]:
    """Every answered or lossy measurement as a pair placed in the tree (each node's first
    MAX_MEASUREMENTS only: reports are outside input)."""
    chains = _chains(tree)
    tier_of = {name: d.tier for name, d in tree.domains.items()}
    leaf_of = tree.leaf_of
    placed: dict[tuple[str | None, str | None], tuple[str, int, str, str]] = {}  # per pair of leaves
    out = []
    for node, ms in measured.items():
        mine = chains.get(node, ())
        for m in ms[:MAX_MEASUREMENTS]:
            key = (leaf_of.get(node), leaf_of.get(m.peer))
            if key not in placed:
                meet, a_child, b_child = _meet(mine, chains.get(m.peer, ()))
                placed[key] = (meet, tier_of[meet] if meet else 0, a_child, b_child)
            meet, tier, a_child, b_child = placed[key]
            out.append(
                Pair(node, m.peer, m.p50_us, m.loss_percent, meet, tier, a_child, b_child, m.bandwidth_mbps)
            )
    return out


def _median(values: Sequence[int]) -> int | None:
    return round(statistics.median(values)) if values else None


def _domain_figures(tree: Tree, found: Sequence[Pair]) -> dict[str, DomainFigures]:
    inside: dict[str, list[int]] = defaultdict(list)
    towards: dict[str, list[int]] = defaultdict(list)
    for p in found:
        if not p.meet or p.loss_percent >= 100:
            continue
        inside[p.meet].append(p.p50_us)
        if p.a_child:  # the child of `meet` each end is in has a sibling sample
            towards[p.a_child].append(p.p50_us)
            towards[p.b_child].append(p.p50_us)
    return {
        name: DomainFigures(
            _median(inside[name]), len(inside[name]), _median(towards[name]), len(towards[name])
        )
        for name in tree.domains
        if inside[name] or towards[name]
    }


def _tier_profile(found: Sequence[Pair]) -> dict[int, int]:
    by_tier: dict[int, list[int]] = defaultdict(list)
    for p in found:
        if p.tier and p.loss_percent < 100:
            by_tier[p.tier].append(p.p50_us)
    return {tier: round(statistics.median(v)) for tier, v in sorted(by_tier.items())}


def _cut(tiers: Mapping[int, int], low: int) -> float | None:
    """Halfway (geometrically) between a tier's profile and the next measured tier's."""
    above = [t for t in tiers if t > low]
    if low not in tiers or not above:
        return None
    return math.sqrt(max(tiers[low], 1) * max(tiers[min(above)], 1))


def _excess(found: Sequence[Pair], tiers: Mapping[int, int]) -> dict[str, float]:
    """Per node, the median of its pairs' p50 over their tier's profile: a node behind a slow link
    or NIC is slow towards everyone (well above 1), its healthy partner only towards it."""
    ratios: dict[str, list[float]] = defaultdict(list)
    for p in found:
        if p.tier in tiers and p.loss_percent < 100:
            ratio = p.p50_us / max(tiers[p.tier], 1)
            ratios[p.a].append(ratio)
            ratios[p.b].append(ratio)
    return {node: statistics.median(r) for node, r in ratios.items()}


def _slow_in_leaf(found: Sequence[Pair], tiers: Mapping[int, int]) -> list[MeasuredFinding]:
    cut = _cut(tiers, 1)
    if cut is None:
        return []
    slow = [p for p in found if p.tier == 1 and p.loss_percent < 100 and p.p50_us > cut]
    excess = _excess(found, tiers) if slow else {}
    up = min((t for t in tiers if t > 1), default=1)
    out = []
    for p in slow:
        node = p.a if excess.get(p.a, 0) >= excess.get(p.b, 0) else p.b
        out.append(
            MeasuredFinding(
                node,
                "slow-in-leaf",
                f"{p.a} -> {p.b} in leaf {p.meet}: p50 {p.p50_us} us, like tier {up} ({tiers[up]} us) "
                f"rather than the leaf tier ({tiers[1]} us)",
            )
        )
    return out


def _per_node_leaf_latency(tree: Tree, found: Sequence[Pair], cut: float) -> dict[str, dict[str, list[int]]]:
    """Per node, its p50s grouped by the other end's leaf: only for nodes with a leaf-like round
    trip to another leaf (no other node can measure like another leaf), so a healthy fabric costs
    one pass over the pairs."""
    suspects = {
        end for p in found if p.tier > 1 and p.loss_percent < 100 and p.p50_us < cut for end in (p.a, p.b)
    }
    by: dict[str, dict[str, list[int]]] = {node: defaultdict(list) for node in suspects}
    for p in found:
        if p.loss_percent >= 100 or not (p.a in by or p.b in by):
            continue
        for me, other in ((p.a, p.b), (p.b, p.a)):
            leaf = tree.leaf_of.get(other)
            if leaf and me in by:
                by[me][leaf].append(p.p50_us)
    return by


def _other_leaf(tree: Tree, found: Sequence[Pair], tiers: Mapping[int, int]) -> list[MeasuredFinding]:
    cut = _cut(tiers, 1)
    if cut is None:
        return []
    out = []
    for node, by_leaf in sorted(_per_node_leaf_latency(tree, found, cut).items()):
        own = tree.leaf_of.get(node)
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


def _lossy(found: Sequence[Pair]) -> list[MeasuredFinding]:
    return [
        MeasuredFinding(p.b, "loss", f"{p.a} -> {p.b}: {p.loss_percent:g} % of probes lost")
        for p in found
        if p.loss_percent >= LOSS_FINDING_PERCENT
    ]


def _rates(found: Sequence[Pair], skip: set[str], into: bool) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Per domain, the train rates of the sibling pairs leaving it (or entering it, `into`), trains
    from the `skip` domains left out; and each domain's parent."""
    rates: dict[str, list[int]] = defaultdict(list)
    parent: dict[str, str] = {}
    for p in found:
        if p.a_child and p.mbps and p.a_child not in skip:
            rates[p.b_child if into else p.a_child].append(p.mbps)
            parent[p.a_child] = parent[p.b_child] = p.meet
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


def _slow_links(tree: Tree, found: Sequence[Pair]) -> list[MeasuredFinding]:
    """A domain whose bandwidth trains to its siblings (its uplink) or, apart from trains of slow
    uplinks, from them (its downlink) arrive at under SLOW_LINK_RATIO of its siblings' median:
    every node of it is blamed (the link is the domain's, not one node's), the numbers in the
    text. Between two siblings a slow uplink and a slow downlink of the other are one path; it is
    named as the uplink."""
    up = _slow_side(*_rates(found, set(), into=False))
    down = _slow_side(*_rates(found, set(up), into=True))
    findings = []
    for kind, slow, verb in (("slow-uplink", up, "from it to"), ("slow-downlink", down, "into it from")):
        for d, (mine, theirs) in sorted(slow.items()):
            text = f"{d}: bandwidth trains {verb} its siblings at {round(mine)} Mbit/s, theirs at {round(theirs)} Mbit/s"
            findings += [MeasuredFinding(n, kind, text) for n in tree.nodes.get(d, ())]
    return findings


def by_transport(measured: Mapping[str, Sequence[Measurement]]) -> dict[str, dict[str, list[Measurement]]]:
    """The rows split by the transport that measured them (each node's first MAX_MEASUREMENTS).

    Why: an RDMA round trip skips both kernels' stacks (a few us) where a UDP one crosses them
    (tens of us), and an ib_write_bw rate is not a UDP train's. Compared in one profile, UDP rows of
    a leaf would "measure like the spine" of the RDMA rows: each transport is judged on its own."""
    out: dict[str, dict[str, list[Measurement]]] = defaultdict(lambda: defaultdict(list))
    for node, ms in measured.items():
        for m in ms[:MAX_MEASUREMENTS]:
            out[m.transport][node].append(m)
    return out


def main_transport(measured: Mapping[str, Sequence[Measurement]]) -> Mapping[str, Sequence[Measurement]]:
    """The rows of the transport that measured the most pairs (ties: by name), for the figures a
    domain shows and for leaf inference, which need one scale."""
    split = by_transport(measured)
    if len(split) <= 1:
        return measured
    best = max(split, key=lambda t: (sum(map(len, split[t].values())), t))
    return split[best]


def _findings(tree: Tree, found: Sequence[Pair], tiers: Mapping[int, int]) -> list[MeasuredFinding]:
    return [
        *_slow_in_leaf(found, tiers),
        *_other_leaf(tree, found, tiers),
        *_lossy(found),
        *_slow_links(tree, found),
    ]


def fold(domains: Iterable[Domain], measured: Mapping[str, Sequence[Measurement]]) -> Fold:
    """Per-domain figures, the tier profile and the findings for one set of measurements.

    Rows of different transports (udp, rdma) are never compared with each other: each transport's
    pairs get their own tier profile and findings (named with the transport); the domains' figures
    and the profile returned are the main transport's (`main_transport`)."""
    tree = build_tree(domains, order=False)
    split = by_transport(measured)
    if len(split) <= 1:
        found = pairs(tree, measured)
        tiers = _tier_profile(found)
        return Fold(_domain_figures(tree, found), tiers, tuple(_findings(tree, found, tiers)[:MAX_FINDINGS]))
    findings: list[MeasuredFinding] = []
    for transport in sorted(split):
        found = pairs(tree, split[transport])
        findings += [
            MeasuredFinding(f.node, f.kind, f"{f.text} ({transport})")
            for f in _findings(tree, found, _tier_profile(found))
        ]
    main = pairs(tree, main_transport(measured))
    return Fold(_domain_figures(tree, main), _tier_profile(main), tuple(findings[:MAX_FINDINGS]))


def _widest_gap(values: Sequence[int]) -> tuple[float, float]:
    """(cut, ratio) at the widest ratio between consecutive sorted p50s."""
    ordered = sorted(max(v, 1) for v in values)
    best = (float(ordered[-1]) + 1, 1.0)
    for lo, hi in itertools.pairwise(ordered):
        if hi / lo > best[1]:
            best = (math.sqrt(lo * hi), hi / lo)
    return best


def _gap_at(values: Sequence[int], cut: float) -> float:
    """How far apart the round trips either side of a given cut are (a ratio; 1 when one side is empty)."""
    below = [v for v in values if v < cut]
    above = [v for v in values if v >= cut]
    return min(above) / max(max(below), 1) if below and above else 1.0


def infer_leaves(measured: Mapping[str, Sequence[Measurement]], cut_us: float | None = None) -> LeafGuess:
    """Connected components of the leaf-like round trips (union-find, near O(pairs)); leaf-like is
    below the widest gap, or below `cut_us` when given (the tree's leaf tier cut, to check the
    tree's leaves rather than guess them). One transport's rows only (the main one): a cut between
    RDMA and UDP round trips is no leaf boundary."""
    answered = [
        (a, m.peer, m.p50_us)
        for a, ms in main_transport(measured).items()
        for m in ms[:MAX_MEASUREMENTS]
        if m.loss_percent < 100
    ]
    nodes = {a for a in measured} | {b for _, b, _ in answered}
    if not answered:
        return LeafGuess(tuple(frozenset({n}) for n in sorted(nodes)), 0.0, 1.0, 0.0)
    values = [us for _, _, us in answered]
    cut, gap = _widest_gap(values) if cut_us is None else (cut_us, _gap_at(values, cut_us))
    root = {n: n for n in nodes}

    def find(n: str) -> str:
        while root[n] != n:
            root[n] = root[root[n]]
            n = root[n]
        return n

    linked: set[str] = set()
    for a, b, us in answered:
        if us < cut:
            root[find(a)] = find(b)
            linked |= {a, b}
    groups: dict[str, set[str]] = defaultdict(set)
    for n in nodes:
        groups[find(n)].add(n)
    ordered = tuple(sorted((frozenset(g) for g in groups.values()), key=lambda g: sorted(g)))
    return LeafGuess(ordered, cut, gap, len(linked) / len(nodes))
