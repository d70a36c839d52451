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
their p50s grouped by the pair of leaves at their two ends (where two nodes meet in the tree
depends only on their leaves, so it is worked out once per pair of leaves, a few thousand times,
not once per row), and the figures come from those groups; no object is made per row. The
findings look at single rows again only where a group says there is something to find (a leaf
pair above the leaf cut, a pair between leaves below it), so a healthy fabric costs one pass.
tests/measured_fold_reference.py keeps the per-pair fold this replaced; tests compare the two.

Pure: reports and the tree in, plain values out; time and I/O belong to the callers.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from agent.measure_plan import Domain, Tree, build_tree
from agent.report import MAX_MEASUREMENTS, Measurement
from aggregator.graph import FabricFault

LOSS_FINDING_PERCENT = 10.0  # two of twenty probes: one lost datagram is noise, not a finding
# a domain's trains out of (or into) it at under a quarter of its siblings' median rate: trains
# through busy hubs and NICs vary by 3x (195 against 540 Mbit/s between two healthy lab leaves)
SLOW_LINK_RATIO = 0.25
MAX_FINDINGS = 100  # a fabric-wide problem is told by its first hundred pairs, not all
CAUSE = "latency"
CAUSES = {"slow-uplink": "bandwidth", "slow-downlink": "bandwidth"}  # by finding kind; else CAUSE


@dataclass(frozen=True, slots=True)
class DomainFigures:
    inside_us: int | None
    inside_samples: int
    sibling_us: int | None
    sibling_samples: int


@dataclass(frozen=True, slots=True)
class MeasuredFinding:
    node: str  # the node it blames
    kind: str  # "slow-in-leaf" | "other-leaf" | "loss"
    text: str


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


_TRANSPORT = attrgetter("transport")
Place = tuple[str, int, str, str]  # (where two meet, its tier, the child of it each end is in)
Row = tuple[str, str, int, float, str | None, str | None]  # (prober, peer, p50, loss, their leaves)


class _Places:
    """Where two leaves meet in the tree: the lowest common domain ("" when the tree does not
    join them), its tier (0 then) and the child of it each end is in ("" inside one leaf; else the
    pair is a sibling sample of those two children). Worked out once per pair of leaves, and for
    two leaves of as deep chains under different parents, as where their parents meet (a few
    hundred pairs of spines, not tens of thousands of pairs of leaves)."""

    def __init__(self, tree: Tree) -> None:
        self.tier_of = {name: d.tier for name, d in tree.domains.items()}
        self.chains: dict[str | None, tuple[str, ...]] = {name: _chain(tree, name) for name in tree.domains}
        self.up = {name: chain[-2] for name, chain in self.chains.items() if len(chain) > 1}  # the parent
        self.known: dict[tuple[str | None, str | None], Place] = {}

    def __call__(self, mine: str | None, theirs: str | None) -> Place:
        place = self.known.get((mine, theirs))
        if place is None:
            place = self.known[mine, theirs] = self._work_out(mine, theirs)
        return place

    def _work_out(self, mine: str | None, theirs: str | None) -> Place:
        a, b = self.chains.get(mine, ()), self.chains.get(theirs, ())
        if len(a) == len(b) > 1 and a[-2] != b[-2]:  # they part above their parents: where those meet
            return self(a[-2], b[-2])
        meet, a_child, b_child = _meet(a, b)
        return meet, self.tier_of[meet] if meet else 0, a_child, b_child


def _chain(tree: Tree, name: str) -> tuple[str, ...]:
    """A domain's chain of domains from the root down to it."""
    chain: list[str] = []
    here: str | None = name
    while here is not None and here not in chain:
        chain.append(here)
        here = tree.parent.get(here)
    return tuple(reversed(chain))


def _meet(mine: tuple[str, ...], theirs: tuple[str, ...]) -> tuple[str, str, str]:
    """(lowest common domain, the child of it each chain goes on to): chains from the root down."""
    meet = ""
    for x, y in zip(mine, theirs, strict=False):
        if x != y:
            return meet, x, y
        meet = x
    return meet, "", ""


