"""hypertopo the way a user runs it: the image built from the Dockerfile, installed with the README's
own commands onto a cluster with a real node (kubelet, containerd, runc, the CNI bridge: see
tests/realnode/node.py), its agent a pod of the DaemonSet reporting that node."""

from __future__ import annotations

import contextlib
import grp
import json
import shlex
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
from realnode.node import NODE, NODE_IP, RealNodeCluster, built, require_node_parts
from realnode.prometheus import scraping
from realparts import missing
from test_agent_lldpd_socket import readme_gid, readme_overlay, write_overlay
from test_readme_lifecycle import install_lines, run_lines, shell, uninstall_lines, upgrade_lines
from test_real_node_readme_overlays import readme_helm_nics_args
from test_real_node_readme_overlays import readme_overlay as readme_overlay_of

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


@contextlib.contextmanager
def hypernode_watch(cluster: RealNodeCluster) -> Iterator[list[str]]:
    """Every watch event type on hypertopo's HyperNodes while the block runs (filled in on exit)."""
    watch = subprocess.Popen([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "get",
                              "hypernodes", "-l", OWNED, "--watch", "--output-watch-events", "-o",
                              "custom-columns=EVENT:.type,NAME:.object.metadata.name", "--no-headers"],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    events: list[str] = []
    try:
        time.sleep(2)
        yield events
        time.sleep(5)  # a deletion the aggregator makes once the rollout settled shows too
    finally:
        watch.terminate()
        events += watch.communicate(timeout=10)[0].split()


def uids(cluster: RealNodeCluster) -> dict[str, str]:
    return {h["metadata"]["name"]: h["metadata"]["uid"] for h in owned_hypernodes(cluster)}


def ready_leaf(cluster: RealNodeCluster, what: str, timeout: float = 90) -> dict[str, Any]:
    found: list[dict[str, Any]] = wait_for(what, lambda: [
        h for h in owned_hypernodes(cluster) if "leaf-sw1" in json.dumps(h) and ready_condition(h) == "True"
    ], timeout=timeout)  # fmt: skip
    return found[0]


def rollout(cluster: RealNodeCluster, *actions: str) -> None:
    for action in actions:
        cluster.kubectl("rollout", action, "-n", AGENT_NS, "daemonset/hypertopo-agent",
                        *(["--timeout=180s"] if action == "status" else []), timeout=200)  # fmt: skip


def test_the_readmes_lldpd_overlay_reads_the_nodes_lldpd_and_its_switch_becomes_a_leaf_hypernode(
    cluster: RealNodeCluster, tmp_path: Path
) -> None:
    """The lldpd-socket overlay of docs/install.md (its GID the node's `_lldpd`) on the kustomize install: the
    agent, with the shipped securityContext, reads the node's lldpd, which hears the switch stand-in
    `leaf-sw1` on eth1; the aggregator makes that switch a leaf HyperNode, Ready. Two rollouts of the
    agents delete no HyperNode (the same object, its watch sees no DELETED): `kubectl rollout
    restart`, then docs/install.md's overlay for virtual fabric NICs (the node's eth1 is a veth), with
    which the agent hears the switch itself and watches eth1's carrier. Cutting the cable turns the
    leaf Ready=False (LinkFailed), plugging it back Ready=True."""
    name, text = readme_overlay()
    gid = grp.getgrnam("_lldpd").gr_gid
    text = text.replace(f"value: {readme_gid(text)}", f"value: {gid}")
    cluster.kubectl("apply", "-k", str(write_overlay(tmp_path, name, text)))
    rollout(cluster, "status")
    neighbours = wait_for("leaf-sw1 in the node's report", lambda: [
        n for n in (get_json(cluster, "ntopo", NODE)["spec"].get("lldp") or []) if n.get("systemName") == "leaf-sw1"
    ], timeout=60)  # fmt: skip
    assert neighbours[0].get("interface", "eth1") == "eth1", neighbours
    leaf = ready_leaf(cluster, "a Ready leaf HyperNode of leaf-sw1", timeout=60)
    print(f"\nleaf HyperNode {leaf['metadata']['name']}: {leaf['spec']}")
    before = uids(cluster)
    with hypernode_watch(cluster) as events:
        rollout(cluster, "restart", "status")
        ready_leaf(cluster, "the leaf Ready again after the restart")
        nics = tmp_path / "nics"
        nics.mkdir()
        cluster.kubectl("apply", "-k", str(write_overlay(nics, "nics-overlay", readme_overlay_of("nics-overlay"))))
        rollout(cluster, "status")
        args = get_json(cluster, "daemonset", "-n", AGENT_NS, "hypertopo-agent")["spec"]["template"]["spec"][
            "containers"][0]["args"]  # fmt: skip
        assert "--interfaces=^eth[1-9]$" in args and not [a for a in args if a.startswith("--lldpd-socket")], args
        ready_leaf(cluster, "the leaf Ready again with the nics overlay")
    assert "DELETED" not in events, events
    assert uids(cluster) == before
    cluster.cable(up=False)
    cut = wait_for("the leaf Ready=False after its cable was cut", lambda: [
        c for h in owned_hypernodes(cluster) for c in h["status"]["conditions"]
        if c["type"] == "Ready" and c["status"] == "False"], timeout=60)[0]  # fmt: skip
    assert cut["reason"] == "LinkFailed" and "eth1: link down" in cut["message"], cut
    cluster.cable(up=True)
    ready_leaf(cluster, "the leaf Ready again with its cable back", timeout=60)


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


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    """Prints how long a check took (the real-node checks are slow: each one's cost in the run)."""
    started = time.monotonic()
    yield
    print(f"\n[real node] {what}: {time.monotonic() - started:.1f} s")


DASHBOARD = REPO / "daemonset" / "monitoring" / "hypertopo-dashboard.json"
NO_HARDWARE = ("nvlink", "gpu", "rdma")  # series this node cannot have: no GPU, no HCA


def test_prometheus_scrapes_the_three_components_pods_that_the_podmonitors_select(cluster: RealNodeCluster) -> None:
    """A real Prometheus on the node, its jobs made from daemonset/monitoring's PodMonitors
    (tests/realnode/prometheus.py), scrapes the agent and both replicas of the aggregator and the
    scheduler by pod IP; the values are the cluster's: one leader of each, as many HyperNodes as
    the API server holds, no stale agent, eth1 up on the node (the PodMonitor's `node` label); every
    dashboard query returns data but those of GPUs and HCAs, which this node has none of."""
    with timed("Prometheus scrape check"), scraping(cluster.netns, NODE_IP, cluster.workdir) as prometheus:
        prometheus.discover(get_json(cluster, "pods", "-A")["items"])
        targets = wait_for("5 targets up", lambda: (found := prometheus.targets()) and len(found) == 5 and all(
            t["health"] == "up" for t in found) and found, timeout=60)  # fmt: skip
        jobs = sorted(t["labels"]["job"].split("/")[2] for t in targets)
        assert jobs == ["hypertopo-agent", *["hypertopo-aggregator"] * 2, *["hypertopo-scheduler"] * 2], targets
        hosts = {t["labels"]["job"].split("/")[2]: t["labels"]["instance"].rsplit(":", 1)[0] for t in targets}
        assert hosts["hypertopo-agent"] == NODE_IP, targets  # the host network's pod IP: the node's
        assert all(hosts[n].startswith("10.252.0.") for n in ("hypertopo-aggregator", "hypertopo-scheduler")), targets
        hypernodes = len(owned_hypernodes(cluster))
        expected = {
            "sum(hypertopo_aggregator_is_leader)": 1.0,
            "count(hypertopo_aggregator_is_leader)": 2.0,
            "sum(hypertopo_scheduler_is_leader)": 1.0,
            "sum(hypertopo_aggregator_hypernodes)": float(hypernodes),
            "max(hypertopo_aggregator_stale_agents)": 0.0,
            f'hypertopo_interface_up{{node="{NODE}",interface="eth1"}}': 1.0,
        }
        values = wait_for("the expected values", lambda: (got := {e: prometheus.value(e) for e in expected}) == expected
                          and got, timeout=60)  # fmt: skip
        print(f"\nPrometheus: {len(targets)} targets up; {values}")
        panels = [(panel["title"], target["expr"]) for panel in json.loads(DASHBOARD.read_text())["panels"]
                  for target in panel["targets"]]  # fmt: skip
        want = {title for title, expr in panels if not any(w in expr for w in NO_HARDWARE)}
        with_data = wait_for("dashboard queries with data", lambda: (found := {
            title for title, expr in panels if prometheus.query(expr)}) >= want and found, timeout=30)  # fmt: skip
        print(f"dashboard panels with data: {sorted(with_data)}; without (no GPU/HCA): "
              f"{sorted({title for title, _ in panels} - with_data)}")
        assert with_data == want, with_data ^ want


def helm_line(line: str, *extra: str) -> str:
    """A README Helm line with more arguments (before its comment)."""
    command = line.split("#", 1)[0].rstrip()
    assert command.startswith("helm "), line
    return " ".join([command, *map(shlex.quote, extra)])


def test_the_readme_uninstall_leaves_nothing_and_the_helm_install_runs_on_the_same_node(
    cluster: RealNodeCluster, helm: str
) -> None:
    """After the kustomize install above: the README's Uninstall (the namespace controller of the real
    kube-controller-manager finishing what `kubectl delete -k` waits for), then the Install with Helm
    (with docs/install.md's value for virtual fabric NICs) on the same node: the same pods, and the
    switch's leaf HyperNode again."""
    installed = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(REPO / "daemonset")).stdout) if d]
    run_lines(cluster, None, uninstall_lines(helm=False, kueue=False))
    assert_uninstalled(cluster, installed)
    run_lines(cluster, helm, [helm_line(line, *readme_helm_nics_args()) if line.startswith("helm ") else line
                              for line in install_lines(helm=True)])  # fmt: skip
    assert_running_and_reporting(cluster)
    manifest = [d for d in yaml.safe_load_all(shell(cluster, helm, f"helm get manifest hypertopo -n {SYSTEM_NS}").stdout)
                if d]  # fmt: skip
    assert {"DaemonSet", "Deployment", "ValidatingAdmissionPolicy"} <= {d["kind"] for d in manifest}
    ready_leaf(cluster, "the leaf HyperNode under the Helm install")


