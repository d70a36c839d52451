"""HyperNodes for a cluster model file, so the simulator and benchmarks run without the aggregator.

A small stand-in for the aggregator's tier inference, following the same rules (DESIGN.md):
domains are the node sets below each switch and each NVLink domain annotation; equal sets are one
HyperNode (an NVL72 rack that is also one leaf); each set's parent is the smallest strict superset;
tiers are levels of kinds (nvlink < leaf < spine < core, or leaf < nvlink when an NVLink domain
spans leaves) counted from 1, so a node with no domain of some kind joins the next level directly.
A node cabled to several leaves (rail-optimised) counts under its first block's leaf.
"""

from __future__ import annotations

import re
from typing import Any

from agent.cluster_model import ClusterModel

_KINDS = ("nvlink", "leaf", "spine", "core")


def _dns(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "x"


def _domain_sets(model: ClusterModel) -> dict[frozenset[str], tuple[str, str]]:
    """node set -> (name, kind); the first claimant of a set keeps it (switches before NVLink)."""
    first_leaf: dict[str, str] = {}
    for block in model.blocks:
        for node in block.nodes:
            first_leaf.setdefault(node, block.switch)
    below: dict[str, set[str]] = {}
    for node, leaf in first_leaf.items():
        for switch in (leaf, *model.ancestors(leaf)):
            below.setdefault(switch, set()).add(node)
    sets: dict[frozenset[str], tuple[str, str]] = {}
    for switch in sorted(below, key=lambda s: (-len(model.ancestors(s)), s)):  # leaves claim first
        depth_kind = _KINDS[min(1 + _height(model, switch), 3)]
        sets.setdefault(frozenset(below[switch]), (_dns(switch), depth_kind))
    nvlink: dict[str, set[str]] = {}
    for node in first_leaf:
        if (domain := model.domain_of(node)) is not None:
            nvlink.setdefault(domain, set()).add(node)
    for domain in sorted(nvlink):
        sets.setdefault(frozenset(nvlink[domain]), (f"nvl-{_dns(domain)}", "nvlink"))
    return sets


def _kind_order(sets: dict[frozenset[str], tuple[str, str]]) -> list[str]:
    """Kinds present, smallest first: nvlink below leaf unless an NVLink domain spans several leaves."""
    present = {kind for _, kind in sets.values()}
    nvl_sets = [s for s, (_, kind) in sets.items() if kind == "nvlink"]
    leaf_sets = [s for s, (_, kind) in sets.items() if kind == "leaf"]
    spans = any(leaf < nvl for nvl in nvl_sets for leaf in leaf_sets)
    kinds = ("leaf", "nvlink", "spine", "core") if spans else _KINDS
    return [k for k in kinds if k in present]


def _height(model: ClusterModel, switch: str) -> int:
    """0 for a switch with no child switch, else 1 + the highest child."""
    children = [c for c, p in model.parents.items() if p == switch]
    return 0 if not children else 1 + max(_height(model, c) for c in children)


def hypernodes_from_model(model: ClusterModel) -> list[dict[str, Any]]:
    """Volcano HyperNode objects (dicts, Ready) for the model's switch tree and NVLink domains."""
    sets = _domain_sets(model)
    ordered = sorted(sets, key=lambda s: (len(s), sets[s][0]))
    parent: dict[frozenset[str], frozenset[str]] = {}
    for i, small in enumerate(ordered):
        parent_set = next((big for big in ordered[i + 1:] if small < big), None)
        if parent_set is not None:
            parent[small] = parent_set
    children: dict[frozenset[str], list[frozenset[str]]] = {s: [] for s in ordered}
    for child, up in parent.items():
        children[up].append(child)
    order = _kind_order(sets)
    level: dict[frozenset[str], int] = {}
    for s in ordered:  # supersets come later, so children are levelled first
        level[s] = max(order.index(sets[s][1]) + 1, 1 + max((level[c] for c in children[s]), default=0))
    tier_name = {lv: order[min(lv, len(order)) - 1] for lv in level.values()}
    return [_object(sets[s][0], level[s], tier_name[level[s]], s, children[s], sets) for s in ordered]


def _object(name: str, tier: int, tier_name: str, nodes: frozenset[str], children: list[frozenset[str]],
            sets: dict[frozenset[str], tuple[str, str]]) -> dict[str, Any]:
    covered = set().union(*children) if children else set()
    members = [{"type": "HyperNode", "selector": {"exactMatch": {"name": sets[c][0]}}}
               for c in sorted(children, key=lambda c: sets[c][0])]
    members += [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in sorted(nodes - covered)]
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
        "metadata": {"name": name, "labels": {"volcano.sh/network-topology-source": "hypertopo",
                                              "app.kubernetes.io/managed-by": "hypertopo"}},
        "spec": {"tier": tier, "tierName": tier_name, "members": members},
        "status": {"nodeCount": len(nodes), "conditions": [{"type": "Ready", "status": "True"}]},
    }