@dataclass(slots=True)
class _Rows:
    """One transport's rows (each node's first MAX_MEASUREMENTS), read once: the p50s of the
    answered ones (loss under 100 %) grouped by where the two ends meet, and the few rows a
    finding or a train needs one by one, in the order the reports give them."""

    places: _Places
    lost: int = 0  # rows with no answer (loss 100 % or not a number)
    by_place: dict[Place, list[int]] = field(default_factory=dict)
    # routes to by_place's lists, so a row costs a look-up or three: a pair of leaves -> its list,
    # and for leaves of as deep chains under different parents, the pair of parents -> theirs
    by_leaves: dict[str | None, dict[str | None, list[int]]] = field(default_factory=dict)
    by_parents: dict[str | None, dict[str | None, list[int]]] = field(default_factory=dict)
    odd: list[tuple[str | None, str | None, int]] = field(default_factory=list)  # loss not a number
    lossy: list[tuple[str, str, float]] = field(default_factory=list)  # loss >= LOSS_FINDING_PERCENT
    trains: list[tuple[str | None, str | None, int]] = field(default_factory=list)  # (leaves, Mbit/s)

    @property
    def count(self) -> int:
        return sum(map(len, self.by_place.values())) + self.lost

    def route(self, mine: str | None, theirs: str | None) -> list[int]:
        """The list a pair of leaves' p50s go into (its place's), remembered for the next row."""
        chains = self.places.chains
        a, b = chains.get(mine, ()), chains.get(theirs, ())
        if len(a) == len(b) > 1 and a[-2] != b[-2]:  # where their parents meet: any leaves under them
            into = self._list(self.places(a[-2], b[-2]))
            self.by_parents.setdefault(a[-2], {})[b[-2]] = into
        else:
            into = self._list(self.places(mine, theirs))
            self.by_leaves.setdefault(mine, {})[theirs] = into
        return into

    def _list(self, place: Place) -> list[int]:
        into = self.by_place.get(place)
        if into is None:
            into = self.by_place[place] = []
        return into

    def note(self, node: str, m: Measurement, mine: str | None, theirs: str | None) -> None:
        """A row lossy enough to be a finding, or unanswered."""
        loss = m.loss_percent
        if not loss < 100:
            self.lost += 1
            if loss != loss:  # NaN (a file may say .nan): in the domain figures, as it always was
                self.odd.append((mine, theirs, m.p50_us))
        if loss >= LOSS_FINDING_PERCENT:
            self.lossy.append((node, m.peer, loss))


def _read(
    places: _Places, leaf_of: Mapping[str, str], measured: Mapping[str, Sequence[Measurement]]
) -> dict[str, _Rows]:
    """Every row into its transport's _Rows: the one pass over all rows a fold makes."""
    split: dict[str, _Rows] = {}
    rows, inner, across, transport = _Rows(places), {}, {}, None
    leaf, up = leaf_of.get, places.up.get
    for node, ms in measured.items():
        mine, transport = leaf(node), None
        for m in ms[:MAX_MEASUREMENTS]:
            if m.transport != transport:  # a node's rows are mostly of one transport
                transport = m.transport
                rows = split.get(transport) or split.setdefault(transport, _Rows(places))
                inner = rows.by_leaves.setdefault(mine, {})
                across = rows.by_parents.setdefault(up(mine), {})
            theirs = leaf(m.peer)
            if m.loss_percent < LOSS_FINDING_PERCENT:
                (inner.get(theirs) or across.get(up(theirs)) or rows.route(mine, theirs)).append(m.p50_us)
            else:
                rows.note(node, m, mine, theirs)
                if m.loss_percent < 100:
                    (inner.get(theirs) or across.get(up(theirs)) or rows.route(mine, theirs)).append(m.p50_us)
            if m.bandwidth_mbps:
                rows.trains.append((mine, theirs, m.bandwidth_mbps))
    return split


def _each(
    leaf_of: Mapping[str, str], measured: Mapping[str, Sequence[Measurement]], transport: str
) -> Iterator[Row]:
    """One transport's rows one by one, in the reports' order: for the findings that need them."""
    for a, ms in measured.items():
        mine = leaf_of.get(a)
        for m in ms[:MAX_MEASUREMENTS]:
            if m.transport == transport:
                yield a, m.peer, m.p50_us, m.loss_percent, mine, leaf_of.get(m.peer)


class _Replay:
    """One transport's rows one by one (`_each`), as often as a finding asks."""

    def __init__(
        self, leaf_of: Mapping[str, str], measured: Mapping[str, Sequence[Measurement]], transport: str
    ):
        self.leaf_of, self.measured, self.transport = leaf_of, measured, transport

    def __iter__(self) -> Iterator[Row]:
        return _each(self.leaf_of, self.measured, self.transport)


