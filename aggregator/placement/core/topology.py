"""The HyperNode tree as placement needs it: indexed once, queried many times per decision.

Input is what the API server returns for `topology.volcano.sh/v1alpha1` HyperNodes (plain dicts):
`spec.tier`, `spec.tierName`, `spec.members` (type Node or HyperNode; selector `exactMatch`,
`regexMatch` or `labelMatch`, the last two resolved against a node list with labels, as Volcano
does) and `status.conditions` (Ready). The result maps every node to its immediate HyperNode (its
"leaf" for placement), every HyperNode to its parent, tier and the leaves below it.

Readiness: a HyperNode whose Ready condition is False cannot host a gang and takes its whole
subtree with it (traffic below a failed switch group is not trusted). Unknown or missing Ready
counts as ready: hand-written HyperNodes carry no conditions, and a stale agent alone must not
empty the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Natural = tuple[tuple[str | int, ...], str]  # `natural`'s key
_DIGITS = re.compile(r"([0-9]+)")


@dataclass(frozen=True)
class Domain:
    name: str
    tier: int
    tier_name: str
    parent: str | None
    children: tuple[str, ...]  # child HyperNodes, sorted
    nodes: tuple[str, ...]  # direct node members, sorted
    ready: bool


@dataclass(frozen=True)
class Topology:
    """An indexed HyperNode forest. Build it with `build()`."""

    domains: Mapping[str, Domain]
    node_leaf: Mapping[str, str]  # node -> its immediate (lowest) HyperNode
    tier_names: Mapping[int, str]
    chains: Mapping[str, tuple[str, ...]]  # domain -> itself and its ancestors, nearest first
    leaves_below: Mapping[str, tuple[str, ...]]  # domain -> domains with direct nodes in its subtree
    by_tier: Mapping[int, tuple[str, ...]]
    usable: Mapping[str, bool]  # domain -> itself and every ancestor Ready
    problems: tuple[str, ...] = field(default=())
    fabric_position: Mapping[str, int] = field(default_factory=dict)  # node -> its place in fabric order

    @property
    def tiers(self) -> tuple[int, ...]:
        return tuple(sorted(self.by_tier))

    @property
    def top_tier(self) -> int:
        return max(self.by_tier, default=0)

    def tier_of_name(self, name: str) -> int | None:
        for tier, tier_name in sorted(self.tier_names.items()):
            if tier_name == name:
                return tier
        return None

    def node_usable(self, node: str) -> bool:
        """False when a HyperNode at or above the node's leaf is not Ready."""
        leaf = self.node_leaf.get(node)
        return leaf is None or self.usable[leaf]

    def nodes_of(self, domain: str) -> list[str]:
        return [n for leaf in self.leaves_below[domain] for n in self.domains[leaf].nodes]

    def lca(self, nodes: Iterable[str]) -> str | None:
        """The lowest HyperNode containing all `nodes`; None when they share none (or a node has none)."""
        common: list[str] | None = None
        for node in nodes:
            leaf = self.node_leaf.get(node)
            if leaf is None:
                return None
            chain = self.chains[leaf]
            if common is None:
                common = list(chain)
            else:
                members = set(chain)
                common = [d for d in common if d in members]
            if not common:
                return None
        return common[0] if common else None


def _condition_ready(obj: Mapping[str, Any]) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") != "False"
    return True


