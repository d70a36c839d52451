"""hypertopo the way a user runs it: the image built from the Dockerfile, installed with the README's
own commands onto a cluster with a real node (kubelet, containerd, runc, the CNI bridge: see
tests/realnode/node.py), its agent a pod of the DaemonSet reporting that node."""

from __future__ import annotations

import grp
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import REPO, ControlPlaneError, build
from realnode.node import NODE, RealNodeCluster, built, require_node_parts
from realparts import missing
from test_agent_lldpd_socket import readme_gid, readme_overlay, write_overlay
from test_readme_lifecycle import install_lines, run_lines, shell, uninstall_lines

pytestmark = [pytest.mark.apiserver, pytest.mark.netns, pytest.mark.timeout(900)]
AGENT_NS, SYSTEM_NS = "hypertopo-agent", "hypertopo-system"
OWNED = "volcano.sh/network-topology-source=hypertopo"
CLUSTER_KINDS = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                 "Namespace", "PriorityClass"}  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealNodeCluster]:
    require_node_parts()
    node_bin = Path(built("tests/realnode/nodebin/build.sh", "kubelet, kube-controller-manager, kube-scheduler"))
    images = (built("tests/image/build.sh", "the project's image"), built("tests/image/pause.sh", "the pause image"))
    workdir = Path(tempfile.mkdtemp(prefix="hypertopo-realnode-"))
    plane = RealNodeCluster(bin_dir=build(), workdir=workdir, node_bin=node_bin, images=images)
    try:
        plane.start()
        plane.start_node()
        yield plane
    except ControlPlaneError as exc:
        missing(f"cannot start the real node: {exc}")
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def get_json(cluster: RealNodeCluster, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)
    return doc


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_pods_ready(cluster: RealNodeCluster, namespace: str, selector: str, timeout: float) -> list[dict[str, Any]]:
    """The pods that match, once there are some and each is Ready on the node."""
    deadline = time.monotonic() + timeout
    pods: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        pods = get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
        if pods and all(ready(p) and p["spec"].get("nodeName") == NODE for p in pods):
            return pods
        time.sleep(1)
    states = [(p["metadata"]["name"], p.get("status", {}).get("phase"), p.get("status", {}).get("containerStatuses"))
              for p in pods]  # fmt: skip
    events = cluster.kubectl("get", "events", "-n", namespace, check=False).stdout[-2000:]
    pytest.fail(f"{selector} in {namespace} not Ready on {NODE} after {timeout:.0f} s: {states}\n{events}"
                f"\n{cluster.log_tail('kubelet', 3000)}")  # fmt: skip


