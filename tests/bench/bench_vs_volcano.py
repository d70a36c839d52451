"""hypertopo-scheduler side by side with the real Volcano scheduler (vc-scheduler v1.14.1).

    python tests/bench/bench_vs_volcano.py [--sizes 1000,5000,10000] [--gangs 8:1,64:2,256:3]
                                     [--schedulers volcano,hypertopo] [--timeout 300] [--json]

For each size, on a control plane of its own (etcd + kube-apiserver, tests/controlplane): N kwok
nodes of 8 GPUs, cabled as leaves of 16 nodes under spines of 8 leaves under one core (a cluster
model), and the HyperNodes the aggregator's pipeline renders from that model (what
`hypertopo-aggregator render --model` prints), so both schedulers read the same tree. Then, one
scheduler process at a time on the same state, each gang of --gangs (PODS:TIER: PODS pods of 8 GPUs
in a Volcano PodGroup with `spec.networkTopology` hard mode, `highestTierAllowed: TIER`):

* its pods are created first (no scheduler acts on them: their PodGroup does not exist yet),
* the PodGroup is created: the clock starts,
* the clock stops when the bench's own watch has seen every pod of the gang bound (spec.nodeName),
* the placement is checked against the tier limit: the lowest HyperNode holding all the gang's
  nodes must be of tier <= TIER (violations are printed and make the exit status 1),
* the gang is deleted and its pods waited for, so the next gang meets the same free cluster.

vc-scheduler runs with Volcano's Helm scheduler configuration plus the network-topology-aware
plugin (tests/kits/volcano_live.py), its default 1 s schedule period; hypertopo-scheduler runs as its
`hypertopo-scheduler run` process. A gang a scheduler does not bind within --timeout is reported
as timed out, with how many of its pods were bound and the PodGroup's last condition. No target
for Volcano: the bench reports what it does. Figures go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))

from aggregator_fabric import nodes_below  # noqa: E402
from controlplane.harness import ControlPlane, running  # noqa: E402
from placement_live import KWOK_LABEL, build_kwok  # noqa: E402
from realparts import free_port, http_get, stop_processes  # noqa: E402
from volcano_live import DEFAULT_CONF, SCHEDULER_NAME, volcano_dir, volcano_running  # noqa: E402

from agent.cluster_model import parse_model  # noqa: E402
from agent.common.adapters.kube import LEASES  # noqa: E402
from aggregator.pipeline import ClusterInputs, Pipeline  # noqa: E402
from aggregator.placement.adapters import kube  # noqa: E402

GPUS = 8
LEAF_NODES = 16  # nodes per leaf switch
SPINE_LEAVES = 8  # leaves per spine switch
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
TEST_LABEL = "hypertopo.io/test"
HYPERTOPO = "hypertopo"
VOLCANO = "volcano"
DEFAULT_GANGS = ((8, 1), (64, 2), (256, 3))


# -- the cluster: model -> HyperNodes (the aggregator's pipeline) ---------------------------------------
def model_doc(nodes: int) -> dict[str, Any]:
    """A cluster model: `nodes` nodes in leaves of LEAF_NODES, leaves under spines of SPINE_LEAVES,
    spines under one core switch (the shape of a two-level fat tree with a core)."""
    leaves = -(-nodes // LEAF_NODES)
    blocks = [{"switch": f"leaf{i:04d}", "nodes": [f"node[{i * LEAF_NODES:05d}-{min(nodes, (i + 1) * LEAF_NODES) - 1:05d}]"]}
              for i in range(leaves)]
    spines = -(-leaves // SPINE_LEAVES)
    switches: dict[str, Any] = {
        f"spine{s:03d}": {"switches": [f"leaf{i:04d}" for i in range(s * SPINE_LEAVES, min(leaves, (s + 1) * SPINE_LEAVES))]}
        for s in range(spines)}
    switches["core"] = {"switches": sorted(switches)}
    return {"switches": switches, "blocks": blocks}


def render_tree(nodes: int) -> tuple[list[str], list[dict[str, Any]]]:
    """Node names and the HyperNode objects the aggregator writes for them (all nodes Ready)."""
    model = parse_model(model_doc(nodes))
    names = sorted({n for block in model.blocks for n in block.nodes})
    inputs = ClusterInputs(reports={}, node_ready=dict.fromkeys(names, True), model=model)
    return names, Pipeline().compute(inputs, time.time()).hypernodes


class Tree:
    """The rendered HyperNodes as sets of nodes: which tier a set of nodes spans."""

    def __init__(self, hypernodes: Sequence[Mapping[str, Any]]) -> None:
        self.tier = {o["metadata"]["name"]: int(o["spec"]["tier"]) for o in hypernodes}
        self.nodes = nodes_below(hypernodes)

    def span(self, nodes: Sequence[str]) -> tuple[str, int] | None:
        """The lowest-tier HyperNode holding all `nodes` (name, tier); None if none does."""
        wanted = set(nodes)
        holding = [(self.tier[n], n) for n, members in self.nodes.items() if wanted <= members]
        if not holding:
            return None
        tier, name = min(holding)
        return name, tier

    def tiers(self) -> dict[int, int]:
        count: dict[int, int] = {}
        for tier in self.tier.values():
            count[tier] = count.get(tier, 0) + 1
        return dict(sorted(count.items()))


# -- setup ---------------------------------------------------------------------------------------
def parallel(fn: Callable[[Any], Any], items: Sequence[Any], workers: int = 24) -> list[Any]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


@dataclass
class Setup:
    nodes: int
    hypernodes: int
    tiers: dict[int, int]
    render_s: float
    nodes_s: float
    hypernodes_s: float
    kwok_ready_s: float

    @property
    def total_s(self) -> float:
        return self.render_s + self.nodes_s + self.hypernodes_s + self.kwok_ready_s


def create_nodes(api: kube.KubeClient, names: Sequence[str], tag: str) -> None:
    amounts = {"nvidia.com/gpu": str(GPUS), "cpu": "64", "memory": "512Gi", "pods": "110"}
    labels = {TEST_LABEL: tag, KWOK_LABEL[0]: KWOK_LABEL[1]}

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "registered by the bench",
             "lastHeartbeatTime": now, "lastTransitionTime": now}

    def one(name: str) -> None:
        # registered Ready, as a kubelet registers its Node; kwok keeps it so (heartbeats, leases)
        api.create(kube.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                                "status": {"capacity": amounts, "allocatable": amounts, "conditions": [ready]}})
        # TaintNodesByCondition taints every new node not-ready; the node lifecycle controller (not
        # run here) lifts it once the kubelet (kwok) reports Ready, so the bench lifts it
        api.merge_patch(kube.NODES, name, {"spec": {"taints": None}})

    parallel(one, names)


def create_hypernodes(api: kube.KubeClient, objects: Sequence[Mapping[str, Any]]) -> None:
    parallel(lambda obj: api.create(kube.HYPERNODES, {k: v for k, v in obj.items() if k != "status"}), objects)


def ready_nodes(api: kube.KubeClient, tag: str) -> int:
    items, _ = api.list(kube.NODES, label_selector=f"{TEST_LABEL}={tag}")
    return sum(1 for n in items for c in (n.get("status") or {}).get("conditions") or []
               if c.get("type") == "Ready" and c.get("status") == "True")


@contextlib.contextmanager
def kwok(plane: ControlPlane, *, lease_seconds: int) -> Iterator[None]:
    """kwok managing the bench's nodes (Ready, pods Running). The node lease is long: at 10,000 nodes
    kwok's default renewals (every 10 s per node) would be 1,000 writes/s on this 2-core machine."""
    log = open(plane.workdir / "kwok.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [build_kwok(), f"--kubeconfig={plane.kubeconfig}",
         f"--manage-nodes-with-label-selector={KWOK_LABEL[0]}={KWOK_LABEL[1]}",
         f"--node-lease-duration-seconds={lease_seconds}", "--cidr=10.240.0.1/16"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        stop_processes([proc], timeout=15)
        log.close()


def open_default_queue(api: kube.KubeClient) -> None:
    """Volcano's `default` Queue, Open. vc-scheduler creates the queue but vc-controller-manager's
    queue controller (not run here: the bench measures the schedulers) is what marks it Open, and
    vc-scheduler allocates nothing in a queue that is not."""
    with contextlib.suppress(kube.ApiError):
        api.create(kube.QUEUES, {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                                 "metadata": {"name": "default"}, "spec": {"weight": 1, "reclaimable": True}})
    api.patch_status(kube.QUEUES, None, "default", {"status": {"state": "Open"}})


# -- one gang --------------------------------------------------------------------------------------
@dataclass
class GangResult:
    scheduler: str
    pods: int
    tier_allowed: int
    seconds: float | None  # PodGroup creation -> the last pod seen bound; None: not all bound
    bound: int
    span: str | None = None  # the lowest HyperNode holding the gang's nodes
    span_tier: int | None = None
    violation: str = ""
    why: str = ""  # the PodGroup's last condition when the gang was not bound
    create_pods_s: float = 0.0

    @property
    def placed(self) -> bool:
        return self.seconds is not None


class BoundWatch(threading.Thread):
    """Follows the gang's pods from `rv` on and notes, per pod, the node it was bound to."""

    def __init__(self, api: kube.KubeClient, ns: str, gang: str, rv: str, pods: int) -> None:
        super().__init__(name=f"watch-{gang}", daemon=True)
        self.api, self.ns, self.gang, self.rv, self.pods = api, ns, gang, rv, pods
        self.placement: dict[str, str] = {}
        self.done = threading.Event()
        self.last_bound = 0.0
        self._stream: Any = None
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.close()

    def run(self) -> None:
        while not self._stop.is_set() and not self.done.is_set():
            try:
                self._stream = self.api.watch(kube.PODS, resource_version=self.rv, namespace=self.ns,
                                              label_selector=f"gang={self.gang}", timeout_seconds=600)
                for event in self._stream:
                    self.rv = event.object.get("metadata", {}).get("resourceVersion", self.rv)
                    node = (event.object.get("spec") or {}).get("nodeName")
                    if event.type in ("ADDED", "MODIFIED") and node:
                        name = event.object["metadata"]["name"]
                        if name not in self.placement:
                            self.placement[name] = node
                            self.last_bound = time.monotonic()
                        if len(self.placement) >= self.pods:
                            self.done.set()
                            return
            except kube.ApiError:
                if self._stop.is_set():
                    return
                time.sleep(0.2)


def pod_body(ns: str, name: str, gang: str, scheduler: str) -> dict[str, Any]:
    resources = {"requests": {"nvidia.com/gpu": str(GPUS), "cpu": "4", "memory": "32Gi"},
                 "limits": {"nvidia.com/gpu": str(GPUS)}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"gang": gang},
                         "annotations": {GROUP_ANNOTATION: gang}},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "trainer:latest", "resources": resources}]}}


