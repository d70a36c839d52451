"""The agent's `runtimeClassName` (the NVIDIA runtime where it is not containerd's default) is one
Helm value and one kustomize component, as the README says (issue 23): the README's overlay,
taken from the README as written, puts `runtimeClassName: nvidia` on the agent's pod template and
changes nothing else; Helm's `agent.runtimeClassName` renders the same DaemonSet; the API server
accepts it; and by default neither sets a runtime class."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from controlplane.harness import ControlPlane
from renders import docs, kustomize, server_dry_run

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hypertopo"
NS = "hypertopo-system"


def readme_overlay() -> tuple[str, str]:
    """(directory, kustomization text) of docs/install.md's runtime-class overlay block."""
    readme = (REPO / "docs" / "install.md").read_text()
    block = re.search(r"```yaml\n# (\S+)/kustomization\.yaml, next to daemonset/[^\n]*\n(.*?)```", readme, re.S)
    assert block, "docs/install.md has no overlay block for the NVIDIA runtime class"
    return block.group(1), block.group(2)


@pytest.fixture
def overlay(tmp_path: Path) -> Path:
    """The README's overlay directory, next to (a link to) this checkout's daemonset/."""
    name, text = readme_overlay()
    (tmp_path / "daemonset").symlink_to(REPO / "daemonset")
    (tmp_path / name).mkdir()
    (tmp_path / name / "kustomization.yaml").write_text(text)
    return tmp_path / name


AGENT = ("DaemonSet", "hypertopo-agent")


def test_the_readme_overlay_runs_the_agent_under_the_nvidia_runtime_class_and_changes_nothing_else(
    kubectl: str, overlay: Path
) -> None:
    base = kustomize(kubectl, REPO / "daemonset")
    patched = kustomize(kubectl, overlay)
    assert "runtimeClassName" not in base[AGENT]["spec"]["template"]["spec"]
    assert patched[AGENT]["spec"]["template"]["spec"].pop("runtimeClassName") == "nvidia"
    assert patched == base


def test_helms_runtime_class_value_renders_the_overlays_agent(helm: str, kubectl: str, overlay: Path) -> None:
    def template(*args: str) -> dict[tuple[str, str], dict[str, Any]]:
        proc = subprocess.run([helm, "template", "hypertopo", str(CHART), "--namespace", NS, *args],
                              capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return docs(proc.stdout)

    assert "runtimeClassName" not in template()[AGENT]["spec"]["template"]["spec"]
    agent = template("--set", "agent.runtimeClassName=nvidia")[AGENT]
    assert agent["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert agent == kustomize(kubectl, overlay)[AGENT]


@pytest.mark.apiserver
def test_the_api_server_accepts_the_overlays_agent(apiserver: ControlPlane, kubectl: str, overlay: Path) -> None:
    proc = server_dry_run(apiserver, kubectl, overlay)
    assert proc.returncode == 0, proc.stderr
    assert "daemonset.apps/hypertopo-agent serverside-applied (server dry run)" in proc.stdout
