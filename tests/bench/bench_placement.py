"""Placement benchmarks: `python tests/bench/bench_placement.py [--quick]`; prints figures (and JSON with --json).

1. Decision latency on 10,000 nodes (8 GPUs each) under ~9,500 HyperNodes (NVLink domains of 2
   nodes, leaves of 4, spines of 8, pods of 16, cores of 128, one cluster root): a 1,024-GPU gang
   (128 pods x 8 GPUs), an 8-pod gang, a single 2-GPU pod, and a single CPU-only pod and an 8-pod
   CPU-only gang (`1xcpu`, `8xcpu`: 4 CPUs, 64 GiB each) on a partly occupied cluster: p50/p99
   of the core reading a `FreeIndex` (the aggregates the live scheduler and the simulator keep),
   checked pod for pod against today's counting core on every state, and the same decisions with
   `tier-dry-run` (Volcano's way) in the same run -> the ratio. The index's build time and its
   upkeep per bound/released pod are printed too. Then the 1,024-GPU gang and the single CPU-only
   pod on 100,000 nodes (`--large`). Each shape prints the rank-order crossings of its first
   placement per tier against the minimum (`ranks.crossings`, `ranks.minimum_crossings`).
2. A synthetic trace replayed over a modelled cluster: share of gangs at the lowest feasible tier
   for `hypertopo`, `first-fit` and `tier-dry-run`.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.cluster_model import parse_model
from aggregator.placement.core import ranks
from aggregator.placement.core.free_index import FreeIndex
from aggregator.placement.core.gang import Gang, Mode, PodSpec
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology, build
from aggregator.placement.sim.policies import POLICIES
from aggregator.placement.sim.simulate import Simulation, model_hypernodes, node_capacity, percentile
from aggregator.placement.sim.trace import synthetic

LEVELS = (("nvlink", 2), ("leaf", 4), ("spine", 8), ("pod", 16), ("core", 128))


def big_cluster(nodes: int) -> tuple[list[dict[str, Any]], list[str]]:
    """HyperNode objects for `nodes` nodes grouped by LEVELS (sizes in nodes), plus a cluster root."""
    names = [f"node-{i:05d}" for i in range(nodes)]
    objs: list[dict[str, Any]] = []
    below: list[tuple[str, int]] = []  # (child HyperNode, first node index) of the previous level
    for tier, (kind, size) in enumerate((*LEVELS, ("cluster", nodes)), start=1):
        current = []
        for start in range(0, nodes, size):
            name = f"{kind}-{start // size:05d}"
            if tier == 1:
                members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in names[start:start + size]]
            else:
                members = [{"type": "HyperNode", "selector": {"exactMatch": {"name": child}}}
                           for child, first in below if start <= first < start + size]
            objs.append({"metadata": {"name": name}, "spec": {"tier": tier, "tierName": kind, "members": members}})
            current.append((name, start))
        below = current
    return objs, names


def occupied(names: list[str], rng: random.Random, busy: float) -> dict[str, Resources]:
    """About `busy` of the nodes run something (1-8 GPUs taken), in runs of neighbours, as jobs leave them."""
    free: dict[str, Resources] = {}
    taken = 0
    for name in names:
        if taken == 0 and rng.random() < busy / 16:
            taken = rng.randint(1, 32)  # a run of busy neighbours
        used = rng.randint(1, 8) if taken > 0 else 0
        taken = max(0, taken - 1)
        free[name] = Resources(8 - used, 128_000 - 4000 * used, 2 * 2**40, 110 - used)
    return free


def gang(pods: int, gpus: int) -> Gang:
    request = Resources(gpus, 4000, 64 * 2**30, 1)
    return Gang(f"bench-{pods}x{gpus}", tuple(PodSpec(f"p{i:04d}", request) for i in range(pods)), mode=Mode.SOFT)


def time_policy(name: str, topology: Topology, states: Sequence[Mapping[str, Resources]], job: Gang,
                repeats: int) -> tuple[list[float], list[Any]]:
    policy = POLICIES[name]
    times, results = [], []
    for free in states:
        for _ in range(repeats):
            begin = time.perf_counter()
            placement = policy(topology, free, job)
            times.append((time.perf_counter() - begin) * 1000)
        results.append(placement)
    return times, results


def _bind_cost_us(index: FreeIndex, placement: Any, job: Gang) -> float:
    """Microseconds per pod to charge a placement to the index and release it again (the upkeep
    a live scheduler pays per bind and per pod that leaves)."""
    request = job.pods[0].request
    begin = time.perf_counter()
    for node in placement.assignments.values():
        index.set(node, index[node] - request)
    for node in placement.assignments.values():
        index.set(node, index[node] + request)
    return (time.perf_counter() - begin) * 1e6 / max(1, 2 * len(placement.assignments))


def _crossings(topology: Topology, placement: Any, job: Gang) -> dict[str, str]:
    """Tier -> "crossings/minimum": domain boundaries between consecutive ranks of the first
    placement, against the fewest any rank order over its nodes could have."""
    placed = sorted((p for p in job.pods if p.name in placement.assignments), key=lambda p: ranks.name_key(p.name))
    order = [placement.assignments[p.name] for p in placed]
    got, least = ranks.crossings(topology, order), ranks.minimum_crossings(topology, order)
    return {str(tier): f"{got[tier]}/{least[tier]}" for tier in got}


def decision_bench(nodes: int, states: int, repeats: int, dry_states: int,
                   shapes: tuple[tuple[int, int], ...] = ((128, 8), (8, 8), (1, 2), (1, 0), (8, 0))) -> dict[str, Any]:
    objs, names = big_cluster(nodes)
    begin = time.perf_counter()
    topology = build(objs)
    build_ms = (time.perf_counter() - begin) * 1000
    rng = random.Random(1)
    frees = [occupied(names, rng, busy=0.5) for _ in range(states)]
    begin = time.perf_counter()
    indexes = [FreeIndex(topology, free) for free in frees]
    for index in indexes:
        for pods, gpus in shapes:  # built once, as a live scheduler's index is after its first decisions
            if gpus:
                index.shape(gpus)
            else:
                index.request_shape(gang(pods, gpus).pods[0].request)
    index_ms = (time.perf_counter() - begin) * 1000 / len(indexes)
    gc.freeze()  # as hypertopo-scheduler does after each topology rebuild (see scheduler._cycle)
    out: dict[str, Any] = {"nodes": nodes, "hypernodes": len(topology.domains), "tiers": len(topology.tiers),
                           "topology_build_ms": round(build_ms, 1), "index_build_ms": round(index_ms, 1)}
    for pods, gpus in shapes:
        job = gang(pods, gpus)
        ours, placed = time_policy("hypertopo", topology, indexes, job, repeats)
        counted, reference = time_policy("hypertopo", topology, frees, job, 1)  # today's counting core
        theirs, dry = time_policy("tier-dry-run", topology, frees[:dry_states], job, 1)
        same = sum(a.tier == b.tier for a, b in zip(placed, dry, strict=False))
        identical = sum(a == b for a, b in zip(placed, reference, strict=True))
        out[f"{pods}x{gpus}gpu" if gpus else f"{pods}xcpu"] = {
            "hypertopo_ms": {"p50": round(percentile(ours, 50), 3), "p99": round(percentile(ours, 99), 3),
                             "decisions": len(ours)},
            "counting_core_ms": {"p50": round(percentile(counted, 50), 1), "p99": round(percentile(counted, 99), 1),
                                 "decisions": len(counted)},
            "tier_dry_run_ms": {"p50": round(percentile(theirs, 50), 1), "p99": round(percentile(theirs, 99), 1),
                                "decisions": len(theirs)},
            "ratio_p50": round(percentile(theirs, 50) / max(percentile(ours, 50), 1e-9), 1),
            "identical_to_counting_core": f"{identical}/{len(reference)}",
            "bind_and_release_us_per_pod": round(_bind_cost_us(indexes[0], placed[0], job), 1),
            "tiers_hypertopo": sorted({p.tier for p in placed}), "same_tier_as_dry_run": f"{same}/{len(dry)}",
            "rank_order_crossings": _crossings(topology, placed[0], job),
        }
    return out


def trace_model(spines: int, leaves: int, nodes_per_leaf: int, nvl: int) -> dict[str, Any]:
    """core > spines > leaves > nodes; every `nvl` nodes of a leaf share an NVLink domain."""
    switches: dict[str, Any] = {"core": {"switches": [f"spine{s}" for s in range(spines)]}}
    blocks = []
    for s in range(spines):
        switches[f"spine{s}"] = {"switches": [f"leaf{s}-{i}" for i in range(leaves)]}
        for i in range(leaves):
            base = (s * leaves + i) * nodes_per_leaf
            for d in range(0, nodes_per_leaf, nvl):
                blocks.append({"switch": f"leaf{s}-{i}", "nodes": [f"n[{base + d + 1}-{base + d + nvl}]"],
                               "annotations": {"accelerator.topology.test/domain": f"nvl-{s}-{i}-{d // nvl}"}})
    return {"switches": switches, "blocks": blocks}


def trace_bench(jobs: int, seed: int, policies: list[str]) -> dict[str, Any]:
    model = parse_model(trace_model(spines=4, leaves=4, nodes_per_leaf=16, nvl=4))
    topology = build(model_hypernodes(model))
    nodes = model.nodes()
    trace = synthetic(nodes, jobs, seed=seed)
    out: dict[str, Any] = {"nodes": len(nodes), "hypernodes": len(topology.domains), "jobs": jobs}
    for name in policies:
        begin = time.perf_counter()
        result = Simulation(topology, node_capacity(nodes), trace, POLICIES[name]).run()
        out[name] = {k: result[k] for k in ("lowest_feasible_tier_share", "mean_lca_tier", "mean_leaves_per_gang",
                                             "gpu_utilisation", "decision_latency_ms", "evictions", "unplaced")}
        out[name]["queueing_delay_mean_s"] = result["queueing_delay_s"]["mean"]
        out[name]["wall_s"] = round(time.perf_counter() - begin, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller runs (for a smoke test)")
    parser.add_argument("--json", action="store_true", help="print one JSON document only")
    parser.add_argument("--large", type=int, default=100_000, help="nodes of the large run (1,024-GPU gang only)")
    args = parser.parse_args()
    if args.quick:
        decisions = decision_bench(2000, states=3, repeats=3, dry_states=1)
        large = decision_bench(5000, states=1, repeats=5, dry_states=0, shapes=((128, 8),))
        trace = trace_bench(100, seed=1, policies=["hypertopo", "first-fit", "tier-dry-run"])
    else:
        decisions = decision_bench(10_000, states=10, repeats=10, dry_states=3)
        large = decision_bench(args.large, states=2, repeats=50, dry_states=0, shapes=((128, 8), (1, 0)))
        trace = trace_bench(1000, seed=1, policies=["hypertopo", "first-fit", "tier-dry-run"])
    result = {"decisions": decisions, "decisions_large": large, "trace": trace}
    print(json.dumps(result, indent=2))
    if not args.json:
        print()
        for run, targets in ((decisions, {"128x8gpu": 10, "8x8gpu": 2, "1x2gpu": 1, "1xcpu": 1, "8xcpu": 2}), (large, {"128x8gpu": 25, "1xcpu": 1})):
            for key, target in targets.items():
                if key not in run:  # --quick's large run times the 1,024-GPU gang only
                    continue
                row = run[key]
                print(f"{key} on {run['nodes']} nodes / {run['hypernodes']} HyperNodes: hypertopo p50 "
                      f"{row['hypertopo_ms']['p50']} ms, p99 {row['hypertopo_ms']['p99']} ms (target < {target}); "
                      f"counting core p50 {row['counting_core_ms']['p50']} ms; identical "
                      f"{row['identical_to_counting_core']}; tier-dry-run p50 {row['tier_dry_run_ms']['p50']} ms; "
                      f"rank-order crossings/minimum per tier {row['rank_order_crossings']}")
        for name in ("hypertopo", "first-fit", "tier-dry-run"):
            if name in trace:
                print(f"lowest-feasible-tier share {name}: {trace[name]['lowest_feasible_tier_share']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
