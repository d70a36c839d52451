"""A cluster model file as a source: a declared switch tree and node blocks.

Where the fabric cannot be discovered (or to check discovery against intent), the model
(agent.cluster_model) declares it: each switch's parent, the leaf each block of nodes is cabled
to, and the NVLink domain annotation. Its links are directed (child -> parent), which settles
tiers that undirected discovered links leave ambiguous (a leaf cabled straight to a core switch).
NVLink domain names are mapped to the clique IDs agents of that model report
(agent.cluster_model.fabric_of), so model and reports agree.
"""

from __future__ import annotations

import argparse
from itertools import groupby

from agent.cluster_model import Block, ClusterModel, fabric_of, load_model
from aggregator.graph import FabricGraph
from aggregator.sources import Cluster, Source


def apply(graph: FabricGraph, model: ClusterModel, *, declare_nodes: bool = True) -> None:
    """Switch tree always; node blocks when `declare_nodes` (else only for nodes already known)."""
    for child, parent in model.parents.items():
        graph.add_uplink(child, parent)
    graph.switches.update(model.switches)
    domains: dict[str, str] = {}
    known = graph.nodes
    # consecutive blocks of the same nodes (a rack, one block per rail) are declared in one go, in
    # order, so a node's NVLink domain is still the first its blocks name
    for run in (list(run) for _, run in groupby(model.blocks, key=_nodes_of)):
        nvlink = None
        for block in run:
            if block.domain:
                if block.domain not in domains:
                    cluster_uuid, clique = fabric_of(block.domain)
                    domains[block.domain] = f"{cluster_uuid}/{clique}"
                nvlink = domains[block.domain]
                break
        nodes = run[0].nodes if declare_nodes else [n for n in run[0].nodes if n in known]
        graph.declare_block(nodes, [block.switch for block in run], nvlink)


def _nodes_of(block: Block) -> tuple[str, ...]:
    return block.nodes


class ModelFile(Source):
    """A cluster model file (`--model`) as a source. Its node blocks declare nodes only where no
    cluster is known (render without Nodes); with a cluster, only the cluster's nodes are placed."""

    name = "model"

    def __init__(self, model: ClusterModel) -> None:
        self.model = model

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        parser.add_argument("--model", metavar="FILE", help="a cluster model file (switch tree + node blocks)")

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> ModelFile | None:
        path = getattr(options, "model", None)
        return cls(load_model(path)) if path else None

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        apply(graph, self.model, declare_nodes=not cluster.node_ready)
