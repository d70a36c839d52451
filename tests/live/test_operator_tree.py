"""`hypertopo-aggregator tree` and `render --format dot`: the fabric as a tree people read (issue 13).

The cluster is the README's: a modelled 3-tier fat-tree of 16 nodes whose agents report through
`probe --model`, with h006's RDMA port down and h011's agent silent (tests/kits/operator_view_example.py).
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_view_example import FAILED_RDMA, render_args, write
from realparts import require_binary

from aggregator.tree.dot import render_dot
from aggregator.tree.model import Tree, View, render_text

REPO = Path(__file__).resolve().parents[2]

EXPECTED = """\
7 HyperNodes, 16 nodes; tiers core > spine > leaf; 5 not healthy
└── core core-core1  16 nodes  NotReady (RDMAFailed)
    ├── spine spine-pod1-spine  8 nodes  NotReady (RDMAFailed)
    │   ├── leaf leaf-pod1-leaf1  4 nodes  Ready
    │   └── leaf leaf-pod1-leaf2  4 nodes  NotReady (RDMAFailed)
    │       └── ✗ h006: RDMA failed: mlx5_2 port 1 DOWN (carrier lost)
    └── spine spine-pod2-spine  8 nodes  Ready=Unknown (ReportsMissing)
        ├── leaf leaf-pod2-leaf1  4 nodes  Ready=Unknown (ReportsMissing)
        │   └── ? h011: no NodeTopology report
        └── leaf leaf-pod2-leaf2  4 nodes  Ready
