"""The pieces of the soak (tests/bench/bench_soak.py, tests/live/test_soak_small.py): the cluster's objects
written as their writers write them, the agents' RDMA port flaps, a watch that keeps every
HyperNode event, aggregator replicas as processes, and a fresh `hypertopo-aggregator render` of the
reports the API server holds.

Nodes are the live memory bench's Nodes less their image list (a kwok-sized Node with kubelet's
labels and conditions); each NodeTopology is the memory bench's 8-GPU, 8-HCA report, applied
through the agent's own adapter (server-side apply, field manager hypertopo-agent, an owner
reference to its Node) after the agent's RDMA judgement. A flap is what an agent publishes when
a cable goes: one port DOWN/Polling, judged by `agent.probes.rdma.judge` against the ports it has
seen active (the port failed, the rdma component degraded), then the same port ACTIVE again."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aggregator_controller_kit import AggregatorProcess
from bench_memory import _report_templates, node_name, node_object, topology_json
from controlplane.harness import ControlPlane

from agent.adapters.node_topology import KubeApi
from agent.common.adapters.kube import NODES, NODETOPOLOGIES, KubeClient
from agent.common.api_error import ApiError
from agent.common.report import (
    ComponentHealth,
    Health,
    NodeReport,
    ProbeResult,
    node_topology_object,
    report_from_spec,
)
from agent.probes.rdma import active_ports, judge
from aggregator.adapters.kube import HYPERNODES, LEASES

REPO = Path(__file__).resolve().parents[2]
NAMESPACE, LEASE = "hypertopo-system", "hypertopo-aggregator"


# -- the agents' reports -----------------------------------------------------------------------------

def judged(report: NodeReport, seen: set[tuple[str, int]]) -> NodeReport:
    """The report with its RDMA ports and component judged as the agent's rdma probe judges them."""
    result = judge(ProbeResult(report.rdma, ComponentHealth(Health.OK)), seen_active=seen)
    return dataclasses.replace(report, rdma=result.value or (), health={**report.health, "rdma": result.health})


def port_down(report: NodeReport, device: int, seen: set[tuple[str, int]]) -> NodeReport:
    """What the agent publishes once HCA `device`'s port 1 lost its link."""
    rdma = list(report.rdma)
    ports = tuple(dataclasses.replace(p, state="DOWN", phys_state="Polling", rate_gbps=None) for p in rdma[device].ports)
    rdma[device] = dataclasses.replace(rdma[device], ports=ports)
    return judged(dataclasses.replace(report, rdma=tuple(rdma)), seen)


class Agents:
    """Every node's report, and its writes through the agent's adapter (KubeApi)."""

    def __init__(self, kube: KubeClient, nodes: int, per_leaf: int) -> None:
        templates = _report_templates(per_leaf)
        raw = [report_from_spec(json.loads(topology_json(templates, i))["spec"]) for i in range(nodes)]
        self.seen = {r.node_name: active_ports(r.rdma) for r in raw}
        self.healthy = {r.node_name: judged(r, self.seen[r.node_name]) for r in raw}
        self.current = dict(self.healthy)
        self.owners: dict[str, dict[str, str]] = {}
        self._api = _AgentApi(kube, self.owners)

    def publish(self, report: NodeReport) -> float:
        """Applies the report as the node's agent does; the time (epoch) its write was answered."""
        self._api.apply(node_topology_object(report))
        self.current[report.node_name] = report
        return time.time()

    def flap_down(self, node: str, device: int) -> float:
        return self.publish(port_down(self.healthy[node], device, self.seen[node]))

    def flap_up(self, node: str) -> float:
        return self.publish(self.healthy[node])


class _AgentApi(KubeApi):
    """The agent's adapter with the owner reference its pod-bound token would give (the Node's UID,
    known here from creating the Node: the test's admin token names no node)."""

    def __init__(self, kube: KubeClient, owners: dict[str, dict[str, str]]) -> None:
        super().__init__(kube)
        self._known = owners

    def owner_of(self, node: str) -> dict[str, str] | None:
        return self._known.get(node)


def load(kube: KubeClient, agents: Agents, threads: int = 8) -> None:
    """Each Node as kubelet registers it (status included), then its agent's first report."""
    def one(i: int) -> None:
        body = node_object(i, managed=False)
        body["status"].pop("images")
        created = kube.create(NODES, body, field_manager="kubelet")
        name = node_name(i)
        agents.owners[name] = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": created["metadata"]["uid"]}
        agents.publish(agents.healthy[name])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(agents.healthy))))


# -- the HyperNodes as the API server serves them --------------------------------------------------

@dataclasses.dataclass(slots=True)
class Seen:
    t: float
    kind: str  # ADDED | MODIFIED | DELETED | RELIST
    ready: str
    message: str


def ready_condition(obj: dict[str, Any]) -> tuple[str, str]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status")), str(cond.get("message", ""))
    return "", ""


