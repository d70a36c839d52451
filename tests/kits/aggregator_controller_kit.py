"""Shared pieces of the aggregator controller tests: HyperNode bodies, NodeTopology and Node
objects, a private control plane (for tests that run whole aggregators, which act on every
NodeTopology and owned HyperNode they see), a metrics scraper, and a TCP proxy that can cut the
controller off from the API server."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator, MutableSequence
from pathlib import Path
from typing import Any

import yaml
from controlplane.harness import ControlPlane, running
from realparts import free_port, require_binary, wait_for

from agent.common.report import (
    ComponentHealth,
    Gpu,
    Health,
    LldpNeighbour,
    NodeReport,
    NvLink,
    NvmlReport,
    node_topology_object,
)
from aggregator.live.reconcile import OWNER_LABELS

REPO = Path(__file__).resolve().parents[2]
READY_AT = "2024-01-01T00:00:00Z"


def hypernode(
    name: str,
    *,
    tier: int,
    tier_name: str,
    members: list[tuple[str, str]],
    node_count: int,
    ready: str = "True",
    since: str = READY_AT,
) -> dict[str, Any]:
    """A full desired HyperNode as the pipeline renders it (members: (type, name))."""
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "labels": dict(OWNER_LABELS)},
        "spec": {
            "tier": tier,
            "tierName": tier_name,
            "members": [{"type": t, "selector": {"exactMatch": {"name": n}}} for t, n in members],
        },
        "status": {
            "nodeCount": node_count,
            "conditions": [
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": "MembersHealthy" if ready == "True" else "MembersUnhealthy",
                    "message": "all members healthy" if ready == "True" else "members unhealthy",
                    "lastTransitionTime": since,
                }
            ],
        },
    }


def small_tree(prefix: str) -> list[dict[str, Any]]:
    """spine <- 2 leaves <- 2 nodes each."""
    leaves = [
        hypernode(f"{prefix}-leaf-{i}", tier=1, tier_name="leaf", node_count=2,
                  members=[("Node", f"{prefix}-n{2 * i + j}") for j in range(2)])
        for i in range(2)
    ]
    spine = hypernode(f"{prefix}-spine", tier=2, tier_name="spine", node_count=4,
                      members=[("HyperNode", leaf["metadata"]["name"]) for leaf in leaves])
    return [*leaves, spine]


def report(node: str, *, leaf: str, nvlink_up: bool = True) -> NodeReport:
    """A node with 2 GPUs (one NVLink each) and an LLDP neighbour naming its leaf switch."""
    link_state = "up" if nvlink_up else "down"
    gpu_health = ComponentHealth(Health.OK) if nvlink_up else ComponentHealth(Health.FAILED, "NVLink 0 down")
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-{node}-{i}", name="NVIDIA H100", pci_bus_id=f"0000:1{i}:00.0",
            nvlinks=(NvLink(link=0, state=link_state if i == 0 else "up"),),
            health=gpu_health if i == 0 else ComponentHealth(Health.OK))
        for i in range(2)
    )
    nvml_health = ComponentHealth(Health.OK) if nvlink_up else ComponentHealth(Health.FAILED, "GPU 0 NVLink down")
    return NodeReport(
        node_name=node,
        health={"nvml": nvml_health, "lldp": ComponentHealth(Health.OK)},
        nvml=NvmlReport(driver_version="550.54.15", gpus=gpus),
        lldp=(LldpNeighbour(interface="eth0", chassis_id=f"chassis-{leaf}", port_id="Ethernet1", ttl=120,
                            system_name=leaf),),
    )


def nodetopology(node: str, *, leaf: str, nvlink_up: bool = True) -> dict[str, Any]:
    return node_topology_object(report(node, leaf=leaf, nvlink_up=nvlink_up))


def node_object(name: str, *, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None
                ) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or []},
    }


def apply_objects(plane: ControlPlane, objs: list[dict[str, Any]], *, kubeconfig: Path | None = None) -> None:
    """Server-side applies the objects as one List (field manager "test")."""
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    plane.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=doc, kubeconfig=kubeconfig)


def set_ready(plane: ControlPlane, kind: str, name: str, namespace: str | None = None) -> None:
    """Marks a Node or pod Ready through its status subresource, as a kubelet would."""
    cond = {"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z", "reason": "Up"}
    patch = json.dumps({"status": {"conditions": [cond]}})
    ns = ["-n", namespace] if namespace else []
    plane.kubectl("patch", kind, name, *ns, "--subresource=status", "--type=merge", "-p", patch)


def ready_with_agents(plane: ControlPlane, nodes: list[dict[str, Any]], reports: dict[str, NodeReport]) -> None:
    """Applies the Node objects, an agent pod (hypertopo-system, the agent's label) and the
    NodeTopology of each report's node, then marks those Nodes and pods Ready."""
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"agent-{n}", "namespace": "hypertopo-system",
                          "labels": {"app.kubernetes.io/name": "hypertopo-agent"}},
             "spec": {"nodeName": n, "containers": [{"name": "agent", "image": "hypertopo:test"}]}} for n in reports]  # fmt: skip
    apply_objects(plane, [*nodes, *pods, *(node_topology_object(r) for r in reports.values())])
    for n in reports:
        set_ready(plane, "node", n)
        set_ready(plane, "pod", f"agent-{n}", "hypertopo-system")