def podgroup_condition(api: kube.KubeClient, ns: str, gang: str) -> str:
    with contextlib.suppress(kube.ApiError):
        group = api.get(kube.VC_PODGROUPS, gang, namespace=ns)
        status = group.get("status") or {}
        conds = sorted(status.get("conditions") or [], key=lambda c: str(c.get("lastTransitionTime", "")))
        last = f"{conds[-1].get('type')}: {conds[-1].get('message', '')}"[:300] if conds else "no condition"
        return f"phase {status.get('phase', 'Pending')}; {last}"
    return "PodGroup unreadable"


def delete_gang(api: kube.KubeClient, ns: str, gang: str, timeout: float = 120.0) -> None:
    with contextlib.suppress(kube.ApiError):
        api.request("DELETE", kube.VC_PODGROUPS.path(namespace=ns, name=gang))
    api.request("DELETE", kube.PODS.path(namespace=ns), query={"labelSelector": f"gang={gang}", "gracePeriodSeconds": 0})
    deadline = time.monotonic() + timeout
    while api.list(kube.PODS, namespace=ns, label_selector=f"gang={gang}")[0]:
        if time.monotonic() > deadline:
            raise AssertionError(f"pods of gang {gang} still there {timeout}s after deletion")
        time.sleep(0.1)


