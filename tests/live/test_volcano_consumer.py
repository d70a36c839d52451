"""The real Volcano consumes what hypertopo writes: on a kwok cluster whose HyperNodes come from a live
`hypertopo-aggregator run` (fed NodeTopology reports of the small-tree model: two leaves of four
8-GPU nodes under one spine), Volcano v1.14.1's own CRD accepts every HyperNode, the real
vc-scheduler (network-topology-aware plugin) places hard-topology gangs inside one tier-1 HyperNode
by number and by tier name, keeps a gang that fits no tier-1 HyperNode Pending, and, once a fabric
fault on one node reaches the aggregator, places the next gang away from that node (the aggregator's
opt-in taint: vc-scheduler v1.14.1 does not read HyperNode conditions).

Everything runs on a control plane of its own: the aggregator acts on every NodeTopology it sees and
vc-scheduler on every node and `volcano` pod. Free capacity is shaped with filler pods bound
directly to nodes, so each placement has exactly one right answer that a topology- or
taint-unaware scheduler would be unlikely to find."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from aggregator_controller_kit import private_plane, scrape, writes_of
from aggregator_fabric import nodes_below
from controlplane.harness import ControlPlane
from placement_live import KEEP_RUNNING, Cluster, keep_running_stages, kwok_running, wait_for
from realparts import free_port, stop_processes
from volcano_live import CONTROLLERS, SCHEDULER_NAME, Volcano, volcano_crds, volcano_dir, volcano_running

from agent.cluster_model import load_model
from agent.common.report import ComponentHealth, Health, NodeReport, node_topology_object
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.placement.adapters import kube
from aggregator.placement.core import gang_health
from aggregator.placement.live.scheduler import Options, Scheduler

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tests" / "models" / "small-tree.yaml"
AGENT_NS = "hypertopo-system"
TAINT = "hypertopo.io/fabric-unhealthy"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VC_PODGROUPS = kube.Resource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", namespaced=True)
VC_JOBS = kube.Resource("batch.volcano.sh", "v1alpha1", "jobs", "Job", namespaced=True)
AGENT_MANAGER = "hypertopo-agent"  # the agents' field manager for their NodeTopology (server-side apply)
PLACE_TIMEOUT = 20.0  # seconds for vc-scheduler (1 s period) to bind a gang
PENDING_FOR = 4.0  # seconds (scheduling cycles) a gang must stay unbound after vc-scheduler judged it
pytestmark = pytest.mark.apiserver


# -- the cluster: nodes, agents, reports, aggregator, Volcano ------------------------------------------


@dataclasses.dataclass
class Fabric:
    plane: ControlPlane
    api: kube.KubeClient
    volcano: Volcano
    reports: dict[str, NodeReport]
    aggregator: subprocess.Popen[bytes]
    aggregator_port: int
    aggregator_log: Path

    def hypernodes(self) -> dict[str, dict[str, Any]]:
        items, _ = self.api.list(kube.HYPERNODES)
        return {o["metadata"]["name"]: o for o in items}

    def tier(self, number: int) -> dict[str, list[str]]:
        """HyperNode name -> its member nodes (real nodes, recursively), for the HyperNodes of a tier."""
        tree = self.hypernodes()
        below = nodes_below(tree.values())
        return {n: sorted(below[n]) for n, o in sorted(tree.items()) if o["spec"]["tier"] == number}

    def tier_name(self, number: int) -> str:
        names = {o["spec"]["tierName"] for o in self.hypernodes().values() if o["spec"]["tier"] == number}
        assert len(names) == 1, names
        return names.pop()

    def node(self, name: str) -> dict[str, Any]:
        return self.api.get(kube.NODES, name)

    def publish(self, report: NodeReport) -> None:
        """The agent's write: its node's NodeTopology, server-side applied."""
        body = json.dumps(node_topology_object(report))
        self.plane.kubectl("apply", "--server-side", f"--field-manager={AGENT_MANAGER}", "-f", "-", input=body)

    def check_alive(self) -> None:
        self.volcano.check_alive()
        if self.aggregator.poll() is not None:
            raise AssertionError(f"aggregator exited {self.aggregator.returncode}:\n"
                                 f"{self.aggregator_log.read_text()[-3000:]}")


def expected_tree(reports: Mapping[str, NodeReport]) -> dict[str, dict[str, Any]]:
    """The HyperNodes the aggregator's pipeline derives from these reports (all Ready)."""
    inputs = ClusterInputs(reports=reports, node_ready={n: True for n in reports},
                           agent_ready={n: True for n in reports}, model=load_model(str(MODEL)))
    return {o["metadata"]["name"]: o for o in Pipeline().compute(inputs, time.time()).hypernodes}


