"""The real node runs the Kubernetes the control plane runs: tests/realnode/nodebin (kubelet,
kube-controller-manager, kube-scheduler) pins every module it shares with tests/controlplane
(kube-apiserver, kubectl) at the same version, k8s.io/kubernetes and its staging modules included."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def pins(go_mod: Path) -> dict[str, str]:
    """module -> version, a `replace` winning over a `require` as it does for the Go tool."""
    text = go_mod.read_text()
    found: dict[str, str] = {}
    for module, version in re.findall(r"^\s*(?:require\s+)?([\w./-]+)\s+(v[\w.+-]+)(?:\s*//.*)?$", text, re.M):
        found[module] = version
    for module, version in re.findall(r"^\s*([\w./-]+)\s+=>\s+[\w./-]+\s+(v[\w.+-]+)\s*$", text, re.M):
        found[module] = version
    return found


def test_the_node_binaries_pin_every_shared_module_as_the_control_plane_does() -> None:
    node, plane = pins(TESTS / "realnode/nodebin/go.mod"), pins(TESTS / "controlplane/go.mod")
    assert node["k8s.io/kubernetes"] == plane["k8s.io/kubernetes"]
    staging = [m for m in plane if m.startswith("k8s.io/") and plane[m].startswith("v0.")]
    assert len(staging) > 20
    differ = {m: (node[m], plane[m]) for m in node.keys() & plane.keys() if node[m] != plane[m]}
    assert not differ, f"tests/realnode/nodebin/go.mod drifted from tests/controlplane/go.mod: {differ}"
    assert all(node.get(m) == plane[m] for m in staging)
