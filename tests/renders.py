"""Kustomize overlays the deploy tests render (tests import this module): written into a test's
own directory, with paths relative to it as a user's overlay would hold them."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def node_marks_overlay(overlay: Path) -> Path:
    """`overlay` made a kustomization of daemonset/ with components/node-marks (what grants the
    aggregator Node patch); returns it, for `kubectl kustomize` or `kubectl apply -k`."""
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "daemonset", overlay)],
        "components": [os.path.relpath(REPO / "daemonset" / "components" / "node-marks", overlay)]}))  # fmt: skip
    return overlay
