"""Binding throughput of hypertopo-scheduler against the real API server (target >= 1,000 pods/s).

    python tests/bench/bench_binding.py [--pods 2000] [--gang 4] [--nodes 100] [--workers 32]
                                  [--rounds lean] (e.g. --rounds generated,lean: an A/B on one control plane)

Starts the test control plane (etcd + kube-apiserver, tests/controlplane), creates --nodes Node
objects (no kwok: nobody runs the pods, only binding is measured) under leaf/spine HyperNodes,
then --pods pending pods in gangs of --gang (one PodGroup each), then starts the scheduler (its own
client, pooled as `hypertopo-scheduler run` pools it) and measures, end to end, from its start
(initial list included) until its own watch has seen every pod bound: decisions, assumptions,
pods/binding calls, PodGroup status writes and watch events all included. Prints one JSON line,
with the scheduler process's CPU per bound pod, the steadier figure where other work shares the
machine, and the control plane's CPU (kube-apiserver, etcd) in the same window: on a 2-core
machine they share the cores with the scheduler, and they are where the limit is.

`--rounds` runs the measurement several times on the same control plane, one round per name:
`lean` is the scheduler as shipped (client: agent.common.adapters.kube_http), `generated` sends the same
requests through the generated `kubernetes` client's transport (urllib3), as before that existed,
and `lean-status-first` writes each gang's PodGroup status at once, as before status writes yielded
to pending binds. The PodGroup status writes that yield still happen, one per gang: each round
waits for all of them after its window and prints when they were done (`status_done_after_s`) and
the control plane's CPU up to then (`server_cpu_s_with_later_status`) next to the window's own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))

from controlplane.harness import ControlPlane, running
from placement_live import Cluster, parallel

from aggregator.placement.adapters import kube
from aggregator.placement.live.scheduler import Options, Scheduler


class BoundCounter:
    """Counts this run's pods as the scheduler's own watch delivers them bound: wraps its state's
    `apply` (called on the loop thread, O(1) per event), so the count costs nothing like a scan of
    every cached pod, and the end is the moment the scheduler itself has seen the last bind."""

    def __init__(self, sched: Scheduler, namespace: str, pods: int) -> None:
        self.namespace, self.pods = namespace, pods
        self.bound: set[str] = set()
        self.first = 0.0
        self.done = threading.Event()
        self._apply = sched.state.apply
        sched.state.apply = self._count  # type: ignore[method-assign]

    def _count(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self._apply(kind, event, obj)
        meta = obj.get("metadata") or {}
        if kind == "Pod" and event != "DELETED" and (obj.get("spec") or {}).get("nodeName") \
                and meta.get("namespace") == self.namespace:
            self.first = self.first or time.monotonic()
            self.bound.add(str(meta.get("name")))
            if len(self.bound) >= self.pods:
                self.done.set()


def _populate(cluster: Cluster, *, pods: int, gang: int, nodes: int, scheduler: str) -> None:
    per_leaf = 10
    leaves = max(1, nodes // per_leaf)
    cluster.leaf_spine(leaves=leaves, per_leaf=per_leaf, gpus=8)
    groups = [f"job-{i}" for i in range((pods + gang - 1) // gang)]
    parallel(lambda g: cluster.add_podgroup(g, gang), groups)
    bodies = []
    for i in range(pods):
        body = cluster.pod_body(f"p-{i}", scheduler, gang=groups[i // gang], gpus=0)
        body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
        bodies.append(body)
    cluster.add_pods(bodies)


def _program(argv: Any) -> str:
    return Path(str(argv[0] if isinstance(argv, (list, tuple)) else argv)).name


class ServerCpu:
    """CPU seconds the control plane's processes (kube-apiserver, etcd) spend in a window: they
    share the machine with the scheduler, so they show where the limit is."""

    def __init__(self, plane: ControlPlane) -> None:
        self.procs = {_program(p.args): psutil.Process(p.pid) for p in plane.processes if p.poll() is None}
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        return {name: sum(proc.cpu_times()[:2]) for name, proc in self.procs.items()}

    def since_start(self) -> dict[str, float]:
        now = self._now()
        return {name: round(now[name] - self.start[name], 2) for name in now}


def measure(plane: ControlPlane, *, pods: int = 2000, gang: int = 4, nodes: int = 100, workers: int = 32,
            tag: str = "bench", timeout: float = 300.0, transport: str = "lean",
            status_first: bool = False) -> dict[str, Any]:
    cluster = Cluster(plane, tag, kwok=False)
    name = f"hypertopo-{tag}"
    try:
        started = time.monotonic()
        _populate(cluster, pods=pods, gang=gang, nodes=nodes, scheduler=name)
        created = time.monotonic() - started
        # the scheduler's own client, sized as `hypertopo-scheduler run` sizes it (bind workers + 8)
        api = kube.connect(str(plane.kubeconfig), pool_size=workers + 8, timeout=30.0)
        if transport == "generated":
            api.http = None  # the generated client's urllib3 transport carries every request
        elif transport != "lean":
            raise ValueError(f"unknown transport {transport!r} (lean or generated)")
        gangs = (pods + gang - 1) // gang
        sched = Scheduler(api, Options(scheduler_name=name, node_selector=cluster.selector, bind_workers=workers))
        if status_first:  # as before the status writer yielded to binds: every write goes at once
            sched.status.busy = lambda: False
        counter = BoundCounter(sched, cluster.ns, pods)
        load0, servers = os.getloadavg()[0], ServerCpu(plane)
        t0, cpu0 = time.monotonic(), time.process_time()
        sched.start()
        try:
            counter.done.wait(timeout)
            elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
            server_cpu = servers.since_start()
            count = len(counter.bound)
            first = counter.first - t0 if counter.first else 0.0
            reg = sched.metrics.registry
            decisions = reg.get_sample_value("hypertopo_scheduler_decisions_total", {"result": "scheduled"}) or 0
            decision_sum = reg.get_sample_value("hypertopo_scheduler_decision_duration_seconds_sum") or 0.0
            result = {
                "transport": transport, "status_first": status_first, "pods": pods, "gang": gang, "nodes": nodes, "bind_workers": workers, "bound": count,
                "seconds": round(elapsed, 3), "pods_per_second": round(count / elapsed, 1),
                "first_bind_after_s": round(first, 3),
                "bind_phase_pods_per_second": round(count / max(1e-9, elapsed - first), 1),
                "gangs_scheduled": int(decisions),
                "mean_decision_ms": round(1000 * decision_sum / max(1, decisions), 3),
                # the scheduler's CPU (this process: every thread) per bound pod; steadier than
                # pods/s where other work shares the machine
                "cpu_ms_per_pod": round(1000 * cpu / max(1, count), 3),
                "setup_seconds": round(created, 1),
                # the control plane's CPU seconds in the same window (2 cores in all on the bench machine)
                "server_cpu_s": server_cpu,
                "scheduler_cpu_s": round(cpu, 2),
                "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
                # PodGroup status writes yield to pending binds (status_writer): those not yet
                # written when the last pod is bound come after the window
                "status_writes_after_window": gangs - sched.status.status_completed,
            }
            # every gang's PodGroup status written (one write each), and the control plane's CPU
            # up to then: the work the window left out, shown next to the window's own
            deadline = time.monotonic() + timeout
            while sched.status.status_completed < gangs and time.monotonic() < deadline:
                time.sleep(0.01)
            result["status_written"] = sched.status.status_completed
            result["status_done_after_s"] = round(time.monotonic() - t0, 3)
            result["server_cpu_s_with_later_status"] = servers.since_start()
        finally:
            sched.stop()
        return result
    finally:
        cluster.cleanup()


# round name -> (transport, status_first)
ROUNDS = {"lean": ("lean", False), "generated": ("generated", False), "lean-status-first": ("lean", True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--gang", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--rounds", default="lean",
                        help="comma-separated rounds, one measurement each: lean, generated, lean-status-first")
    args = parser.parse_args()
    unknown = sorted(set(args.rounds.split(",")) - set(ROUNDS))
    if unknown:
        parser.error(f"--rounds: unknown round(s) {', '.join(unknown)} ({', '.join(ROUNDS)})")
    ok = True
    with running() as plane:
        for i, name in enumerate(args.rounds.split(",")):
            transport, status_first = ROUNDS[name]
            result = measure(plane, pods=args.pods, gang=args.gang, nodes=args.nodes, workers=args.workers,
                             tag=f"bench{i}" if i else "bench", transport=transport, status_first=status_first)
            print(json.dumps(result), flush=True)
            ok = ok and result["bound"] == args.pods
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
