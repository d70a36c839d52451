"""What one watch event costs the live scheduler's next cycle on a large cluster:
`python tests/bench/bench_scheduler_events.py [--nodes N ...] [--events K]`.

The scheduler rebuilds its view of the tree (HyperNodes -> `Topology`, the node filters, the
free-capacity aggregates, the failed-node walk) when `ClusterState.topology_generation` moves. A
kubelet posts its Node's status every few minutes even when nothing changed (hundreds of events a
second at 100,000 nodes), and the aggregator or Volcano may rewrite a HyperNode's node count: those
events must cost a cycle next to nothing. Each row feeds K events of one kind into a real
`Scheduler`'s cache (no API server: the state is fed directly, as its informers would) and times
the cycle after each, CPU seconds; one pod that fits nowhere waits, so a cycle that schedules
makes a real decision (and builds the aggregates of a new tree). The row `every event rebuilt` replays the heartbeats with the
generation moved by hand, as every Node and HyperNode event did before, so the ratio is measured
in one run. The last two rows bind another scheduler's pod (a pass runs, nothing is freed): the
waiting pod is not decided again, and, as before, decided again at every pass.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from typing import Any

from bench_placement import big_cluster

from aggregator.placement.live.scheduler import Options, Scheduler


def _node(name: str, beat: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "resourceVersion": str(beat)},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "128", "memory": "2Ti", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": f"t{beat}"}]}}


class SilentApi:
    """Every API call answers nothing (the events and statuses a cycle writes go nowhere)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: {}


def _waiting_pod(scheduler: str) -> dict[str, Any]:
    """A pod no node can hold (16 GPUs): every cycle that schedules tries it, a real decision."""
    return {"metadata": {"namespace": "bench", "name": "too-big", "uid": "u1"},
            "spec": {"schedulerName": scheduler,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "16"}}}]}}


def _cycle_cpu(sched: Scheduler) -> float:
    begin = time.process_time()
    sched._cycle()
    return time.process_time() - begin


class _Events:
    """One kind of watch event per method, applied to node `name` (the i-th of a row)."""

    def __init__(self, sched: Scheduler, hypernodes: list[dict[str, Any]], count: int) -> None:
        self.state = sched.state
        self.leaves = [h for h in hypernodes if h["spec"]["tier"] == 1][:count]

    def heartbeat(self, name: str, i: int) -> None:
        self.state.apply("Node", "MODIFIED", _node(name, i + 1))

    def relabel(self, name: str, i: int) -> None:
        node = copy.deepcopy(self.state.nodes[name])
        node["metadata"]["labels"]["bench/relabelled"] = str(i)
        self.state.apply("Node", "MODIFIED", node)

    def node_count(self, name: str, i: int) -> None:
        obj = copy.deepcopy(self.leaves[i % len(self.leaves)])
        obj["status"]["nodeCount"] = len(obj["spec"]["members"])
        self.state.apply("HyperNode", "MODIFIED", obj)

    def bound_elsewhere(self, name: str, i: int) -> None:
        """Another scheduler's pod binds: a pass runs, nothing is freed."""
        pod = {"metadata": {"namespace": "bench", "name": f"other-{i}-{len(self.state.pods)}", "uid": f"o{i}"},
               "spec": {"schedulerName": "default-scheduler", "nodeName": name,
                        "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}
        self.state.apply("Pod", "ADDED", pod)


def _row(sched: Scheduler, picked: list[str], change: Any, *, by_hand: bool = False,
         retry_unfit: bool = False) -> dict[str, float]:
    state, times = sched.state, []
    for i, name in enumerate(picked):
        change(name, i)
        if by_hand:  # what every Node event moved before: the tree's generation and a pass
            state.topology_generation += 1
            state.generation += 1
        if retry_unfit:  # as before: the waiting gang decided again at every pass
            sched._unfit.clear()
        times.append(_cycle_cpu(sched))
    return {"median_ms": round(statistics.median(times) * 1000, 3), "max_ms": round(max(times) * 1000, 3),
            "events": len(times)}


def run(nodes: int, events: int) -> dict[str, Any]:
    hypernodes, names = big_cluster(nodes)
    sched = Scheduler(SilentApi(), Options())  # never started: no informer, no watch
    state = sched.state
    state.apply("Pod", "ADDED", _waiting_pod(sched.options.scheduler_name))
    for obj in hypernodes:
        obj["status"] = {"nodeCount": 0, "conditions": [{"type": "Ready", "status": "True"}]}
        state.apply("HyperNode", "ADDED", obj)
    for name in names:
        state.apply("Node", "ADDED", _node(name, 0))
    cold = _cycle_cpu(sched)  # the first view: tree, aggregates, walks
    gc.collect()
    gc.freeze()
    picked = names[:: max(1, nodes // events)][:events]
    kinds = _Events(sched, hypernodes, events)
    out: dict[str, Any] = {
        "nodes": nodes, "hypernodes": len(hypernodes), "cold_cycle_s": round(cold, 2),
        "node_heartbeat": _row(sched, picked, kinds.heartbeat),
        "hypernode_node_count": _row(sched, picked, kinds.node_count),
        "every_event_rebuilt": _row(sched, picked, kinds.heartbeat, by_hand=True),
        "node_label_change": _row(sched, picked, kinds.relabel),  # a real change: rebuilt, as it must be
        "pod_bound_elsewhere": _row(sched, picked, kinds.bound_elsewhere),
        "pod_bound_elsewhere_unfit_retried": _row(sched, picked, kinds.bound_elsewhere, retry_unfit=True),
    }
    out["heartbeat_ratio"] = round(out["every_event_rebuilt"]["median_ms"] / max(out["node_heartbeat"]["median_ms"], 1e-3))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000], help="cluster sizes (nodes)")
    parser.add_argument("--events", type=int, default=5, help="events of each kind per size (default 5)")
    args = parser.parse_args()
    for nodes in args.nodes:
        result = run(nodes, args.events)
        print(json.dumps(result))
        print(f"{nodes} nodes / {result['hypernodes']} HyperNodes: cycle after a Node heartbeat "
              f"{result['node_heartbeat']['median_ms']} ms median; after a HyperNode node-count rewrite "
              f"{result['hypernode_node_count']['median_ms']} ms; rebuilt as every event was before "
              f"{result['every_event_rebuilt']['median_ms']} ms ({result['heartbeat_ratio']:,.0f} times as long); after a label "
              f"change (rebuilt) {result['node_label_change']['median_ms']} ms; after another scheduler's pod "
              f"bound, the waiting pod not retried {result['pod_bound_elsewhere']['median_ms']} ms, retried at "
              f"every pass as before {result['pod_bound_elsewhere_unfit_retried']['median_ms']} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
