"""The live rows of tests/bench/bench_memory.py: a real etcd + kube-apiserver (tests/controlplane) holds
the benchmark's Nodes, NodeTopology reports and Pods; two aggregator replicas with leader election
(leader and standby) and a scheduler run as processes, the old code and this tree's side by side
(each pair with its own Lease), and their RSS is read once they are ready and have settled.

The base of each row is the same process's settled RSS on the same API server before any object
is created (interpreter, imports, TLS, threads, the first empty lists): MB per 1,000 nodes above
it is what the nodes cost, as in the in-process rows."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (controlplane) when run from tests/bench
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))  # realparts, which the harness imports

from bench_memory import _report_templates, _row, node_object, pod_object, rss_mb, topology_json
from controlplane.harness import running

from agent.common.adapters.kube import NODES, NODETOPOLOGIES, PODS, Resource, connect

NAMESPACES = Resource("", "v1", "namespaces", "Namespace")


def _load(kubeconfig: str, nodes: int) -> None:
    """Creates the objects (8 client threads), each as its writer would: kubelet-like managers."""
    import json

    kube = connect(kubeconfig, pool_size=16)
    templates = _report_templates()

    def one(i: int) -> None:
        kube.create(NODES, node_object(i, managed=False), field_manager="kubelet")
        kube.create(NODETOPOLOGIES, json.loads(topology_json(templates, i)), field_manager="hypertopo-agent")
        for k in range(3):
            kube.create(PODS, pod_object(i, k, managed=False), field_manager="kubectl")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(nodes)))


def _ready(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _settled(pids: dict[str, int], timeout: float) -> dict[str, float]:
    """RSS of each process once no sample moved more than 1% in three samples 5 s apart."""
    history: list[dict[str, float]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        history.append({name: rss_mb(pid) for name, pid in pids.items()})
        if len(history) >= 3 and all(
                max(h[n] for h in history[-3:]) <= 1.01 * min(h[n] for h in history[-3:]) for n in pids):
            break
        time.sleep(5)
    return history[-1]


def run_live(sizes: list[int], dirs: dict[str, str]) -> None:
    for nodes in sizes:
        with running() as plane:
            kubeconfig = str(plane.kubeconfig)
            kube = connect(kubeconfig)
            for ns in ("hypertopo-system", "work"):
                kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            base = _measure(plane, kubeconfig, 0, dirs, {})
            started = time.monotonic()
            _load(kubeconfig, nodes)
            print(f"live: {nodes} nodes, {nodes} reports, {3 * nodes} pods created in "
                  f"{time.monotonic() - started:.0f} s", flush=True)
            _measure(plane, kubeconfig, nodes, dirs, base)


def _measure(plane: Any, kubeconfig: str, nodes: int, dirs: dict[str, str],
             base: dict[str, float]) -> dict[str, float]:  # fmt: skip
    """Runs each replica until ready and settled; prints a row each (none for the base run, nodes
    0); returns their RSS by name."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, tuple[int, str]] = {}
    port = 19700
    try:
        for code, path in dirs.items():
            env = {**os.environ, "PYTHONPATH": path}
            for role in ("aggregator leader", "aggregator standby", "scheduler"):
                port += 1
                if role.startswith("aggregator"):
                    argv = [sys.executable, "-m", "aggregator", "run", f"--kubeconfig={kubeconfig}",
                            "--namespace=hypertopo-system", f"--lease-name=agg-{code}",
                            f"--identity={role.split()[1]}-{code}", f"--listen=127.0.0.1:{port}"]
                    check = "/readyz"
                else:
                    argv = [sys.executable, "-m", "aggregator.placement.cli", "run", f"--kubeconfig={kubeconfig}",
                            "--namespace=hypertopo-system", f"--lease-name=sched-{code}",
                            f"--listen=127.0.0.1:{port}"]
                    check = "/healthz"
                log = open(Path(plane.workdir) / f"{code}-{role.replace(' ', '-')}-{nodes}.log", "wb")  # noqa: SIM115
                procs[f"{role} {code}"] = subprocess.Popen(argv, env=env, cwd="/", stdout=log, stderr=subprocess.STDOUT)
                ports[f"{role} {code}"] = (port, check)
                time.sleep(3 if role == "aggregator leader" else 0.5)  # the leader takes the Lease first
        deadline = time.monotonic() + 600  # a replica that cannot list in 10 min is reported NOT READY
        while not all(_ready(*ports[n]) for n in procs) and time.monotonic() < deadline:
            time.sleep(2)
        rss = _settled({n: p.pid for n, p in procs.items()}, timeout=300)
        if not nodes:
            print("live: base (no objects): " + ", ".join(f"{n} {v:.1f} MB" for n, v in sorted(rss.items())), flush=True)
            return rss
        for name in sorted(procs, key=lambda n: (n.split()[:-1], n.split()[-1] != "old")):
            role, code = name.rsplit(" ", 1)
            _row(f"live {role}", nodes, code, rss[name], base.get(name, 0.0), "" if _ready(*ports[name]) else "[NOT READY]")
        return rss
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
