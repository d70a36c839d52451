"""Test helpers for the aggregator: what a modelled cluster's fabric would show.

`ibnetdiscover_dump(model)` writes the dump `ibnetdiscover` would print for the model's fabric, in
its topology format (Switch and Ca blocks, port lines on both ends of every cable), with HCA GUIDs
and node descriptions as the modelled nodes' agents report them (agent.model_probe). `expected_tree`
is an independent oracle for the tree a model declares: every switch's subtree above the leaves is
a domain, nodes sharing a set of leaves are one, every NVLink annotation is one; equal node sets are one domain,
and a domain's parent is the smallest strictly larger one. `nodes_below` reads rendered HyperNodes
back as the node sets they hold.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from agent.cluster_model import ClusterModel
from agent.model_probe import node_guid


def switch_guid(switch: str) -> str:
    return "9c63c0" + hashlib.sha256(switch.encode()).hexdigest()[:10]


def ca_guid(node: str, hca: int) -> str:
    return node_guid(node, hca).replace(":", "")


def hca_attachments(model: ClusterModel) -> Iterator[tuple[str, str, int]]:
    """(leaf switch, node, HCA index) for every HCA of the model; a node's HCAs are numbered in the
    order of the blocks that cable them (block 0 gets mlx5_0, the next block mlx5_1, ...)."""
    hca_index: dict[str, int] = defaultdict(int)
    for block in model.blocks:
        for node in block.nodes:
            yield block.switch, node, hca_index[node]
            hca_index[node] += 1


def ibnetdiscover_dump(
    model: ClusterModel,
    *,
    host_descriptions: bool = True,
    extra_cables: Iterable[tuple[str, str]] = (),
    only: Collection[str] | None = None,
    ca_description: Callable[[str, int], str] | None = None,
) -> str:
    """The model's fabric as `ibnetdiscover` prints it; without `host_descriptions` the HCAs carry
    a firmware default description ("MT4129 ConnectX-7") that names no host. `extra_cables` adds
    switch-to-switch cables a model cannot declare (a second parent, a core-to-core link); `only`
    keeps the switches of one fabric (a rail or a plane: its own subnet manager's dump) and the
    HCAs cabled to them; `ca_description(node, hca)` replaces "<node> mlx5_<hca>"."""
    ports: dict[str, list[tuple[int, str]]] = defaultdict(list)  # switch -> (port, line)
    cas: list[str] = []
    next_port: dict[str, int] = defaultdict(int)
    everything = {*model.switches, *(s for cable in extra_cables for s in cable)}
    kept = everything if only is None else set(only)

    def port_of(switch: str) -> int:
        next_port[switch] += 1
        return next_port[switch]

    desc = {s: f"MF0;{s}:MQM9700/U1" for s in everything}
    for child, parent in [*sorted(model.parents.items()), *extra_cables]:
        if child not in kept or parent not in kept:
            continue
        cp, pp = port_of(child), port_of(parent)
        ports[child].append(
            (cp, f'[{cp}]\t"S-{switch_guid(parent)}"[{pp}]\t\t# "{desc[parent]}" lid 1 4xNDR')
        )
        ports[parent].append((pp, f'[{pp}]\t"S-{switch_guid(child)}"[{cp}]\t\t# "{desc[child]}" lid 2 4xNDR'))
    for leaf, node, hca in hca_attachments(model):
        if leaf not in kept:
            continue
        guid = ca_guid(node, hca)
        ca_desc = ca_description(node, hca) if ca_description else f"{node} mlx5_{hca}"
        ca_desc = ca_desc if host_descriptions else "MT4129 ConnectX-7"
        sp = port_of(leaf)
        ports[leaf].append((sp, f'[{sp}]\t"H-{guid}"[1]({guid}) \t\t# "{ca_desc}" lid 10 4xNDR'))
        cas.append(
            f"vendid=0x2c9\ndevid=0x1021\nsysimgguid=0x{guid}\ncaguid=0x{guid}\n"
            f'Ca\t1 "H-{guid}"\t\t# "{ca_desc}"\n'
            f'[1]({guid}) \t"S-{switch_guid(leaf)}"[{sp}]\t\t# lid 10 lmc 0 "{desc[leaf]}" '
            "lid 2 4xNDR\n"
        )
    out = ["#", "# Topology file: generated for a cluster model", "#", ""]
    for switch in sorted(kept & everything):
        guid = switch_guid(switch)
        out += [
            "vendid=0x2c9",
            "devid=0xd2f2",
            f"sysimgguid=0x{guid}",
            f"switchguid=0x{guid}({guid})",
            f'Switch\t129 "S-{guid}"\t\t# "{desc[switch]}" enhanced port 0 lid 2 lmc 0',
            *(line for _, line in sorted(ports[switch])),
            "",
        ]
    return "\n".join(out) + "\n" + "\n".join(cas)


def nodes_below(hypernodes: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """HyperNode name -> the Nodes it holds, through its HyperNode members all the way down."""
    members = {o["metadata"]["name"]: o["spec"]["members"] for o in hypernodes}
    found: dict[str, frozenset[str]] = {}

    def of(name: str) -> frozenset[str]:
        if name not in found:
            targets = [(m["type"], m["selector"]["exactMatch"]["name"]) for m in members[name]]
            found[name] = frozenset().union(*(of(t) if kind == "HyperNode" else {t} for kind, t in targets))
        return found[name]

    return {name: of(name) for name in members}


def expected_tree(model: ClusterModel) -> tuple[set[frozenset[str]], dict[frozenset[str], frozenset[str]]]:
    """(domain node sets, parent of each) that the model declares."""
    leaves_of: dict[str, set[str]] = defaultdict(set)
    below: dict[str, set[str]] = defaultdict(set)
    nvlink: dict[str, set[str]] = defaultdict(set)
    for block in model.blocks:
        for node in block.nodes:
            leaves_of[node].add(block.switch)
            for switch in model.ancestors(block.switch):  # a leaf's own nodes: see by_leaves
                below[switch].add(node)
            if block.domain:
                nvlink[block.domain].add(node)
    by_leaves: dict[frozenset[str], set[str]] = defaultdict(set)
    for node, leaves in leaves_of.items():
        by_leaves[frozenset(leaves)].add(node)
    domains = {frozenset(s) for s in (*below.values(), *by_leaves.values(), *nvlink.values()) if s}
    parent = {}
    for domain in domains:
        larger = [d for d in domains if domain < d]
        if larger:
            parent[domain] = min(larger, key=len)
    return domains, parent
