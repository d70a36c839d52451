"""Aggregator benchmark: prints figures for docs/benchmarks.md and the issue.

    python tests/bench/bench_aggregator.py [--nodes 10000 100000]

For each size, a GB200-style rail-optimised cluster model is generated: scalable units (SU) of two
NVL72 racks (2 x 18 compute trays), four rails (one leaf per SU and rail), a spine per pod of 8 SUs
and rail, a core per rail. Every node's NodeTopology report comes from agent.model_probe (not
timed). Timed:

* full: fabric graph (reports + the model's switch tree) + tier inference + Ready conditions +
  rendering every HyperNode (Pipeline.compute), 3 runs, wall clock and this process's CPU time —
  target < 3 s at 100,000 nodes (issue 11); the generated reports are collected and frozen
  before the first run, as the controller freezes its start-up heap (gc.freeze); the pipeline is
  the controller's (`freeze_built_state`: the collector paused during a build, and what the build
  leaves alive frozen at its end, inside the timed call);
* (then the pipeline's state is frozen too, as the controller does after its first cycle)
* one node's report changes (its NVLink fails, then recovers): recompute + diff through
  Pipeline.update_report — target < 5 ms — and how many HyperNodes changed (only the failing
  node's domains: its rack, SU leaf, pod spine and core);
* one node's cabling changes three ways: its LLDP loses a leaf the model still declares (no
  structural change), its cables move to the next scalable unit's leaves, and its GPUs join a rack
  of another unit's NVLink clique (structural changes: the node moves between classes, inference
  runs over the classes again, only the domains whose classes changed are rebuilt) — each moved
  away and back 10 times; best, median and max; target < 100 ms;
* last rows: a UFM answer for 10,000 hosts (one HCA each, then four) and 600 switches, from the
  bytes UFM sends to the facts merged into the graph (tests/bench/bench_ufm.py; target < 1 s): the answer
  the poller asks for (the active ports, `ports?active=true`), and under `whole_listing` the whole
  port listing (every switch's 64 ports, cabled or not) for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import time

from agent.cluster_model import DOMAIN_ANNOTATION, ClusterModel, parse_model
from agent.common.report import ComponentHealth, Health, NodeReport
from agent.model_probe import report_for
from aggregator.live.controller import freeze_start_up_heap
from aggregator.pipeline import ClusterInputs, Pipeline

RAILS = 4
RACK = 18
SUS_PER_POD = 8


def cluster(nodes: int) -> ClusterModel:
    sus = -(-nodes // (2 * RACK))
    pods = -(-sus // SUS_PER_POD)
    switches: dict[str, dict[str, list[str]]] = {}
    blocks = []
    for r in range(RAILS):
        switches[f"core-r{r}"] = {"switches": [f"pod{p}-r{r}-spine" for p in range(pods)]}
        for p in range(pods):
            su_range = range(p * SUS_PER_POD, min(sus, (p + 1) * SUS_PER_POD))
            switches[f"pod{p}-r{r}-spine"] = {"switches": [f"su{s}-r{r}" for s in su_range]}
    for s in range(sus):
        for rack in range(2):
            first = (2 * s + rack) * RACK + 1
            names = f"gb[{first:06d}-{first + RACK - 1:06d}]"
            for r in range(RAILS):
                blocks.append(
                    {
                        "switch": f"su{s}-r{r}",
                        "nodes": [names],
                        "annotations": {DOMAIN_ANNOTATION: f"rack{2 * s + rack}"},
                    }
                )
    return parse_model({"switches": switches, "blocks": blocks})


def _nvlink_failed(report: NodeReport) -> NodeReport:
    health = dict(report.health)
    health["nvml"] = ComponentHealth(Health.FAILED, "GPU 2: NVLink 7 down")
    return dataclasses.replace(report, health=health)


def _timed(fn, repeat: int = 1, cpu: list[float] | None = None):  # type: ignore[no-untyped-def]
    """Wall-clock seconds of each call (and this process's CPU seconds into `cpu`: on a shared
    machine the wall clock also counts the time other processes held the cores)."""
    times, result = [], None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - start_cpu)
    return result, times


def bench(size: int) -> dict[str, object]:
    model = cluster(size)
    names = model.nodes()
    start = time.perf_counter()
    reports = {n: report_for(model, n) for n in names}
    generate = time.perf_counter() - start
    # the reports are ~90 objects each (9 million at 100,000 nodes): as the controller does once its
    # informers have listed everything, one collection and then out of the collector's sight
    # (aggregator.live.controller.freeze_start_up_heap), so full collections do not walk them again
    freeze_start_up_heap()
    inputs = ClusterInputs(reports=reports, node_ready=dict.fromkeys(names, True), model=model)
    pipeline = Pipeline(ready_threshold=0, hold_down_seconds=0, freeze_built_state=True)  # as the controller
    full_cpu: list[float] = []
    desired, full = _timed(lambda: pipeline.compute(inputs, now=1000.0), repeat=3, cpu=full_cpu)
    freeze_start_up_heap()  # the pipeline's state too, as the controller after its first cycle
    victim = names[len(names) // 2]
    failing, healthy = _nvlink_failed(reports[victim]), reports[victim]
    fast, changed = [], []
    for i in range(20):
        report = failing if i % 2 == 0 else healthy
        result, t = _timed(lambda r=report, i=i: pipeline.update_report(victim, r, now=2000.0 + i))  # type: ignore[misc]
        fast.append(t[0])
        changed.append(len(result.changed))
    moved = dataclasses.replace(healthy, lldp=healthy.lldp[:-1])
    _, lost = _timed(lambda: pipeline.update_report(victim, moved, now=3000.0))
    pipeline.update_report(victim, healthy, now=3001.0)
    recabled, recabled_changed = _alternate(pipeline, victim, healthy, _recabled(healthy, model, victim), 4000.0)
    clique, clique_changed = _alternate(pipeline, victim, healthy, _other_clique(healthy, reports, names), 5000.0)
    assert pipeline.full_computes == 3, "a fast path fell back to a full rebuild"
    gc.unfreeze()  # this size's objects back in the collector's sight before the next size
    return {
        "nodes": len(names),
        "hypernodes": len(desired.hypernodes),
        "tiers": list(desired.tree.tiers) if desired.tree else [],
        "report_generation_s": round(generate, 2),
        "full_compute_s": _seconds(full),
        "full_compute_cpu_s": _seconds(full_cpu),
        "one_report_health_change_ms": _ms(fast),
        "hypernodes_changed_per_update": sorted(set(changed)),
        "one_cable_lost_model_keeps_leaf_ms": _ms(lost),
        "one_node_recabled_to_another_su_ms": _ms(recabled),
        "hypernodes_changed_per_recabling": sorted(set(recabled_changed)),
        "one_node_into_another_nvlink_clique_ms": _ms(clique),
        "hypernodes_changed_per_clique_move": sorted(set(clique_changed)),
    }


def _seconds(times: list[float]) -> dict[str, float]:
    return {"best": round(min(times), 3), "median": round(statistics.median(times), 3)}


def _ms(times: list[float]) -> dict[str, float]:
    return {
        "best": round(min(times) * 1000, 2),
        "median": round(statistics.median(times) * 1000, 2),
        "max": round(max(times) * 1000, 2),
    }


def _alternate(pipeline: Pipeline, node: str, home: NodeReport, away: NodeReport, start: float, rounds: int = 10):  # type: ignore[no-untyped-def]
    """Moves the node away and back `rounds` times; every update timed, HyperNodes changed counted."""
    times, changed = [], []
    for i in range(rounds):
        report = away if i % 2 == 0 else home
        result, t = _timed(lambda r=report, i=i: pipeline.update_report(node, r, now=start + i))  # type: ignore[misc]
        times.append(t[0])
        changed.append(len(result.changed))
    return times, changed


def _recabled(report: NodeReport, model: ClusterModel, node: str) -> NodeReport:
    """The node's LLDP now names the leaves of the next scalable unit (its cables moved there; the
    model still declares its own, so it hangs off both: a structural change)."""
    su = int(report.lldp[0].system_name.split("-")[0][2:])  # "su12-r0" -> 12
    other = (su + 1) % len({b.switch.split("-")[0] for b in model.blocks})
    lldp = tuple(
        dataclasses.replace(n, system_name=f"su{other}-{n.system_name.split('-')[1]}") for n in report.lldp
    )
    return dataclasses.replace(report, lldp=lldp)


def _other_clique(report: NodeReport, reports: dict[str, NodeReport], names: list[str]) -> NodeReport:
    """The node's GPUs now report the NVLink clique of a rack in another scalable unit."""
    assert report.nvml is not None and report.nvml.domain is not None
    far = reports[names[(names.index(report.node_name) + 5 * 2 * RACK) % len(names)]]
    assert far.nvml is not None
    return dataclasses.replace(report, nvml=dataclasses.replace(report.nvml, domain=far.nvml.domain))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--no-ufm", action="store_true", help="skip the UFM row (tests/bench/bench_ufm.py)")
    args = parser.parse_args()
    for size in args.nodes:
        print(json.dumps(bench(size)), flush=True)
    if not args.no_ufm:
        for hcas in (1, 4):
            print(json.dumps(ufm_row(hcas)), flush=True)


def ufm_row(hcas: int) -> dict[str, object]:
    """A UFM answer for 10,000 hosts (`hcas` HCAs each) and 600 switches, from the bytes UFM sends
    to the facts merged into the graph (issue 12): the active ports the poller asks for, and the
    whole port listing under `whole_listing`."""
    import bench_ufm  # tests/, beside this file

    return bench_ufm.bench(10_000, 600, hcas)


if __name__ == "__main__":
    main()