def ready_of(obj: Mapping[str, Any]) -> str | None:
    return next((c["status"] for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), None)


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    volcano_dir()  # a missing Volcano build fails (CI) or skips here, before anything starts
    model = load_model(str(MODEL))
    nodes = sorted({n for block in model.blocks for n in block.nodes})
    reports = {n: report_for(model, n) for n in nodes}
    with private_plane() as plane, kwok_running(plane, config=keep_running_stages(plane.workdir)):
        cluster = Cluster(plane, uuid.uuid4().hex[:6])
        cluster.add_nodes(nodes, gpus=8)  # kwok keeps them Ready; the not-ready taint is lifted
        api = cluster.api
        for n in nodes:  # one agent pod per node: kwok runs it and reports it Ready
            api.create(kube.PODS, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"agent-{n}", "namespace": AGENT_NS,
                             "labels": {"app.kubernetes.io/name": "hypertopo-agent"}},
                "spec": {"nodeName": n, "containers": [{"name": "agent", "image": "hypertopo:test"}]}})
        topologies = {"apiVersion": "v1", "kind": "List", "items": [node_topology_object(r) for r in reports.values()]}
        plane.kubectl("apply", "--server-side", f"--field-manager={AGENT_MANAGER}", "-f", "-", input=json.dumps(topologies))
        port = free_port()
        log = plane.workdir / "aggregator.log"
        argv = [sys.executable, "-m", "aggregator", "run", "--kubeconfig", str(plane.kubeconfig),
                "--listen", f"127.0.0.1:{port}", "--model", str(MODEL), "--identity", "vc-consumer",
                "--taint-unhealthy", "--hold-down", "1", "--debounce", "0.05",
                "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"]
        with open(log, "wb") as out:
            aggregator = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            # Volcano's hyperNode-controller stays off here: where it runs it owns status.nodeCount
            # (its own count), which the aggregator then leaves alone (the last test); the other
            # tests read the aggregator's recursive count.
            with volcano_running(plane, controller_manager=True,
                                 controllers=f"{CONTROLLERS},-hyperNode-controller") as volcano:
                fab = Fabric(plane, api, volcano, reports, aggregator, port, log)
                want = expected_tree(reports)
                started = time.monotonic()

                def tree_written() -> bool:
                    fab.check_alive()
                    have = fab.hypernodes()
                    return have.keys() == want.keys() and all(ready_of(have[n]) == "True" for n in have)

                wait_for("the aggregator's HyperNode tree, all Ready", tree_written, timeout=60, interval=0.2)
                print(f"aggregator wrote {len(want)} HyperNodes, all Ready, "
                      f"{time.monotonic() - started:.1f}s after Volcano was up")
                yield fab
        finally:
            stop_processes([aggregator], timeout=20)


# -- workloads: filler pods, Volcano PodGroups and their pods --------------------------------------