def test_the_readme_install_runs_the_agent_as_a_pod_of_the_real_node_that_reports_the_node(
    cluster: RealNodeCluster,
) -> None:
    run_lines(cluster, None, install_lines(helm=False))
    assert_running_and_reporting(cluster)
    agents = get_json(cluster, "pods", "-n", AGENT_NS, "-l", "app.kubernetes.io/name=hypertopo-agent")["items"]
    assert [p["spec"]["containers"][0]["image"] for p in agents] == [cluster.images[0]]
    for name in ("hypertopo-aggregator", "hypertopo-scheduler"):  # both replicas of each, on the pod network
        pods = get_json(cluster, "pods", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/name={name}")["items"]
        assert len(pods) == 2 and all(p["status"]["podIP"].startswith("10.252.0.") for p in pods), pods
    report = get_json(cluster, "ntopo", NODE)
    assert report["spec"]["nodeName"] == NODE


def test_the_admission_policy_denies_the_agent_pod_another_nodes_report(cluster: RealNodeCluster) -> None:
    """From inside the agent's own pod, with its own projected token, a copy of its node's report
    created again (a server-side dry run): under its own node's name it passes admission and meets
    the report already there; under another node's name the policy forbids it."""
    pod = wait_pods_ready(cluster, AGENT_NS, "app.kubernetes.io/name=hypertopo-agent", timeout=180)[0]
    script = """
import json, sys
from kubernetes import client, config
config.load_incluster_config()
api = client.CustomObjectsApi()
own = api.get_cluster_custom_object("hypertopo.io", "v1alpha1", "nodetopologies", sys.argv[1])
for name in sys.argv[1:]:
    body = {"apiVersion": own["apiVersion"], "kind": own["kind"], "metadata": {"name": name},
            "spec": {**own["spec"], "nodeName": name}}
    try:
        api.create_cluster_custom_object("hypertopo.io", "v1alpha1", "nodetopologies", body, dry_run="All")
        print(json.dumps([name, 201, ""]))
    except client.ApiException as exc:
        print(json.dumps([name, exc.status, json.loads(exc.body).get("message", "")]))
"""
    out = cluster.kubectl("exec", "-n", AGENT_NS, pod["metadata"]["name"], "--", "python3", "-c", script,
                          NODE, "other-node", timeout=60).stdout  # fmt: skip
    results = {name: (status, message) for name, status, message in map(json.loads, out.splitlines())}
    assert results[NODE][0] == 409, results  # past admission, stopped only by the report it already wrote
    status, message = results["other-node"]
    assert status == 403, results
    assert f"hypertopo-agent on node {NODE} may write only the NodeTopology named after its own node" in message


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(1)
    return found


def owned_hypernodes(cluster: RealNodeCluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "hypernodes", "-l", OWNED)["items"]
    return items


def ready_condition(hypernode: dict[str, Any]) -> str:
    conditions = (hypernode.get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


def test_the_readmes_lldpd_overlay_reads_the_nodes_lldpd_and_its_switch_becomes_a_leaf_hypernode(
    cluster: RealNodeCluster, tmp_path: Path
) -> None:
    """The README's lldpd-socket overlay (its GID the node's `_lldpd`) on the kustomize install: the
    agent, with the shipped securityContext, reads the node's lldpd, which hears the switch stand-in
    `leaf-sw1` on eth1; the aggregator makes that switch a leaf HyperNode, Ready. Two rollouts of the
    agents (a changed flag, then `kubectl rollout restart`) delete no HyperNode (the same object, its
    watch sees no DELETED). Cutting the cable turns it Ready=False (LinkFailed), plugging it back
    Ready=True."""
    name, text = readme_overlay()
    gid = grp.getgrnam("_lldpd").gr_gid
    text = text.replace(f"value: {readme_gid(text)}", f"value: {gid}")
    cluster.kubectl("apply", "-k", str(write_overlay(tmp_path, name, text)))
    cluster.kubectl("rollout", "status", "-n", AGENT_NS, "daemonset/hypertopo-agent", "--timeout=180s", timeout=200)
    neighbours = wait_for("leaf-sw1 in the node's report", lambda: [
        n for n in (get_json(cluster, "ntopo", NODE)["spec"].get("lldp") or []) if n.get("systemName") == "leaf-sw1"
    ], timeout=60)  # fmt: skip
    assert neighbours[0].get("interface", "eth1") == "eth1", neighbours
    leaf = wait_for("a Ready leaf HyperNode of leaf-sw1", lambda: [
        h for h in owned_hypernodes(cluster) if "leaf-sw1" in json.dumps(h) and ready_condition(h) == "True"
    ], timeout=60)[0]  # fmt: skip
    print(f"\nleaf HyperNode {leaf['metadata']['name']}: {leaf['spec']}")
    watch = subprocess.Popen([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "get",
                              "hypernodes", "-l", OWNED, "--watch", "--output-watch-events", "-o",
                              "custom-columns=EVENT:.type,NAME:.object.metadata.name", "--no-headers"],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(2)
        # A veth is no physical NIC, which the agent's default `--interfaces fabric` looks for: name the
        # node's cable, so its carrier counts (a rollout of its own).
        cluster.kubectl("patch", "-n", AGENT_NS, "daemonset/hypertopo-agent", "--type=json", "-p", json.dumps([
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--interfaces=eth1"}]))
        for action in ("status", "restart", "status"):
            cluster.kubectl("rollout", action, "-n", AGENT_NS, "daemonset/hypertopo-agent",
                            *(["--timeout=180s"] if action == "status" else []), timeout=200)  # fmt: skip
        after = wait_for("the leaf Ready again after the restart", lambda: [
            h for h in owned_hypernodes(cluster) if h["metadata"]["name"] == leaf["metadata"]["name"]
            and ready_condition(h) == "True"], timeout=90)[0]  # fmt: skip
        time.sleep(5)
    finally:
        watch.terminate()
        events = watch.communicate(timeout=10)[0].split()
    assert after["metadata"]["uid"] == leaf["metadata"]["uid"]
    assert "DELETED" not in events, events
    cluster.cable(up=False)
    cut = wait_for("the leaf Ready=False after its cable was cut", lambda: [
        c for h in owned_hypernodes(cluster) for c in h["status"]["conditions"]
        if c["type"] == "Ready" and c["status"] == "False"], timeout=60)[0]  # fmt: skip
    assert cut["reason"] == "LinkFailed" and "eth1: link down" in cut["message"], cut
    cluster.cable(up=True)
    wait_for("the leaf Ready again with its cable back", lambda: [
        h for h in owned_hypernodes(cluster) if ready_condition(h) == "True"], timeout=60)  # fmt: skip


def assert_uninstalled(cluster: RealNodeCluster, installed: list[dict[str, Any]]) -> None:
    """Every object the install made NotFound, no pod of it left on the node, no NodeTopology CRD
    (and so no report) and no HyperNode of hypertopo's."""
    for obj in installed:
        where = ["-n", obj["metadata"]["namespace"]] if obj["metadata"].get("namespace") else []
        proc = cluster.kubectl("get", obj["kind"], obj["metadata"]["name"], *where, check=False)
        assert proc.returncode != 0 and "NotFound" in proc.stderr, f"{obj['kind']} {obj['metadata']['name']} left"
    left = [p["metadata"]["name"] for p in get_json(cluster, "pods", "-A")["items"]]
    assert not [name for name in left if name.startswith("hypertopo-")], left
    crd = cluster.kubectl("get", "crd", "nodetopologies.hypertopo.io", check=False)
    assert crd.returncode != 0 and "NotFound" in crd.stderr
    assert owned_hypernodes(cluster) == []


def assert_running_and_reporting(cluster: RealNodeCluster) -> None:
    wait_pods_ready(cluster, AGENT_NS, "app.kubernetes.io/name=hypertopo-agent", timeout=180)
    for name in ("hypertopo-aggregator", "hypertopo-scheduler"):
        wait_pods_ready(cluster, SYSTEM_NS, f"app.kubernetes.io/name={name}", timeout=180)
    deadline = time.monotonic() + 60
    while NODE not in cluster.kubectl("get", "ntopo", check=False).stdout.split():
        assert time.monotonic() < deadline, f"kubectl get ntopo shows no {NODE}"
        time.sleep(1)


def test_the_readme_uninstall_leaves_nothing_and_the_helm_install_runs_on_the_same_node(
    cluster: RealNodeCluster, helm: str
) -> None:
    """After the kustomize install above: the README's Uninstall (the namespace controller of the real
    kube-controller-manager finishing what `kubectl delete -k` waits for), then the Install with Helm,
    then Helm's Uninstall, on the same node."""
    installed = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(REPO / "daemonset")).stdout) if d]
    run_lines(cluster, None, uninstall_lines(helm=False, kueue=False))
    assert_uninstalled(cluster, installed)
    run_lines(cluster, helm, install_lines(helm=True))
    assert_running_and_reporting(cluster)
    manifest = [d for d in yaml.safe_load_all(shell(cluster, helm, f"helm get manifest hypertopo -n {SYSTEM_NS}").stdout)
                if d]  # fmt: skip
    assert {"DaemonSet", "Deployment", "ValidatingAdmissionPolicy"} <= {d["kind"] for d in manifest}
    for obj in manifest:  # helm's manifest leaves the release namespace out of namespaced objects
        if obj["kind"] not in CLUSTER_KINDS:
            obj["metadata"].setdefault("namespace", SYSTEM_NS)
    run_lines(cluster, helm, uninstall_lines(helm=True, kueue=False))
    assert_uninstalled(cluster, [*manifest, {"kind": "Namespace", "metadata": {"name": SYSTEM_NS}}])
