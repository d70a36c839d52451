"""The live scheduler's warm spares (`spares`): every live gang's reserved nodes, held out of the
cluster state's shared free index for as long as they are reserved.

Why held and not excluded per decision: a decision must not place a gang on another gang's spare.
Excluding the spares at each decision took every one of them out of the index's aggregates and
put it back (10,240 nodes: 100 ms per decision with 400 spares reserved, 292 ms with 1,000).
Held, a spare is taken out once, when it is reserved, and put back once, when it is taken by its
gang's pod, given up, or its gang ends; a decision pays only for the few spares of its own gang
that it may use (`FreeIndex.revealed`). The simulator holds its spares out the same way.

What a reservation is follows `spares.reservations`: what the PodGroups say (`hypertopo.io/spares`,
so a restarted scheduler holds the same nodes), with what this scheduler decided and has not seen
written back yet taking precedence; a gang whose PodGroup is gone or ended holds nothing. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from aggregator.placement.core import spares
from aggregator.placement.live.state import ClusterState, PodKey

__all__ = ["ReservedSpares"]


class ReservedSpares(Mapping[PodKey, tuple[str, ...]]):
    """Gang -> its reserved spares (`spares.Reservations`), each node held out of `state`'s free
    index while some gang reserves it."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._by_gang: dict[PodKey, tuple[str, ...]] = {}
        self._holders: dict[str, int] = {}  # node -> how many gangs reserve it (a hand-edited annotation may repeat one)
        self._fresh: dict[PodKey, tuple[str, ...]] = {}  # decided here, the PodGroup's annotation not seen back yet
        self._nodes: frozenset[str] | None = frozenset()  # every reserved node; None: to be gathered again

    def __getitem__(self, gang: PodKey) -> tuple[str, ...]:
        return self._by_gang[gang]

    def __iter__(self) -> Iterator[PodKey]:
        return iter(self._by_gang)

    def __len__(self) -> int:
        return len(self._by_gang)

    @property
    def nodes(self) -> frozenset[str]:
        """Every reserved node (gathered again only after a reservation changed)."""
        if self._nodes is None:
            self._nodes = frozenset(self._holders)
        return self._nodes

    def others(self, gang: PodKey) -> frozenset[str]:
        """Nodes reserved by gangs other than `gang` (`spares.others`, without a pass over every gang)."""
        own = self._by_gang.get(gang, ())
        if not own:
            return self.nodes
        return self.nodes - {n for n in own if self._holders.get(n) == 1}

    def keep(self, gang: PodKey, nodes: tuple[str, ...]) -> None:
        """A decision's spares for the gang (none: it holds none any more)."""
        self._fresh[gang] = nodes
        self._set(gang, nodes)

    def rebuild(self, podgroups: Mapping[PodKey, Mapping[str, Any]]) -> None:
        """Every gang's reservation again from the PodGroups (one changed), the decided ones first."""
        found = spares.reservations(podgroups, self._fresh)
        self._fresh = {k: v for k, v in self._fresh.items() if k in found}
        for gang in [g for g in self._by_gang if g not in found]:
            self._set(gang, ())
        for gang, nodes in found.items():
            self._set(gang, nodes)

    def _set(self, gang: PodKey, nodes: tuple[str, ...]) -> None:
        before = self._by_gang.get(gang, ())
        if before == nodes:
            return
        if nodes:
            self._by_gang[gang] = nodes
        else:
            self._by_gang.pop(gang, None)
        gone, new = set(before) - set(nodes), set(nodes) - set(before)
        released = [n for n in gone if self._drop(n)]
        held = [n for n in new if self._add(n)]
        self.state.release(released)
        self.state.hold(held)
        self._nodes = None if released or held else self._nodes

    def _add(self, node: str) -> bool:
        """One more gang reserves `node`; True when it was reserved by none before."""
        self._holders[node] = self._holders.get(node, 0) + 1
        return self._holders[node] == 1

    def _drop(self, node: str) -> bool:
        """One gang fewer reserves `node`; True when none does any more."""
        left = self._holders[node] - 1
        if left:
            self._holders[node] = left
            return False
        del self._holders[node]
        return True
