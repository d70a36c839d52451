"""charts/hypertopo: lints with the real helm, renders the kustomize install's objects for default
values, passes a server-side dry run on the test API server, and its values do what they say
(issue 13). helm is built from its Go module (tests/controlplane/helm/build_helm.sh) and cached."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane
from renders import node_marks_overlay

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hypertopo"
NS = "hypertopo-system"
AGENT_NS = "hypertopo-agent"
RELEASE_NAMESPACE = ("Namespace", "", NS)  # rendered only with namespace.create=true


# Cluster-scoped kinds: kustomize's `namespace:` also stamps a namespace on the admission policy and
# its binding (it does not know they are cluster-scoped; the API server ignores it), so it is dropped.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}


def _objects(text: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Objects by (kind, namespace, name); comments and key order do not matter."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for doc in yaml.safe_load_all(text):
        if doc:
            meta = doc["metadata"]
            if doc["kind"] in CLUSTER_SCOPED:
                meta.pop("namespace", None)
            out[(doc["kind"], meta.get("namespace", ""), meta["name"])] = doc
    return out


def _template(helm: str, *sets: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """`helm template` with `--set` values (`--set-string` for those written `string:KEY=VALUE`)."""
    args = [a for s in sets for a in (("--set-string", s[7:]) if s.startswith("string:") else ("--set", s))]
    proc = subprocess.run([helm, "template", "hypertopo", str(CHART), "--namespace", NS, *args],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return _objects(proc.stdout)


def _kustomize(kubectl: str, path: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    proc = subprocess.run([kubectl, "kustomize", str(REPO / path)], capture_output=True, text=True, check=True)
    return _objects(proc.stdout)


def _differences(chart: dict[Any, Any], kustomize: dict[Any, Any]) -> list[str]:
    lines = [f"only in the chart: {k}" for k in chart.keys() - kustomize.keys()]
    lines += [f"only in kustomize: {k}" for k in kustomize.keys() - chart.keys()]
    lines += [f"differs: {k}: {json.dumps(chart[k], sort_keys=True)} != {json.dumps(kustomize[k], sort_keys=True)}"
              for k in chart.keys() & kustomize.keys() if chart[k] != kustomize[k]]
    return lines


def test_helm_lint_passes(helm: str) -> None:
    for sets in ([], ["monitoring.enabled=true", "namespace.create=true", "aggregator.nodeLabels=true"]):
        args = [a for s in sets for a in ("--set", s)]
        proc = subprocess.run([helm, "lint", "--strict", str(CHART), "--namespace", NS, *args], capture_output=True,
                              text=True, check=False, timeout=120)
        assert proc.returncode == 0 and "0 chart(s) failed" in proc.stdout, proc.stdout + proc.stderr


def test_default_values_render_the_kustomize_install(helm: str, kubectl: str) -> None:
    kustomize = _kustomize(kubectl, "daemonset")
    without_namespace = {k: v for k, v in kustomize.items() if k != RELEASE_NAMESPACE}
    assert _differences(_template(helm), without_namespace) == []
    assert _differences(_template(helm, "namespace.create=true"), kustomize) == []


def test_monitoring_on_adds_the_monitoring_kustomization(helm: str, kubectl: str) -> None:
    want = {**_kustomize(kubectl, "daemonset"), **_kustomize(kubectl, "daemonset/monitoring")}
    want = {k: v for k, v in want.items() if k != RELEASE_NAMESPACE}
    assert _differences(_template(helm, "monitoring.enabled=true"), want) == []


def _container(objects: dict[Any, Any], kind: str, name: str) -> dict[str, Any]:
    namespace = AGENT_NS if kind == "DaemonSet" else NS
    pod: dict[str, Any] = objects[(kind, namespace, name)]["spec"]["template"]["spec"]
    return pod


def test_values_set_image_placement_opt_ins_and_thresholds(helm: str) -> None:
    objects = _template(
        helm,
        "image.repository=registry.example/ht", "image.tag=9.9",
        "string:agent.nodeSelector.nvidia\\.com/gpu\\.present=true",
        "aggregator.nodeLabels=true", "aggregator.taintUnhealthy=true", "aggregator.readyThreshold=0.25",
        "aggregator.degradedThreshold=2", "aggregator.holdDown=10", "scheduler.enabled=false",
    )
    agent = _container(objects, "DaemonSet", "hypertopo-agent")
    assert agent["containers"][0]["image"] == "registry.example/ht:9.9"
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert agent["tolerations"] == [{"operator": "Exists"}]
    args = _container(objects, "Deployment", "hypertopo-aggregator")["containers"][0]["args"]
    assert args == ["--namespace=$(POD_NAMESPACE)", "--listen=0.0.0.0:9731", "--agent-namespace=hypertopo-agent",
                    "--node-labels", "--taint-unhealthy", "--ready-threshold=0.25", "--degraded-threshold=2",
                    "--hold-down=10"]
    assert not any(k[2] == "hypertopo-scheduler" for k in objects)
    tolerated = _template(helm, "agent.tolerations=null")
    assert "tolerations" not in _container(tolerated, "DaemonSet", "hypertopo-agent")


@pytest.mark.apiserver
def test_the_rendered_chart_passes_a_server_side_dry_run(helm: str, apiserver: ControlPlane) -> None:
    for namespace in (NS, AGENT_NS):  # a dry run creates no namespace for the objects in it
        apiserver.kubectl("create", "namespace", namespace, check=False)
    rendered = subprocess.run([helm, "template", "hypertopo", str(CHART), "--namespace", NS,
                               "--set", "aggregator.nodeLabels=true"],
                              capture_output=True, text=True, check=True, timeout=120).stdout
    proc = apiserver.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=rendered)
    assert proc.stdout.count("(server dry run)") == len(_objects(rendered)), proc.stdout


def test_the_readme_puts_the_helm_install_next_to_the_kustomize_one() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    install = readme[readme.index("## Install"):][:1500]
    assert "helm install hypertopo charts/hypertopo" in install and "kubectl apply -k daemonset/" in install


NODE_MARKS = {("ClusterRole", "", "hypertopo-aggregator-node-marks"),
              ("ClusterRoleBinding", "", "hypertopo-aggregator-node-marks")}  # fmt: skip


def test_node_patch_is_granted_only_with_a_node_mark_value_as_the_kustomize_component_does(
    helm: str, kubectl: str, tmp_path: Path
) -> None:
    assert not NODE_MARKS & _template(helm).keys()  # default: no Node patch
    overlay = node_marks_overlay(tmp_path / "overlay")
    with_component = _objects(subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True,
                                             check=True).stdout)  # fmt: skip
    chart = _template(helm, "aggregator.nodeLabels=true")
    aggregator = ("Deployment", NS, "hypertopo-aggregator")  # differs by the flag itself
    assert _differences({k: v for k, v in chart.items() if k != aggregator},
                        {k: v for k, v in with_component.items() if k not in (aggregator, RELEASE_NAMESPACE)}) == []
    taint_only = _template(helm, "aggregator.taintUnhealthy=true")
    rules = taint_only[("ClusterRole", "", "hypertopo-aggregator-node-marks")]["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]  # no Kueue without labels


def test_values_move_the_agent_and_its_address(helm: str) -> None:
    objects = _template(helm, "agent.namespace=gpu-agents", "agent.listenAddress=0.0.0.0")
    agent = objects[("DaemonSet", "gpu-agents", "hypertopo-agent")]["spec"]["template"]["spec"]["containers"][0]
    assert "--listen=0.0.0.0:9730" in agent["args"]
    assert objects[("Namespace", "", "gpu-agents")]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
        "privileged")
    binding = objects[("ClusterRoleBinding", "", "hypertopo-agent")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hypertopo-agent", "namespace": "gpu-agents"}]
    reads = objects[("RoleBinding", "gpu-agents", "hypertopo-aggregator-reads-agents")]
    assert reads["subjects"] == [{"kind": "ServiceAccount", "name": "hypertopo-aggregator", "namespace": NS}]
    args = objects[("Deployment", NS, "hypertopo-aggregator")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--agent-namespace=gpu-agents" in args
    monitor = _template(helm, "agent.namespace=gpu-agents", "monitoring.enabled=true")[
        ("PodMonitor", NS, "hypertopo-agent")]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-agents"]}
