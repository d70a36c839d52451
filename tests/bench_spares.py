"""Warm spares on a failure trace (issue 25's benchmark): the same synthetic trace replayed by the
simulator with one spare per gang and without, side by side: recoveries that kept their tier,
mean time to whole, the whole-time ratio, the GPU-hours the spares cost, queueing delay, and the
replay's own wall time.

The cluster is `bench_placement.trace_model`: 20 spines x 16 leaves x 32 nodes (10,240 nodes,
8 GPUs each, NVLink domains of 4). The default trace, 10,240 jobs and 1,536 node failures (30 min
each), keeps the cluster busy; `--jobs 4000 --failures 600` is the lighter run the issue first
named. `hypertopo-scheduler simulate --model FILE --synthetic N --failures F --fault-policy
restart-pods --spare-nodes 1 --recovery-seconds 120` prints the same figures for any model file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench_placement import trace_model

from agent.cluster_model import parse_model
from aggregator.placement.policies import policy
from aggregator.placement.simulate import Simulation, model_hypernodes, node_capacity
from aggregator.placement.topology import build
from aggregator.placement.trace import synthetic

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
    args = parser.parse_args()
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