def test_the_readme_helm_upgrade_to_a_new_image_rolls_every_component_and_deletes_no_hypernode(
    cluster: RealNodeCluster, helm: str
) -> None:
    """The README's Upgrade with Helm, to a new image tag (the same image tagged again in the node's
    containerd, as a release would be): the agent DaemonSet, the aggregator and the scheduler roll
    onto it, and a watch of hypertopo's HyperNodes sees no DELETED; each keeps its UID."""
    with timed("helm upgrade check"):
        ready_leaf(cluster, "the leaf HyperNode before the upgrade")
        before = uids(cluster)
        image = cluster.tag_image(cluster.images[0], "0.1.1-test")
        with hypernode_watch(cluster) as events:
            run_lines(cluster, helm, [
                helm_line(line, *readme_helm_nics_args(), "--set", "image.tag=0.1.1-test") if line.startswith("helm ")
                else line for line in upgrade_lines(helm=True)])  # fmt: skip
            rollout(cluster, "status")
            for name in ("hypertopo-aggregator", "hypertopo-scheduler"):
                cluster.kubectl("rollout", "status", "-n", SYSTEM_NS, f"deployment/{name}", "--timeout=180s",
                                timeout=200)  # fmt: skip
            wait_for("only the new image's 5 pods", lambda: [
                p["spec"]["containers"][0]["image"] for ns in (AGENT_NS, SYSTEM_NS)
                for p in get_json(cluster, "pods", "-n", ns)["items"]] == [image] * 5, timeout=90)  # fmt: skip
            ready_leaf(cluster, "the leaf Ready after the upgrade")
        print(f"\nHyperNode watch during the upgrade: {events}")
        assert "DELETED" not in events, events
        assert uids(cluster) == before


