"""Helpers for the live-scheduler tests and the binding benchmark: kwok (built by
tests/controlplane/kwok/build_kwok.sh), GPU Node objects, HyperNodes, PodGroups and pods on the
real API server, an in-process scheduler, and waits on conditions (no sleeps)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import yaml
from controlplane.harness import ControlPlane
from realparts import missing

from aggregator.placement.adapters import kube
from aggregator.placement.live.scheduler import Options, Scheduler

HERE = Path(__file__).resolve().parent.parent
KWOK_LABEL = ("type", "kwok")
ON_FABRIC_FAULT = "hypertopo.io/on-fabric-fault"  # a gang's policy when a node under it fails
T = TypeVar("T")


def build_kwok() -> str:
    proc = subprocess.run(["bash", str(HERE / "controlplane" / "kwok" / "build_kwok.sh")],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        missing(f"kwok build failed: {proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


KEEP_RUNNING = "hypertopo.io/kwok-keep-running"


def keep_running_stages(workdir: Path) -> Path:
    """kwok's own pod stages (from its module) with one change: a pod annotated
    `hypertopo.io/kwok-keep-running` is never completed. kwok completes every Running pod owned by
    a kind named "Job" at once, which matches Volcano's batch Jobs too; a trainer runs for hours."""
    proc = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], cwd=HERE / "controlplane" / "kwok",
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        missing(f"kwok module not found: {proc.stderr[-1000:]}")
    fast = Path(proc.stdout.strip()) / "kustomize" / "stage" / "pod" / "fast"
    docs = []
    for name in ("pod-ready.yaml", "pod-complete.yaml", "pod-delete.yaml"):
        stage = yaml.safe_load((fast / name).read_text())
        if stage["metadata"]["name"] == "pod-complete":
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{KEEP_RUNNING}"]', "operator": "DoesNotExist"})
        docs.append(stage)
    path = workdir / "kwok-stages.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