class Workload:
    """One test's pods and PodGroups, in a namespace of its own; all pods are deleted afterwards (and
    waited for, so vc-scheduler sees the capacity free again before the next test)."""

    def __init__(self, fab: Fabric, name: str) -> None:
        self.fab, self.api = fab, fab.api
        self.ns = f"vc-{name}-{uuid.uuid4().hex[:4]}"
        self.api.create(kube.NAMESPACES,
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})

    def fill(self, node: str, gpus: int = 8) -> None:
        """A pod bound straight to `node` (no scheduler) holding `gpus` GPUs and a share of CPU/memory."""
        share = gpus / 8
        requests = {"nvidia.com/gpu": str(gpus), "cpu": str(int(32 * share)), "memory": f"{int(256 * share)}Gi"}
        self.api.create(kube.PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"filler-{node}-{uuid.uuid4().hex[:4]}", "namespace": self.ns,
                         "labels": {"role": "filler"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "filler:latest",
                                     "resources": {"requests": requests, "limits": {"nvidia.com/gpu": str(gpus)}}}]}})

    def pod_body(self, name: str, gang: str, gpus: int) -> dict[str, Any]:
        resources = {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "32Gi"},
                     "limits": {"nvidia.com/gpu": str(gpus)}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.ns, "labels": {"gang": gang},
                             "annotations": {GROUP_ANNOTATION: gang}},
                "spec": {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": "trainer:latest", "resources": resources}]}}

    def gang(self, name: str, pods: int, gpus: int, topology: Mapping[str, Any]) -> float:
        """A Volcano PodGroup (minMember = pods, `spec.networkTopology` = topology) and its pods;
        returns the monotonic time the last object was created."""
        self.api.create(VC_PODGROUPS, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"minMember": pods, "queue": "default", "networkTopology": dict(topology)}})
        for i in range(pods):
            self.api.create(kube.PODS, self.pod_body(f"{name}-{i}", name, gpus))
        return time.monotonic()

    def placement(self, gang: str) -> dict[str, str | None]:
        items, _ = self.api.list(kube.PODS, label_selector=f"gang={gang}")
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in items if p["metadata"]["namespace"] == self.ns}

    def wait_placed(self, gang: str, pods: int, since: float) -> tuple[dict[str, str], float]:
        def placed() -> dict[str, str] | None:
            self.fab.check_alive()
            where = self.placement(gang)
            bound = {p: n for p, n in where.items() if n}
            return bound if len(bound) == pods else None

        bound = wait_for(f"gang {gang} bound by vc-scheduler", placed, timeout=PLACE_TIMEOUT, interval=0.05)
        return bound, time.monotonic() - since

    def podgroup(self, name: str) -> dict[str, Any]:
        return self.api.get(VC_PODGROUPS, name, namespace=self.ns)

    def delete_gang(self, name: str) -> None:
        with contextlib.suppress(kube.ApiError):
            self.api.request("DELETE", VC_PODGROUPS.path(namespace=self.ns, name=name))
        self._delete_pods(f"gang={name}")

    def _delete_pods(self, selector: str) -> None:
        self.api.request("DELETE", kube.PODS.path(namespace=self.ns), query={"labelSelector": selector, "gracePeriodSeconds": 0})
        wait_for(f"pods {selector or '(all)'} of {self.ns} gone",
                 lambda: not [p for p in self.api.list(kube.PODS, label_selector=selector)[0]
                              if p["metadata"]["namespace"] == self.ns], timeout=30, interval=0.1)

    def cleanup(self) -> None:
        with contextlib.suppress(kube.ApiError):
            self.api.request("DELETE", VC_JOBS.path(namespace=self.ns))
        with contextlib.suppress(kube.ApiError):
            self.api.request("DELETE", VC_PODGROUPS.path(namespace=self.ns))
        self._delete_pods("")


@pytest.fixture
def workload(fabric: Fabric, request: pytest.FixtureRequest) -> Iterator[Workload]:
    w = Workload(fabric, request.node.name.split("[")[0].removeprefix("test_")[:20].rstrip("_").replace("_", "-"))
    yield w
    w.cleanup()


def leaves(fab: Fabric) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
    """The two tier-1 HyperNodes (leaves) and their nodes, in node order."""
    tier1 = sorted(fab.tier(1).items(), key=lambda item: item[1])
    assert len(tier1) == 2 and all(len(nodes) == 4 for _, nodes in tier1), tier1
    return tier1[0], tier1[1]


def hard(fab: Fabric, by: str, tier: int) -> dict[str, Any]:
    """networkTopology hard with the limit given by tier number or by the aggregator's tier name."""
    if by == "number":
        return {"mode": "hard", "highestTierAllowed": tier}
    return {"mode": "hard", "highestTierName": fab.tier_name(tier)}


def decided_hypernode(fab: Fabric, ns: str, gang: str) -> str | None:
    """The HyperNode vc-scheduler logged for this gang (`Allocate job to hyperNode success`)."""
    return next((hn for job, hn in fab.volcano.hypernode_decisions().items() if job.startswith(f"{ns}/{gang}")), None)


# -- the tests --------------------------------------------------------------------------------------