def run_gang(api: kube.KubeClient, tree: Tree, *, ns: str, scheduler: str, scheduler_name: str, pods: int, tier: int,
             timeout: float) -> GangResult:
    gang = f"{scheduler}-{pods}p-t{tier}"
    _, rv = api.list(kube.PODS, namespace=ns, label_selector=f"gang={gang}")
    watch = BoundWatch(api, ns, gang, rv, pods)
    watch.start()
    began = time.monotonic()
    parallel(lambda i: api.create(kube.PODS, pod_body(ns, f"{gang}-{i}", gang, scheduler_name)), range(pods), workers=16)
    create_pods_s = time.monotonic() - began
    group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": gang, "namespace": ns},
             "spec": {"minMember": pods, "queue": "default",
                      "networkTopology": {"mode": "hard", "highestTierAllowed": tier}}}
    started = time.monotonic()
    api.create(kube.VC_PODGROUPS, group)
    placed = watch.done.wait(timeout)
    watch.stop()
    result = GangResult(scheduler, pods, tier, round(watch.last_bound - started, 3) if placed else None,
                        len(watch.placement), create_pods_s=round(create_pods_s, 2))
    if placed:
        span = tree.span(list(watch.placement.values()))
        nodes = set(watch.placement.values())
        if span is None:
            result.violation = "no HyperNode holds all its nodes"
        else:
            result.span, result.span_tier = span
            if span[1] > tier:
                result.violation = f"spans {span[0]} (tier {span[1]}) > highestTierAllowed {tier}"
        if len(nodes) != pods:
            result.violation += f"; {pods} pods of {GPUS} GPUs on {len(nodes)} nodes"
    else:
        result.why = podgroup_condition(api, ns, gang)
    delete_gang(api, ns, gang)
    return result


