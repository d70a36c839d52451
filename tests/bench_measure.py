"""Measured-fabric benchmark: what the probe plan costs per node at 10k nodes, and how long the
aggregator takes to fold 10k nodes' measurements (target < 1 s).

    python tests/bench_measure.py [--nodes 10240] [--count 20] [--interval 300] [--runs 3]

The cluster is a three-tier fat tree (leaves of 32 nodes, spines of 16 leaves, one root). Figures:
plan size and in-degree per node (against the N-1 peers of all-pairs probing), datagrams and bytes
a node sends per hour (its probes and its answers) at --count probes per peer every --interval seconds, the agent's
CPU seconds per hour for its rounds (one real UDP round on loopback, timed with process_time),
the time every agent takes to compute the plan, and the time to fold the cluster's measurements
and to infer leaves from them (best of --runs). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from agent.adapters.udp_probe import BURST_SIZE, PACKET_SIZE, UdpResponder, UdpTransport
from agent.measure_plan import Domain, in_degree, plan
from agent.measure_rows import to_wire
from agent.report import ComponentHealth, Health, Measurement, NodeReport
from aggregator.measured import fold, infer_leaves
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
