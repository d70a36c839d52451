"""Measured-fabric benchmark: what the probe plan costs per node at 10k nodes, and how long the
aggregator takes to fold 10k nodes' measurements (target < 1 s).

    python tests/bench/bench_measure.py [--nodes 10240] [--count 20] [--interval 300] [--runs 3]

The cluster is a three-tier fat tree (leaves of 32 nodes, spines of 16 leaves, one root). Figures:
plan size and in-degree per node (against the N-1 peers of all-pairs probing), datagrams and bytes
a node sends per hour (its probes and its answers) at --count probes per peer every --interval seconds, the agent's
CPU seconds per hour for its rounds (one real UDP round on loopback, timed with process_time),
the time every agent takes to compute the plan, and the time to fold the cluster's measurements
and to infer leaves from them (best of --runs). Prints JSON.

The fold, the leaf inference and the live source's fold step are timed beside the per-pair fold
they replaced (tests/bench/measured_fold_reference.py), old and new in turn in each run, wall and CPU
seconds, with the ratio and the load average, on the healthy fabric and on a degraded one (slow and
mis-cabled nodes, lossy and unanswered pairs, a third of the nodes over RDMA, bandwidth trains
with one slow uplink); each pair of results is checked equal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import measured_fold_reference as reference

import aggregator.sources.measured as measured_source
from agent.adapters.udp_probe import BURST_SIZE, PACKET_SIZE, UdpResponder, UdpTransport
from agent.common.measure_rows import to_wire
from agent.common.report import ComponentHealth, Health, Measurement, NodeReport
from agent.measure_plan import Domain, in_degree, plan
from aggregator.measured import fold, infer_leaves, leaf_cut
from aggregator.sources.measured import MeasuredFabric
from aggregator.sources.nodetopology import PARSED_KEY

WIRE_BYTES = PACKET_SIZE + 8 + 20 + 14  # UDP, IPv4 and Ethernet headers around the probe


def fat_tree(nodes: int, leaf_size: int = 32, leaves_per_spine: int = 16) -> list[Domain]:
    leaves = [
        Domain(f"leaf{i}", 1, tuple(f"n{j}" for j in range(i * leaf_size, min(nodes, (i + 1) * leaf_size))))
        for i in range((nodes + leaf_size - 1) // leaf_size)
    ]
    spines = [
        Domain(
            f"spine{s}", 2, tuple(lf.name for lf in leaves[s * leaves_per_spine : (s + 1) * leaves_per_spine])
        )
        for s in range((len(leaves) + leaves_per_spine - 1) // leaves_per_spine)
    ]
    return [*leaves, *spines, Domain("root", 3, tuple(s.name for s in spines))]


def best(runs: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def synthetic(domains: list[Domain], plans: Any) -> dict[str, list[Measurement]]:
    """10 us inside a leaf, 25 us inside a spine, 60 us across the root."""
    leaf = {n: d.name for d in domains if d.tier == 1 for n in d.children}
    spine = {lf: d.name for d in domains if d.tier == 2 for lf in d.children}

    def rtt(a: str, b: str) -> int:
        if leaf[a] == leaf[b]:
            return 10
        return 25 if spine[leaf[a]] == spine[leaf[b]] else 60

    return {
        a: [
            Measurement(p.peer, rtt(a, p.peer), rtt(a, p.peer) * 2, 0.0, 20, "2026-11-25T18:00:00Z")
            for p in ps
        ]
        for a, ps in plans.items()
    }


def degraded(domains: list[Domain], plans: Any, seed: int = 27) -> dict[str, list[Measurement]]:
    """synthetic()'s fabric with what the findings look for: 1 % of nodes slow (x5 to everyone),
    0.5 % mis-cabled (they measure like another leaf), 3 % of rows lossy (20 %) and 1 % unanswered,
    a third of the nodes over RDMA (a fifth of the round trip), and a bandwidth train on one row in
    twelve, leaf0's uplink at a tenth of the rate."""
    rng = random.Random(seed)
    leaf = {n: d.name for d in domains if d.tier == 1 for n in d.children}
    spine = {lf: d.name for d in domains if d.tier == 2 for lf in d.children}
    nodes = sorted(leaf)
    slow = set(rng.sample(nodes, len(nodes) // 100))
    moved = dict(zip(rng.sample(nodes, len(nodes) // 200), rng.sample(nodes, len(nodes) // 200), strict=True))
    rdma = set(rng.sample(nodes, len(nodes) // 3))

    def rtt(a: str, b: str) -> float:
        la, lb = leaf[moved.get(a, a)], leaf[moved.get(b, b)]
        us = 10 if la == lb else 25 if spine[la] == spine[lb] else 60
        return us * (5 if {a, b} & slow else 1) * rng.uniform(0.9, 1.1)

    out = {}
    for a, ps in plans.items():
        rows = []
        for p in ps:
            transport = "rdma" if a in rdma else "udp"
            us = max(1, round(rtt(a, p.peer) / (5 if transport == "rdma" else 1)))
            draw = rng.random()
            loss = 100.0 if draw < 0.01 else 20.0 if draw < 0.04 else 0.0
            mbps = None
            if rng.random() < 1 / 12:
                mbps = rng.randint(800, 950) // (10 if leaf[a] == "leaf0" and leaf[p.peer] != "leaf0" else 1)
            rows.append(Measurement(p.peer, 0 if loss == 100 else us, us * 2, loss, 20, "2026-11-25T18:00:00Z",
                                    transport, mbps))  # fmt: skip
        out[a] = rows
    return out


def side_by_side(runs: int, old: Callable[[], Any], new: Callable[[], Any]) -> dict[str, Any]:
    """Old and new in turn, `runs` times: best wall and CPU seconds of each, the ratios, and
    whether they gave equal results."""
    times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    results: dict[str, Any] = {}
    for _ in range(runs):
        for name, fn in (("old", old), ("new", new)):
            wall, cpu = time.perf_counter(), time.process_time()
            results[name] = fn()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    best = {name: (min(w for w, _ in t), min(c for _, c in t)) for name, t in times.items()}
    return {
        "old_s": round(best["old"][0], 3),
        "new_s": round(best["new"][0], 3),
        "ratio": round(best["old"][0] / max(best["new"][0], 1e-9), 1),
        "old_cpu_s": round(best["old"][1], 3),
        "new_cpu_s": round(best["new"][1], 3),
        "cpu_ratio": round(best["old"][1] / max(best["new"][1], 1e-9), 1),
        "equal": results["old"] == results["new"],
    }


@contextlib.contextmanager
def old_fold_in_source() -> Iterator[None]:
    """The live source running the per-pair fold and leaf inference it ran before."""
    saved = measured_source.fold, measured_source.infer_leaves
    measured_source.fold, measured_source.infer_leaves = reference.fold, reference.infer_leaves
    try:
        yield
    finally:
        measured_source.fold, measured_source.infer_leaves = saved


def source_fold_step(domains: list[Domain], measured: dict[str, list[Measurement]]) -> Callable[[], Any]:
    """What the live source does with changed measurements (MeasuredFabric._fold: the fold, the
    tree check against the measured leaf groups, the disagreements); returns its state."""

    def step() -> Any:
        source = MeasuredFabric(period=60)
        source._fold(domains, measured)
        s = source.state
        return s.faults, s.figures, s.tiers, s.findings, s.disagreements, s.guess

    return step


def compare_folds(domains: list[Domain], measured: dict[str, list[Measurement]], runs: int) -> dict[str, Any]:
    """fold, infer_leaves (a guess, and the check at the tree's cut) and the source's fold step,
    old beside new."""
    cut = leaf_cut(fold(domains, measured).tiers)
    step = source_fold_step(domains, measured)

    def old_step() -> Any:
        with old_fold_in_source():
            return step()

    return {
        "fold": side_by_side(runs, lambda: reference.fold(domains, measured), lambda: fold(domains, measured)),
        "infer_leaves_guess": side_by_side(runs, lambda: reference.infer_leaves(measured), lambda: infer_leaves(measured)),
        "infer_leaves_at_tree_cut": side_by_side(
            runs, lambda: reference.infer_leaves(measured, cut), lambda: infer_leaves(measured, cut)
        ),
        "source_fold_step": side_by_side(runs, old_step, step),
    }


def agent_cpu_per_round(peers: int, count: int) -> float:
    """CPU seconds of one real UDP round (peers x count probes) on loopback, prober and responder."""
    responder = UdpResponder(
        "127.0.0.1", port=0, allowed=lambda: frozenset({"127.0.0.2"}), rate=1e6, burst=1e6
    )
    responder.start()
    try:
        transport = UdpTransport("127.0.0.2", port=responder.port, gap=0.0)
        start = time.process_time()
        for _ in range(peers):
            transport.round_trips("127.0.0.1", count)
        return time.process_time() - start
    finally:
        responder.stop()


def controller_figures(domains: list[Domain], measured: dict[str, list[Measurement]], runs: int) -> dict[str, Any]:
    """The live controller's `measured` source over caches of the whole cluster: its first step
    (every node's plan row, the fold, the tree check), a step with nothing changed (what every
    --measured-period costs on a quiet cluster), and the size of a published row."""
    hypernodes = {}
    for d in domains:
        kind = "Node" if d.tier == 1 else "HyperNode"
        members = [{"type": kind, "selector": {"exactMatch": {"name": c}}} for c in d.children]
        hypernodes[d.name] = {"metadata": {"name": d.name}, "spec": {"tier": d.tier, "members": members}}
    ok = {"host": ComponentHealth(Health.OK)}
    records = {n: {"metadata": {"name": n}, PARSED_KEY: NodeReport(n, ok, measurements=tuple(ms),
                                                                   probe_address=f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")}
               for i, (n, ms) in enumerate(measured.items())}  # fmt: skip
    published: list[Any] = []

    def first() -> MeasuredFabric:
        source = MeasuredFabric(period=60)
        source.attach(lambda: (hypernodes, records), lambda rows, _records: published.append(rows) or len(rows))
        source.step()
        return source

    first_s, source = best(runs, first)
    idle_s, _ = best(runs, source.step)
    row_bytes = [len(json.dumps(to_wire(r))) for r in published[-1].values()]
    return {
        "controller_first_step_s": round(first_s, 3),
        "controller_idle_step_s": round(idle_s, 3),
        "controller_fold_s": round(source.state.fold_seconds, 3),
        "probe_plan_row_bytes": {"max": max(row_bytes), "mean": round(statistics.mean(row_bytes))},
    }


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--nodes", type=int, default=10240)
    args.add_argument("--count", type=int, default=20)
    args.add_argument("--interval", type=float, default=300.0)
    args.add_argument("--runs", type=int, default=3)
    args.add_argument("--burst-every", type=int, default=12, help="rounds between bandwidth trains (the agent's default)")
    args.add_argument("--burst-count", type=int, default=32, help="datagrams in a train (the agent's default)")
    opts = args.parse_args()
    domains = fat_tree(opts.nodes)
    plan_s, plans = best(opts.runs, lambda: plan(domains))
    sizes = [len(ps) for ps in plans.values()]
    degree = list(in_degree(plans).values())
    rounds_per_hour = 3600 / opts.interval
    # what a node's fabric NIC sends: its own probes, and its answers to the nodes that probe it
    # (it receives as many: their answers and their probes); the cluster carries each probe twice
    incoming = in_degree(plans)
    sent_per_hour = [(len(ps) + incoming.get(n, 0)) * opts.count * rounds_per_hour for n, ps in plans.items()]
    measured = synthetic(domains, plans)
    load_before = os.getloadavg()[0]
    healthy = compare_folds(domains, measured, opts.runs)
    broken = degraded(domains, plans)
    degraded_figures = {**compare_folds(domains, broken, opts.runs), "findings": len(fold(domains, broken).findings)}
    load_after = os.getloadavg()[0]
    fold_s, result = best(opts.runs, lambda: fold(domains, measured))
    infer_s, guess = best(opts.runs, lambda: infer_leaves(measured))
    cpu_round = agent_cpu_per_round(max(sizes), opts.count)
    figures = {
        "nodes": opts.nodes,
        "tiers": 3,
        "plan_peers_per_node": {"max": max(sizes), "mean": round(statistics.mean(sizes), 2)},
        "all_pairs_peers_per_node": opts.nodes - 1,
        "plan_vs_all_pairs": round(max(sizes) / (opts.nodes - 1), 5),
        "in_degree": {"max": max(degree), "mean": round(statistics.mean(degree), 2)},
        "datagrams_sent_per_node_per_hour": round(max(sent_per_hour)),
        "bytes_sent_per_node_per_hour": round(max(sent_per_hour) * WIRE_BYTES),
        # bandwidth trains: --burst-count datagrams of BURST_SIZE to each peer every --burst-every rounds
        "train_bytes_sent_per_node_per_hour": round(
            max(sizes) * opts.burst_count * (BURST_SIZE + WIRE_BYTES - PACKET_SIZE) * rounds_per_hour / max(opts.burst_every, 1)
        ),
        "cluster_datagrams_per_second": round(2 * sum(sizes) * opts.count * rounds_per_hour / 3600, 1),
        "agent_cpu_s_per_round": round(cpu_round, 4),
        "agent_cpu_s_per_hour": round(cpu_round * rounds_per_hour, 3),
        "plan_whole_cluster_s": round(plan_s, 3),
        "fold_s": round(fold_s, 3),
        "fold_target_s": 1.0,
        "old_vs_new": {
            "load_average": [round(load_before, 2), round(load_after, 2)],
            "healthy": healthy,
            "degraded": degraded_figures,
        },
        "infer_leaves_s": round(infer_s, 3),
        "pairs_folded": sum(len(ms) for ms in measured.values()),
        "tier_profile_us": result.tiers,
        "leaf_groups_inferred": len(guess.groups),
        "leaves_in_tree": sum(1 for d in domains if d.tier == 1),
        "findings": len(result.findings),
        **controller_figures(domains, measured, opts.runs),
        # what an agent reads a round to know its peers: before, every HyperNode (a LIST) and its
        # ~14 peers' and probers' reports (kept an hour); now its own NodeTopology (one GET)
        "agent_objects_read_per_round_before": len(domains),
        "agent_objects_read_per_round_now": 1,
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