@contextlib.contextmanager
def kwok_running(plane: ControlPlane, *, config: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """kwok managing the nodes labelled type=kwok: keeps them Ready, moves bound pods to Running,
    finishes deletions (as a kubelet would). `config`: a kwok config file (stages)."""
    binary = build_kwok()
    log = open(plane.workdir / "kwok.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [binary, f"--kubeconfig={plane.kubeconfig}", f"--manage-nodes-with-label-selector={KWOK_LABEL[0]}={KWOK_LABEL[1]}",
         "--node-lease-duration-seconds=40", "--cidr=10.240.0.1/16", *([f"--config={config}"] if config else [])],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 20.0, interval: float = 0.05) -> T:
    """Polls `probe` until it returns something truthy; fails with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Cluster:
    """Objects of one test, all labelled `hypertopo.io/test=<tag>`, in namespace `ns`."""

    def __init__(self, plane: ControlPlane, tag: str, *, kwok: bool = True) -> None:
        self.plane, self.tag, self.kwok = plane, tag, kwok
        self.ns = f"live-{tag}"
        self.api = kube.connect(str(plane.kubeconfig), pool_size=32, timeout=30.0)
        self._raw = self.api.request  # tests create/delete with plain JSON calls
        self.nodes: list[str] = []
        self.hypernodes: list[str] = []
        self._raw("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})

    @property
    def selector(self) -> str:
        return f"hypertopo.io/test={self.tag}"

    @property
    def scheduler_name(self) -> str:
        """The schedulerName of `scheduler()`, which `add_gang` and `add_gang_pods` put on their pods."""
        return f"hypertopo-{self.tag}"

    def labels(self) -> dict[str, str]:
        labels = {"hypertopo.io/test": self.tag}
        if self.kwok:
            labels[KWOK_LABEL[0]] = KWOK_LABEL[1]
        return labels

    # -- nodes and topology -------------------------------------------------------------------
    def add_nodes(self, names: Sequence[str], *, gpus: int = 8) -> None:
        def one(name: str) -> None:
            amounts = {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": self.labels()},
                    "status": {"capacity": amounts, "allocatable": amounts}}
            self._raw("POST", "/api/v1/nodes", body=body)
            # The TaintNodesByCondition admission plugin taints every new node not-ready; in a real
            # cluster the node lifecycle controller lifts it once the kubelet (here kwok) reports.
            self._raw("PATCH", kube.NODES.path(name=name), body={"spec": {"taints": None}},
                      content_type=kube.MERGE_PATCH)

        parallel(one, names)
        self.nodes.extend(names)

    def add_hypernode(self, name: str, tier: int, tier_name: str, *, nodes: Sequence[str] = (),
                      children: Sequence[str] = ()) -> None:
        members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
        members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": c}}} for c in children]
        body = {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
                "metadata": {"name": name, "labels": {"hypertopo.io/test": self.tag}},
                "spec": {"tier": tier, "tierName": tier_name, "members": members}}
        self._raw("POST", kube.HYPERNODES.path(), body=body)
        self.hypernodes.append(name)

    def leaf_spine(self, leaves: int, per_leaf: int, *, gpus: int = 8) -> dict[str, list[str]]:
        """`leaves` leaf HyperNodes of `per_leaf` nodes under one spine; returns leaf -> nodes."""
        layout = {f"leaf-{self.tag}-{i}": [f"n-{self.tag}-{i}-{j}" for j in range(per_leaf)] for i in range(leaves)}
        self.add_nodes([n for nodes in layout.values() for n in nodes], gpus=gpus)
        for leaf, nodes in layout.items():
            self.add_hypernode(leaf, 1, "leaf", nodes=nodes)
        self.add_hypernode(f"spine-{self.tag}", 2, "spine", children=list(layout))
        return layout

    def set_hypernode_ready(self, name: str, status: str, reason: str = "FabricDown") -> None:
        cond = {"type": "Ready", "status": status, "reason": reason, "message": f"test sets {status}",
                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.api.patch_status(kube.HYPERNODES, None, name, {"status": {"conditions": [cond]}})

    def taint(self, node: str, key: str = "hypertopo.io/fabric-unhealthy") -> None:
        patch = {"spec": {"taints": [{"key": key, "effect": "NoSchedule"}]}}
        self._raw("PATCH", kube.NODES.path(name=node), body=patch, content_type=kube.MERGE_PATCH)

    # -- workloads ----------------------------------------------------------------------------
    def add_podgroup(self, name: str, min_member: int, annotations: dict[str, str] | None = None,
                     timeout: int | None = None) -> None:
        spec: dict[str, Any] = {"minMember": min_member}
        if timeout is not None:
            spec["scheduleTimeoutSeconds"] = timeout
        body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": name, "namespace": self.ns, "annotations": annotations or {}}, "spec": spec}
        self._raw("POST", kube.PODGROUPS.path(namespace=self.ns), body=body)

    def pod_body(self, name: str, scheduler: str, *, gang: str | None = None, gpus: int = 1,
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
        labels = {"hypertopo.io/test": self.tag}
        if gang:
            labels["scheduling.x-k8s.io/pod-group"] = gang
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.ns, "labels": labels, "annotations": annotations or {}},
                "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": "trainer:latest", "resources": resources}]}}

    def add_gang(self, gang: str, pods: int, *, gpus: int = 1, min_member: int | None = None,
                 on_fault: str | None = None, annotations: dict[str, str] | None = None) -> None:
        """PodGroup GANG (minMember `min_member`, else `pods`; `on_fault` is its hypertopo.io/on-fabric-fault
        policy) and its pods GANG-0 .. GANG-<pods-1>, each asking `gpus` GPUs."""
        policy = {ON_FABRIC_FAULT: on_fault} if on_fault else {}
        self.add_podgroup(gang, pods if min_member is None else min_member, annotations={**(annotations or {}), **policy})
        self.add_gang_pods(gang, [f"{gang}-{i}" for i in range(pods)], gpus=gpus)

    def add_gang_pods(self, gang: str, names: Iterable[str], *, gpus: int = 1) -> None:
        """More pods of GANG (replacements, late members) for `scheduler()`, each asking `gpus` GPUs."""
        self.add_pods([self.pod_body(name, self.scheduler_name, gang=gang, gpus=gpus) for name in names])

    def add_pods(self, bodies: Sequence[dict[str, Any]]) -> None:
        parallel(lambda body: self._raw("POST", kube.PODS.path(namespace=self.ns), body=body), bodies)

    def pods(self) -> dict[str, dict[str, Any]]:
        items, _ = self.api.list(kube.PODS, label_selector=self.selector)
        return {p["metadata"]["name"]: p for p in items if p["metadata"]["namespace"] == self.ns}

    def placement(self) -> dict[str, str]:
        """pod -> node for the bound pods of this test."""
        return {name: p["spec"]["nodeName"] for name, p in self.pods().items() if p["spec"].get("nodeName")}

    def wait_bound(self, count: int, timeout: float = 20.0) -> dict[str, str]:
        def probe() -> dict[str, str] | None:
            placement = self.placement()
            return placement if len(placement) == count else None

        return wait_for(f"{count} pods bound", probe, timeout)

    def wait_events(self, reason: str, count: int = 1, timeout: float = 20.0) -> list[dict[str, Any]]:
        def probe() -> list[dict[str, Any]] | None:
            events = self.events(reason)
            return events if len(events) >= count else None

        return wait_for(f"{count} {reason} events", probe, timeout)

    def events(self, reason: str) -> list[dict[str, Any]]:
        doc = self._raw("GET", kube.EVENTS.path(namespace=self.ns), query={"fieldSelector": f"reason={reason}"})
        return list(doc.get("items") or [])

    def podgroup(self, name: str) -> dict[str, Any]:
        return self.api.get(kube.PODGROUPS, name, namespace=self.ns)

    # -- scheduler and teardown ---------------------------------------------------------------
    @contextlib.contextmanager
    def scheduler(self, api: Any = None, **overrides: Any) -> Iterator[Scheduler]:
        options = Options(scheduler_name=self.scheduler_name, node_selector=self.selector,
                          watch_timeout=20, **overrides)
        sched = Scheduler(api or self.api, options)
        sched.start()
        try:
            wait_for("scheduler informers to sync", sched.synced)
            yield sched
        finally:
            sched.stop()

    def cleanup(self) -> None:
        """Deletes what the test made (pods at once: there is no kubelet for non-kwok nodes)."""
        with contextlib.suppress(kube.ApiError):
            self._raw("DELETE", kube.PODS.path(namespace=self.ns), query={"gracePeriodSeconds": 0})
        for name in self.hypernodes:
            with contextlib.suppress(kube.ApiError):
                self._raw("DELETE", kube.HYPERNODES.path(name=name))
        parallel(lambda n: self._try_delete(kube.NODES.path(name=n)), self.nodes)
        with contextlib.suppress(kube.ApiError):
            self._raw("DELETE", f"/api/v1/namespaces/{self.ns}")

    def _try_delete(self, path: str) -> None:
        with contextlib.suppress(kube.ApiError):
            self._raw("DELETE", path)


def parallel(fn: Callable[[Any], Any], items: Sequence[Any], workers: int = 16) -> list[Any]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)[:3000]
