"""Folds the agents' round-trip measurements over the HyperNode tree: what each domain measures
inside and towards its siblings, which pairs contradict the inferred tree, and which leaf groups
latency alone suggests.

Why: the tree is inferred from cabling (LLDP, ibnetdiscover, UFM, a model), and cabling can be
wrong, missing, or right and still slow. A round trip is what a job gets. So for every pair
measured, its tiers are where the two nodes meet in the tree (their lowest common domain), and:

* per HyperNode: the median p50 of the pairs that meet in it (`inside_us`) and of the pairs from
  it to a sibling (`sibling_us`), for annotations, metrics and `measured` output;
* per tier: the median p50 of all pairs meeting at that tier (the latency profile of the fabric);
* findings: a pair inside one leaf whose p50 is nearer the next tier's profile than the leaf's
  ("measures like the spine"), a node whose p50 to another leaf is leaf-like while to its own it
  is not ("measures like leaf X"), and a pair losing probes. Each carries the pair and the numbers,
  and marks the node it blames as a grey failure (FabricDegraded), never as a failure: the link
  still carries traffic;
* `infer_leaves`: groups of nodes connected by leaf-like round trips, the cut taken at the widest
  gap in the measured p50s, with how sure it is (the gap ratio and the share of nodes measured),
  for a fabric with no cabling source.

How it stays fast at 10,000 nodes (70,000 pairs, issue 27's benchmark): the rows are read once,
their p50s grouped by where the two ends meet (aggregator.measured_rows), and the figures come
from those groups; no object is made per row. The findings (aggregator.measured_findings) look at
single rows again only where a group says there is something to find, so a healthy fabric costs
one pass. tests/bench/measured_fold_reference.py keeps the per-pair fold this replaced; tests compare
the two and tests/bench/bench_measure.py times them side by side.

Pure: reports and the tree in, plain values out; time and I/O belong to the callers.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.common.report import MAX_MEASUREMENTS, Measurement
from agent.measure_plan import Domain, build_tree
from aggregator.graph import FabricFault
from aggregator.measured_findings import MeasuredFinding, tier_cut, transport_findings
from aggregator.measured_rows import TRANSPORT, Judged, Places, Replay, read

MAX_FINDINGS = 100  # a fabric-wide problem is told by its first hundred pairs, not all
CAUSE = "latency"
CAUSES = {"slow-uplink": "bandwidth", "slow-downlink": "bandwidth"}  # by finding kind; else CAUSE


@dataclass(frozen=True, slots=True)
class DomainFigures:
    inside_us: int | None
    inside_samples: int
    sibling_us: int | None
    sibling_samples: int


@dataclass(frozen=True)
class Fold:
    domains: Mapping[str, DomainFigures]
    tiers: Mapping[int, int]  # tier -> median p50 of the pairs meeting there
    findings: tuple[MeasuredFinding, ...]

    def fabric_faults(self) -> Mapping[str, tuple[FabricFault, ...]]:
        """The findings as grey faults on the nodes they blame (FabricDegraded on their domains)."""
        out: dict[str, list[FabricFault]] = defaultdict(list)
        for f in self.findings:
            out[f.node].append(FabricFault(False, CAUSES.get(f.kind, CAUSE), f.text))
        return {node: tuple(faults) for node, faults in out.items()}

    def annotations(self, name: str) -> Mapping[str, str]:
        """A HyperNode's measured figures as annotations (nothing for a domain never measured)."""
        d = self.domains.get(name)
        out: dict[str, str] = {}
        if d and d.inside_us is not None:
            out["hypertopo.io/measured-inside-p50-us"] = str(d.inside_us)
        if d and d.sibling_us is not None:
            out["hypertopo.io/measured-sibling-p50-us"] = str(d.sibling_us)
        return out


def _median(values: Sequence[int]) -> int | None:
    return round(statistics.median(values)) if values else None


def _figures(j: Judged) -> dict[str, DomainFigures]:
    inside: dict[str, list[int]] = defaultdict(list)
    towards: dict[str, list[int]] = defaultdict(list)
    odd = [(j.places(a, b), [us]) for a, b, us in j.rows.odd]
    for (meet, _, a_child, b_child), us in [*j.rows.by_place.items(), *odd]:
        if meet and us:
            inside[meet] += us
            if a_child:  # the child of `meet` each end is in has a sibling sample
                towards[a_child] += us
                towards[b_child] += us
    return {
        name: DomainFigures(
            _median(inside[name]), len(inside[name]), _median(towards[name]), len(towards[name])
        )
        for name in j.tree.domains
        if inside.get(name) or towards.get(name)
    }


def _tiers(j: Judged) -> dict[int, int]:
    by_tier: dict[int, list[int]] = defaultdict(list)
    for (_, tier, _, _), us in j.rows.by_place.items():
        if tier:
            by_tier[tier] += us
    return {tier: round(statistics.median(v)) for tier, v in sorted(by_tier.items()) if v}


def main_transport(measured: Mapping[str, Sequence[Measurement]]) -> Mapping[str, Sequence[Measurement]]:
    """The rows of the transport that measured the most pairs (ties: by name; each node's first
    MAX_MEASUREMENTS), for the figures a domain shows and for leaf inference, which need one scale.

    Why per transport: an RDMA round trip skips both kernels' stacks (a few us) where a UDP one
    crosses them (tens of us), and an ib_write_bw rate is not a UDP train's. Compared in one
    profile, UDP rows of a leaf would "measure like the spine" of the RDMA rows."""
    counts: Counter[str] = Counter()
    for ms in measured.values():
        counts.update(map(TRANSPORT, ms[:MAX_MEASUREMENTS]))
    if len(counts) <= 1:
        return measured
    best = max(counts, key=lambda t: (counts[t], t))
    kept = {node: [m for m in ms[:MAX_MEASUREMENTS] if m.transport == best] for node, ms in measured.items()}
    return {node: ms for node, ms in kept.items() if ms}


