"""Binding throughput of hypertopo-scheduler against the real API server (target >= 500 pods/s).

    python tests/bench_binding.py [--pods 2000] [--gang 4] [--nodes 100] [--workers 16]

Starts the test control plane (etcd + kube-apiserver, tests/controlplane), creates --nodes Node
objects (no kwok: nobody runs the pods, only binding is measured) under leaf/spine HyperNodes,
then --pods pending pods in gangs of --gang (one PodGroup each), then starts the scheduler and
measures, end to end, from its start (initial list included) until its own watch has seen every
pod bound: decisions, assumptions, pods/binding calls, PodGroup status writes and watch events
all included. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controlplane.harness import ControlPlane, running
from placement_live import Cluster, parallel

from aggregator.placement.scheduler import Options, Scheduler


def _bound(sched: Scheduler, namespace: str) -> int:
    """Bound pods of this run (the scheduler also caches pods of anything else on the server)."""
    for _ in range(5):
        try:
            return sum(
                1
                for p in list(sched.state.pods.values())
                if (p.get("spec") or {}).get("nodeName") and (p.get("metadata") or {}).get("namespace") == namespace
            )
        except RuntimeError:  # the loop thread resized the dict mid-count; count again
            continue
    return 0


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


def measure(plane: ControlPlane, *, pods: int = 2000, gang: int = 4, nodes: int = 100, workers: int = 32,
            tag: str = "bench", timeout: float = 300.0) -> dict[str, Any]:
    cluster = Cluster(plane, tag, kwok=False)
    name = f"hypertopo-{tag}"
    try:
        started = time.monotonic()
        _populate(cluster, pods=pods, gang=gang, nodes=nodes, scheduler=name)
        created = time.monotonic() - started
        sched = Scheduler(cluster.api, Options(scheduler_name=name, node_selector=cluster.selector, bind_workers=workers))
        t0 = time.monotonic()
        sched.start()
        first = None
        try:
            while (count := _bound(sched, cluster.ns)) < pods and time.monotonic() - t0 < timeout:
                if count and first is None:
                    first = time.monotonic() - t0
                time.sleep(0.01)
            elapsed = time.monotonic() - t0
            reg = sched.metrics.registry
            decisions = reg.get_sample_value("hypertopo_scheduler_decisions_total", {"result": "scheduled"}) or 0
            decision_sum = reg.get_sample_value("hypertopo_scheduler_decision_duration_seconds_sum") or 0.0
            result = {
                "pods": pods, "gang": gang, "nodes": nodes, "bind_workers": workers, "bound": count,
                "seconds": round(elapsed, 3), "pods_per_second": round(count / elapsed, 1),
                "first_bind_after_s": round(first or 0.0, 3),
                "bind_phase_pods_per_second": round(count / max(1e-9, elapsed - (first or 0.0)), 1),
                "gangs_scheduled": int(decisions),
                "mean_decision_ms": round(1000 * decision_sum / max(1, decisions), 3),
                "setup_seconds": round(created, 1),
            }
        finally:
            sched.stop()
        return result
    finally:
        cluster.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--gang", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--workers", type=int, default=32)
    args = parser.parse_args()
    with running() as plane:
        result = measure(plane, pods=args.pods, gang=args.gang, nodes=args.nodes, workers=args.workers)
    print(json.dumps(result))
    return 0 if result["bound"] == args.pods else 1


if __name__ == "__main__":
    raise SystemExit(main())