"""


def _aggregator(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True, text=True, timeout=120,
                          check=False, input=stdin, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("example")
    write(folder / "reports")
    proc = _aggregator(*render_args(folder / "reports"))
    assert proc.returncode == 0, proc.stderr
    (folder / "hypernodes.yaml").write_text(proc.stdout)
    return folder / "hypernodes.yaml"


def test_the_tree_nests_tiers_and_lists_unhealthy_nodes_under_their_leaf(rendered: Path) -> None:
    proc = _aggregator("tree", "--from", str(rendered))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == EXPECTED  # piped: no colour codes
    assert FAILED_RDMA in proc.stdout


def test_the_readme_shows_this_very_tree() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert EXPECTED in readme
    first_screen = "\n".join(readme.splitlines()[:60])
    assert "hypertopo-aggregator tree" in first_screen and "h006: RDMA failed" in first_screen


def test_depth_and_only_unhealthy_prune_the_tree(rendered: Path) -> None:
    shallow = _aggregator("tree", "--from", str(rendered), "--depth", "2").stdout
    assert "spine-pod2-spine" in shallow and "leaf-" not in shallow and "h006" not in shallow
    unhealthy = _aggregator("tree", "--from", str(rendered), "--only-unhealthy").stdout
    assert "leaf-pod1-leaf2" in unhealthy and "leaf-pod2-leaf1" in unhealthy
    assert "leaf-pod1-leaf1" not in unhealthy and "leaf-pod2-leaf2" not in unhealthy
    bad_depth = _aggregator("tree", "--from", str(rendered), "--depth", "0")
    assert bad_depth.returncode == 2 and "must be 1 or more" in bad_depth.stderr


def test_colour_on_request_or_terminal_and_never_down_a_pipe(rendered: Path) -> None:
    coloured = _aggregator("tree", "--from", str(rendered), "--color", "always").stdout
    assert "\033[31mNotReady (RDMAFailed)\033[0m" in coloured and "\033[32mReady\033[0m" in coloured
    assert "\033[33m? h011: no NodeTopology report\033[0m" in coloured
    assert "\033[" not in _aggregator("tree", "--from", str(rendered)).stdout


def test_tree_reads_stdin_and_refuses_an_unreadable_file_in_one_line(rendered: Path, tmp_path: Path) -> None:
    piped = _aggregator("tree", "--from", "-", stdin=rendered.read_text())
    assert piped.returncode == 0 and piped.stdout == EXPECTED
    broken = tmp_path / "broken.yaml"
    broken.write_text("items: [\n")
    proc = _aggregator("tree", "--from", str(broken))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "broken.yaml: cannot read" in proc.stderr


def test_tree_refuses_a_file_that_holds_no_hypernode_and_draws_an_empty_list(tmp_path: Path) -> None:
    not_objects = tmp_path / "passwd"
    not_objects.write_text("root:x:0:0:root:/root:/bin/bash\n")
    proc = _aggregator("tree", "--from", str(not_objects))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "passwd: document 1 is not a HyperNode (no kind" in proc.stderr and not proc.stdout
    pods = tmp_path / "pods.yaml"
    pods.write_text("kind: List\nitems:\n- {kind: Pod, metadata: {name: a}}\n---\nkind: Node\n")
    proc = _aggregator("tree", "--from", str(pods))
    assert proc.returncode == 1 and "pods.yaml: holds no HyperNode, only Node, Pod" in proc.stderr
    empty = tmp_path / "none.yaml"  # what `kubectl get hypernodes -o yaml` prints on a cluster without any
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n---\n")
    proc = _aggregator("tree", "--from", str(empty))
    assert proc.returncode == 0 and proc.stdout.startswith("0 HyperNodes"), proc.stderr


def _hypernode(name: str, tier: int, members: list[tuple[str, str]], conditions: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name},
        "spec": {"tier": tier, "tierName": f"t{tier}",
                 "members": [{"type": t, "selector": {"exactMatch": {"name": n}}} for t, n in members]},
        "status": {"conditions": conditions},
    }


def test_conditions_are_read_by_type_fabric_degraded_included() -> None:
    degraded = {"type": "FabricDegraded", "status": "True", "reason": "RDMADegraded",
                "message": "1 of 2 nodes degraded (tolerates 0): n2: RDMA mlx5_0/1 rate 200 of 400 Gb/s; and 4 more"}
    leaf = _hypernode("leaf-a", 1, [("Node", "n1"), ("Node", "n2")],
                      [{"type": "Ready", "status": "True", "reason": "MembersHealthy"}, degraded])
    text = render_text(Tree([leaf, _hypernode("top", 2, [("HyperNode", "leaf-a"), ("HyperNode", "gone")], [])]))
    assert "t1 leaf-a  2 nodes  FabricDegraded (RDMADegraded)" in text
    assert "! n2: RDMA mlx5_0/1 rate 200 of 400 Gb/s" in text and "… and 4 more" in text
    assert "t2 top  2 nodes  no conditions" in text  # a missing child is skipped, the count from below


def test_a_hypernode_cycle_is_cut_not_followed() -> None:
    a = _hypernode("a", 2, [("HyperNode", "b")], [])
    b = _hypernode("b", 1, [("HyperNode", "a"), ("Node", "n1")], [])
    c = _hypernode("c", 3, [("HyperNode", "a")], [])
    text = render_text(Tree([a, b, c]), View(depth=10))
    assert "(cycle: a holds itself)" in text or "(cycle: b holds itself)" in text


def test_dot_output_is_drawn_by_the_real_graphviz(rendered: Path, tmp_path: Path) -> None:
    dot = require_binary("dot")
    proc = _aggregator(*render_args(rendered.parent / "reports"), "--format", "dot")
    assert proc.returncode == 0, proc.stderr
    svg = subprocess.run([dot, "-Tsvg"], input=proc.stdout, capture_output=True, text=True, timeout=60, check=False)
    assert svg.returncode == 0 and not svg.stderr, svg.stderr
    texts = _svg_texts(svg.stdout)
    for text in ("core-core1", "leaf-pod1-leaf2", "NotReady (RDMAFailed)", "h006", "h011", "h016"):
        assert text in texts
    assert svg.stdout.count('class="node"') == 7 + 16  # the HyperNodes and every Node member (h011 too)
    assert svg.stdout.count('class="edge"') == 6 + 16


def _svg_texts(svg: str) -> set[str]:
    """The text Graphviz drew (one <text> per label line), unescaped."""
    return {html.unescape(text) for text in re.findall(r"<text[^>]*>(.*?)</text>", svg)}


def test_dot_escapes_quotes_and_backslashes_in_names() -> None:
    odd = _hypernode('leaf "q" \\ x', 1, [("Node", 'n"1')], [{"type": "Ready", "status": "False", "reason": "R",
                                                              "message": 'x (t): n"1: broken'}])
    proc = subprocess.run([require_binary("dot"), "-Tsvg"], input=render_dot([odd]), capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    texts = _svg_texts(proc.stdout)
    assert 'n"1' in texts and 'leaf "q" \\ x' in texts and "NotReady (R)" in texts


@pytest.mark.apiserver
def test_tree_reads_the_live_hypernodes_with_the_kubeconfig_kubectl_uses(
    apiserver: Any, rendered: Path, unique: str
) -> None:
    items = yaml.safe_load(rendered.read_text())["items"]
    names = {item["metadata"]["name"] for item in items}
    rename = {name: f"{name}-{unique}" for name in names}
    for item in items:
        item["metadata"]["name"] = rename[item["metadata"]["name"]]
        for member in item["spec"]["members"]:
            if member["type"] == "HyperNode":
                member["selector"]["exactMatch"]["name"] = rename[member["selector"]["exactMatch"]["name"]]
    try:
        for item in items:
            status = item.pop("status")
            apiserver.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(item))
            patch = json.dumps({"status": status})
            apiserver.kubectl("patch", "hypernode", item["metadata"]["name"], "--subresource=status", "--type=merge",
                              "-p", patch)
        proc = _aggregator("tree", env={**apiserver.env(), "HOME": str(rendered.parent)})
        assert proc.returncode == 0, proc.stderr
        for line in EXPECTED.splitlines()[1:]:  # the other tests' HyperNodes may be listed too
            expected = line
            for old, new in sorted(rename.items(), key=lambda kv: -len(kv[0])):
                expected = expected.replace(f" {old} ", f" {new} ")
            assert expected.strip() in proc.stdout, (expected, proc.stdout)
    finally:
        apiserver.kubectl("delete", "hypernode", *rename.values(), "--ignore-not-found")
