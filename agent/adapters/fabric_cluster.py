"""The cluster view the fabric measuring loop needs, from the API server: the HyperNode tree and
the probe addresses (NodeTopology `spec.probeAddress`) of the few nodes it deals with.

Why not list every NodeTopology each round: at 10,000 nodes that is 10,000 agents each reading
10,000 reports every few minutes, traffic that grows with the square of the cluster, which is
what the probe plan exists to avoid. A node needs the addresses of its ~7 planned peers and ~7
probers only, so they are read one GET each when first needed and kept for `ttl` seconds (an
address changes only when a node is re-addressed); a node without one (not measuring) is asked
again after a round's time. The HyperNodes (one per ~32 nodes) are listed each round: the plan
must follow the tree."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from agent.adapters.kube import HYPERNODES, NODETOPOLOGIES, KubeClient
from agent.api_error import ApiError
from agent.fabric_measure import ClusterView
from agent.measure_plan import domains_from_hypernodes


class ProbeAddresses(Mapping[str, str]):
    """Node name -> probe address, read on first use and kept `ttl` seconds; a node without one
    is asked again after `miss_ttl` (it may be turning measuring on)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        ttl: float = 3600.0,
        miss_ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._kube, self._ttl, self._miss_ttl, self._clock = kube, ttl, miss_ttl, clock
        self._cache: dict[str, tuple[float, str | None]] = {}
        self.reads = 0

    def _lookup(self, node: str) -> str | None:
        now = self._clock()
        hit = self._cache.get(node)
        if hit is None or now - hit[0] > (self._ttl if hit[1] is not None else self._miss_ttl):
            self.reads += 1
            try:
                spec = self._kube.get(NODETOPOLOGIES, node).get("spec") or {}
                address = spec.get("probeAddress")
            except ApiError as exc:  # a missing report is a node without an address; else retry later
                if not exc.not_found:
                    raise
                address = None
            hit = (now, address if isinstance(address, str) else None)
            self._cache[node] = hit
        return hit[1]

    def __getitem__(self, node: str) -> str:
        address = self._lookup(node)
        if address is None:
            raise KeyError(node)
        return address

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, (_, a) in self._cache.items() if a is not None])

    def __len__(self) -> int:
        return sum(1 for _, a in self._cache.values() if a is not None)


def cluster_view(kube: KubeClient, addresses: ProbeAddresses) -> ClusterView:
    hypernodes, _ = kube.list(HYPERNODES)
    return domains_from_hypernodes(hypernodes), addresses
