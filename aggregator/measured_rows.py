"""The rows of a fold of measured round trips (aggregator.measured), read once and grouped by
where their two ends meet in the tree.

Why grouped: at 10,000 nodes a fold reads about 70,000 rows, and the figures it makes (medians
per domain, per tier) depend only on where each pair meets, which depends only on the two nodes'
leaves. So a row costs one or three dictionary look-ups and an append to its place's list; where
two leaves meet is worked out once per pair of leaves, and rows between leaves under different
parents (most rows between leaves) go straight to their parents' pair, so that work is done for
a few hundred pairs of spines, not tens of thousands of pairs of leaves. The few rows a finding or
a train needs one by one are kept as they come, or read again (`Replay`) only when a group says
there is something to find.

Pure: plain values in and out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from agent.common.report import MAX_MEASUREMENTS, Measurement
from agent.measure_plan import Tree

LOSS_FINDING_PERCENT = 10.0  # two of twenty probes: one lost datagram is noise, not a finding


TRANSPORT = attrgetter("transport")
Place = tuple[str, int, str, str]  # (where two meet, its tier, the child of it each end is in)
Row = tuple[str, str, int, float, str | None, str | None]  # (prober, peer, p50, loss, their leaves)


class Places:
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
class Rows:
    """One transport's rows (each node's first MAX_MEASUREMENTS), read once: the p50s of the
    answered ones (loss under 100 %) grouped by where the two ends meet, and the few rows a
    finding or a train needs one by one, in the order the reports give them."""

    places: Places
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


def read(
    places: Places, leaf_of: Mapping[str, str], measured: Mapping[str, Sequence[Measurement]]
) -> dict[str, Rows]:
    """Every row into its transport's Rows: the one pass over all rows a fold makes."""
    split: dict[str, Rows] = {}
    rows, inner, across, transport = Rows(places), {}, {}, None
    leaf, up = leaf_of.get, places.up.get
    for node, ms in measured.items():
        mine, transport = leaf(node), None
        for m in ms[:MAX_MEASUREMENTS]:
            if m.transport != transport:  # a node's rows are mostly of one transport
                transport = m.transport
                rows = split.get(transport) or split.setdefault(transport, Rows(places))
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


def each_row(
    leaf_of: Mapping[str, str], measured: Mapping[str, Sequence[Measurement]], transport: str
) -> Iterator[Row]:
    """One transport's rows one by one, in the reports' order: for the findings that need them."""
    for a, ms in measured.items():
        mine = leaf_of.get(a)
        for m in ms[:MAX_MEASUREMENTS]:
            if m.transport == transport:
                yield a, m.peer, m.p50_us, m.loss_percent, mine, leaf_of.get(m.peer)


class Replay:
    """One transport's rows one by one (`_each`), as often as a finding asks."""

    def __init__(
        self, leaf_of: Mapping[str, str], measured: Mapping[str, Sequence[Measurement]], transport: str
    ):
        self.leaf_of, self.measured, self.transport = leaf_of, measured, transport

    def __iter__(self) -> Iterator[Row]:
        return each_row(self.leaf_of, self.measured, self.transport)


@dataclass
class Judged:
    """One transport's rows: grouped (`rows`) and one by one (`each`)."""

    tree: Tree
    rows: Rows
    each: Iterable[Row]  # re-iterable

    @property
    def places(self) -> Places:
        return self.rows.places

    def places_where(self, keep: Callable[[int, list[int]], bool]) -> set[Place]:
        """The places whose group `keep(tier, p50s)` says to look into."""
        return {place for place, us in self.rows.by_place.items() if us and keep(place[1], us)}
