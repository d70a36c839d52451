"""Node classes: nodes alike in everything tier inference reads, standing for all their nodes.

Inference (aggregator.tiers.infer) never looks at nodes one by one: nodes cabled to the same switches, in
the same NVLink clique and with the same label path form a class, and candidates, levels and
nesting are worked out over classes, each weighing its number of nodes. A GB200 rack is one class
of 18 nodes, so 100,000 nodes are ~5,600 classes. The classes are kept up to date node by node
(`NodeClasses.move`), so a node whose cabling or NVLink clique changes moves between two classes
and inference can tell which classes changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aggregator.graph import FabricGraph
from aggregator.tiers.levels import SwitchLevels, switch_levels

# what inference reads of a node: attached switches, NVLink clique, label path
Signature = tuple[frozenset[str], str | None, tuple[tuple[str, str], ...]]


def signature_of(graph: FabricGraph, node: str) -> Signature:
    return (graph.attached_switches(node), graph.nvlink_of(node), graph.label_paths.get(node, ()))


@dataclass
class NodeClasses:
    """The graph's nodes grouped by signature; a class id stands for all its nodes in inference.

    Ids are "c<number>", given when a signature first appears and kept while it has nodes, so an
    unchanged class keeps its id across updates (how `infer` knows what it may reuse)."""

    members: dict[str, set[str]] = field(default_factory=dict)  # class id -> nodes
    signature: dict[str, Signature] = field(default_factory=dict)  # class id -> signature
    of_signature: dict[Signature, str] = field(default_factory=dict)
    of_node: dict[str, str] = field(default_factory=dict)  # node -> class id
    _next: int = 0
    _levels: tuple[Any, SwitchLevels] | None = None

    @classmethod
    def of(cls, graph: FabricGraph) -> NodeClasses:
        """The classes of every node: the ids `move` would give node by node in name order (a
        class's id follows where its first node comes), built in one pass per class."""
        grouped: dict[Signature, list[str]] = {}
        attached, clique, paths = graph.attached_switches, graph.nvlink_of, graph.label_paths
        for node in graph.nodes_in_order():  # the classes are ordered by their first node below
            signature = (attached(node), clique(node), paths.get(node, ()))
            found = grouped.get(signature)
            if found is None:
                grouped[signature] = [node]
            else:
                found.append(node)
        classes = cls()
        ordered = sorted((min(nodes), signature) for signature, nodes in grouped.items())
        for number, (_, signature) in enumerate(ordered):
            nodes = grouped[signature]
            cid = f"c{number}"
            classes.of_signature[signature] = cid
            classes.signature[cid] = signature
            classes.members[cid] = set(nodes)
            classes.of_node.update(dict.fromkeys(nodes, cid))
        classes._next = len(grouped)
        return classes

    def move(self, node: str, signature: Signature | None) -> set[str]:
        """Puts the node in the class of `signature` (None: removes it); returns the class ids
        whose membership changed (empty when the node stays where it was)."""
        old = self.of_node.get(node)
        if old is not None and signature is not None and self.signature[old] == signature:
            return set()
        dirty = set()
        if old is not None:
            dirty.add(old)
            del self.of_node[node]
            members = self.members[old]
            members.discard(node)
            if not members:
                del self.members[old]
                del self.of_signature[self.signature.pop(old)]
        if signature is not None:
            cid = self.of_signature.get(signature)
            if cid is None:
                cid = f"c{self._next}"
                self._next += 1
                self.of_signature[signature] = cid
                self.signature[cid] = signature
                self.members[cid] = set()
            self.members[cid].add(node)
            self.of_node[node] = cid
            dirty.add(cid)
        return dirty

    def weight(self, cid: str) -> int:
        return len(self.members[cid])

    def levels(self, graph: FabricGraph, leaves: frozenset[str]) -> SwitchLevels:
        """The switch levels for these leaves, kept between inferences while the graph's switch
        links and the leaves stay the same (a node moving between classes rarely changes either)."""
        key = (id(graph), len(graph.switch_links), len(graph.uplinks), leaves)
        if self._levels is None or self._levels[0] != key:
            self._levels = (key, SwitchLevels(*switch_levels(graph, set(leaves))))
        return self._levels[1]

    def switches(self, cid: str) -> frozenset[str]:
        return self.signature[cid][0]
