"""The HyperNode tree as a Graphviz `dot` graph (`hypertopo-aggregator render --format dot`).

A picture shows what a list cannot: how wide each tier is and where the faults sit. Each
HyperNode is a box (green: healthy, amber: Unknown or a grey failure, red: not Ready) labelled
with its tier, node count and state; each Node member is a small ellipse under its leaf, filled
red or amber when its domain's conditions name it. Pure: objects in, text out
(`dot -Tsvg` or `dot -Tpng` draws it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aggregator.tree.model import POSITIVE, Domain, Tree

FILL = {"healthy": "#c8e6c9", "warn": "#ffe0b2", "bad": "#ffcdd2"}
NODE_FILL = {"healthy": "#f5f5f5", "warn": "#ffb74d", "bad": "#e57373"}


def _quote(text: str) -> str:
    """A dot ID string: quotes and backslashes escaped, line breaks as dot's own `\\n`."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "")
    return f'"{escaped}"'


def _grade(domain: Domain) -> str:
    if not domain.bad:
        return "healthy"
    hard = any(c.bad and c.type in POSITIVE and not c.unsure for c in domain.conditions)
    return "bad" if hard else "warn"


def render_dot(objects: Iterable[Mapping[str, Any]], *, nodes: bool = True) -> str:
    """The digraph of the HyperNodes (and, with `nodes`, their Node members)."""
    tree = Tree(objects)
    lines = [
        "digraph hypertopo {",
        "  rankdir=TB;",
        '  graph [fontname="Helvetica", nodesep=0.15, ranksep=0.5];',
        '  node [fontname="Helvetica", fontsize=10];',
        "  edge [arrowhead=none, color=\"#607d8b\"];",
    ]
    for name in sorted(tree.domains):
        domain = tree.domains[name]
        label = f"{domain.name}\n{domain.tier_name} · {tree.node_count(name)} nodes\n{domain.state()}"
        lines.append(f"  {_quote('hn/' + name)} [shape=box, style=\"rounded,filled\", "
                     f"fillcolor=\"{FILL[_grade(domain)]}\", label={_quote(label)}];")
        for child in tree.children(name):
            lines.append(f"  {_quote('hn/' + name)} -> {_quote('hn/' + child)};")
        if nodes:
            lines.extend(_node_members(domain))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _node_members(domain: Domain) -> list[str]:
    out = []
    for node in domain.nodes:
        mark, problem = domain.blamed.get(node, ("", "healthy"))
        fill = NODE_FILL["bad" if mark == "✗" else "warn" if mark else "healthy"]
        tooltip = f"{mark} {problem}".strip()
        out.append(f"  {_quote('node/' + node)} [shape=ellipse, style=filled, fontsize=8, height=0.25, "
                   f"fillcolor=\"{fill}\", label={_quote(node)}, tooltip={_quote(tooltip)}];")
        out.append(f"  {_quote('hn/' + domain.name)} -> {_quote('node/' + node)};")
    return out
