"""Free capacity per node with per-domain aggregates kept incrementally, so a decision reads only
the domains a gang can use instead of counting every node of the cluster.

Why: `capacity.measure` counts, once per decision, how many of the gang's pods every node, leaf
and HyperNode holds: a pass over all nodes (O(cluster)) even for a single pod. `ShapeIndex` keeps
that count for one pod shape per node, per leaf and per HyperNode (and the cluster), a histogram
of leaf counts per domain, every tier's domains sorted by count and the leaves sorted by name per
count. A bind, a release or a node change updates them along one ancestor chain (O(depth x log)),
and a decision reads them.

Which shapes: most gangs are bound by GPUs, and a node's count of g-GPU pods is then `free GPUs
// g` whatever the pod's CPU and memory, so one index per GPU size serves them all (`shape`).
Every other single-shape gang (CPU-only pods, or GPU pods whose CPU, memory or pod slots run out
first) gets an index of its exact request (`request_shape`), counted with the counting core's own
arithmetic (`capacity.count_fits`). A cluster may see many distinct requests, so those indexes
are brought up to date only when a decision asks for them: a change notes the node (and what it
had) against each, and the next use replays the noted nodes. The most recently used
`REQUEST_SHAPES` are kept, and one that falls further behind than a rebuild would cost is let go:
a bind pays the GPU indexes' upkeep plus a note per request index, however many there are.

`FreeIndex` is a `Mapping[str, Resources]` (node -> free), so every caller that took a free-map
takes it unchanged; `core.place` notices it and reads the aggregates, which give exactly the
answer the full count gives, and counts the classic way where they cannot (mixed shapes, running
pods, preferred nodes).

Held nodes (`hold`): nodes most decisions must not use, such as other gangs' reserved spares,
count no pod in the aggregates while the mapping still gives their real free resources. A
decision that excluded them one by one took each out of the aggregates and put it back (hundreds
of spares: a hundred milliseconds per decision); held, they cost nothing per decision, and the
one that may use some of them shows those for its length (`revealed`). The callers still name
them in `excluded_nodes`, so the counting path, which reads the mapping, leaves them out too. Pure.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

from aggregator.placement.core.capacity import count_fits, leaf_key
from aggregator.placement.core.gang import ROOT
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology

__all__ = ["REQUEST_SHAPES", "FreeIndex", "ShapeIndex"]

REQUEST_SHAPES = 16  # exact-request indexes kept (most recently used); each costs a note per change


def gpu_count(gpus: int) -> Callable[[Resources | None], int]:
    """A node's count of `gpus`-GPU pods by GPUs alone (what a GPU-bound gang's count is)."""
    return lambda free: max(free.gpus, 0) // gpus if free is not None else 0


def request_count(request: Resources) -> Callable[[Resources | None], int]:
    """A node's count of pods asking exactly `request`, as the counting core counts it."""
    return lambda free: count_fits(free, request) if free is not None else 0


