"""Warm spares on a failure trace (issue 25's benchmark): the same synthetic trace replayed by the
simulator with one spare per gang and without, side by side: recoveries that kept their tier,
mean time to whole, the whole-time ratio, the GPU-hours the spares cost, queueing delay, and the
replay's own wall time.

The cluster is `bench_placement.trace_model`: 20 spines x 16 leaves x 32 nodes (10,240 nodes,
8 GPUs each, NVLink domains of 4). The default trace, 10,240 jobs and 1,536 node failures (30 min
each), keeps the cluster busy; `--jobs 4000 --failures 600` is the lighter run the issue first
named. `hypertopo-scheduler simulate --model FILE --synthetic N --failures F --fault-policy
restart-pods --spare-nodes 1 --recovery-seconds 120` prints the same figures for any model file.

`--live-decisions` measures the live scheduler's side instead: one 8-pod decision (`decide_spec`)
on the same 10,240-node cluster, 60 % of its nodes busy, while 0 / 400 / 1,000 spares are
reserved by other gangs: old (the spares excluded at every decision) and new (held out of the
shared free index, `spare_hold`) side by side, the decisions checked equal.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from bench_placement import trace_model

from agent.cluster_model import parse_model
from aggregator.placement.core.decide import decide_spec
from aggregator.placement.core.topology import Topology, build
from aggregator.placement.kinds import gang_spec, podgroups
from aggregator.placement.live.spare_hold import ReservedSpares
from aggregator.placement.live.state import ClusterState
from aggregator.placement.sim.policies import policy
from aggregator.placement.sim.simulate import Simulation, model_hypernodes, node_capacity
from aggregator.placement.sim.trace import synthetic

ROWS = (
    ("recoveries", lambda r: r["recoveries"]),
    ("kept their tier", lambda r: f"{r['recoveries_kept_tier']} ({r['recoveries_kept_tier_share']})"),
    ("on spares (all / some pods)", lambda r: f"{r['recoveries_on_spares']} / {r['recoveries_partly_on_spares']}"),
    ("time to whole mean / p99 (s)", lambda r: f"{r['time_to_whole_s']['mean']} / {r['time_to_whole_s']['p99']}"),
    ("never whole again", lambda r: r["recoveries_never_whole"]),
    ("whole-time ratio (time-weighted / mean per gang)",
     lambda r: f"{r['whole_time_ratio']} / {r['whole_time_ratio_mean_per_gang']}"),
    ("spare GPU-hours", lambda r: r["spare_gpu_hours"]),
    ("GPU utilisation", lambda r: r["gpu_utilisation"]),
    ("queueing delay mean / p99 (s)", lambda r: f"{r['queueing_delay_s']['mean']} / {r['queueing_delay_s']['p99']}"),
    ("pods evicted", lambda r: r["evictions"]),
    ("mean LCA tier", lambda r: r["mean_lca_tier"]),
    ("decisions (queued gangs kept from the policy)", lambda r: f"{r['decisions']} ({r['unfit_skipped']})"),
    ("replay wall time (s)", lambda r: r["wall_s"]),
)


def replay(spines: int, leaves: int, per_leaf: int, jobs: int, failures: int, recovery: float,
           spare: str, load: float) -> dict[str, Any]:
    model = parse_model(trace_model(spines, leaves, per_leaf, nvl=4))
    nodes = model.nodes()
    topology = build(model_hypernodes(model))
    trace = synthetic(nodes, jobs, seed=0, failures=failures, on_fabric_fault="restart-pods", load=load)
    out: dict[str, Any] = {"nodes": len(nodes), "jobs": jobs, "failures": failures, "recovery_seconds": recovery,
                           "load": load}
    for label, spares in ((f"spares_{spare}", spare), ("no_spares", "")):
        begin = time.perf_counter()
        result = Simulation(topology, node_capacity(nodes), trace, policy("hypertopo"), spare_nodes=spares,
                            recovery_seconds=recovery).run()
        result["wall_s"] = round(time.perf_counter() - begin, 1)
        out[label] = result
    return out


def _live_cluster(nodes: list[str], busy: float, seed: int) -> ClusterState:
    """The live scheduler's state: every node 8 GPUs, `busy` of them full, one 8-pod gang pending."""
    rng = random.Random(seed)
    state = ClusterState("hypertopo-scheduler")
    amounts = {"nvidia.com/gpu": "8", "cpu": "128", "memory": "2Ti", "pods": "110"}
    for name in nodes:
        state.apply("Node", "ADDED", {"metadata": {"name": name, "labels": {}}, "spec": {}, "status": {"allocatable": amounts}})

    def pod(name: str, node: str, group: str = "") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "uid": name,
                             "labels": {"scheduling.x-k8s.io/pod-group": group} if group else {}},
                "spec": {"schedulerName": "hypertopo-scheduler" if group else "other", "nodeName": node or None,
                         "containers": [{"name": "c", "resources": {"requests": {
                             "nvidia.com/gpu": "8", "cpu": "1", "memory": "1Gi"}}}]},
                "status": {"phase": "Running" if node else "Pending"}}

    for name in rng.sample(nodes, int(len(nodes) * busy)):
        state.apply("Pod", "ADDED", pod(f"busy-{name}", name))
    state.apply("PodGroup", "ADDED", {"metadata": {"name": "g", "namespace": "ns", "annotations": {}},
                                      "spec": {"minMember": 8}})
    for i in range(8):
        state.apply("Pod", "ADDED", pod(f"g-{i}", "", "g"))
    return state


