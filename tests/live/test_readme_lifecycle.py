"""The README's Install, Upgrade and Uninstall blocks, run as written (bash, from the repository
root) on a control plane of this module's own (issue 23): with kustomize and with Helm, install
then upgrade, leave behind what the agents and the aggregator would have written (HyperNodes,
NodeTopologies, the opt-in Node labels, taint and annotation, Kueue's Topology), uninstall, and
no hypertopo object is left, while other projects' objects on the same Nodes and a HyperNode
Volcano made stay.

The test control plane runs no kube-controller-manager, so `namespace_controller` does what its
namespace controller does: a namespace being deleted has its objects deleted and its finalizer
removed; without it `kubectl delete namespace` (as the uninstall runs it) never returns."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane, ControlPlaneError, running
from realparts import missing

from agent.common.report import ComponentHealth, Health, NodeReport, node_topology_object
from aggregator.live.kueue_topology import DEFAULT_NAME, topology_object
from aggregator.live.node_marks import DEGRADED_ANNOTATION, LABEL_PREFIX, TAINT_KEY
from aggregator.live.reconcile import OWNER_LABELS

REPO = Path(__file__).resolve().parents[2]
NS = "hypertopo-system"
KUSTOMIZE_APP = "kubectl apply -k daemonset/"
pytestmark = pytest.mark.apiserver


def blocks(title: str) -> list[list[str]]:
    """The command lines of each code block of README section `title`."""
    readme = (REPO / "README.md").read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", readme, re.S | re.M)
    assert match, f"README has no '{title}' section"
    found = re.findall(r"^```\n(.*?)^```", match.group(1), re.S | re.M)
    assert found, f"README's '{title}' section has no code block"
    return [[line for line in block.splitlines() if line.strip()] for block in found]


def install_lines(helm: bool) -> list[str]:
    """The Install block's commands that change the cluster, for one way of installing (monitoring
    needs prometheus-operator's CRDs: test_deploy_monitoring)."""
    lines = [line for line in blocks("Install")[0] if line.split()[:2] != ["kubectl", "get"]]
    lines = [line for line in lines if "daemonset/monitoring/" not in line]
    return [line for line in lines if not line.startswith("helm " if not helm else KUSTOMIZE_APP)]


def upgrade_lines(helm: bool) -> list[str]:
    return [line for line in blocks("Upgrade")[0] if not line.startswith("helm " if not helm else KUSTOMIZE_APP)]


def uninstall_lines(helm: bool, kueue: bool) -> list[str]:
    main, helm_first, kueue_block = blocks("Uninstall")
    assert main[0].startswith("kubectl delete -k daemonset/ "), main[0]
    lines = ([helm_first[0]] if helm else [main[0]]) + main[1:]
    return lines + (kueue_block if kueue else [])


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    try:
        with running() as started:
            yield started
    except ControlPlaneError as exc:
        missing(f"cannot start a test control plane: {exc}")


@pytest.fixture(scope="module")
def kueue(plane: ControlPlane) -> None:
    proc = subprocess.run(["bash", str(REPO / "tests/controlplane/kueue_crds.sh")], capture_output=True, text=True,
                          check=False)  # fmt: skip
    if proc.returncode != 0:
        missing(f"Kueue's CRDs unavailable: {proc.stderr[-500:]}")
    plane.kubectl("apply", "--server-side", "-f", str(Path(proc.stdout.strip()) / "kueue.x-k8s.io_topologies.yaml"))
    plane.wait_crds_established("topologies.kueue.x-k8s.io")


def shell(plane: ControlPlane, helm_bin: str | None, line: str) -> subprocess.CompletedProcess[str]:
    """One README line in bash from the repository root, kubectl (and helm) on PATH."""
    tools = [str(plane.bin_dir)] + ([str(Path(helm_bin).parent)] if helm_bin else [])
    path = os.pathsep.join([*tools, os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "KUBECONFIG": str(plane.kubeconfig)}
    return subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
                          check=False)  # fmt: skip


