"""Benchmark: API writes and time when one node's report changes in a 1,000-node cluster.

Starts a private control plane, renders the HyperNode tree of a 1,008-node model (56 NVL72-style
racks of 18 nodes under their leaves, 7 spines, one core) through the controller's own path
(PipelineFeed -> Applier -> API server), then fails one node's NVLink and repairs it, printing the
writes each step made and the time of recompute + diff. Only the affected HyperNodes (the node's
rack/leaf and the domains above it) must be written.

    python tests/bench/bench_aggregator_writes.py [--nodes-per-rack 18] [--racks 56]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))

import yaml
from controlplane.harness import running

from agent.cluster_model import parse_model
from agent.common.report import ComponentHealth, Health, node_topology_object
from agent.model_probe import report_for
from aggregator.adapters.kube import HYPERNODES, HyperNodeClient, connect
from aggregator.live.feed import PipelineFeed, StaticSources
from aggregator.live.reconcile import Applier, plan
from aggregator.pipeline import Pipeline


def model_text(racks: int, per_rack: int, leaves_per_spine: int = 8) -> str:
    spines = (racks + leaves_per_spine - 1) // leaves_per_spine
    lines = ["switches:", f"  core1: {{switches: [{', '.join(f'spine{s}' for s in range(1, spines + 1))}]}}"]
    for s in range(1, spines + 1):
        leaves = range((s - 1) * leaves_per_spine + 1, min(racks, s * leaves_per_spine) + 1)
        lines.append(f"  spine{s}: {{switches: [{', '.join(f'leaf{i}' for i in leaves)}]}}")
    lines.append("blocks:")
    for r in range(1, racks + 1):
        first, last = (r - 1) * per_rack + 1, r * per_rack
        lines.append(f"  - {{switch: leaf{r}, nodes: ['n[{first:04d}-{last:04d}]'], "
                     f"annotations: {{accelerator.topology.test/domain: rack{r}}}}}")
    return "\n".join(lines) + "\n"


def objects(reports: dict) -> dict:  # type: ignore[type-arg]
    return {n: {**node_topology_object(r), "metadata": {"name": n, "resourceVersion": str(i)}}
            for i, (n, r) in enumerate(reports.items(), 1)}


def step(label: str, feed: PipelineFeed, applier: Applier, kube, topologies: dict, now: float) -> None:  # type: ignore[no-untyped-def, type-arg]
    started = time.perf_counter()
    desired = feed.compute(topologies, {}, None, now)
    live = {o["metadata"]["name"]: o for o in kube.list(HYPERNODES)[0]}
    diff = plan(desired.hypernodes, live)
    compute_ms = (time.perf_counter() - started) * 1000
    outcome = applier.apply(desired.hypernodes, live)
    print(f"{label:<28} {len(desired.hypernodes):>5} HyperNodes  writes {outcome.total_writes:>4} "
          f"{dict(outcome.writes)}  recompute+list+diff {compute_ms:7.1f} ms  "
          f"(changed: {sorted(set(diff.update_status) | set(diff.create))[:6]})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--racks", type=int, default=56)
    parser.add_argument("--nodes-per-rack", type=int, default=18)
    args = parser.parse_args()
    model = parse_model(yaml.safe_load(model_text(args.racks, args.nodes_per_rack)))
    nodes = sorted({n for block in model.blocks for n in block.nodes})
    reports = {n: report_for(model, n) for n in nodes}
    print(f"{len(nodes)} nodes, {args.racks} racks")
    with running() as plane:
        kube = connect(str(plane.kubeconfig))
        feed = PipelineFeed(Pipeline(hold_down_seconds=0), StaticSources(model=model))
        applier = Applier(HyperNodeClient(kube))
        topologies = objects(reports)
        step("first reconcile", feed, applier, kube, topologies, time.time())
        step("nothing changed", feed, applier, kube, topologies, time.time())
        victim = nodes[len(nodes) // 2]
        broken = dataclasses.replace(reports[victim], health={
            **reports[victim].health, "nvml": ComponentHealth(Health.FAILED, "GPU 2 NVLink 5 down")})
        topologies[victim] = {**node_topology_object(broken), "metadata": {"name": victim, "resourceVersion": "x1"}}
        step(f"{victim} NVLink failed", feed, applier, kube, topologies, time.time())
        topologies[victim] = {**node_topology_object(reports[victim]), "metadata": {"name": victim, "resourceVersion": "x2"}}
        step(f"{victim} repaired", feed, applier, kube, topologies, time.time())
        print(f"full pipeline rebuilds: {feed.full_rebuilds} (the rest took the fast path)")
        for proc in plane.processes:
            proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