# -- the schedulers --------------------------------------------------------------------------------
@contextlib.contextmanager
def hypertopo_running(plane: ControlPlane, name: str, selector: str) -> Iterator[None]:
    """`hypertopo-scheduler run` as its own process (as deployed), once /healthz says it has synced."""
    port = free_port()
    log = open(plane.workdir / "hypertopo-scheduler.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator.placement.cli", "run", f"--kubeconfig={plane.kubeconfig}",
         f"--scheduler-name={name}", f"--listen=127.0.0.1:{port}", f"--node-selector={selector}",
         "--no-leader-election", "--log-level=WARNING"],
        stdout=log, stderr=subprocess.STDOUT, cwd=HERE.parent)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"hypertopo-scheduler exited {proc.returncode}: "
                                     f"{(plane.workdir / 'hypertopo-scheduler.log').read_text()[-3000:]}")
            if http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)[0] == 200:
                break
            if time.monotonic() > deadline:
                raise AssertionError("hypertopo-scheduler not healthy after 300s")
            time.sleep(0.2)
        yield
    finally:
        stop_processes([proc], timeout=30)
        log.close()


@contextlib.contextmanager
def scheduler_running(which: str, plane: ControlPlane, tag: str, volcano_verbosity: int) -> Iterator[str]:
    """Starts one scheduler; yields the schedulerName its pods carry."""
    if which == VOLCANO:
        with volcano_running(plane, conf=DEFAULT_CONF, verbosity=volcano_verbosity, ready_timeout=300):
            yield SCHEDULER_NAME
    else:
        name = f"hypertopo-{tag}"
        with hypertopo_running(plane, name, f"{TEST_LABEL}={tag}"):
            yield name


# -- one size --------------------------------------------------------------------------------------
@dataclass
class SizeResult:
    setup: Setup
    gangs: list[GangResult] = field(default_factory=list)