@dataclass
class _Judged:
    """One transport's rows: grouped (`rows`) and one by one (`each`)."""

    tree: Tree
    rows: _Rows
    each: Iterable[Row]  # re-iterable

    @property
    def places(self) -> _Places:
        return self.rows.places

    def figures(self) -> dict[str, DomainFigures]:
        inside: dict[str, list[int]] = defaultdict(list)
        towards: dict[str, list[int]] = defaultdict(list)
        odd = [(self.places(a, b), [us]) for a, b, us in self.rows.odd]
        for (meet, _, a_child, b_child), us in [*self.rows.by_place.items(), *odd]:
            if meet and us:
                inside[meet] += us
                if a_child:  # the child of `meet` each end is in has a sibling sample
                    towards[a_child] += us
                    towards[b_child] += us
        return {
            name: DomainFigures(
                _median(inside[name]), len(inside[name]), _median(towards[name]), len(towards[name])
            )
            for name in self.tree.domains
            if inside.get(name) or towards.get(name)
        }

    def tiers(self) -> dict[int, int]:
        by_tier: dict[int, list[int]] = defaultdict(list)
        for (_, tier, _, _), us in self.rows.by_place.items():
            if tier:
                by_tier[tier] += us
        return {tier: round(statistics.median(v)) for tier, v in sorted(by_tier.items()) if v}

    def places_where(self, keep: Callable[[int, list[int]], bool]) -> set[Place]:
        """The places whose group `keep(tier, p50s)` says to look into."""
        return {place for place, us in self.rows.by_place.items() if us and keep(place[1], us)}


def _median(values: Sequence[int]) -> int | None:
    return round(statistics.median(values)) if values else None


def _cut(tiers: Mapping[int, int], low: int) -> float | None:
    """Halfway (geometrically) between a tier's profile and the next measured tier's."""
    above = [t for t in tiers if t > low]
    if low not in tiers or not above:
        return None
    return math.sqrt(max(tiers[low], 1) * max(tiers[min(above)], 1))


def _excess(j: _Judged, tiers: Mapping[int, int], nodes: set[str]) -> dict[str, float]:
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


def _slow_in_leaf(j: _Judged, tiers: Mapping[int, int], room: int) -> list[MeasuredFinding]:
    """Pairs inside one leaf above the leaf cut (the first `room`), each blamed on the end that is
    slower towards everyone."""
    cut = _cut(tiers, 1)
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


def _per_node_leaf_latency(j: _Judged, cut: float) -> dict[str, dict[str, list[int]]]:
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


def _other_leaf(j: _Judged, tiers: Mapping[int, int], room: int) -> list[MeasuredFinding]:
    cut = _cut(tiers, 1)
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


def _lossy(j: _Judged, room: int) -> list[MeasuredFinding]:
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


def _slow_links(j: _Judged) -> list[MeasuredFinding]:
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


def _findings(j: _Judged, tiers: Mapping[int, int], room: int) -> list[MeasuredFinding]:
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


def main_transport(measured: Mapping[str, Sequence[Measurement]]) -> Mapping[str, Sequence[Measurement]]:
    """The rows of the transport that measured the most pairs (ties: by name; each node's first
    MAX_MEASUREMENTS), for the figures a domain shows and for leaf inference, which need one scale.

    Why per transport: an RDMA round trip skips both kernels' stacks (a few us) where a UDP one
    crosses them (tens of us), and an ib_write_bw rate is not a UDP train's. Compared in one
    profile, UDP rows of a leaf would "measure like the spine" of the RDMA rows."""
    counts: Counter[str] = Counter()
    for ms in measured.values():
        counts.update(map(_TRANSPORT, ms[:MAX_MEASUREMENTS]))
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
    places = _Places(tree)
    split = _read(places, tree.leaf_of, measured)
    judged = {t: _Judged(tree, rows, _Replay(tree.leaf_of, measured, t)) for t, rows in sorted(split.items())}
    if not judged:
        return Fold({}, {}, ())
    if len(judged) == 1:
        (j,) = judged.values()
        tiers = j.tiers()
        return Fold(j.figures(), tiers, tuple(_findings(j, tiers, MAX_FINDINGS)))
    findings: list[MeasuredFinding] = []
    for transport, j in judged.items():
        findings += [
            MeasuredFinding(f.node, f.kind, f"{f.text} ({transport})")
            for f in _findings(j, j.tiers(), MAX_FINDINGS - len(findings))
        ]
    main = judged[max(split, key=lambda t: (split[t].count, t))]
    return Fold(main.figures(), main.tiers(), tuple(findings))


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
    return _cut(tiers, 1)
