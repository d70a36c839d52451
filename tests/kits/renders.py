"""Kustomize overlays the deploy tests render (tests import this module): written into a test's
own directory, with paths relative to it as a user's overlay would hold them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from controlplane.harness import ControlPlane

REPO = Path(__file__).resolve().parents[2]


def node_marks_overlay(overlay: Path) -> Path:
    """`overlay` made a kustomization of daemonset/ with components/node-marks (what grants the
    aggregator Node patch); returns it, for `kubectl kustomize` or `kubectl apply -k`."""
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "daemonset", overlay)],
        "components": [os.path.relpath(REPO / "daemonset" / "components" / "node-marks", overlay)]}))  # fmt: skip
    return overlay


def docs(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Rendered manifests by (kind, name)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}


def kustomize(kubectl: str, path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """`kubectl kustomize PATH` by (kind, name); a render that fails fails the test."""
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return docs(proc.stdout)


def server_dry_run(apiserver: ControlPlane, kubectl: str, overlay: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --server-side --dry-run=server -k OVERLAY`, its namespaces created first (a dry
    run creates none, so the namespaced objects would be refused for that alone)."""
    for kind, name in kustomize(kubectl, overlay):
        if kind == "Namespace":
            apiserver.kubectl("create", "namespace", name, check=False)
    return apiserver.kubectl("apply", "--server-side", "--dry-run=server", "-k", str(overlay), check=False)