@contextlib.contextmanager
def private_plane() -> Iterator[ControlPlane]:
    """A control plane of one's own; killed (not drained) at the end to keep teardown short."""
    with running() as plane:
        plane.kubectl("create", "namespace", "hypertopo-system")
        try:
            yield plane
        finally:
            for proc in plane.processes:
                proc.kill()


def scrape(port: int) -> dict[str, float]:
    """/metrics as {"name{labels}": value} (labels as exposed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


class AggregatorProcess:
    """`hypertopo-aggregator run` as a process of its own on a free port, logging to
    `aggregator-NAME-PORT.log` in the plane's workdir; the flags (kubeconfig and the rest) are the
    caller's. Returns once /metrics answers. `running`, when given, collects the process so a
    fixture can kill whatever a failed test left behind."""

    def __init__(
        self,
        plane: ControlPlane,
        flags: list[str],
        *,
        name: str,
        running: MutableSequence[subprocess.Popen[bytes]] | None = None,
    ):
        self.port = free_port()
        self.log = plane.workdir / f"aggregator-{name}-{self.port}.log"
        argv = [sys.executable, "-m", "aggregator", "run", "--listen", f"127.0.0.1:{self.port}", *flags]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        if running is not None:
            running.append(self.proc)
        wait_for(self.metrics, timeout=30, what=f"aggregator {name} metrics")

    def metrics(self) -> dict[str, float]:
        if self.proc.poll() is not None:
            raise AssertionError(f"aggregator exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            return scrape(self.port)
        return {}

    def stop(self) -> int:
        """SIGTERM, then its exit code; killed if it has not exited within 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@contextlib.contextmanager
def prometheus_scraping(job: str, ports: list[int], rule_groups: list[Any] | None = None) -> Iterator[str]:
    """A real Prometheus scraping 127.0.0.1:PORT for each port every second (optionally with rule
    groups loaded); yields its base URL."""
    binary = require_binary("prometheus")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hypertopo-prom-") as tmp:
        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]}],
        }
        if rule_groups is not None:
            (Path(tmp) / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}))
            config["rule_files"] = [str(Path(tmp) / "rules.yaml")]
        (Path(tmp) / "prometheus.yml").write_text(yaml.safe_dump(config))
        argv = [binary, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(15)


def prometheus_query(base: str, query: str) -> dict[str, float]:
    """An instant query's result as {"label=value,...": value} ({} while Prometheus is not up)."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            result = json.loads(resp.read())["data"]["result"]
    except OSError:
        return {}
    return {",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): float(r["value"][1]) for r in result}


def writes_of(samples: dict[str, float], resource: str) -> float:
    return sum(v for k, v in samples.items()
               if k.startswith("hypertopo_aggregator_api_writes_total{") and f'resource="{resource}"' in k)


class Proxy:
    """A TCP forwarder to the API server that the test can cut (all connections dropped) and restore."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up.clear()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


# -- the HyperNodes on the API server ------------------------------------------------------------
def live(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    items = json.loads(plane.kubectl("get", "hypernodes", "-o", "json").stdout)["items"]
    return {o["metadata"]["name"]: o for o in items}


def ready_of(obj: dict[str, Any]) -> str:
    return next(c["status"] for c in obj["status"]["conditions"] if c["type"] == "Ready")


def same_tree(plane: ControlPlane, want: dict[str, dict[str, Any]]) -> bool:
    """The live HyperNodes are exactly `want`: spec, nodeCount and Ready."""
    have = live(plane)
    return have.keys() == want.keys() and all(
        have[n]["spec"] == want[n]["spec"] and "status" in have[n]
        and have[n]["status"]["nodeCount"] == want[n]["status"]["nodeCount"]
        and ready_of(have[n]) == ready_of(want[n]) for n in want)
