"""The README's two overlays the real-node tests install (tests/live/test_real_node.py), checked here
without a node: each renders exactly what its Helm equivalent in the README renders.

- Virtual fabric NICs (`nics-overlay/`): the agent's `--interfaces` names them, as the README's
  `--set-json 'agent.extraArgs=[...]'` does with Helm; nothing else changes.
- The agent in another namespace (`gpu-agents/`): as `--set agent.namespace=gpu-agents`."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from test_agent_lldpd_socket import write_overlay
from test_helm_chart import CHART, NS, _differences, _objects

REPO = Path(__file__).resolve().parents[2]
AGENT = ("DaemonSet", "hypertopo-agent", "hypertopo-agent")


def readme_overlay(name: str) -> str:
    """The kustomization of docs/install.md's overlay block for directory `name`."""
    readme = (REPO / "docs" / "install.md").read_text()
    block = re.search(rf"```yaml\n(# {re.escape(name)}/kustomization\.yaml, next to daemonset/[^\n]*\n.*?)```",
                      readme, re.S)  # fmt: skip
    assert block, f"docs/install.md has no overlay block for {name}/"
    return block.group(1)


def readme_helm_nics_args() -> list[str]:
    """The Helm arguments docs/install.md gives for virtual fabric NICs."""
    readme = " ".join((REPO / "docs" / "install.md").read_text().split())
    found = re.search(r"virtual links.*?With Helm: `(--set-json '[^`]*')`", readme)
    assert found, "docs/install.md gives no Helm value for virtual fabric NICs"
    return shlex.split(found.group(1))


def template(helm: str, *args: str) -> dict[tuple[str, str, str], dict[str, object]]:
    proc = subprocess.run([helm, "template", "hypertopo", str(CHART), "--namespace", NS, "--set",
                           "namespace.create=true", *args], capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return _objects(proc.stdout)


def kustomize(kubectl: str, tmp_path: Path, name: str) -> dict[tuple[str, str, str], dict[str, object]]:
    proc = subprocess.run([kubectl, "kustomize", str(write_overlay(tmp_path, name, readme_overlay(name)))],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return _objects(proc.stdout)


def test_the_readme_nics_overlay_adds_only_the_agents_interfaces_flag_as_its_helm_value_does(
    helm: str, kubectl: str, tmp_path: Path
) -> None:
    helm_args = readme_helm_nics_args()
    assert _differences(template(helm, *helm_args), kustomize(kubectl, tmp_path, "nics-overlay")) == []
    base, patched = template(helm), template(helm, *helm_args)
    args = patched[AGENT]["spec"]["template"]["spec"]["containers"][0]["args"]  # type: ignore[index]
    assert args[-1] == "--interfaces=^eth[1-9]$", args
    args.pop()
    assert _differences(patched, base) == []


def test_the_readme_gpu_agents_overlay_moves_the_agent_as_helms_agent_namespace_does(
    helm: str, kubectl: str, tmp_path: Path
) -> None:
    moved = kustomize(kubectl, tmp_path, "gpu-agents")
    assert _differences(template(helm, "--set", "agent.namespace=gpu-agents"), moved) == []
    assert not [key for key in moved if "hypertopo-agent" in key[1:2]], "an object left in hypertopo-agent"
    assert ("Namespace", "", "gpu-agents") in moved
