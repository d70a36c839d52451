"""The real kube-scheduler places gangs on hypertopo's labels (issue 26.2). On a kwok cluster of the
small-tree model (two leaves of four 8-GPU nodes under one spine) whose HyperNodes and node labels
come from a live `hypertopo-aggregator run --node-labels --taint-unhealthy`, kube-scheduler of the
pinned Kubernetes release (built with the control plane), with the Workload API and topology-aware
workload scheduling gates on, reads `scheduling.k8s.io/v1beta1` PodGroups whose
`schedulingConstraints.topology` names `hypertopo.io/<leaf tier>`:

- the README's PodGroup (a gang of whole nodes) lands in the one leaf that can hold it;
- a gang bigger than any leaf stays unschedulable, and the same gang on the spine tier binds;
- after a fabric fault on the node a gang sits on, its recreated pods avoid that node (the
  aggregator's taint), going to the other leaf.

Free capacity is shaped with filler pods bound straight to nodes, so each placement has one right
answer that a topology- or taint-unaware scheduler would be unlikely to find. Times are printed
(`pytest -s`)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import re
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aggregator_controller_kit import private_plane
from controlplane.harness import WORKLOAD_GATES, ControlPlane
from placement_live import Cluster, kwok_running, wait_for
from realparts import free_port, missing, stop_processes

from agent.cluster_model import load_model
from agent.common.report import ComponentHealth, Health, NodeReport, node_topology_object
from agent.model_probe import report_for
from aggregator.placement.adapters import kube

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tests" / "models" / "small-tree.yaml"
AGENT_NS = "hypertopo-system"
AGENT_MANAGER = "hypertopo-agent"
TAINT = "hypertopo.io/fabric-unhealthy"
PODGROUPS = kube.Resource("scheduling.k8s.io", "v1beta1", "podgroups", "PodGroup", namespaced=True)
README_SECTION = "### kube-scheduler on hypertopo's labels"
PLACE_TIMEOUT = 30.0
PENDING_FOR = 5.0  # seconds a gang must stay unbound after kube-scheduler judged it
pytestmark = pytest.mark.apiserver


def readme_example() -> tuple[dict[str, Any], dict[str, Any]]:
    """The PodGroup and the Pod of the kube-scheduler example in docs/scheduling.md, as written there."""
    readme = (REPO / "docs" / "scheduling.md").read_text(encoding="utf-8")
    section = readme.split(README_SECTION, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, f"README: no yaml example under {README_SECTION!r}"
    podgroup, pod = yaml.safe_load_all(block.group(1))
    assert (podgroup["kind"], pod["kind"]) == ("PodGroup", "Pod")
    return podgroup, pod


@dataclasses.dataclass
class Fabric:
    plane: ControlPlane
    cluster: Cluster
    reports: dict[str, NodeReport]
    leaf_key: str  # hypertopo.io/<the tier-1 tierName>
    spine_key: str
    scheduler_log: Path
    procs: dict[str, subprocess.Popen[bytes]]

    @property
    def api(self) -> kube.KubeClient:
        return self.cluster.api

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = self.plane.workdir / f"{name}.log"
                raise AssertionError(f"{name} exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")

    def leaves(self) -> dict[str, list[str]]:
        """Leaf label value -> the nodes carrying it, as the aggregator labelled them."""
        found: dict[str, list[str]] = {}
        for node in self.api.list(kube.NODES, label_selector=self.cluster.selector)[0]:
            value = node["metadata"]["labels"].get(self.leaf_key)
            if value:
                found.setdefault(value, []).append(node["metadata"]["name"])
        return {k: sorted(v) for k, v in sorted(found.items())}

    def publish(self, report: NodeReport) -> None:
        body = json.dumps(node_topology_object(report))
        self.plane.kubectl("apply", "--server-side", f"--field-manager={AGENT_MANAGER}", "-f", "-", input=body)

    def taints(self, node: str) -> list[str]:
        return [t["key"] for t in self.api.get(kube.NODES, node)["spec"].get("taints") or []]


def _scheduler_ready(port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with contextlib.suppress(OSError), urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx,
                                                              timeout=2) as resp:  # fmt: skip
        return bool(resp.status == 200)
    return False


def _start(plane: ControlPlane, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    with open(plane.workdir / f"{name}.log", "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    model = load_model(str(MODEL))
    reports = {n: report_for(model, n) for n in sorted({n for b in model.blocks for n in b.nodes})}
    with private_plane() as plane, kwok_running(plane):
        if not plane.workload_api:
            missing(f"the control plane {plane.bin_dir.name} serves no scheduling.k8s.io/v1beta1 PodGroups")
        cluster = Cluster(plane, uuid.uuid4().hex[:6])
        cluster.add_nodes(list(reports), gpus=8)
        for n in reports:  # one agent pod per node: kwok runs it and reports it Ready
            cluster.api.create(kube.PODS, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"agent-{n}", "namespace": AGENT_NS,
                             "labels": {"app.kubernetes.io/name": "hypertopo-agent"}},
                "spec": {"nodeName": n, "containers": [{"name": "agent", "image": "hypertopo:test"}]}})
        topologies = {"apiVersion": "v1", "kind": "List", "items": [node_topology_object(r) for r in reports.values()]}
        plane.kubectl("apply", "--server-side", f"--field-manager={AGENT_MANAGER}", "-f", "-", input=json.dumps(topologies))
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            started = time.monotonic()
            procs["aggregator"] = _start(plane, "aggregator", [
                sys.executable, "-m", "aggregator", "run", "--kubeconfig", str(plane.kubeconfig),
                "--listen", f"127.0.0.1:{free_port()}", "--model", str(MODEL), "--no-leader-election",
                "--node-labels", "--taint-unhealthy", "--hold-down", "1", "--debounce", "0.05"])
            port = free_port()
            procs["kube-scheduler"] = _start(plane, "kube-scheduler", [
                str(plane.bin_dir / "kube-scheduler"), f"--kubeconfig={plane.kubeconfig}", "--leader-elect=false",
                f"--feature-gates={WORKLOAD_GATES}", "--bind-address=127.0.0.1", f"--secure-port={port}", "--v=2"])
            fab = Fabric(plane, cluster, reports, "", "", plane.workdir / "kube-scheduler.log", procs)

            def tiers() -> dict[int, str] | None:
                fab.check_alive()
                found = {int(o["spec"]["tier"]): o["spec"]["tierName"] for o in fab.api.list(kube.HYPERNODES)[0]}
                return found if {1, 2} <= found.keys() else None

            names = wait_for("the aggregator's HyperNodes (tiers 1 and 2)", tiers, timeout=60, interval=0.1)
            fab.leaf_key, fab.spine_key = f"hypertopo.io/{names[1]}", f"hypertopo.io/{names[2]}"

            def labelled() -> bool:
                fab.check_alive()
                nodes = fab.api.list(kube.NODES, label_selector=cluster.selector)[0]
                return len(nodes) == len(reports) and all(
                    {fab.leaf_key, fab.spine_key} <= n["metadata"]["labels"].keys() for n in nodes)

            wait_for("the aggregator's node labels", labelled, timeout=60, interval=0.1)
            labels_at = time.monotonic()

            def scheduler_ready() -> bool:
                fab.check_alive()
                return _scheduler_ready(port)

            wait_for("kube-scheduler /readyz", scheduler_ready, timeout=60, interval=0.2)
            print(f"\nnode labels from the aggregator {labels_at - started:.2f}s after it started; kube-scheduler "
                  f"({plane.bin_dir.name}) ready {time.monotonic() - started:.2f}s; leaves: {fab.leaves()}")
            yield fab
        finally:
            stop_processes(procs.values(), timeout=10)


class Workload:
    """One test's PodGroups, pods and filler pods in a namespace of its own, deleted afterwards."""

    def __init__(self, fab: Fabric, name: str) -> None:
        self.fab, self.api = fab, fab.api
        self.ns = f"ks-{name}-{uuid.uuid4().hex[:4]}"
        self.api.create(kube.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})

    def fill(self, node: str) -> None:
        """A pod bound straight to `node` holding all its GPUs and half its CPU and memory."""
        self.api.create(kube.PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"filler-{node}", "namespace": self.ns, "labels": {"role": "filler"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "filler:latest", "resources": {
                         "requests": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"},
                         "limits": {"nvidia.com/gpu": "8"}}}]}})

    def gang(self, name: str, pods: int, *, key: str | None = None, gpus: int | None = None) -> float:
        """The README's PodGroup and pods renamed, with `pods` pods (minCount too), the topology key
        and the GPUs per pod optionally replaced; returns the monotonic time of the last create."""
        podgroup, pod = copy.deepcopy(readme_example())
        podgroup["metadata"].update(name=name, namespace=self.ns)
        podgroup["spec"]["schedulingPolicy"]["gang"]["minCount"] = pods
        if key is not None:
            podgroup["spec"]["schedulingConstraints"]["topology"] = [{"key": key}]
        self.api.create(PODGROUPS, podgroup)
        pod["spec"]["schedulingGroup"]["podGroupName"] = name
        pod["spec"]["terminationGracePeriodSeconds"] = 0
        if gpus is not None:
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
        for i in range(pods):
            body = copy.deepcopy(pod)
            body["metadata"] = {"name": f"{name}-{i}", "namespace": self.ns, "labels": {"gang": name}}
            self.api.create(kube.PODS, body)
        return time.monotonic()

    def placement(self, gang: str) -> dict[str, str | None]:
        items, _ = self.api.list(kube.PODS, label_selector=f"gang={gang}")
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in items if p["metadata"]["namespace"] == self.ns}

    def wait_placed(self, gang: str, pods: int, since: float) -> tuple[dict[str, str], float]:
        def placed() -> dict[str, str] | None:
            self.fab.check_alive()
            bound = {p: n for p, n in self.placement(gang).items() if n}
            return bound if len(bound) == pods else None

        bound = wait_for(f"gang {gang} bound by kube-scheduler", placed, timeout=PLACE_TIMEOUT)
        return bound, time.monotonic() - since

    def condition(self, gang: str) -> dict[str, Any] | None:
        conditions = (self.api.get(PODGROUPS, gang, namespace=self.ns).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodGroupInitiallyScheduled"), None)

    def delete_pods(self, selector: str) -> None:
        self.api.request("DELETE", kube.PODS.path(namespace=self.ns), query={"labelSelector": selector,
                                                                             "gracePeriodSeconds": 0})
        wait_for(f"pods {selector or '(all)'} of {self.ns} gone",
                 lambda: not [p for p in self.api.list(kube.PODS, label_selector=selector)[0]
                              if p["metadata"]["namespace"] == self.ns], timeout=30, interval=0.1)

    def cleanup(self) -> None:
        with contextlib.suppress(kube.ApiError):
            self.api.request("DELETE", PODGROUPS.path(namespace=self.ns))
        self.delete_pods("")


@pytest.fixture
def workload(fabric: Fabric, request: pytest.FixtureRequest) -> Iterator[Workload]:
    w = Workload(fabric, request.node.name.removeprefix("test_")[:20].rstrip("_").replace("_", "-"))
    yield w
    w.cleanup()


def _two_leaves(fab: Fabric) -> tuple[list[str], list[str]]:
    leaves = list(fab.leaves().values())
    assert len(leaves) == 2 and all(len(nodes) == 4 for nodes in leaves), leaves
    return leaves[0], leaves[1]


def test_the_readme_podgroup_lands_in_the_one_leaf_that_can_hold_it(fabric: Fabric, workload: Workload) -> None:
    podgroup, _ = readme_example()
    assert podgroup["spec"]["schedulingConstraints"]["topology"] == [{"key": fabric.leaf_key}]
    pods = podgroup["spec"]["schedulingPolicy"]["gang"]["minCount"]
    leaf_a, leaf_b = _two_leaves(fabric)
    workload.fill(leaf_a[0])  # leaf A keeps 3 free nodes, leaf B 4: only B holds 4 whole-node pods
    since = workload.gang("trainer", pods)
    bound, took = workload.wait_placed("trainer", pods, since)
    print(f"README gang ({pods} x 8 GPUs on {fabric.leaf_key}) bound in {took:.2f}s on {sorted(bound.values())}")
    assert sorted(bound.values()) == leaf_b
    wait_for("PodGroupInitiallyScheduled=True", lambda: (workload.condition("trainer") or {}).get("status") == "True")


def test_a_gang_bigger_than_any_leaf_stays_unschedulable_and_binds_on_the_spine(
    fabric: Fabric, workload: Workload
) -> None:
    since = workload.gang("wide", 5)  # 5 whole nodes: each leaf has 4
    judged = wait_for("PodGroupInitiallyScheduled=False",
                      lambda: (c := workload.condition("wide")) and c["status"] == "False" and c, timeout=PLACE_TIMEOUT)
    print(f"5 x 8 GPUs on {fabric.leaf_key}: judged {judged['reason']} in {time.monotonic() - since:.2f}s "
          f"({judged['message'][:160]})")
    assert judged["reason"] == "Unschedulable"
    deadline = time.monotonic() + PENDING_FOR
    while time.monotonic() < deadline:  # pending for several scheduling attempts, not one
        assert not any(workload.placement("wide").values())
        time.sleep(0.25)
    workload.cleanup()

    # control: the same gang constrained on the spine tier fits (and so spans both leaves)
    since = workload.gang("spine", 5, key=fabric.spine_key)
    bound, took = workload.wait_placed("spine", 5, since)
    print(f"5 x 8 GPUs on {fabric.spine_key}: bound in {took:.2f}s on {sorted(bound.values())}")
    leaf_a, leaf_b = _two_leaves(fabric)
    assert len(set(bound.values())) == 5 and set(bound.values()) & set(leaf_a) and set(bound.values()) & set(leaf_b)


def test_after_a_fabric_fault_recreated_pods_avoid_the_failed_node(fabric: Fabric, workload: Workload) -> None:
    leaf_a, leaf_b = _two_leaves(fabric)
    victim = leaf_b[0]
    for node in leaf_b[1:]:
        workload.fill(node)
    # Leaf B has one free node, leaf A four. kube-scheduler scores a gang's placements by how full
    # they would be (NodeResourcesFit, MostAllocated), so a 2 x 4-GPU gang goes to leaf B, onto `victim`.
    since = workload.gang("ft", 2, gpus=4)
    bound, took = workload.wait_placed("ft", 2, since)
    print(f"before the fault: 2 x 4-GPU gang bound in {took:.2f}s on {sorted(bound.values())}")
    assert set(bound.values()) == {victim}, "control: without a fault the gang belongs on the fuller leaf"

    broken = dataclasses.replace(fabric.reports[victim], health={
        **fabric.reports[victim].health, "rdma": ComponentHealth(Health.FAILED, "mlx5_0 port 1 Down")})
    fault = time.monotonic()
    fabric.publish(broken)
    try:
        wait_for(f"taint {TAINT} on {victim}", lambda: TAINT in fabric.taints(victim), timeout=15, interval=0.02)
        tainted = time.monotonic()
        # the gang's pods recreated, as a controller does after the node failed under them
        workload.delete_pods("gang=ft")
        recreated = time.monotonic()
        for i in range(2):
            _, pod = readme_example()
            pod["metadata"] = {"name": f"ft-{i}", "namespace": workload.ns, "labels": {"gang": "ft"}}
            pod["spec"]["schedulingGroup"]["podGroupName"] = "ft"
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 4
            workload.api.create(kube.PODS, pod)
        bound, took = workload.wait_placed("ft", 2, time.monotonic())
        print(f"fault on {victim} (NodeTopology rdma failed): taint after {tainted - fault:.2f}s; recreated pods "
              f"bound {took:.2f}s after their creation ({time.monotonic() - fault:.2f}s after the fault, "
              f"{recreated - tainted:.2f}s of it deleting the old pods) on {sorted(bound.values())}")
        assert victim not in bound.values()
        assert set(bound.values()) <= set(leaf_a)  # leaf B has no room left without the victim
    finally:
        fabric.publish(fabric.reports[victim])
        wait_for(f"taint on {victim} removed after repair", lambda: TAINT not in fabric.taints(victim), timeout=15)