class ShapeIndex:
    """Counts of one pod shape per node, leaf and domain, kept as nodes change. `count` gives a
    node's count from its free resources (`gpu_count`, `request_count`)."""

    def __init__(self, topology: Topology, count: Callable[[Resources | None], int], free: Mapping[str, Resources],
                 usable: Mapping[str, str]) -> None:
        self.topology, self.count = topology, count
        self.node_cap: dict[str, int] = {}
        self.leaf_cap: dict[str, int] = {}
        for node, leaf in usable.items():
            cap = count(free[node])
            if cap > 0:
                self.node_cap[node] = cap
                self.leaf_cap[leaf] = self.leaf_cap.get(leaf, 0) + cap
        self.domain_cap: dict[str, int] = {ROOT: 0}
        self.leaf_hist: dict[str, dict[int, int]] = {ROOT: {}}  # domain -> leaf count -> leaves
        self.leaves_by_cap: dict[int, list[str]] = {}  # leaf count -> leaves, sorted by name
        for leaf, cap in self.leaf_cap.items():
            self.leaves_by_cap.setdefault(cap, []).append(leaf)
            for up in (*topology.chains.get(leaf, ()), ROOT):
                self.domain_cap[up] = self.domain_cap.get(up, 0) + cap
                hist = self.leaf_hist.setdefault(up, {})
                hist[cap] = hist.get(cap, 0) + 1
        for names in self.leaves_by_cap.values():
            names.sort()
        self.by_tier: dict[int, list[tuple[int, str]]] = {}  # tier -> (count, domain), sorted
        for domain, cap in self.domain_cap.items():
            if domain != ROOT and cap > 0:
                self.by_tier.setdefault(topology.domains[domain].tier, []).append((cap, domain))
        for ranked in self.by_tier.values():
            ranked.sort()

    def update(self, node: str, leaf: str, old: int, new: int) -> None:
        """A usable node's count went from `old` to `new` pods."""
        delta = new - old
        if delta == 0:
            return
        cap = self.node_cap.get(node, 0) + delta
        _set_positive(self.node_cap, node, cap)
        before = self.leaf_cap.get(leaf, 0)
        after = before + delta
        _set_positive(self.leaf_cap, leaf, after)
        _move(self.leaves_by_cap, leaf, before, after)
        for up in (*self.topology.chains.get(leaf, ()), ROOT):
            hist = self.leaf_hist.setdefault(up, {})
            if before > 0:
                _set_positive(hist, before, hist[before] - 1)
            if after > 0:
                hist[after] = hist.get(after, 0) + 1
            had = self.domain_cap.get(up, 0)
            self.domain_cap[up] = had + delta
            if up != ROOT:
                ranked = self.by_tier.setdefault(self.topology.domains[up].tier, [])
                if had > 0:
                    del ranked[bisect_left(ranked, (had, up))]
                if had + delta > 0:
                    insort(ranked, (had + delta, up))

    def leaves_of(self, domain: str, cap: int) -> Iterator[str]:
        """Leaves below `domain` whose count is `cap`, by name (what `core.cover` orders by)."""
        if domain == ROOT:
            return iter(self.leaves_by_cap.get(cap, ()))
        below = self.topology.leaves_below[domain]
        if len(below) <= 4 * len(self.leaves_by_cap.get(cap, ())):
            return (leaf for leaf in below if self.leaf_cap.get(leaf) == cap)
        chains = self.topology.chains
        return (leaf for leaf in self.leaves_by_cap.get(cap, ()) if domain in chains.get(leaf, ()))

    def nodes_of(self, leaf: str) -> list[str]:
        """The leaf's nodes that hold a pod, by name."""
        if leaf in self.topology.domains:
            return [n for n in self.topology.domains[leaf].nodes if n in self.node_cap]
        return [leaf.split("/", 1)[1]]


def _set_positive(table: dict[Any, int], key: Any, value: int) -> None:
    if value > 0:
        table[key] = value
    else:
        table.pop(key, None)


def _move(lists: dict[int, list[str]], name: str, before: int, after: int) -> None:
    if before > 0:
        names = lists[before]
        del names[bisect_left(names, name)]
    if after > 0:
        insort(lists.setdefault(after, []), name)


_SCALE = 840  # every GPU count from 1 to 8 divides it: amount * 840 / gpus is then an exact int


def _ratio(amount: int, gpus: int) -> int | Fraction:
    """`amount / gpus`, scaled by `_SCALE`, exactly: an int for the usual GPU counts (cheap to
    compare and to keep in a heap), a Fraction for the others (ints and Fractions compare exactly)."""
    scaled = amount * _SCALE
    return scaled // gpus if _SCALE % gpus == 0 else Fraction(scaled, gpus)