def test_every_hypernode_the_aggregator_writes_is_accepted_by_volcanos_crd(fabric: Fabric) -> None:
    crd = json.loads(fabric.plane.kubectl("get", "crd", "hypernodes.topology.volcano.sh", "-o", "json").stdout)
    volcano_crd = yaml.safe_load(next(p for p in volcano_crds() if p.name == "topology.volcano.sh_hypernodes.yaml")
                                 .read_text())
    # The API server serves Volcano's own HyperNode CRD (its schema, descriptions included), not ours.
    assert crd["spec"]["versions"] == volcano_crd["spec"]["versions"]

    want = expected_tree(fabric.reports)
    have = fabric.hypernodes()
    print(fabric.plane.kubectl("get", "hn").stdout)
    assert have.keys() == want.keys()
    assert {o["spec"]["tier"] for o in have.values()} == {1, 2}
    for name, desired in want.items():
        live = have[name]
        # Everything the aggregator sends survives Volcano's schema (nothing pruned or defaulted away).
        assert live["spec"] == desired["spec"], name
        assert {k: v for k, v in live["metadata"]["labels"].items() if k in desired["metadata"]["labels"]} \
            == desired["metadata"]["labels"]
        assert live["status"]["nodeCount"] == desired["status"]["nodeCount"]
        for cond in desired["status"]["conditions"]:
            got = next(c for c in live["status"]["conditions"] if c["type"] == cond["type"])
            assert {k: got.get(k) for k in cond if k != "lastTransitionTime"} == \
                {k: v for k, v in cond.items() if k != "lastTransitionTime"}, (name, got, cond)
            assert got["lastTransitionTime"]
    # And vc-scheduler, watching the same objects, built its tree from them (its informer synced).
    fabric.check_alive()


@pytest.mark.parametrize("by", ["number", "name"])
def test_a_hard_tier1_gang_lands_in_the_one_leaf_that_fits_it(fabric: Fabric, workload: Workload, by: str) -> None:
    (_, nodes_a), (leaf_b, nodes_b) = leaves(fabric)
    for n in (nodes_a[2], nodes_a[3], nodes_b[3]):
        workload.fill(n)
    # Free: two whole nodes in leaf A, three in leaf B; five free nodes in all.
    topology = hard(fabric, by, 1)
    since = workload.gang("g3", pods=3, gpus=8, topology=topology)
    bound, took = workload.wait_placed("g3", 3, since)
    print(f"networkTopology {topology}: 3 x 8-GPU gang bound in {took:.2f}s on {sorted(bound.values())} "
          f"(leaf {leaf_b}: {nodes_b})")
    assert set(bound.values()) == set(nodes_b[:3])  # the only tier-1 placement; 1 in 10 by chance
    assert workload.podgroup("g3")["status"].get("phase") in ("Running", "Inqueue")
    decided = wait_for("vc-scheduler's HyperNode decision in its log",
                       lambda: decided_hypernode(fabric, workload.ns, "g3"), timeout=5)
    assert decided == leaf_b


@pytest.mark.parametrize("by", ["number", "name"])
def test_a_gang_that_fits_no_tier1_hypernode_stays_pending_until_tier2_is_allowed(
    fabric: Fabric, workload: Workload, by: str
) -> None:
    (_, nodes_a), (_, nodes_b) = leaves(fabric)
    for n in (nodes_a[2], nodes_a[3], nodes_b[3]):
        workload.fill(n)
    # Five free nodes, but no leaf has four.
    topology = hard(fabric, by, 1)
    workload.gang("g4", pods=4, gpus=8, topology=topology)

    def judged() -> list[dict[str, Any]] | None:
        fabric.check_alive()
        conds = (workload.podgroup("g4").get("status") or {}).get("conditions") or []
        return [c for c in conds if c["type"] == "Unschedulable" and c["status"] == "True"] or None

    cond = wait_for("vc-scheduler to mark the tier-1 gang Unschedulable", judged, timeout=PLACE_TIMEOUT)
    time.sleep(PENDING_FOR)  # several more scheduling cycles
    assert not any(workload.placement("g4").values()), workload.placement("g4")
    assert workload.podgroup("g4")["status"].get("phase") != "Running"
    print(f"networkTopology {topology}: 4 x 8-GPU gang Pending ({cond[0].get('reason')}: "
          f"{cond[0].get('message', '')[:160]})")
    workload.delete_gang("g4")

    wider = hard(fabric, by, 2)
    since = workload.gang("g4-wide", pods=4, gpus=8, topology=wider)
    bound, took = workload.wait_placed("g4-wide", 4, since)
    print(f"networkTopology {wider}: the same gang bound in {took:.2f}s on {sorted(bound.values())}")
    free = {nodes_a[0], nodes_a[1], *nodes_b[:3]}
    assert set(bound.values()) <= free and len(set(bound.values())) == 4
    assert set(bound.values()) & set(nodes_a) and set(bound.values()) & set(nodes_b)  # spans both leaves


