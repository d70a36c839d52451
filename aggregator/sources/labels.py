"""Node-label levels as a source: topology a cluster already writes on its Nodes.

Many clusters label nodes with their place (`topology.kubernetes.io/zone`, a block or rack label
from the provider), the way Kueue's Topology levels name them: an ordered list of label keys,
broadest first. Each level groups nodes by their values for that key and every broader one, so
"rack r1" in zone a and "rack r1" in zone b are different domains. Tier inference places these
domains above what the switch fabric shows (aggregator.tiers.infer).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from aggregator.graph import FabricGraph
from aggregator.sources import Cluster, OptionError, Source


class LabelLevelsError(OptionError):
    """`--label-levels` that cannot be used (a repeated key)."""


def parse_levels(text: str) -> tuple[str, ...]:
    """ "zone,example.com/block" -> ("zone", "example.com/block"); broadest first."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    if len(set(keys)) != len(keys):
        raise LabelLevelsError(f"label levels repeat a key: {text!r}")
    return keys


def apply(graph: FabricGraph, levels: tuple[str, ...], labels: Mapping[str, Mapping[str, str]]) -> None:
    """Label paths for the graph's nodes (labels of nodes the graph does not know are ignored)."""
    graph.set_labels(
        levels, {node: node_labels for node, node_labels in labels.items() if node in graph.nodes}
    )


class LabelLevels(Source):
    """Node-label levels (`--label-levels`) as a source; the labels are the Nodes' (`run`) or a
    file's (`render --node-labels`)."""

    name = "labels"
    node_labels_matter = True

    def __init__(self, levels: tuple[str, ...]) -> None:
        self.levels = levels

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        parser.add_argument(
            "--label-levels",
            action="append",
            metavar="KEYS",
            help="comma-separated node label keys, broadest first (as Kueue Topology levels; a repeat "
            "adds narrower keys)"
            + ("" if live else "; the labels come from --node-labels"),
        )

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> LabelLevels | None:
        given = getattr(options, "label_levels", None) or ()
        text = ",".join([given] if isinstance(given, str) else given)  # repeats add up, in order
        levels = parse_levels(text) if text else ()
        return cls(levels) if levels else None

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        apply(graph, self.levels, cluster.node_labels)
