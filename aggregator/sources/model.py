"""A cluster model file as a source: a declared switch tree and node blocks.

Where the fabric cannot be discovered (or to check discovery against intent), the model
(agent.cluster_model) declares it: each switch's parent, the leaf each block of nodes is cabled
to, and the NVLink domain annotation. Its links are directed (child -> parent), which settles
tiers that undirected discovered links leave ambiguous (a leaf cabled straight to a core switch).
NVLink domain names are mapped to the clique IDs agents of that model report
(agent.model_probe.fabric_of), so model and reports agree.
"""

from __future__ import annotations

from agent.cluster_model import ClusterModel
from agent.model_probe import fabric_of
from aggregator.graph import FabricGraph


def apply(graph: FabricGraph, model: ClusterModel, *, declare_nodes: bool = True) -> None:
    """Switch tree always; node blocks when `declare_nodes` (else only for nodes already known)."""
    for child, parent in model.parents.items():
        graph.add_uplink(child, parent)
    graph.switches.update(model.switches)
    domains: dict[str, str] = {}
    for block in model.blocks:
        nvlink = None
        if block.domain:
            if block.domain not in domains:
                cluster_uuid, clique = fabric_of(block.domain)
                domains[block.domain] = f"{cluster_uuid}/{clique}"
            nvlink = domains[block.domain]
        for node in block.nodes:
            if declare_nodes or node in graph.nodes:
                graph.declare(node, block.switch, nvlink)
