"""The HyperNode tree as people read it: nested, with each domain's state and its unhealthy nodes.

`kubectl get hypernodes` lists HyperNodes flat, so nobody sees where a fault sits in the fabric
without reading YAML. This module turns HyperNode objects (live, or a `render` output) into the
nested tree: tier name, HyperNode, node count, its state with the reason, and the unhealthy nodes
under the domain that holds them. Pure: objects in, text out (the Graphviz form is
`aggregator.tree.dot`); `hypertopo-aggregator tree` does the reading and the printing.

Conditions are read generically by type, as Kubernetes does: `Ready` is good when True, every
other type (`FabricDegraded`, and whatever comes next) is bad when True. The nodes a condition
blames are read back from its message (`N of M nodes unhealthy (...): node01: NVLink failed: ...;
node02: ...; and 3 more`, aggregator.health), kept only where they are members of the domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

POSITIVE = frozenset({"Ready"})  # condition types that are good when True
GREEN, YELLOW, RED, BOLD, DIM, RESET = "\033[32m", "\033[33m", "\033[31m", "\033[1m", "\033[2m", "\033[0m"


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""

    @property
    def bad(self) -> bool:
        return self.status != "True" if self.type in POSITIVE else self.status == "True"

    @property
    def unsure(self) -> bool:
        return self.status == "Unknown"

    @property
    def mark(self) -> str:
        if self.type in POSITIVE and self.bad:
            return "?" if self.unsure else "✗"
        return "!"


@dataclass(frozen=True)
class Domain:
    """One HyperNode: its Node members, its child HyperNodes and its conditions."""

    name: str
    tier: int
    tier_name: str
    nodes: tuple[str, ...]
    children: tuple[str, ...]
    node_count: int
    conditions: tuple[Condition, ...] = ()
    # node -> (mark, what its domain's conditions say about it), only nodes that are members;
    # mark: "✗" failed (Ready=False), "?" unknown, "!" degraded or within the threshold
    blamed: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    more_blamed: int = 0  # "and N more" in the messages
    measured: str = ""  # the measured p50s of the annotations (aggregator.sources.measured), as shown

    @property
    def bad(self) -> bool:
        return any(c.bad for c in self.conditions)

    def state(self) -> str:
        """`Ready`, or each bad condition with its reason: `NotReady (NVLinkFailed)`."""
        parts = []
        for c in self.conditions:
            if not c.bad:
                continue
            if c.type in POSITIVE:
                word = f"{c.type}=Unknown" if c.unsure else f"Not{c.type}"
            else:
                word = c.type if c.status == "True" else f"{c.type}={c.status}"
            parts.append(f"{word} ({c.reason})" if c.reason else word)
        ready = [c for c in self.conditions if c.type == "Ready"]
        if not parts:
            return "Ready" if ready else "no conditions"
        return ", ".join(parts)


def _member_names(members: Any, kind: str) -> list[str]:
    names = []
    for member in members if isinstance(members, list) else []:
        if not isinstance(member, dict) or member.get("type") != kind:
            continue
        selector = _map(member.get("selector"))
        exact, regex = _map(selector.get("exactMatch")), _map(selector.get("regexMatch"))
        if exact.get("name"):
            names.append(str(exact["name"]))
        elif regex.get("pattern"):
            names.append(f"~{regex['pattern']}")
    return names


def _map(value: Any) -> dict[str, Any]:
    """The value when it is a map, else an empty one (a HyperNode from a file may be anything)."""
    return value if isinstance(value, dict) else {}


def _conditions(status: Mapping[str, Any]) -> tuple[Condition, ...]:
    raw = status.get("conditions")
    return tuple(
        Condition(str(c.get("type", "")), str(c.get("status", "")), str(c.get("reason") or ""),
                  str(c.get("message") or ""))
        for c in (raw if isinstance(raw, list) else [])
        if isinstance(c, dict) and c.get("type")
    )


def blamed_nodes(message: str, members: Iterable[str]) -> tuple[dict[str, str], int]:
    """The `node: problem` entries of a condition message whose node is a member, and the count
    the message gives for the rest (`and 3 more`)."""
    wanted = set(members)
    _, sep, listing = message.partition("): ")
    if not sep:
        _, _, listing = message.partition(": ")
    blamed: dict[str, str] = {}
    more = 0
    for part in listing.split("; "):
        node, sep, problem = part.partition(": ")
        if sep and node in wanted:
            blamed[node] = problem
        elif part.startswith("and ") and part.split(" ")[1].isdigit():
            more = int(part.split(" ")[1])
    return blamed, more


def domain_of(obj: Mapping[str, Any]) -> Domain | None:
    """A HyperNode object -> Domain; None for something that is no usable HyperNode."""
    metadata, spec = obj.get("metadata"), obj.get("spec")
    if obj.get("kind", "HyperNode") != "HyperNode" or not isinstance(metadata, dict) or not isinstance(spec, dict):
        return None
    status = _map(obj.get("status"))
    nodes = tuple(sorted(_member_names(spec.get("members"), "Node")))
    conditions = _conditions(status)
    blamed: dict[str, tuple[str, str]] = {}
    more = 0
    for c in sorted(conditions, key=lambda c: "✗?!".index(c.mark)):  # the worst mark wins
        if nodes and (c.bad or c.reason == "WithinThreshold"):
            found, extra = blamed_nodes(c.message, nodes)
            blamed.update({n: (c.mark, p) for n, p in found.items() if n not in blamed})
            more = max(more, extra)
    tier = spec.get("tier")
    count = status.get("nodeCount")
    return Domain(
        name=str(metadata.get("name", "")),
        tier=tier if isinstance(tier, int) and not isinstance(tier, bool) else 0,
        tier_name=str(spec.get("tierName") or f"tier {tier}"),
        nodes=nodes,
        children=tuple(sorted(_member_names(spec.get("members"), "HyperNode"))),
        node_count=count if isinstance(count, int) and not isinstance(count, bool) else -1,
        conditions=conditions,
        blamed=dict(sorted(blamed.items())),
        more_blamed=more,
        measured=_measured(_map(metadata.get("annotations"))),
    )


def _measured(annotations: Mapping[str, Any]) -> str:
    """`p50 12 us inside, 140 us to siblings` from the measured-fabric annotations ("" without)."""
    parts = []
    for key, what in (("hypertopo.io/measured-inside-p50-us", "inside"), ("hypertopo.io/measured-sibling-p50-us", "to siblings")):
        value = annotations.get(key)
        if isinstance(value, str) and value.isdigit() and len(value) < 10:
            parts.append(f"{value} us {what}")
    return f"p50 {', '.join(parts)}" if parts else ""


class Tree:
    """HyperNodes by name, with their roots (those no other HyperNode holds), broadest first."""

    def __init__(self, objects: Iterable[Mapping[str, Any]]):
        found = (domain_of(obj) for obj in objects if isinstance(obj, Mapping))
        self.domains: dict[str, Domain] = {d.name: d for d in found if d is not None}
        held = {child for d in self.domains.values() for child in d.children}
        self.roots = sorted((n for n in self.domains if n not in held), key=lambda n: (-self.domains[n].tier, n))

    def children(self, name: str) -> list[str]:
        return [c for c in self.domains[name].children if c in self.domains]

    def node_count(self, name: str, seen: frozenset[str] = frozenset()) -> int:
        """status.nodeCount, else the distinct Node members below (a cycle is cut, never looped)."""
        domain = self.domains[name]
        if domain.node_count >= 0:
            return domain.node_count
        return len(self._nodes_below(name, seen))

    def _nodes_below(self, name: str, seen: frozenset[str]) -> set[str]:
        nodes = set(self.domains[name].nodes)
        for child in self.children(name):
            if child not in seen:
                nodes |= self._nodes_below(child, seen | {name})
        return nodes

    def troubled(self, name: str, seen: frozenset[str] = frozenset()) -> bool:
        """This domain or one below it is not healthy, or names unhealthy nodes."""
        domain = self.domains[name]
        if domain.bad or domain.blamed:
            return True
        return any(self.troubled(c, seen | {name}) for c in self.children(name) if c not in seen)


@dataclass(frozen=True)
class View:
    depth: int | None = None  # levels of HyperNodes shown; None: all
    only_unhealthy: bool = False
    colour: bool = False


def render_text(tree: Tree, view: View | None = None) -> str:
    """The nested tree, one line per HyperNode and per unhealthy node, with a summary line."""
    view = view or View()
    lines = [_summary(tree, view)]
    roots = [r for r in tree.roots if not view.only_unhealthy or tree.troubled(r)]
    for i, root in enumerate(roots):
        _walk(tree, root, view, lines, prefix="", last=i == len(roots) - 1, level=1, seen=frozenset())
    return "\n".join(lines) + "\n"


def _summary(tree: Tree, view: View) -> str:
    tiers = sorted({(d.tier, d.tier_name) for d in tree.domains.values()}, reverse=True)
    bad = sum(1 for d in tree.domains.values() if d.bad)
    text = (f"{len(tree.domains)} HyperNodes, {sum(tree.node_count(r) for r in tree.roots)} nodes; "
            f"tiers {' > '.join(name for _, name in tiers) or 'none'}; {bad} not healthy")
    return _paint(text, BOLD, view)


def _walk(tree: Tree, name: str, view: View, lines: list[str], *, prefix: str, last: bool, level: int,
          seen: frozenset[str]) -> None:
    domain = tree.domains[name]
    branch, below = ("└── ", "    ") if last else ("├── ", "│   ")
    lines.append(f"{prefix}{branch}{_line(tree, domain, view)}")
    inner = prefix + below
    if name in seen:
        lines.append(f"{inner}└── (cycle: {name} holds itself)")
        return
    shown_nodes = list(domain.blamed.items())
    children: Sequence[str] = []
    if view.depth is None or level < view.depth:
        children = [c for c in tree.children(name) if not view.only_unhealthy or tree.troubled(c)]
    entries = len(shown_nodes) + (1 if domain.more_blamed else 0) + len(children)
    for node, (mark, problem) in shown_nodes:
        entries -= 1
        text = _paint(f"{mark} {node}: {problem}", RED if mark == "✗" else YELLOW, view)
        lines.append(f"{inner}{'└── ' if entries == 0 else '├── '}{text}")
    if domain.more_blamed:
        entries -= 1
        lines.append(f"{inner}{'└── ' if entries == 0 else '├── '}… and {domain.more_blamed} more")
    for i, child in enumerate(children):
        _walk(tree, child, view, lines, prefix=inner, last=i == len(children) - 1, level=level + 1,
              seen=seen | {name})


def _line(tree: Tree, domain: Domain, view: View) -> str:
    state = domain.state()
    colour = GREEN if not domain.bad else (YELLOW if _only_unsure_or_degraded(domain) else RED)
    count = tree.node_count(domain.name)
    nodes = f"{count} node{'s' if count != 1 else ''}"
    measured = f"  {_paint(domain.measured, DIM, view)}" if domain.measured else ""
    return f"{_paint(domain.tier_name, DIM, view)} {_paint(domain.name, BOLD, view)}  {nodes}  {_paint(state, colour, view)}{measured}"


def _only_unsure_or_degraded(domain: Domain) -> bool:
    """Yellow, not red: Ready only Unknown, or only a negative condition (a grey failure)."""
    return not any(c.bad and c.type in POSITIVE and not c.unsure for c in domain.conditions)


def _paint(text: str, colour: str, view: View) -> str:
    return f"{colour}{text}{RESET}" if view.colour else text
