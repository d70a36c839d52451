"""hypertopo-scheduler and Kubernetes' own PodGroups (`scheduling.k8s.io/v1beta1`) on a real API
server that serves them (v1.37, the GenericWorkload and TopologyAwareWorkloadScheduling gates on:
tests/controlplane/harness.py) with kwok nodes and HyperNodes: the README's worked PodGroup is
bound in one leaf and says so the way kube-scheduler does, a gang no leaf can hold waits with the
reason, a key that is no hypertopo tier is refused in one line, and a fabric fault is handled as
the PodGroup's `hypertopo.io/on-fabric-fault` asks, with FabricHealthy beside kube-scheduler's
condition. The test plays the workload controller: it creates replacements for evicted pods.

Last, a gang the real kube-scheduler places (same release, its Workload gates on) is remediated by
hypertopo-scheduler `--remediate-only`: FabricHealthy goes beside kube-scheduler's own condition
and the pods of a failed node are evicted; kube-scheduler places their replacements in the leaf."""

from __future__ import annotations

import contextlib
import copy
import re
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import WORKLOAD_GATES, ControlPlane
from placement_live import Cluster, wait_for
from realparts import free_port, missing, stop_processes

from aggregator.placement.adapters import kube

pytestmark = pytest.mark.apiserver
README = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"


@pytest.fixture(autouse=True)
def _serves_podgroups(apiserver: ControlPlane) -> None:
    if not apiserver.workload_api:
        missing("the test API server does not serve scheduling.k8s.io/v1beta1 PodGroups (Kubernetes 1.37 and later)")


def readme_example() -> tuple[dict[str, Any], dict[str, Any]]:
    """The PodGroup and the pod of docs/scheduling.md's "Kubernetes PodGroups in hypertopo-scheduler"."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Kubernetes PodGroups in hypertopo-scheduler"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, "the README's section has no YAML example"
    group, pod = yaml.safe_load_all(block.group(1))
    return group, pod


def add_k8s_podgroup(cluster: Cluster, body: dict[str, Any]) -> None:
    body = copy.deepcopy(body)
    body["metadata"]["namespace"] = cluster.ns
    cluster.api.request("POST", kube.K8S_PODGROUPS.path(namespace=cluster.ns), body=body)


def k8s_podgroup(name: str, min_count: int, key: str, on_fault: str = "") -> dict[str, Any]:
    group, _ = readme_example()
    group["metadata"] = {"name": name, "annotations": {"hypertopo.io/on-fabric-fault": on_fault} if on_fault else {}}
    group["spec"]["schedulingPolicy"]["gang"]["minCount"] = min_count
    group["spec"]["schedulingConstraints"]["topology"] = [{"key": key}]
    return group


def add_pods(cluster: Cluster, group: str, names: list[str], gpus: int = 4, scheduler: str = "") -> None:
    """The README's pod under each name, in the test's namespace, for the test's scheduler (or
    `scheduler`), on the test's nodes only."""
    _, template = readme_example()
    bodies = []
    for name in names:
        body = copy.deepcopy(template)
        body["metadata"] = {"name": name, "namespace": cluster.ns, "labels": {"hypertopo.io/test": cluster.tag}}
        body["spec"]["schedulerName"] = scheduler or cluster.scheduler_name
        body["spec"]["nodeSelector"] = {"hypertopo.io/test": cluster.tag}
        body["spec"]["schedulingGroup"]["podGroupName"] = group
        body["spec"]["terminationGracePeriodSeconds"] = 0
        body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)},
                                                      "requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}
        bodies.append(body)
    cluster.add_pods(bodies)