class _MinRatio:
    """The smallest `amount / GPUs` (scaled, `_ratio`) over nodes with GPUs, kept with a lazily
    cleaned heap."""

    def __init__(self, start: Iterable[tuple[str, int, int]] = ()) -> None:
        """`start`: (node, amount, gpus) of every node at first, put in one heapify."""
        self.version: dict[str, int] = {}
        self.heap: list[tuple[int | Fraction, int, str]] = []
        for node, amount, gpus in start:
            self.version[node] = 1
            if gpus > 0:
                self.heap.append((_ratio(amount, gpus), 1, node))
        heapq.heapify(self.heap)

    def put(self, node: str, amount: int | None, gpus: int) -> None:
        version = self.version.get(node, 0) + 1
        self.version[node] = version
        if amount is not None and gpus > 0:
            heapq.heappush(self.heap, (_ratio(amount, gpus), version, node))
        if len(self.heap) > 4 * len(self.version) + 1024:
            self.heap = [e for e in self.heap if self.version.get(e[2]) == e[1]]
            heapq.heapify(self.heap)

    def least(self) -> int | Fraction | None:
        while self.heap and self.version.get(self.heap[0][2]) != self.heap[0][1]:
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else None


class FreeIndex(Mapping[str, Resources]):
    """Free resources per node for one `Topology`, with the aggregates `core.place` reads."""

    def __init__(self, topology: Topology, free: Mapping[str, Resources], held: Iterable[str] = ()) -> None:
        self.topology = topology
        self._free: dict[str, Resources] = dict(free)
        self._held: set[str] = set(held)  # counted as holding no pod in the aggregates (`hold`)
        # node -> its leaf (or pseudo-leaf), for nodes a placement may use at all (leaf usable)
        self._usable = {n: leaf_key(topology, n) for n in self._free if topology.node_usable(n)}
        self._shapes: dict[int, ShapeIndex] = {}  # GPUs per pod -> the GPU-bound index
        self._requests: OrderedDict[Resources, ShapeIndex] = OrderedDict()  # least recently used first
        # request -> node -> (its leaf, its free resources when that index last counted it)
        self._behind: dict[Resources, dict[str, tuple[str, Resources | None]]] = {}
        usable = [(node, self._free[node]) for node in self._usable]
        self._ratios = (
            _MinRatio((node, free.cpu_milli, free.gpus) for node, free in usable),
            _MinRatio((node, free.memory, free.gpus) for node, free in usable),
            _MinRatio((node, free.pods, free.gpus) for node, free in usable),
        )

    def __getitem__(self, node: str) -> Resources:
        return self._free[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._free)

    def __len__(self) -> int:
        return len(self._free)

    # The Mapping mixins go through __getitem__ per key: the counting core walks every node's free
    # capacity once per decision (CPU-only gangs take that path), so these read the dict directly.
    def items(self) -> ItemsView[str, Resources]:
        return self._free.items()

    def keys(self) -> KeysView[str]:
        return self._free.keys()

    def values(self) -> ValuesView[Resources]:
        return self._free.values()

    def __contains__(self, node: object) -> bool:
        return node in self._free

    def get(self, node: str, default: Any = None) -> Any:
        return self._free.get(node, default)

    def leaf_of(self, node: str) -> str:
        """The leaf (or pseudo-leaf) of a node a placement may use."""
        return self._usable[node]

    def set(self, node: str, free: Resources | None) -> None:
        """A node's free resources changed (None: the node is gone)."""
        old = self._free.get(node)
        if free is None:
            self._free.pop(node, None)
        else:
            self._free[node] = free
        leaf = self._usable.get(node)
        if leaf is None and free is not None and old is None and self.topology.node_usable(node):
            leaf = self._usable[node] = leaf_key(self.topology, node)
        if leaf is None:
            return
        if free is None:
            del self._usable[node]
        self._track(node, free)
        if node not in self._held:
            self._shift(node, leaf, old, free)

    def _shift(self, node: str, leaf: str, before: Resources | None, after: Resources | None) -> None:
        """The aggregates learn that a usable node's counted resources went from `before` to `after`."""
        for shape in self._shapes.values():
            count = shape.count
            shape.update(node, leaf, count(before), count(after))
        too_far = None
        for request, behind in self._behind.items():
            if node not in behind:
                behind[node] = (leaf, before)
                if len(behind) > len(self._usable) // 4 + 64:  # replaying would cost more than a rebuild
                    too_far = [*(too_far or ()), request]
        for request in too_far or ():
            del self._requests[request], self._behind[request]

    def _counted(self, node: str) -> Resources | None:
        """What the aggregates count for a node: nothing while it is held."""
        return None if node in self._held else self._free.get(node)

    def hold(self, nodes: Iterable[str]) -> None:
        """These nodes count no pod in the aggregates until `release` (the mapping still gives their
        free resources): O(depth x log) per node, once, instead of per decision."""
        for node in nodes:
            if node not in self._held:
                self._held.add(node)
                if (leaf := self._usable.get(node)) is not None:
                    self._shift(node, leaf, self._free.get(node), None)

    def release(self, nodes: Iterable[str]) -> None:
        """Held nodes count again."""
        for node in nodes:
            if node in self._held:
                self._held.discard(node)
                if (leaf := self._usable.get(node)) is not None:
                    self._shift(node, leaf, None, self._free.get(node))

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def unheld(self, nodes: frozenset[str]) -> frozenset[str]:
        """`nodes` less the held ones (a set difference, not a loop in Python)."""
        return nodes - self._held if self._held else nodes

    @contextmanager
    def revealed(self, nodes: Iterable[str]) -> Iterator[None]:
        """The held ones of `nodes` counted for the length of one decision (the gang's own spares),
        held again after it."""
        shown = [n for n in nodes if n in self._held]
        self.release(shown)
        try:
            yield
        finally:
            self.hold(shown)

    def _usable_counted(self) -> Mapping[str, str]:
        """The usable nodes a new shape index counts (node -> leaf): held ones left out."""
        if not self._held:
            return self._usable
        return {n: leaf for n, leaf in self._usable.items() if n not in self._held}

    def _track(self, node: str, free: Resources | None) -> None:
        gpus = free.gpus if free is not None else 0
        cpu, memory, pods = self._ratios
        cpu.put(node, free.cpu_milli if free else None, gpus)
        memory.put(node, free.memory if free else None, gpus)
        pods.put(node, free.pods if free else None, gpus)

    def gpu_bound(self, request: Resources) -> bool:
        """True when every node's count of `request` pods is its free GPUs // request.gpus: CPU,
        memory and pod slots never bind first. Checked by the smallest CPU, memory and slots per
        free GPU over all nodes (enough, and cheap to keep)."""
        if request.gpus <= 0:
            return False
        for ratios, want in zip(self._ratios, (request.cpu_milli, request.memory, request.pods), strict=True):
            least = ratios.least()
            if want > 0 and least is not None and _ratio(want, request.gpus) > least:
                return False
        return True

    def shape(self, gpus: int) -> ShapeIndex:
        """The aggregates for g-GPU pods, built on first use and kept from then on."""
        found = self._shapes.get(gpus)
        if found is None:
            found = self._shapes[gpus] = ShapeIndex(self.topology, gpu_count(gpus), self._free, self._usable_counted())
        return found

    def request_shape(self, request: Resources) -> ShapeIndex:
        """The aggregates for pods asking exactly `request`, built on first use (a pass over the
        nodes, as one counting decision) and kept while among the `REQUEST_SHAPES` most recently
        used."""
        found = self._requests.get(request)
        if found is not None:
            self._requests.move_to_end(request)
            behind, count = self._behind[request], found.count
            for node, (leaf, was) in behind.items():
                found.update(node, leaf, count(was), count(self._counted(node)))
            behind.clear()
            return found
        found = self._requests[request] = ShapeIndex(self.topology, request_count(request), self._free,
                                                     self._usable_counted())
        self._behind[request] = {}
        while len(self._requests) > REQUEST_SHAPES:
            dropped, _ = self._requests.popitem(last=False)
            del self._behind[dropped]
        return found

    def request_shapes(self) -> list[Resources]:
        """The requests with an index kept now, least recently used first."""
        return list(self._requests)
