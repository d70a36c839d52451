"""`hypertopo-aggregator tree` shows each HyperNode's measured p50s (the measured-fabric
annotations) beside its state, and ignores an annotation that is not a number of microseconds."""

from __future__ import annotations

from typing import Any

from aggregator.tree.model import Tree, View, render_text


def hypernode(name: str, tier: int, members: list[tuple[str, str]], annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "HyperNode",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"tier": tier, "tierName": "leaf" if tier == 1 else "spine",
                 "members": [{"type": t, "selector": {"exactMatch": {"name": n}}} for t, n in members]},
        "status": {"nodeCount": 2, "conditions": [{"type": "Ready", "status": "True", "reason": "MembersHealthy"}]},
    }  # fmt: skip


def test_the_tree_shows_the_measured_p50s_of_each_hypernode() -> None:
    objects = [
        hypernode("leaf-1", 1, [("Node", "n1"), ("Node", "n2")],
                  {"hypertopo.io/measured-inside-p50-us": "12", "hypertopo.io/measured-sibling-p50-us": "140"}),
        hypernode("leaf-2", 1, [("Node", "n3"), ("Node", "n4")], {"hypertopo.io/measured-inside-p50-us": "12; rm"}),
        hypernode("spine-1", 2, [("HyperNode", "leaf-1"), ("HyperNode", "leaf-2")],
                  {"hypertopo.io/measured-inside-p50-us": "140"}),
    ]  # fmt: skip
    text = render_text(Tree(objects), View(colour=False))
    lines = text.splitlines()
    assert lines[1].endswith("spine spine-1  2 nodes  Ready  p50 140 us inside"), text
    assert lines[2].endswith("leaf leaf-1  2 nodes  Ready  p50 12 us inside, 140 us to siblings"), text
    assert lines[3].endswith("leaf leaf-2  2 nodes  Ready"), text  # "12; rm" is no figure
