"""NVIDIA KAI Scheduler's `Topology` for the labels hypertopo writes on Nodes, kept by the aggregator.

KAI's topology-aware scheduling reads a cluster-scoped `Topology` (`kai.scheduler/v1alpha1`, levels
of node labels broadest first); a workload names it in the annotation `kai.scheduler/topology` and
a level in `kai.scheduler/topology-required-placement` or `-preferred-placement`. KAI derived the
type from Kueue's and kept its rules (CRD of KAI v0.12: 1 to 16 levels, unique, the host name only
last, levels immutable), so the levels are Kueue's (`kueue_topology.levels_of`: one
`hypertopo.io/<tierName>` per tier, highest tier first, then `kubernetes.io/hostname`) and the
keeper is Kueue's with KAI's object: a change of tiers deletes and recreates the Topology, and one
of the same name without `app.kubernetes.io/managed-by: hypertopo` is left alone with a warning.
Where KAI is not installed (the resource is not served) that is logged once and asked again every
ABSENT_RECHECK_SECONDS.

Pure; the API adapter is `aggregator.adapters.kai`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aggregator.live import kueue_topology
from aggregator.live.kueue_topology import DEFAULT_NAME, TopologyKeeper

API_VERSION = "kai.scheduler/v1alpha1"


def topology_object(levels: Iterable[str], name: str = DEFAULT_NAME) -> dict[str, Any]:
    return kueue_topology.topology_object(levels, name, API_VERSION)


class KaiTopologyKeeper(TopologyKeeper):
    """Kueue's keeper (`kueue_topology.TopologyKeeper`) writing KAI's object."""

    owner = "KAI"
    api_version = API_VERSION

    def render(self, levels: tuple[str, ...]) -> dict[str, Any]:
        return topology_object(levels, self.name)
