"""The aggregator's stores over the shared client (`agent.common.adapters.kube`): HyperNodes, its Lease
and Node marks, each the small protocol its pure user declares (`reconcile.HyperNodeStore`,
`leader.LeaseStore`, `node_marks.NodeStore`), so those stay testable without an API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.common.adapters.kube import (
    HYPERNODES,
    LEASES,
    NODES,
    NODETOPOLOGIES,
    PODS,
    KubeClient,
    Resource,
    WatchEvent,
    connect,
)

__all__ = ["HYPERNODES", "LEASES", "NODES", "NODETOPOLOGIES", "PODS", "HyperNodeClient", "KubeClient",
           "LeaseClient", "NodeClient", "Resource", "WatchEvent", "connect"]


class HyperNodeClient:
    """`reconcile.HyperNodeStore` over the API server: POST to create, server-side apply (force,
    field manager `hypertopo-aggregator`) for spec and for `/status`."""

    def __init__(self, kube: KubeClient, *, field_manager: str = "hypertopo-aggregator"):
        self.kube = kube
        self.field_manager = field_manager

    def get(self, name: str) -> dict[str, Any]:
        return self.kube.get(HYPERNODES, name)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(HYPERNODES, obj, field_manager=self.field_manager)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.apply(HYPERNODES, obj, field_manager=self.field_manager)

    def apply_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.apply(HYPERNODES, obj, field_manager=self.field_manager, subresource="status")

    def delete(self, name: str, *, resource_version: str) -> None:
        self.kube.delete(HYPERNODES, name, resource_version=resource_version)


class LeaseClient:
    """`leader.LeaseStore` for one Lease: replace is a PUT, so its resourceVersion is a precondition."""

    def __init__(self, kube: KubeClient, *, namespace: str, name: str, field_manager: str = "hypertopo-aggregator"):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.field_manager = field_manager

    def get(self) -> dict[str, Any]:
        return self.kube.get(LEASES, self.name, namespace=self.namespace)

    def create(self, lease: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(LEASES, lease, field_manager=self.field_manager, namespace=self.namespace)

    def replace(self, lease: dict[str, Any]) -> dict[str, Any]:
        return self.kube.replace(LEASES, lease, field_manager=self.field_manager, namespace=self.namespace)


class NodeClient:
    """`node_marks.NodeStore`: labels by server-side apply under their own field manager, taints by
    merge patch guarded by resourceVersion (the taint list is atomic; apply would replace it)."""

    def __init__(self, kube: KubeClient, *, label_manager: str, taint_manager: str = "hypertopo-aggregator"):
        self.kube = kube
        self.label_manager = label_manager
        self.taint_manager = taint_manager

    def get(self, name: str) -> dict[str, Any]:
        return self.kube.get(NODES, name)

    def apply_labels(self, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}}
        return self.kube.apply(NODES, body, field_manager=self.label_manager)

    def patch_taints(self, name: str, taints: list[dict[str, Any]], *, resource_version: str) -> dict[str, Any]:
        patch = {"metadata": {"resourceVersion": resource_version}, "spec": {"taints": taints}}
        return self.kube.merge_patch(NODES, name, patch, field_manager=self.taint_manager)

    def apply_annotations(self, name: str, annotations: Mapping[str, str], *, field_manager: str) -> dict[str, Any]:
        """Server-side apply of these annotations alone under `field_manager` ({} drops its own)."""
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": dict(annotations)}}
        return self.kube.apply(NODES, body, field_manager=field_manager)