def _timed(state: ClusterState, topology: Topology, spec: gang_spec.GangSpec, reserved: Any,
           times: list[float]) -> Any:
    """One decision as the scheduler makes it (its node-filter cache warm), its milliseconds noted."""
    begin = time.perf_counter()
    decision = decide_spec(state, topology, spec, reserved=reserved, filter_cache=_FILTERS.setdefault(id(state), {}))
    times.append((time.perf_counter() - begin) * 1000)
    return decision


_FILTERS: dict[int, dict[Any, dict[str, str]]] = {}


def live_decisions(spines: int, leaves: int, per_leaf: int, counts: list[int], repeats: int,
                   busy: float = 0.6) -> list[dict[str, Any]]:
    """Per count of reserved spares: one 8-pod decision's p50 / max (ms), old and new, in one run:
    two copies of the cluster, old (spares excluded per decision) and new (held out of the index),
    their decisions taken in turn so that the machine's load weighs on both alike."""
    model = parse_model(trace_model(spines, leaves, per_leaf, nvl=4))
    nodes = model.nodes()
    topology = build(model_hypernodes(model))
    state, copy = _live_cluster(nodes, busy, seed=1), _live_cluster(nodes, busy, seed=1)
    view, = podgroups.collect(state)
    spec = gang_spec.read(view, request_of=state.request_of)
    idle = [n for n in nodes if not state.on_node.get(n)]
    rows = []
    for count in counts:
        chosen = random.Random(count).sample(idle, count)
        plain = {("ns", f"r{i}"): tuple(chosen[i:i + 4]) for i in range(0, count, 4)}  # gangs of 4 spares
        held = ReservedSpares(copy)
        _timed(state, topology, spec, plain, [])  # the indexes, their shapes and the filters built first
        _timed(copy, topology, spec, held, [])
        begin = time.perf_counter()
        for gang, spare_nodes in plain.items():
            held.keep(gang, spare_nodes)
        hold_ms = (time.perf_counter() - begin) * 1000
        old: list[float] = []
        new: list[float] = []
        for _ in range(repeats):
            old_decision = _timed(state, topology, spec, plain, old)
            new_decision = _timed(copy, topology, spec, held, new)
        old.sort()
        new.sort()
        held.rebuild({})  # every reservation given up: the next count starts from nothing held
        same = (old_decision.assignments, old_decision.reason) == (new_decision.assignments, new_decision.reason)
        rows.append({"spares": count, "old_p50_ms": round(old[len(old) // 2], 2), "old_max_ms": round(old[-1], 2),
                     "new_p50_ms": round(new[len(new) // 2], 2), "new_max_ms": round(new[-1], 2),
                     "hold_once_ms": round(hold_ms, 1), "same_decision": same})
    return rows


def main_live(args: argparse.Namespace) -> int:
    counts = [int(c) for c in args.spare_counts.split(",")]
    rows = live_decisions(args.spines, args.leaves, args.per_leaf, counts, args.repeats)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{args.spines * args.leaves * args.per_leaf} nodes, 60 % busy, one 8-pod gang of 8-GPU pods, "
          f"{args.repeats} decisions each (decide_spec), other gangs' spares reserved")
    print(f"{'spares':>7} {'old p50 / max (ms)':>20} {'new p50 / max (ms)':>20} {'hold once (ms)':>15} {'same':>5}")
    for r in rows:
        print(f"{r['spares']:>7} {str(r['old_p50_ms']) + ' / ' + str(r['old_max_ms']):>20} "
              f"{str(r['new_p50_ms']) + ' / ' + str(r['new_max_ms']):>20} {r['hold_once_ms']:>15} "
              f"{'yes' if r['same_decision'] else 'NO':>5}")
    return 0 if all(r["same_decision"] for r in rows) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spines", type=int, default=20)
    parser.add_argument("--leaves", type=int, default=16, help="leaves per spine")
    parser.add_argument("--per-leaf", type=int, default=32, help="nodes per leaf")
    parser.add_argument("--jobs", type=int, default=10_240)
    parser.add_argument("--failures", type=int, default=1536)
    parser.add_argument("--recovery-seconds", type=float, default=120.0)
    parser.add_argument("--spare-nodes", default="1")
    parser.add_argument("--load", type=float, default=0.9, help="offered load of the synthetic trace (default 0.9)")
    parser.add_argument("--json", action="store_true", help="print one JSON document only")
    parser.add_argument("--live-decisions", action="store_true",
                        help="the live scheduler's decision time with other gangs' spares reserved, old and new")
    parser.add_argument("--spare-counts", default="0,400,1000", help="with --live-decisions: spares reserved")
    parser.add_argument("--repeats", type=int, default=30, help="with --live-decisions: decisions timed per row")
    args = parser.parse_args()
    if args.live_decisions:
        return main_live(args)
    out = replay(args.spines, args.leaves, args.per_leaf, args.jobs, args.failures, args.recovery_seconds,
                 args.spare_nodes, args.load)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    with_, without = out[f"spares_{args.spare_nodes}"], out["no_spares"]
    print(f"{out['nodes']} nodes, {out['jobs']} jobs at offered load {args.load:g}, {out['failures']} node failures, restart-pods, "
          f"replacements run {args.recovery_seconds:g} s after binding")
    print(f"{'':50} {'spares ' + args.spare_nodes:>24} {'no spares':>24}")
    for name, read in ROWS:
        print(f"{name:50} {read(with_)!s:>24} {read(without)!s:>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
