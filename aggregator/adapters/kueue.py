"""Kueue's Topology objects over the shared client: `kueue_topology.TopologyStore` for the aggregator.

An object that is not there answers None; a resource the API server does not serve at all (Kueue
not installed: a 404 without a Kubernetes Status, or with a reason other than NotFound) raises
ApiError(404), which `TopologyKeeper` takes as "Kueue is absent" and asks again rarely.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.common.adapters.kube import KubeClient, Resource
from agent.common.api_error import ApiError

TOPOLOGIES = Resource("kueue.x-k8s.io", "v1beta2", "topologies", "Topology")
FIELD_MANAGER = "hypertopo-aggregator"


class TopologyClient:
    resource = TOPOLOGIES  # KAI's client names its own (aggregator.adapters.kai)

    def __init__(self, kube: KubeClient):
        self.kube = kube

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.get(self.resource, name)
        except ApiError as exc:
            if exc.status == 404 and exc.reason == "NotFound":  # a Status: the object, not the API
                return None
            raise

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.kube.create(self.resource, obj, field_manager=FIELD_MANAGER)

    def delete(self, name: str, *, uid: str) -> None:
        """DELETE with a UID precondition: never the object someone created meanwhile."""
        self.kube.delete(self.resource, name, uid=uid or None)