class HyperNodeWatch:
    """A watch on the HyperNodes from the start: every event with its arrival time, the latest
    object of each, and the deletions and re-creations (by name and UID) it saw."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.objects: dict[str, dict[str, Any]] = {}
        self.log: dict[str, list[Seen]] = {}
        self.uids: dict[str, str] = {}
        self.deleted = self.recreated = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._watch: Any = None
        items, self.rv = kube.list(HYPERNODES)
        self._relist(items)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        name, uid = obj["metadata"]["name"], obj["metadata"].get("uid", "")
        with self.lock:
            if kind == "DELETED":
                self.deleted += 1
                self.objects.pop(name, None)
            else:
                if self.uids.get(name, uid) != uid:
                    self.recreated += 1
                self.uids[name] = uid
                self.objects[name] = obj
            self.log.setdefault(name, []).append(Seen(time.time(), kind, *ready_condition(obj)))

    def _relist(self, items: list[dict[str, Any]]) -> None:
        gone = set(self.objects) - {o["metadata"]["name"] for o in items}
        for name in gone:
            self._record("DELETED", self.objects[name])
        for obj in items:
            if self.objects.get(obj["metadata"]["name"], {}).get("metadata", {}).get("resourceVersion") != \
                    obj["metadata"].get("resourceVersion"):
                self._record("RELIST", obj)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._watch = self.kube.watch(HYPERNODES, resource_version=self.rv, timeout_seconds=240)
                for event in self._watch:
                    self.rv = event.object.get("metadata", {}).get("resourceVersion", self.rv)
                    if event.type != "BOOKMARK":
                        self._record(event.type, event.object)
            except ApiError:
                if self.stop.is_set():
                    return
                items, self.rv = self.kube.list(HYPERNODES)
                self._relist(items)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self.objects)

    def writes_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for seen in self.log.values() for s in seen
                       if start <= s.t < end and s.kind in ("ADDED", "MODIFIED"))

    def close(self) -> None:
        self.stop.set()
        if self._watch is not None:
            self._watch.close()


def differences(have: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between two trees: names, spec, nodeCount, and each condition's type, status,
    reason and message."""
    def conditions(obj: dict[str, Any]) -> list[tuple[str, ...]]:
        return sorted((c["type"], c["status"], c.get("reason", ""), c.get("message", ""))
                      for c in (obj.get("status") or {}).get("conditions") or [])

    out = [f"{n}: missing" for n in sorted(set(want) - set(have))]
    out += [f"{n}: not in the render" for n in sorted(set(have) - set(want))]
    for name in sorted(set(have) & set(want)):
        a, b = have[name], want[name]
        if a["spec"] != b["spec"]:
            out.append(f"{name}: spec differs")
        if (a.get("status") or {}).get("nodeCount") != b["status"].get("nodeCount"):
            out.append(f"{name}: nodeCount {a.get('status', {}).get('nodeCount')} != {b['status'].get('nodeCount')}")
        if conditions(a) != conditions(b):
            out.append(f"{name}: conditions {conditions(a)} != {conditions(b)}")
    return out


def fresh_render(kube: KubeClient, workdir: Path) -> dict[str, dict[str, Any]]:
    """`hypertopo-aggregator render` of the NodeTopology objects the API server holds now."""
    items, _ = kube.list(NODETOPOLOGIES)
    path = workdir / "reports-now.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    proc = subprocess.run([sys.executable, "-m", "aggregator", "render", "--reports", str(path), "--format", "json"],
                          capture_output=True, text=True, check=True, cwd=REPO)
    return {o["metadata"]["name"]: o for o in json.loads(proc.stdout)["items"]}


# -- the replicas ----------------------------------------------------------------------------------

class Replicas:
    """`hypertopo-aggregator run` replicas with leader election, as a two-replica Deployment runs
    them (agent liveness not tracked: no agent pods here)."""

    def __init__(self, plane: ControlPlane, kube: KubeClient, lease_flags: list[str]) -> None:
        self.plane, self.kube, self.lease_flags = plane, kube, lease_flags
        self.procs: dict[str, AggregatorProcess] = {}
        self.started = 0

    def start(self) -> str:
        self.started += 1
        name = f"replica-{self.started}"
        flags = ["--kubeconfig", str(self.plane.kubeconfig), "--namespace", NAMESPACE, "--identity", name,
                 "--agent-selector=", *self.lease_flags]
        self.procs[name] = AggregatorProcess(self.plane, flags, name=name)
        return name

    def holder(self) -> str:
        try:
            return str(self.kube.get(LEASES, LEASE, namespace=NAMESPACE)["spec"].get("holderIdentity") or "")
        except ApiError:
            return ""

    def ready(self, name: str) -> bool:
        """/readyz answers 200: the replica's informers synced (a Deployment's readiness probe)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.procs[name].port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def kill(self, name: str) -> None:
        """kill -9: no lease release, the standby waits the lease out."""
        self.procs[name].proc.kill()
        self.procs[name].proc.wait()

    def stop(self, name: str) -> None:
        """SIGTERM, as a rollout stops a pod (the leader releases its lease)."""
        self.procs[name].stop()

    def alive(self) -> dict[str, int]:
        return {n: p.proc.pid for n, p in list(self.procs.items()) if p.proc.poll() is None}  # a rollout adds

    def errors_logged(self) -> int:
        return sum(1 for p in list(self.procs.values()) for line in p.log.read_text(errors="replace").splitlines()
                   if " ERROR " in line or "Traceback" in line or '"level": "ERROR"' in line)

    def close(self) -> None:
        for name in list(self.alive()):
            self.procs[name].stop()