def test_the_readme_helm_uninstall_leaves_nothing(cluster: RealNodeCluster, helm: str) -> None:
    manifest = [d for d in yaml.safe_load_all(shell(cluster, helm, f"helm get manifest hypertopo -n {SYSTEM_NS}").stdout)
                if d]  # fmt: skip
    for obj in manifest:  # helm's manifest leaves the release namespace out of namespaced objects
        if obj["kind"] not in CLUSTER_KINDS:
            obj["metadata"].setdefault("namespace", SYSTEM_NS)
    run_lines(cluster, helm, uninstall_lines(helm=True, kueue=False))
    assert_uninstalled(cluster, [*manifest, {"kind": "Namespace", "metadata": {"name": SYSTEM_NS}}])


def aggregator_gauge(cluster: RealNodeCluster, name: str) -> list[str]:
    """`name`'s value on each aggregator replica that exports it (the leader), read in its pod."""
    script = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9731/metrics').read().decode())"
    values = []
    for pod in get_json(cluster, "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=hypertopo-aggregator")["items"]:
        out = cluster.kubectl("exec", "-n", SYSTEM_NS, pod["metadata"]["name"], "--", "python3", "-c", script,
                              check=False).stdout  # fmt: skip
        values += [line.split()[1] for line in out.splitlines() if line.startswith(f"{name} ")]
    return values