def podgroup(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.api.get(kube.K8S_PODGROUPS, name, namespace=cluster.ns)


def condition(cluster: Cluster, name: str, kind: str) -> dict[str, Any] | None:
    conds = (podgroup(cluster, name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == kind), None)


def _get(cluster: Cluster, path: str) -> dict[str, Any] | None:
    try:
        return cluster.api.request("GET", path)
    except kube.ApiError as exc:
        if exc.status == 404:
            return None
        raise


def leaf_of(layout: dict[str, list[str]]) -> dict[str, str]:
    return {n: leaf for leaf, nodes in layout.items() for n in nodes}


def group_events(cluster: Cluster, reason: str, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(reason)
            if e["involvedObject"].get("kind") == "PodGroup" and e["involvedObject"].get("name") == name]


def test_the_readmes_podgroup_is_bound_in_one_leaf_and_says_so_as_kube_scheduler_does(cluster: Cluster) -> None:
    # 2 leaves x 2 nodes x 8 GPUs; the README's gang asks 4 x 4 GPUs = one whole leaf
    layout = cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    group, _ = readme_example()
    with cluster.scheduler():
        started = time.monotonic()
        add_k8s_podgroup(cluster, group)
        add_pods(cluster, "trainer", [f"trainer-{i}" for i in range(4)])
        placement = cluster.wait_bound(4)
        bound_s = time.monotonic() - started
        assert len({leaf_of(layout)[n] for n in placement.values()}) == 1, placement
        scheduled = wait_for("PodGroupInitiallyScheduled=True",
                             lambda: (c := condition(cluster, "trainer", "PodGroupInitiallyScheduled"))
                             and c["status"] == "True" and c)
        healthy = wait_for("FabricHealthy=True", lambda: (c := condition(cluster, "trainer", "FabricHealthy"))
                           and c["status"] == "True" and c)
        wait_for("Scheduled on the PodGroup", lambda: group_events(cluster, "Scheduled", "trainer"))
        ranks = wait_for("the rank map on the PodGroup", lambda: (podgroup(cluster, "trainer")["metadata"].get(
            "annotations") or {}).get("hypertopo.io/rank-map"))
        hostfile = wait_for("the hostfile ConfigMap", lambda: _get(cluster, kube.CONFIGMAPS.path(
            namespace=cluster.ns, name="trainer-hostfile")))
        generation = podgroup(cluster, "trainer")["metadata"].get("generation", 0)
    # kube-scheduler writes the PodGroup's generation, which v1.37's PodGroup strategy never sets
    # (0: omitted); the condition carries the same
    assert scheduled["reason"] == "Scheduled" and scheduled.get("observedGeneration", 0) == generation
    assert healthy["reason"] == "FabricHealthy"
    assert yaml.safe_load(ranks) == [[f"trainer-{i}", placement[f"trainer-{i}"]] for i in range(4)]  # rank order
    (owner,) = hostfile["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["name"]) == ("scheduling.k8s.io/v1beta1", "PodGroup", "trainer")
    print(f"\nREADME PodGroup: 4 pods bound in one leaf {bound_s:.2f} s after the PodGroup was created")


def test_a_gang_no_leaf_can_hold_waits_unschedulable_with_the_reason_on_its_podgroup(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)  # 16 GPUs a leaf, 32 in all
    with cluster.scheduler():
        add_k8s_podgroup(cluster, k8s_podgroup("big", 5, "hypertopo.io/leaf"))  # 5 x 4 = 20 GPUs
        add_pods(cluster, "big", [f"big-{i}" for i in range(5)])
        cond = wait_for("PodGroupInitiallyScheduled=False", lambda: condition(cluster, "big", "PodGroupInitiallyScheduled"))
        (event,) = wait_for("FailedScheduling on the PodGroup", lambda: group_events(cluster, "FailedScheduling", "big"))
        assert cluster.placement() == {}
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert "within tier <= 1 (leaf)" in cond["message"] and cond["message"] == event["message"]
    assert event["involvedObject"]["apiVersion"] == "scheduling.k8s.io/v1beta1"


def test_a_key_that_is_no_hypertopo_tier_is_refused_with_one_clear_line(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=1, per_leaf=2, gpus=8)
    with cluster.scheduler():
        add_k8s_podgroup(cluster, k8s_podgroup("zoned", 2, "topology.kubernetes.io/zone"))
        add_pods(cluster, "zoned", ["zoned-0", "zoned-1"])
        (event,) = wait_for("FailedScheduling on the PodGroup", lambda: group_events(cluster, "FailedScheduling", "zoned"))
        on_pods = wait_for("FailedScheduling on both pods", lambda: len(
            {e["involvedObject"]["name"] for e in cluster.events("FailedScheduling")
             if e["involvedObject"]["kind"] == "Pod"}) == 2)
        cond = wait_for("the condition", lambda: condition(cluster, "zoned", "PodGroupInitiallyScheduled"))
        assert on_pods and cluster.placement() == {}
    assert event["message"] == ("pod group zoned: schedulingConstraints.topology key 'topology.kubernetes.io/zone' "
                                "is no hypertopo tier; hypertopo-scheduler places by the keys hypertopo.io/leaf, "
                                "hypertopo.io/spine")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", event["message"])


def test_a_fabric_fault_restarts_the_pods_of_the_failed_node_in_the_same_leaf(cluster: Cluster) -> None:
    # 2 leaves x 3 nodes x 8 GPUs; 4 pods x 4 GPUs fill 2 nodes of one leaf, its 3rd node is free
    layout = cluster.leaf_spine(leaves=2, per_leaf=3, gpus=8)
    with cluster.scheduler():
        add_k8s_podgroup(cluster, k8s_podgroup("ft", 4, "hypertopo.io/leaf", on_fault="restart-pods"))
        add_pods(cluster, "ft", [f"ft-{i}" for i in range(4)])
        before = cluster.wait_bound(4)
        leaf = {leaf_of(layout)[n] for n in before.values()}
        assert len(leaf) == 1
        failed = sorted(before.values())[0]
        victims = {p for p, n in before.items() if n == failed}
        faulted = time.monotonic()
        cluster.taint(failed)
        wait_for("the failed node's pods evicted", lambda: not victims & set(cluster.pods()))
        down = wait_for("FabricHealthy not True", lambda: (c := condition(cluster, "ft", "FabricHealthy"))
                        and c["status"] != "True" and c)
        add_pods(cluster, "ft", [f"ft-r{i}" for i in range(len(victims))])
        after = cluster.wait_bound(4)
        whole_s = time.monotonic() - faulted
        replacements = {p: n for p, n in after.items() if p.startswith("ft-r")}
        assert {leaf_of(layout)[n] for n in replacements.values()} == leaf and failed not in replacements.values()
        wait_for("FabricHealthy True again", lambda: (c := condition(cluster, "ft", "FabricHealthy"))
                 and c["status"] == "True")
        conds = {c["type"]: c["status"] for c in podgroup(cluster, "ft")["status"]["conditions"]}
    assert down["reason"] in ("FabricFailed", "Recovering")
    assert conds == {"PodGroupInitiallyScheduled": "True", "FabricHealthy": "True"}  # side by side
    print(f"\nfabric fault: gang whole again in its leaf {whole_s:.2f} s after the taint")


def label_leaves(cluster: Cluster, layout: dict[str, list[str]]) -> None:
    """The labels the aggregator's --node-labels writes: hypertopo.io/<tierName>=<HyperNode>."""
    for leaf, nodes in layout.items():
        for name in nodes:
            patch = {"metadata": {"labels": {"hypertopo.io/leaf": leaf, "hypertopo.io/spine": f"spine-{cluster.tag}"}}}
            cluster.api.request("PATCH", kube.NODES.path(name=name), body=patch, content_type=kube.MERGE_PATCH)


def _ready(port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with contextlib.suppress(OSError), urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx,
                                                              timeout=2) as resp:  # fmt: skip
        return bool(resp.status == 200)
    return False


@contextlib.contextmanager
def kube_scheduler(plane: ControlPlane, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """The release's kube-scheduler with its Workload gates on, scheduling pods named `name`."""
    config = plane.workdir / f"kube-scheduler-{name}.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(plane.kubeconfig)}, "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name}]}))
    port = free_port()
    with open(plane.workdir / f"kube-scheduler-{name}.log", "wb") as log:
        proc = subprocess.Popen([str(plane.bin_dir / "kube-scheduler"), f"--config={config}",
                                 f"--feature-gates={WORKLOAD_GATES}", "--bind-address=127.0.0.1",
                                 f"--secure-port={port}", "--v=2"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for("kube-scheduler /readyz", lambda: proc.poll() is None and _ready(port), timeout=60, interval=0.2)
        yield proc
    finally:
        stop_processes([proc], timeout=10)


def test_remediate_only_handles_a_fault_of_a_gang_kube_scheduler_placed(cluster: Cluster) -> None:
    # 2 leaves x 3 nodes x 8 GPUs; kube-scheduler places 4 x 4 GPUs in one leaf (its topology key)
    layout = cluster.leaf_spine(leaves=2, per_leaf=3, gpus=8)
    label_leaves(cluster, layout)
    placer = f"ks-{cluster.tag}"
    with kube_scheduler(cluster.plane, placer), cluster.scheduler(remediate_only=True):
        add_k8s_podgroup(cluster, k8s_podgroup("ks", 4, "hypertopo.io/leaf", on_fault="restart-pods"))
        add_pods(cluster, "ks", [f"ks-{i}" for i in range(4)], scheduler=placer)
        before = cluster.wait_bound(4, timeout=60)
        leaf = {leaf_of(layout)[n] for n in before.values()}
        assert len(leaf) == 1, before
        placed = wait_for("kube-scheduler's PodGroupInitiallyScheduled=True",
                          lambda: (c := condition(cluster, "ks", "PodGroupInitiallyScheduled")) and c["status"] == "True"
                          and c)
        wait_for("hypertopo's FabricHealthy=True", lambda: (c := condition(cluster, "ks", "FabricHealthy"))
                 and c["status"] == "True")
        failed = sorted(before.values())[0]
        victims = {p for p, n in before.items() if n == failed}
        faulted = time.monotonic()
        cluster.taint(failed)
        wait_for("the failed node's pods evicted", lambda: not victims & set(cluster.pods()))
        wait_for("FabricHealthy not True", lambda: (c := condition(cluster, "ks", "FabricHealthy")) and c["status"] != "True")
        add_pods(cluster, "ks", [f"ks-r{i}" for i in range(len(victims))], scheduler=placer)
        after = cluster.wait_bound(4, timeout=60)
        replacements = {p: n for p, n in after.items() if p.startswith("ks-r")}
        assert {leaf_of(layout)[n] for n in replacements.values()} == leaf and failed not in replacements.values()
        wait_for("FabricHealthy True again", lambda: (c := condition(cluster, "ks", "FabricHealthy")) and c["status"] == "True")
        whole_s = time.monotonic() - faulted
        conds = {c["type"]: c for c in podgroup(cluster, "ks")["status"]["conditions"]}
    assert set(conds) == {"PodGroupInitiallyScheduled", "FabricHealthy"}  # kube-scheduler's and hypertopo's
    assert conds["PodGroupInitiallyScheduled"]["lastTransitionTime"] == placed["lastTransitionTime"]
    print(f"\nkube-scheduler's gang, remediated by hypertopo: whole again in its leaf {whole_s:.2f} s after the taint")