def run_lines(plane: ControlPlane, helm_bin: str | None, lines: list[str]) -> None:
    for line in lines:
        proc = shell(plane, helm_bin, line)
        if proc.returncode != 0 and line.startswith("kubectl create -k daemonset/crds/upstream/"):
            # the CRDs exist here (as on a Volcano cluster): `create` refuses them, and only that way
            refusals = [row for row in proc.stderr.splitlines() if row.strip()]
            assert refusals and all("AlreadyExists" in row for row in refusals), proc.stderr
            continue
        assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"


@contextlib.contextmanager
def namespace_controller(plane: ControlPlane) -> Iterator[None]:
    """kube-controller-manager's namespace controller, as far as the uninstall needs it."""
    stop = threading.Event()

    def finish(namespace: dict[str, Any]) -> None:
        name = namespace["metadata"]["name"]
        kinds = plane.kubectl("api-resources", "--namespaced=true", "--verbs=list,delete", "-o", "name").stdout.split()
        plane.kubectl("delete", ",".join(kinds), "--all", "-n", name, "--wait=false", check=False)
        namespace["spec"]["finalizers"] = []
        plane.kubectl("replace", "--raw", f"/api/v1/namespaces/{name}/finalize", "-f", "-",
                      input=json.dumps(namespace), check=False)  # fmt: skip

    def loop() -> None:
        while not stop.wait(0.2):
            proc = plane.kubectl("get", "namespaces", "-o", "json", check=False)
            for namespace in json.loads(proc.stdout or "{}").get("items", []):
                if namespace["metadata"].get("deletionTimestamp") and namespace["spec"].get("finalizers"):
                    finish(namespace)

    thread = threading.Thread(target=loop, name="namespace-controller", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def apply(plane: ControlPlane, *objects: dict[str, Any]) -> None:
    docs = "\n---\n".join(json.dumps(obj) for obj in objects)
    plane.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=docs)


def leave_what_hypertopo_writes(plane: ControlPlane, tag: str) -> None:
    """What a running install writes, as its components write it, beside other projects' objects."""
    plane.wait_crds_established("nodetopologies.hypertopo.io")  # the README applies it without waiting
    marked, plain = f"gpu-a-{tag}", f"gpu-b-{tag}"
    node_marks = {
        "labels": {f"{LABEL_PREFIX}leaf": f"leaf-{tag}", f"{LABEL_PREFIX}spine": f"spine-{tag}", "team": "ml"},
        "annotations": {DEGRADED_ANNOTATION: "2026-11-25T12:00:00Z", "example.com/keep": "yes"},
    }
    taints = [{"key": TAINT_KEY, "effect": "NoSchedule"}, {"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    apply(plane,
          {"apiVersion": "v1", "kind": "Node", "metadata": {"name": marked, **node_marks}, "spec": {"taints": taints}},
          {"apiVersion": "v1", "kind": "Node", "metadata": {"name": plain, "labels": {"team": "ml"}}})  # fmt: skip

    def hypernode(name: str, labels: dict[str, str]) -> dict[str, Any]:
        members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in (marked, plain)]
        return {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
                "metadata": {"name": name, "labels": labels}, "spec": {"tier": 1, "tierName": "leaf", "members": members}}

    apply(plane, hypernode(f"leaf-{tag}", dict(OWNER_LABELS)), hypernode(f"spine-{tag}", dict(OWNER_LABELS)),
          hypernode(f"volcanos-own-{tag}", {}))  # fmt: skip
    for node in (marked, plain):
        apply(plane, node_topology_object(NodeReport(node_name=node, health={"host": ComponentHealth(Health.OK)})))
    apply(plane, topology_object((f"{LABEL_PREFIX}spine", f"{LABEL_PREFIX}leaf", "kubernetes.io/hostname"), DEFAULT_NAME))


