"""The README's table of what each ServiceAccount may do is the whole truth: every verb any
ServiceAccount holds in `daemonset/` (with and without components/node-marks) and in the chart
(rendered by the real helm, with and without its Node-mark values) is in the table, and every row of
the table is held by some render (issue 22). A new verb fails here until the README lists it."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hypertopo"
NS = "hypertopo-system"
Grant = tuple[str, str, str, str]  # (ServiceAccount, "cluster" or namespace, resource, verb)


def readme_table() -> dict[Grant, bool]:
    """docs/security.md's rows: grant -> whether only node-marks grants it."""
    readme = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    start = readme.index("| ServiceAccount | where | resources | verbs | granted |")
    rows: dict[Grant, bool] = {}
    for line in readme[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        account, where, resources, verbs, granted = (c.strip() for c in line.strip("|").split("|"))
        for resource in re.findall(r"`([^`]+)`", resources):
            for verb in verbs.split(", "):
                rows[(account.strip("`"), where.strip("`"), resource, verb)] = granted.startswith("node-marks")
    assert rows, "the README's RBAC table has no rows"
    return rows


def _resource(group: str, resource: str) -> str:
    name, _, sub = resource.partition("/")
    full = f"{name}.{group}" if group else name
    return f"{full}/{sub}" if sub else full


def grants(docs: Iterable[dict[str, Any]]) -> set[Grant]:
    """Every (ServiceAccount, scope, resource, verb) the bindings in `docs` give."""
    docs = [d for d in docs if d]
    roles = {(d["kind"], d["metadata"].get("namespace", "") if d["kind"] == "Role" else "", d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    out: set[Grant] = set()
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        scope = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else "cluster"
        ref = binding["roleRef"]
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else "", ref["name"])]
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], role["metadata"]["name"]
            for subject in binding["subjects"]:
                assert subject["kind"] == "ServiceAccount", subject
                out |= {(subject["name"], scope, _resource(g, r), v)
                        for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    return out


def _kustomize(kubectl: str, path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


def _helm(helm: str, *sets: str) -> list[dict[str, Any]]:
    args = [a for s in sets for a in ("--set", s)]
    proc = subprocess.run([helm, "template", "hypertopo", str(CHART), "--namespace", NS, *args],
                          capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


def _unlisted(held: set[Grant], table: dict[Grant, bool], *, node_marks: bool) -> list[str]:
    listed = {g for g, only_marks in table.items() if node_marks or not only_marks}
    return sorted(f"{'not in the README' if g in held else 'not held'}: {g}" for g in held ^ listed)


@pytest.fixture(scope="module")
def with_node_marks(kubectl: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    overlay = tmp_path_factory.mktemp("node-marks")
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "daemonset", overlay)],
        "components": [os.path.relpath(REPO / "daemonset" / "components" / "node-marks", overlay)]}))  # fmt: skip
    return _kustomize(kubectl, overlay)


def test_the_kustomize_install_holds_exactly_the_readmes_base_rows(kubectl: str) -> None:
    assert _unlisted(grants(_kustomize(kubectl, REPO / "daemonset")), readme_table(), node_marks=False) == []


def test_the_node_marks_component_adds_exactly_the_readmes_node_marks_rows(with_node_marks: list[Any]) -> None:
    assert _unlisted(grants(with_node_marks), readme_table(), node_marks=True) == []


def test_the_chart_holds_exactly_the_readmes_rows_with_and_without_node_marks(helm: str) -> None:
    table = readme_table()
    assert _unlisted(grants(_helm(helm)), table, node_marks=False) == []
    marks = _helm(helm, "aggregator.nodeLabels=true", "aggregator.taintUnhealthy=true", "aggregator.markDegraded=true")
    assert _unlisted(grants(marks), table, node_marks=True) == []


def test_an_unlisted_verb_is_caught(kubectl: str) -> None:
    """The check can fail: one verb more on the agent's role is reported by name."""
    docs = _kustomize(kubectl, REPO / "daemonset")
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "hypertopo-agent")
    role["rules"][0]["verbs"].append("delete")
    assert _unlisted(grants(docs), readme_table(), node_marks=False) == [
        "not in the README: ('hypertopo-agent', 'cluster', 'nodetopologies.hypertopo.io', 'delete')"]
