"""The real node runs the Kubernetes the control plane runs, and each pinned Kubernetes is one
release throughout: tests/controlplane builds kubelet, kube-controller-manager and kube-scheduler
in the same `go build` as kube-apiserver and kubectl (tests/realnode/nodebin/build.sh hands out that
build), and every Kubernetes staging module of a go.mod (the newest release's and the oldest
minor's in compat/) is pinned at the version of its k8s.io/kubernetes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
PLANE = TESTS / "controlplane"
NODE_COMMANDS = {"kubelet", "kube-controller-manager", "kube-scheduler"}


def pins(go_mod: Path) -> dict[str, str]:
    """module -> version, a `replace` winning over a `require` as it does for the Go tool."""
    text = go_mod.read_text()
    found: dict[str, str] = {}
    for module, version in re.findall(r"^\s*(?:require\s+)?([\w./-]+)\s+(v[\w.+-]+)(?:\s*//.*)?$", text, re.M):
        found[module] = version
    for module, version in re.findall(r"^\s*([\w./-]+)\s+=>\s+[\w./-]+\s+(v[\w.+-]+)\s*$", text, re.M):
        found[module] = version
    return found


def staging(go_mod: Path) -> dict[str, str]:
    """The Kubernetes staging modules a go.mod replaces (k8s.io/kubernetes requires them at v0.0.0,
    so a consumer pins each with a `replace`)."""
    text = go_mod.read_text()
    return dict(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+k8s\.io/[\w.-]+\s+(v[\w.+-]+)\s*$", text, re.M))


@pytest.mark.parametrize("go_mod", ["go.mod", "compat/go.mod"])
def test_every_staging_module_is_pinned_at_the_release_of_its_kubernetes(go_mod: str) -> None:
    kubernetes = pins(PLANE / go_mod)["k8s.io/kubernetes"]
    modules = staging(PLANE / go_mod)
    assert len(modules) > 20, modules
    want = "v0." + kubernetes.removeprefix("v1.")
    assert {m: v for m, v in modules.items() if v != want} == {}, f"{go_mod}: staging modules not at {want}"
    assert pins(PLANE / go_mod)["k8s.io/api"] == want


def test_the_compatibility_set_is_an_older_minor_than_the_suites_release() -> None:
    newest, oldest = (pins(PLANE / m)["k8s.io/kubernetes"] for m in ("go.mod", "compat/go.mod"))
    minor = [int(v.split(".")[1]) for v in (newest, oldest)]
    assert minor[0] > minor[1], (newest, oldest)


def test_the_node_binaries_come_from_the_control_planes_one_build() -> None:
    commands = set(re.findall(r'_ "k8s\.io/kubernetes/cmd/([\w-]+)"', (PLANE / "tools.go").read_text()))
    assert NODE_COMMANDS | {"kube-apiserver", "kubectl"} <= commands
    assert not (TESTS / "realnode" / "nodebin" / "go.mod").exists(), "a second Kubernetes module for the node"
    outputs = [subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True, timeout=3000)
               .stdout.strip().splitlines()[-1] for script in (PLANE / "build.sh", TESTS / "realnode/nodebin/build.sh")]  # fmt: skip
    assert outputs[0] == outputs[1]
    assert all((Path(outputs[1]) / command).is_file() for command in NODE_COMMANDS)