def test_a_volcano_job_through_the_controller_manager_lands_in_one_leaf(fabric: Fabric, workload: Workload) -> None:
    (_, nodes_a), (leaf_b, nodes_b) = leaves(fabric)
    for n in (nodes_a[2], nodes_a[3], nodes_b[3]):
        workload.fill(n)
    template = workload.pod_body("unused", "vcjob", 8)
    # kwok must keep the pods running: a Job whose pods complete is finished, and Volcano's job
    # controller then deletes its PodGroup (the one this test reads back below)
    template["metadata"] = {"labels": {"gang": "vcjob"}, "annotations": {KEEP_RUNNING: "true"}}
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
           "metadata": {"name": "vcjob", "namespace": workload.ns},
           "spec": {"schedulerName": SCHEDULER_NAME, "queue": "default", "minAvailable": 3,
                    "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
                    "tasks": [{"name": "worker", "replicas": 3, "template": template}]}}
    workload.api.create(VC_JOBS, job)
    since = time.monotonic()
    bound, took = workload.wait_placed("vcjob", 3, since)
    print(f"Volcano Job (vc-controller-manager made its PodGroup and pods) bound in {took:.2f}s on "
          f"{sorted(bound.values())}")
    assert set(bound.values()) == set(nodes_b[:3])
    groups, _ = workload.api.list(VC_PODGROUPS)
    group = next(g for g in groups if g["metadata"]["namespace"] == workload.ns)
    assert group["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    assert decided_hypernode(fabric, workload.ns, group["metadata"]["name"]) == leaf_b


def taints_of(fab: Fabric, node: str) -> list[str]:
    return [t["key"] for t in fab.node(node)["spec"].get("taints") or []]


def test_after_a_fabric_fault_the_next_gang_avoids_the_tainted_node(fabric: Fabric, workload: Workload) -> None:
    (leaf_a, nodes_a), (leaf_b, nodes_b) = leaves(fabric)
    victim = nodes_b[0]
    for n in nodes_b[1:]:
        workload.fill(n)
    # Leaf B has one free node, leaf A four. vc-scheduler packs HyperNodes (network-topology-aware
    # binpack), so a small tier-1 gang goes to the fuller leaf B, that is onto `victim`.
    topology = {"mode": "hard", "highestTierAllowed": 1}
    since = workload.gang("before", pods=2, gpus=4, topology=topology)
    bound, took = workload.wait_placed("before", 2, since)
    print(f"before the fault: 2 x 4-GPU gang bound in {took:.2f}s on {sorted(bound.values())}")
    assert set(bound.values()) == {victim}, "control: without a fault the gang belongs on the fuller leaf"
    workload.delete_gang("before")

    broken = dataclasses.replace(fabric.reports[victim], health={
        **fabric.reports[victim].health, "rdma": ComponentHealth(Health.FAILED, "mlx5_0 port 1 Down")})
    fault = time.monotonic()
    fabric.publish(broken)
    try:
        wait_for(f"taint {TAINT} on {victim}", lambda: TAINT in taints_of(fabric, victim), timeout=10, interval=0.02)
        tainted = time.monotonic()
        # The next gang comes right after; watch for it to be bound and for the leaf to turn Ready=False.
        since = workload.gang("after", pods=2, gpus=4, topology=topology)
        seen: dict[str, float] = {}

        def both() -> bool:
            fabric.check_alive()
            where = workload.placement("after")
            if "bound" not in seen and len(where) == 2 and all(where.values()):
                seen["bound"] = time.monotonic()
            if "not_ready" not in seen and ready_of(fabric.hypernodes()[leaf_b]) == "False":
                seen["not_ready"] = time.monotonic()
            return len(seen) == 2

        wait_for(f"gang 'after' bound and {leaf_b} Ready=False", both, timeout=PLACE_TIMEOUT, interval=0.02)
        bound = {p: n for p, n in workload.placement("after").items() if n}
        print(f"fault on {victim} (NodeTopology rdma failed): taint after {tainted - fault:.2f}s, {leaf_b} "
              f"Ready=False after {seen['not_ready'] - fault:.2f}s (hold-down 1s); the next gang, submitted on "
              f"the taint, bound {seen['bound'] - since:.2f}s later ({seen['bound'] - fault:.2f}s after the fault) "
              f"on {sorted(bound.values())}")
        assert victim not in bound.values()
        assert set(bound.values()) <= set(nodes_a)  # leaf B has no room left without the victim
        assert decided_hypernode(fabric, workload.ns, "after") == leaf_a
    finally:
        fabric.publish(fabric.reports[victim])
        wait_for(f"taint on {victim} removed after repair", lambda: TAINT not in taints_of(fabric, victim), timeout=15)
        wait_for(f"{leaf_b} Ready again", lambda: ready_of(fabric.hypernodes()[leaf_b]) == "True", timeout=15)


def test_a_fabric_cut_gets_a_volcano_jobs_pod_recreated_by_volcano_on_a_healthy_node_of_its_leaf(
        fabric: Fabric, workload: Workload) -> None:
    """Point 5 of the Volcano issue, end to end on the real parts: vc-controller-manager runs the Job,
    vc-scheduler places it (hard tier 1), hypertopo-scheduler --remediate-only handles the fault
    (agent report -> aggregator -> taint and Ready=False -> eviction of that node's pod only ->
    Volcano recreates it -> vc-scheduler places it on a healthy node of the same leaf)."""
    (_, nodes_a), (_, nodes_b) = leaves(fabric)
    workload.fill(nodes_a[3])  # leaf A: 3 free nodes, leaf B: 4; either holds the job with room to spare
    template = workload.pod_body("unused", "ft", 8)
    template["metadata"] = {"labels": {"gang": "ft"}, "annotations": {KEEP_RUNNING: "true"}}
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
           "metadata": {"name": "ft", "namespace": workload.ns, "annotations": {"hypertopo.io/on-fabric-fault": "restart-pods"}},
           "spec": {"schedulerName": SCHEDULER_NAME, "queue": "default", "minAvailable": 2,
                    "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
                    "tasks": [{"name": "worker", "replicas": 2, "template": template}]}}
    remediator = Scheduler(fabric.api, Options(scheduler_name="hypertopo-remediator", remediate_only=True,
                                               unknown_grace_seconds=60, watch_timeout=20))
    remediator.start()
    victim = ""
    try:
        wait_for("remediator synced", remediator.synced, timeout=20)
        workload.api.create(VC_JOBS, job)
        before, took = workload.wait_placed("ft", 2, time.monotonic())
        leaf_nodes = nodes_a if set(before.values()) <= set(nodes_a) else nodes_b
        assert set(before.values()) <= set(leaf_nodes), before  # one leaf
        victim_pod, victim = sorted(before.items())[0]
        survivor = next(p for p in before if p != victim_pod)
        print(f"Volcano Job placed by vc-scheduler in {took:.2f}s on {sorted(before.values())}")

        broken = dataclasses.replace(fabric.reports[victim], health={
            **fabric.reports[victim].health, "rdma": ComponentHealth(Health.FAILED, "mlx5_0 port 1 Down")})
        fault = time.monotonic()
        fabric.publish(broken)
        marks: dict[str, float] = {}

        def replaced() -> dict[str, str] | None:
            fabric.check_alive()
            where = workload.placement("ft")
            if "taint" not in marks and TAINT in taints_of(fabric, victim):
                marks["taint"] = time.monotonic()
            if "evicted" not in marks and where.get(victim_pod) != victim:
                marks["evicted"] = time.monotonic()
            bound = {p: n for p, n in where.items() if n}
            return bound if len(bound) == 2 and victim not in bound.values() else None

        after = wait_for("the victim's pod evicted, recreated by Volcano and placed again", replaced,
                         timeout=45, interval=0.05)
        done = time.monotonic()
        print(f"fabric cut on {victim}: taint {marks.get('taint', done) - fault:.2f}s, eviction "
              f"{marks.get('evicted', done) - fault:.2f}s, replacement bound {done - fault:.2f}s after the fault, "
              f"on {after[victim_pod]}")
        assert after[survivor] == before[survivor]  # restart-pods: the healthy pod never moved
        assert after[victim_pod] in leaf_nodes and after[victim_pod] != victim  # same leaf, healthy node
        # the eviction thread reports the outcome after the API call returns and the scheduler thread
        # counts it later still: no ordering with what Volcano and vc-scheduler did meanwhile
        def evicted() -> float | None:
            return remediator.metrics.registry.get_sample_value("hypertopo_scheduler_evictions_total",
                                                                {"outcome": "evicted"})

        wait_for("the eviction counted", evicted, timeout=10)
        assert evicted() == 1
        gang_health_through_the_fault(workload, remediator, victim, victim_pod)
    finally:
        remediator.stop()
        if victim:
            fabric.publish(fabric.reports[victim])
            wait_for(f"taint on {victim} removed after repair", lambda: TAINT not in taints_of(fabric, victim), timeout=15)