def test_the_readmes_gpu_agents_overlay_runs_the_agent_in_its_namespace_and_the_aggregator_follows_it(
    cluster: RealNodeCluster, tmp_path: Path
) -> None:
    """docs/install.md's overlay that moves the agent to `gpu-agents`, installed in place of `kubectl
    apply -k daemonset/`: the agent Ready there and reporting, no `hypertopo-agent` namespace, and
    the aggregator tracking the agent pod there (no stale agent; it would count one if it looked in
    another namespace or could not read this one). Uninstalled with `kubectl delete -k gpu-agents/`
    and the rest of the README's Uninstall, nothing is left."""
    with timed("gpu-agents overlay install and uninstall"):
        overlay = write_overlay(tmp_path, "gpu-agents", readme_overlay_of("gpu-agents"))
        lines = install_lines(helm=False)
        assert "kubectl apply -k daemonset/" in lines[-1], lines
        run_lines(cluster, None, lines[:-1])
        cluster.kubectl("apply", "-k", str(overlay))
        wait_pods_ready(cluster, "gpu-agents", "app.kubernetes.io/name=hypertopo-agent", timeout=180)
        for name in ("hypertopo-aggregator", "hypertopo-scheduler"):
            wait_pods_ready(cluster, SYSTEM_NS, f"app.kubernetes.io/name={name}", timeout=180)
        wait_for("the node's report", lambda: NODE in cluster.kubectl("get", "ntopo", check=False).stdout.split(),
                 timeout=60)  # fmt: skip
        gone = cluster.kubectl("get", "namespace", AGENT_NS, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr
        assert wait_for("the leader's stale_agents gauge", lambda: aggregator_gauge(
            cluster, "hypertopo_aggregator_stale_agents"), timeout=60) == ["0.0"]  # fmt: skip
        installed = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(overlay)).stdout) if d]
        main = uninstall_lines(helm=False, kueue=False)
        assert main[0].startswith("kubectl delete -k daemonset/ "), main
        cluster.kubectl("delete", "-k", str(overlay), timeout=180)
        run_lines(cluster, None, main[1:])
        assert_uninstalled(cluster, installed)