def get_json(plane: ControlPlane, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(plane.kubectl("get", *args, "-o", "json").stdout)
    return doc


def where(obj: dict[str, Any]) -> list[str]:
    return ["-n", obj["metadata"]["namespace"]] if obj["metadata"].get("namespace") else []


def assert_all_there(plane: ControlPlane, installed: list[dict[str, Any]]) -> None:
    for obj in installed:
        plane.kubectl("get", obj["kind"], obj["metadata"]["name"], *where(obj))


def assert_nothing_left(plane: ControlPlane, installed: list[dict[str, Any]], tag: str) -> None:
    for obj in installed:
        proc = plane.kubectl("get", obj["kind"], obj["metadata"]["name"], *where(obj), check=False)
        assert proc.returncode != 0 and "NotFound" in proc.stderr, f"{obj['kind']} {obj['metadata']['name']} left"
    source = "volcano.sh/network-topology-source=hypertopo"
    assert get_json(plane, "hypernodes", "-l", source)["items"] == []
    assert [h["metadata"]["name"] for h in get_json(plane, "hypernodes")["items"]] == [f"volcanos-own-{tag}"]
    crd = plane.kubectl("get", "crd", "nodetopologies.hypertopo.io", check=False)
    assert crd.returncode != 0 and "NotFound" in crd.stderr, "the NodeTopology CRD (and its objects) left"
    assert get_json(plane, "topologies.kueue.x-k8s.io", "-l", "app.kubernetes.io/managed-by=hypertopo")["items"] == []
    for node in get_json(plane, "nodes")["items"]:
        meta, spec = node["metadata"], node.get("spec") or {}
        keys = [*meta.get("labels", {}), *meta.get("annotations", {}), *(t["key"] for t in spec.get("taints", []))]
        assert not [k for k in keys if k.startswith(LABEL_PREFIX)], f"{meta['name']}: {keys}"
        assert meta["labels"]["team"] == "ml"  # other projects' marks stay
    marked = get_json(plane, "node", f"gpu-a-{tag}")
    assert marked["metadata"]["annotations"]["example.com/keep"] == "yes"
    assert "nvidia.com/gpu" in [t["key"] for t in marked["spec"]["taints"]]


def clean_volcanos_own(plane: ControlPlane, tag: str) -> None:
    plane.kubectl("delete", "hypernode", f"volcanos-own-{tag}")
    plane.kubectl("delete", "node", f"gpu-a-{tag}", f"gpu-b-{tag}")


def test_the_readme_installs_upgrades_and_uninstalls_with_kustomize_leaving_nothing(
    plane: ControlPlane, kueue: None
) -> None:
    installed = [d for d in yaml.safe_load_all(plane.kubectl("kustomize", str(REPO / "daemonset")).stdout) if d]
    run_lines(plane, None, install_lines(helm=False))
    run_lines(plane, None, upgrade_lines(helm=False))
    assert_all_there(plane, installed)
    leave_what_hypertopo_writes(plane, "k")
    with namespace_controller(plane):
        run_lines(plane, None, uninstall_lines(helm=False, kueue=True))
    assert_nothing_left(plane, installed, "k")
    clean_volcanos_own(plane, "k")


def test_the_readme_installs_upgrades_and_uninstalls_with_helm_leaving_nothing(
    plane: ControlPlane, helm: str, kueue: None
) -> None:
    run_lines(plane, helm, install_lines(helm=True))
    run_lines(plane, helm, upgrade_lines(helm=True))
    manifest = shell(plane, helm, f"helm get manifest hypertopo -n {NS}")
    assert manifest.returncode == 0, manifest.stderr
    installed = [d for d in yaml.safe_load_all(manifest.stdout) if d]
    assert {"DaemonSet", "ValidatingAdmissionPolicy"} <= {d["kind"] for d in installed}
    for obj in installed:  # helm's manifest leaves namespaced objects' namespace to the release
        if obj["kind"] not in {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                               "ValidatingAdmissionPolicyBinding", "Namespace"}:  # fmt: skip
            obj["metadata"].setdefault("namespace", NS)
    installed.append({"kind": "Namespace", "metadata": {"name": NS}})
    assert_all_there(plane, installed)
    leave_what_hypertopo_writes(plane, "h")
    with namespace_controller(plane):
        run_lines(plane, helm, uninstall_lines(helm=True, kueue=True))
    assert_nothing_left(plane, installed, "h")
    release = shell(plane, helm, f"helm list -n {NS} -a -q")
    assert release.stdout.strip() == "", release.stdout
    clean_volcanos_own(plane, "h")