def gang_health_through_the_fault(workload: Workload, remediator: Scheduler, victim: str, victim_pod: str) -> None:
    """Issue 25.2/25.4 on the same real parts: the remediator's FabricHealthy on the Job's PodGroup
    (which vc-scheduler and Volcano's controllers also write) named the victim while it failed, is
    True again once the replacement runs, and the recovery was measured at the same tier."""
    items, _ = workload.api.list(kube.PODS, label_selector="gang=ft")
    group = next(p["metadata"]["annotations"][GROUP_ANNOTATION] for p in items if p["metadata"]["namespace"] == workload.ns)

    def healthy() -> dict[str, Any] | None:
        cond = gang_health.current(workload.podgroup(group), volcano=True)
        return cond if cond and cond["status"] == "True" else None

    wait_for("FabricHealthy=True again on the Job's PodGroup", healthy, timeout=20)
    doc = workload.api.request("GET", kube.EVENTS.path(namespace=workload.ns),
                               query={"fieldSelector": "reason=FabricUnhealthy"})
    messages = [e["message"] for e in doc.get("items") or [] if e["involvedObject"]["name"] == group]
    assert any(f"{victim} (node {victim} has taint" in m and victim_pod in m for m in messages), messages
    registry = remediator.metrics.registry
    assert registry.get_sample_value("hypertopo_gang_recovery_seconds_count", {"stage": "bound"}) == 1
    assert registry.get_sample_value("hypertopo_gang_tier_after_recovery_total",
                                     {"tier_before": "1", "tier_after": "1"}) == 1
    print(f"FabricHealthy on {group}: {healthy()}; recovery bound after "
          f"{registry.get_sample_value('hypertopo_gang_recovery_seconds_sum', {'stage': 'bound'}):.2f}s")