@dataclass
class BenchCluster:
    """The kwok cluster and HyperNode tree of one size, with kwok running; `scheduler()` starts
    one scheduler, `gang()` measures one gang under it."""

    plane: ControlPlane
    api: kube.KubeClient
    tree: Tree
    setup: Setup
    tag: str
    ns: str
    volcano_verbosity: int = 2

    @contextlib.contextmanager
    def scheduler(self, which: str) -> Iterator[str]:
        with scheduler_running(which, self.plane, self.tag, self.volcano_verbosity) as name:
            yield name

    def gang(self, which: str, scheduler_name: str, pods: int, tier: int, timeout: float) -> GangResult:
        return run_gang(self.api, self.tree, ns=self.ns, scheduler=which, scheduler_name=scheduler_name,
                        pods=pods, tier=tier, timeout=timeout)


@contextlib.contextmanager
def cluster(plane: ControlPlane, *, nodes: int, tag: str = "vs", lease_seconds: int = 3600,
            volcano_verbosity: int = 2) -> Iterator[BenchCluster]:
    """Builds the cluster on `plane` (which should be this bench's alone: vc-scheduler acts on every
    node and every `volcano` pod): Nodes (registered Ready, as kubelets register) and HyperNodes
    created concurrently, then kwok started to keep the nodes Ready and run the bound pods; the
    bench goes on once every node reads Ready and kwok holds a Lease for each (its first pass done)."""
    api = kube.connect(str(plane.kubeconfig), pool_size=32, timeout=60.0)
    began = time.monotonic()
    names, hypernodes = render_tree(nodes)
    tree = Tree(hypernodes)
    render_s = time.monotonic() - began
    began = time.monotonic()
    create_nodes(api, names, tag)
    nodes_s = time.monotonic() - began
    began = time.monotonic()
    create_hypernodes(api, hypernodes)
    hypernodes_s = time.monotonic() - began
    ns = f"bench-{tag}"
    api.create(kube.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    open_default_queue(api)
    with kwok(plane, lease_seconds=lease_seconds):
        began = time.monotonic()
        while (ready := ready_nodes(api, tag)) < nodes:
            if time.monotonic() - began > 300 + 0.1 * nodes:
                raise AssertionError(f"only {ready}/{nodes} nodes Ready after {300 + 0.1 * nodes:.0f}s of kwok")
            time.sleep(1.0)
        # kwok's first pass over the nodes (a status patch and a Lease each) is heavy at 10,000 nodes:
        # the clocks start once it is over, so no scheduler is measured under it
        while (leases := len(api.list(LEASES, namespace="kube-node-lease")[0])) < nodes:
            if time.monotonic() - began > 300 + 0.1 * nodes:
                raise AssertionError(f"kwok made {leases}/{nodes} node Leases in {300 + 0.1 * nodes:.0f}s")
            time.sleep(2.0)
        setup = Setup(nodes, len(hypernodes), tree.tiers(), round(render_s, 2), round(nodes_s, 1),
                      round(hypernodes_s, 1), round(time.monotonic() - began, 1))
        yield BenchCluster(plane, api, tree, setup, tag, ns, volcano_verbosity)


def describe(gang: GangResult, timeout: float) -> str:
    text = f"  {gang.scheduler:9} {gang.pods:4} pods tier<={gang.tier_allowed}: " + (
        f"{gang.seconds:.3f}s, span {gang.span} (tier {gang.span_tier})" if gang.placed else
        f"NOT PLACED in {timeout:.0f}s ({gang.bound}/{gang.pods} bound; {gang.why})")
    return text + (f"  VIOLATION: {gang.violation}" if gang.violation else "")


def measure(plane: ControlPlane, *, nodes: int, gangs: Sequence[tuple[int, int]], schedulers: Sequence[str],
            timeout: float, volcano_verbosity: int = 2, report: Callable[[str], None] = print) -> SizeResult:
    """Every gang under every scheduler, one scheduler at a time, on one cluster of `nodes` nodes."""
    with cluster(plane, nodes=nodes, volcano_verbosity=volcano_verbosity) as bench:
        setup = bench.setup
        report(f"{nodes} nodes: setup {setup.total_s:.1f}s (render {setup.render_s}s, nodes {setup.nodes_s}s, "
               f"{setup.hypernodes} HyperNodes {setup.hypernodes_s}s (per tier {setup.tiers}), "
               f"kwok Ready, Leases {setup.kwok_ready_s}s)")
        result = SizeResult(setup)
        for which in schedulers:
            with bench.scheduler(which) as scheduler_name:
                for pods, tier in gangs:
                    gang = bench.gang(which, scheduler_name, pods, tier, timeout)
                    report(describe(gang, timeout))
                    result.gangs.append(gang)
    return result


def table(results: Mapping[int, SizeResult]) -> str:
    lines = ["nodes   gang          volcano s   hypertopo s   volcano/hypertopo",
             "------  ------------  ----------  ------------  -----------------"]
    for nodes, size in results.items():
        keys = sorted({(g.pods, g.tier_allowed) for g in size.gangs})
        for pods, tier in keys:
            got = {g.scheduler: g for g in size.gangs if (g.pods, g.tier_allowed) == (pods, tier)}

            def cell(which: str, got: Mapping[str, GangResult] = got) -> str:
                g = got.get(which)
                if g is None:
                    return "-"
                return f"{g.seconds:.3f}" if g.placed else f"none ({g.bound}/{g.pods})"

            v, h = got.get(VOLCANO), got.get(HYPERTOPO)
            ratio = f"{v.seconds / max(h.seconds, 1e-3):.1f}x" if v and h and v.placed and h.placed \
                and v.seconds is not None and h.seconds is not None else "-"
            lines.append(f"{nodes:<6}  {pods:>4} x {GPUS} t<={tier}  {cell(VOLCANO):>10}  {cell(HYPERTOPO):>12}  {ratio:>17}")
    return "\n".join(lines)


def parse_gangs(text: str) -> list[tuple[int, int]]:
    try:
        gangs = [(int(p), int(t)) for p, t in (item.split(":") for item in text.split(",") if item)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--gangs wants PODS:TIER[,PODS:TIER...], got {text!r}") from exc
    if not gangs or any(p < 1 or t < 1 for p, t in gangs):
        raise argparse.ArgumentTypeError(f"--gangs wants positive PODS:TIER pairs, got {text!r}")
    return gangs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sizes", default="1000,5000,10000", help="node counts, comma-separated (default all three)")
    parser.add_argument("--gangs", type=parse_gangs, default=list(DEFAULT_GANGS),
                        help="PODS:TIER,... gangs of PODS 8-GPU pods, hard highestTierAllowed TIER (default 8:1,64:2,256:3)")
    parser.add_argument("--schedulers", default=f"{VOLCANO},{HYPERTOPO}", help="which, in this order (default both)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a gang may take to be bound (default 300)")
    parser.add_argument("--volcano-v", type=int, default=2, help="vc-scheduler's log verbosity (default 2)")
    parser.add_argument("--json", action="store_true", help="also print one JSON line per size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    schedulers = [s for s in args.schedulers.split(",") if s]
    if unknown := set(schedulers) - {VOLCANO, HYPERTOPO}:
        parser.error(f"unknown scheduler(s) {sorted(unknown)}: use {VOLCANO} and/or {HYPERTOPO}")
    if VOLCANO in schedulers:
        volcano_dir()  # built (and cached) before any clock runs
    results: dict[int, SizeResult] = {}
    for nodes in sizes:
        with running() as plane:
            try:
                results[nodes] = measure(plane, nodes=nodes, gangs=args.gangs, schedulers=schedulers,
                                         timeout=args.timeout, volcano_verbosity=args.volcano_v)
            finally:
                for proc in plane.processes:  # a 10,000-node etcd is not worth a graceful stop
                    proc.kill()
        if args.json:
            print(json.dumps({"nodes": nodes, "setup": asdict(results[nodes].setup),
                              "gangs": [asdict(g) for g in results[nodes].gangs]}), flush=True)
    print()
    print(table(results))
    violations = [g for size in results.values() for g in size.gangs if g.violation]
    for g in violations:
        print(f"TIER LIMIT VIOLATED by {g.scheduler}: {g.pods} pods, tier<={g.tier_allowed}: {g.violation}")
    unplaced = [g for size in results.values() for g in size.gangs if not g.placed and g.scheduler == HYPERTOPO]
    return 1 if violations or unplaced else 0


if __name__ == "__main__":
    raise SystemExit(main())
