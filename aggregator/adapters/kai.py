"""KAI Scheduler's Topology objects over the shared client: `kueue_topology.TopologyStore` for the
aggregator's `kai_topology.KaiTopologyKeeper`. Kueue's client with KAI's resource: the same answers
(None for a missing object, ApiError(404) when KAI's CRD is not installed)."""

from __future__ import annotations

from agent.common.adapters.kube import Resource
from aggregator.adapters.kueue import TopologyClient

KAI_TOPOLOGIES = Resource("kai.scheduler", "v1alpha1", "topologies", "Topology")


class KaiTopologyClient(TopologyClient):
    resource = KAI_TOPOLOGIES