def fold(domains: Iterable[Domain], measured: Mapping[str, Sequence[Measurement]]) -> Fold:
    """Per-domain figures, the tier profile and the findings for one set of measurements.

    Rows of different transports (udp, rdma) are never compared with each other: each transport's
    pairs get their own tier profile and findings (named with the transport); the domains' figures
    and the profile returned are the main transport's (`main_transport`)."""
    tree = build_tree(domains, order=False)
    places = Places(tree)
    split = read(places, tree.leaf_of, measured)
    judged = {t: Judged(tree, rows, Replay(tree.leaf_of, measured, t)) for t, rows in sorted(split.items())}
    if not judged:
        return Fold({}, {}, ())
    if len(judged) == 1:
        (j,) = judged.values()
        tiers = _tiers(j)
        return Fold(_figures(j), tiers, tuple(transport_findings(j, tiers, MAX_FINDINGS)))
    findings: list[MeasuredFinding] = []
    for transport, j in judged.items():
        findings += [
            MeasuredFinding(f.node, f.kind, f"{f.text} ({transport})")
            for f in transport_findings(j, _tiers(j), MAX_FINDINGS - len(findings))
        ]
    main = judged[max(split, key=lambda t: (split[t].count, t))]
    return Fold(_figures(main), _tiers(main), tuple(findings))


@dataclass(frozen=True)
class LeafGuess:
    """Leaf groups from latency alone: `gap` is how far apart (a ratio) the slowest leaf-like and
    the fastest non-leaf-like round trips are (2 or more: clear), `coverage` the share of nodes
    with at least one leaf-like round trip (a node without one is a group of its own)."""

    groups: tuple[frozenset[str], ...]
    cut_us: float
    gap: float
    coverage: float


def _widest_gap(values: Sequence[int]) -> tuple[float, float]:
    """(cut, ratio) at the widest ratio between consecutive sorted p50s (each value once: equal
    neighbours are a ratio of 1, never the widest)."""
    ordered = sorted({max(v, 1) for v in values})
    best = (float(ordered[-1]) + 1, 1.0)
    for lo, hi in itertools.pairwise(ordered):
        if hi / lo > best[1]:
            best = (math.sqrt(lo * hi), hi / lo)
    return best


def _gap_at(values: Iterable[int], cut: float) -> float:
    """How far apart the round trips either side of a given cut are (a ratio; 1 when one side is empty)."""
    values = set(values)  # a few hundred distinct p50s among tens of thousands
    below = [v for v in values if v < cut]
    above = [v for v in values if v >= cut]
    return min(above) / max(max(below), 1) if below and above else 1.0


def _components(nodes: set[str], linked: Mapping[str, list[str]]) -> tuple[frozenset[str], ...]:
    """Connected components of `nodes` joined by `linked` (node -> the peers it is joined to):
    union-find with path halving, sorted by their sorted members."""
    root = {n: n for n in nodes}

    def find(n: str) -> str:
        while root[n] != n:
            root[n] = root[root[n]]
            n = root[n]
        return n

    for a, peers in linked.items():
        ra = find(a)  # stays a root: only the peers' roots are moved under it
        for b in peers:
            rb = find(b)
            if rb != ra:
                root[rb] = ra
    groups: dict[str, set[str]] = defaultdict(set)
    for n in root:
        groups[find(n)].add(n)
    return tuple(sorted((frozenset(g) for g in groups.values()), key=lambda g: sorted(g)))


def infer_leaves(measured: Mapping[str, Sequence[Measurement]], cut_us: float | None = None) -> LeafGuess:
    """Connected components of the leaf-like round trips (union-find, near O(pairs)); leaf-like is
    below the widest gap, or below `cut_us` when given (the tree's leaf tier cut, to check the
    tree's leaves rather than guess them). One transport's rows only (the main one): a cut between
    RDMA and UDP round trips is no leaf boundary."""
    answered = {
        a: [(m.peer, m.p50_us) for m in ms[:MAX_MEASUREMENTS] if m.loss_percent < 100]
        for a, ms in main_transport(measured).items()
    }
    nodes = set(measured)
    for rows in answered.values():
        nodes.update([b for b, _ in rows])
    values = [us for rows in answered.values() for _, us in rows]
    if not values:
        return LeafGuess(tuple(frozenset({n}) for n in sorted(nodes)), 0.0, 1.0, 0.0)
    cut, gap = _widest_gap(values) if cut_us is None else (cut_us, _gap_at(values, cut_us))
    joined = {a: [b for b, us in rows if us < cut] for a, rows in answered.items()}
    linked = {a for a, peers in joined.items() if peers}.union(*joined.values())
    return LeafGuess(_components(nodes, joined), cut, gap, len(linked) / len(nodes))


def leaf_cut(tiers: Mapping[int, int]) -> float | None:
    """The p50 that parts leaf-like from spine-like round trips in this tier profile (None: the
    profile has no leaf tier or nothing above it)."""
    return tier_cut(tiers, 1)