def test_volcanos_hypernode_controller_and_the_aggregator_settle_on_one_node_count(fabric: Fabric) -> None:
    """Volcano's hyperNode-controller writes its own status.nodeCount (direct members); the aggregator
    sees another manager owning the field and stops writing it, so the two settle at once."""
    spine = next(n for n, o in fabric.hypernodes().items() if o["spec"]["tier"] == 2)

    def status_writes() -> float:
        return writes_of(scrape(fabric.aggregator_port), "hypernodes/status")

    with volcano_running(fabric.plane, scheduler=False, controller_manager=True, controllers="hyperNode-controller"):
        time.sleep(2)  # both controllers have acted on every HyperNode by now
        counts, versions, before = set(), set(), status_writes()
        for _ in range(10):
            hn = fabric.hypernodes()[spine]
            counts.add(hn["status"]["nodeCount"])
            versions.add(hn["metadata"]["resourceVersion"])
            time.sleep(0.3)
        rewrites = status_writes() - before
    print(f"spine {spine} over 3s with Volcano's hyperNode-controller on: nodeCount seen {sorted(counts)}, "
          f"{len(versions)} resourceVersions, {rewrites:.0f} status writes by the aggregator")
    fabric.check_alive()
    assert rewrites == 0 and len(versions) == 1, "the aggregator and Volcano keep rewriting the spine's status"
