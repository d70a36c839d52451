"""The cluster view the fabric measuring loop needs, from the API server: the HyperNode tree and
every node's published probe address (NodeTopology `spec.probeAddress`).

Why a LIST each round rather than a watch: a round runs every few minutes, and the NodeTopology
pages are slimmed to two fields as they arrive (`transform`), so an agent never holds other nodes'
reports. The cost (two paged LISTs per node per round) is in the README's "Measured fabric"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.adapters.kube import HYPERNODES, NODETOPOLOGIES, KubeClient
from agent.fabric_measure import ClusterView
from agent.measure_plan import domains_from_hypernodes


def _slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec, meta = obj.get("spec") or {}, obj.get("metadata") or {}
    return {"name": meta.get("name"), "address": spec.get("probeAddress")}


def cluster_view(kube: KubeClient) -> ClusterView:
    hypernodes, _ = kube.list(HYPERNODES)
    reports, _ = kube.list(NODETOPOLOGIES, transform=_slim)
    addresses = {
        r["name"]: r["address"]
        for r in reports
        if isinstance(r["name"], str) and isinstance(r["address"], str)
    }
    return domains_from_hypernodes(hypernodes), addresses