def _label_selected(labels: Mapping[str, str], selector: Mapping[str, Any]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if ((op == "In" and (not present or labels[key] not in values))
                or (op == "NotIn" and present and labels[key] in values)
                or (op == "Exists" and not present) or (op == "DoesNotExist" and present)):
            return False
    return True


def _member_nodes(member: Mapping[str, Any], node_labels: Mapping[str, Mapping[str, str]]) -> list[str]:
    selector = member.get("selector") or {}
    if "exactMatch" in selector:
        name = (selector["exactMatch"] or {}).get("name")
        return [name] if name else []
    if "regexMatch" in selector:
        pattern = re.compile((selector["regexMatch"] or {}).get("pattern", ""))
        return sorted(n for n in node_labels if pattern.search(n))
    if "labelMatch" in selector:
        return sorted(n for n, labels in node_labels.items()
                      if _label_selected(labels, selector["labelMatch"] or {}))
    return []


@dataclass
class _Raw:
    tier: int
    tier_name: str
    ready: bool
    nodes: list[str]
    children: list[str]


def _read(obj: Mapping[str, Any], node_labels: Mapping[str, Mapping[str, str]]) -> _Raw:
    spec = obj.get("spec") or {}
    tier = int(spec.get("tier", 1))
    raw = _Raw(tier, str(spec.get("tierName") or f"tier{tier}"), _condition_ready(obj), [], [])
    for member in spec.get("members") or []:
        if member.get("type") == "HyperNode":
            raw.children.extend(_member_nodes(member, {}))
        else:
            raw.nodes.extend(_member_nodes(member, node_labels))
    return raw


def build(hypernodes: Iterable[Mapping[str, Any]],
          node_labels: Mapping[str, Mapping[str, str]] | None = None) -> Topology:
    """Index HyperNode objects. `node_labels` (node name -> labels) resolves regex/label members."""
    raws = {obj["metadata"]["name"]: _read(obj, node_labels or {}) for obj in hypernodes}
    problems: list[str] = []
    parent = _parents(raws, problems)
    node_leaf = _node_leaves(raws, problems)
    domains = {name: Domain(name, r.tier, r.tier_name, parent.get(name),
                            tuple(sorted(c for c in set(r.children) if parent.get(c) == name)),
                            tuple(sorted(n for n in set(r.nodes) if node_leaf.get(n) == name)), r.ready)
               for name, r in raws.items()}
    return _index(domains, node_leaf, problems)


def _parents(raws: Mapping[str, _Raw], problems: list[str]) -> dict[str, str]:
    parent: dict[str, str] = {}
    for name in sorted(raws):
        for child in sorted(set(raws[name].children)):
            if child not in raws:
                problems.append(f"HyperNode {name} lists missing member HyperNode {child}")
            elif child in parent:
                problems.append(f"HyperNode {child} has two parents ({parent[child]}, {name}); kept the first")
            elif _is_ancestor(child, name, parent) or child == name:
                problems.append(f"HyperNode {name} -> {child} would make a cycle; ignored")
            else:
                parent[child] = name
    return parent


def _is_ancestor(candidate: str, of: str, parent: Mapping[str, str]) -> bool:
    while of in parent:
        of = parent[of]
        if of == candidate:
            return True
    return False


def _node_leaves(raws: Mapping[str, _Raw], problems: list[str]) -> dict[str, str]:
    """Each node's immediate HyperNode: the lowest tier one listing it (ties by name)."""
    node_leaf: dict[str, str] = {}
    for name in sorted(raws, key=lambda n: (raws[n].tier, n)):
        for node in raws[name].nodes:
            if node in node_leaf:
                if node_leaf[node] != name:
                    problems.append(f"node {node} is a member of {node_leaf[node]} and {name}; kept {node_leaf[node]}")
                continue
            node_leaf[node] = name
    return node_leaf


def _index(domains: dict[str, Domain], node_leaf: dict[str, str], problems: list[str]) -> Topology:
    chains: dict[str, tuple[str, ...]] = {}
    for name in domains:
        chain = [name]
        while (up := domains[chain[-1]].parent) is not None:
            chain.append(up)
        chains[name] = tuple(chain)
    leaves_below: dict[str, list[str]] = {name: [] for name in domains}
    for name in sorted(domains):
        if domains[name].nodes:
            for up in chains[name]:
                leaves_below[up].append(name)
    by_tier: dict[int, list[str]] = {}
    tier_names: dict[int, str] = {}
    for name in sorted(domains):
        by_tier.setdefault(domains[name].tier, []).append(name)
        tier_names.setdefault(domains[name].tier, domains[name].tier_name)
    faulty = own_faults(domains, chains)
    usable = {name: not any(d in faulty for d in chains[name]) for name in domains}
    return Topology(domains=domains, node_leaf=node_leaf, tier_names=tier_names, chains=chains,
                    leaves_below={k: tuple(v) for k, v in leaves_below.items()},
                    by_tier={k: tuple(v) for k, v in by_tier.items()}, usable=usable,
                    problems=tuple(problems), fabric_position=fabric_positions(domains))


def natural(text: str) -> Natural:
    """`w-2` before `w-10`: the text cut at its digit runs with the runs as numbers (text and
    number alternate, so any two keys compare), then the text itself (`n01` and `n1` stay apart)."""
    parts: list[Any] = _DIGITS.split(text)
    parts[1::2] = map(int, parts[1::2])
    return tuple(parts), text


def fabric_positions(domains: Mapping[str, Domain]) -> dict[str, int]:
    """Every node's place in fabric order: by its HyperNode at every tier from the top down (none
    first, so every domain's nodes stay contiguous), then by its name, all in natural order.

    Why here: the order is a property of the tree, and the names' natural keys cost a few
    microseconds each; computed once per build, a decision orders its nodes by one lookup each
    instead of parsing a few hundred node and HyperNode names (`ranks.in_fabric_order`).

    How: a walk down the tree, each domain's own nodes first (nothing below them at any lower
    tier), then its children, lower tiers first (a child that skips tiers has nothing where its
    siblings have a domain), then by name. Only siblings are sorted, never all nodes at once."""
    def sibling(domain: Domain) -> tuple[int, Natural]:
        return domain.tier, natural(domain.name)

    order: list[str] = []
    stack = sorted((d for d in domains.values() if d.parent is None), key=sibling, reverse=True)
    while stack:
        domain = stack.pop()
        order.extend(sorted(domain.nodes, key=natural))
        stack.extend(sorted((domains[c] for c in domain.children), key=sibling, reverse=True))
    return {node: i for i, node in enumerate(order)}


def node_labels_of(nodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Node objects -> {name: labels}, the form `build` takes."""
    return {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in nodes}


def own_faults(domains: Mapping[str, Domain], chains: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
    """The Ready=False domains whose fault is their own, not carried up from a failed domain below.

    Health rolls up: one unhealthy node can turn its leaf, spine and core Ready=False together.
    Only the lowest of them is the fault; taking the spine or the core out of service for it would
    take every healthy leaf under them out too. So a failed domain with a failed domain below it
    is not a fault of its own."""
    failed = {name for name, domain in domains.items() if not domain.ready}
    carried = {up for name in failed for up in chains[name][1:]}
    return frozenset(failed - carried)
