"""UFM source benchmark: a UFM answer for 10,000 hosts and 600 switches, parsed and merged into the
fabric graph (issue 12's target: under 1 s). A row of `python tests/bench/bench_aggregator.py`; alone:

    python tests/bench/bench_ufm.py [--hosts 10000] [--switches 600] [--hcas 1 4 8]

The fabric is rail-optimised: groups of 80 hosts, `--hcas` HCAs each (one rail per HCA), one leaf
per group and rail (hosts x rails / 80 leaves), the remaining switches as spines (nine in ten) and
cores above them (eight HCAs per host need 1,000 leaves: more than 600 switches). UFM lists every
port of a switch, cabled or not: each switch has 64 ports at least (`--radix`; unused ones Down,
Polling, no peer). The ports, links, systems and unhealthy-ports listings come from the UFM
stand-in's generator (tests/kits/ufm_standin.py, every port field UFM's guide documents, about 1.1 KiB a
cabled port as UFM sends it; not timed) and are serialised to the bytes the adapter receives.

The figures at the top of each row are for the answer the adapter asks for: the active ports only
(`ports?active=true`, which leaves out the switch ports never cabled), with the other listings;
`whole_listing` is the same fabric's whole port listing (`--ufm-all-ports`, or a UFM without the
filter), for comparison. Timed, best and median of three, from those bytes to the facts in the
graph, as the poller and the source run them: `sources.ufm.from_bodies` (JSON decoding, parsing,
freeing the decoded JSON) and `sources.ufm.remember` against the previous poll (read), then
`sources.ufm_graph.apply` into a graph whose nodes carry their reported GUIDs (merge, the join by
GUID); `wall` is both, `cpu` the process CPU time of both (less sensitive to a shared machine, whose
1-minute load average the row states, before and after).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))

from ufm_standin import active_ports, ca_guid, listings

from agent.cluster_model import ClusterModel, parse_model
from agent.common.report import RdmaDevice
from aggregator.graph import FabricGraph, NodeFacts
from aggregator.sources import ufm, ufm_graph

RAILS = 4
RADIX = 64  # NDR switches (QM9700): 64 ports, each listed by UFM, cabled or not
GROUP = 80


def fabric_model(hosts: int, switches: int, rails: int = RAILS) -> ClusterModel:
    groups = -(-hosts // GROUP)
    leaves = groups * rails
    above = max(2, switches - leaves)
    cores = max(1, above // 10)
    spines = above - cores
    tree: dict[str, dict[str, list[str]]] = {}
    for c in range(cores):
        tree[f"core{c}"] = {"switches": [f"spine{s}" for s in range(spines) if s % cores == c]}
    for s in range(spines):
        tree.setdefault(f"spine{s}", {"switches": []})["switches"] = [
            f"leaf{l_}" for l_ in range(leaves) if l_ % spines == s
        ]
    blocks = []
    for g in range(groups):
        first = g * GROUP + 1
        last = min(hosts, first + GROUP - 1)
        for r in range(rails):
            blocks.append({"switch": f"leaf{g * rails + r}", "nodes": [f"h[{first:05d}-{last:05d}]"]})
    return parse_model({"switches": tree, "blocks": blocks})


def graph_with_reports(model: ClusterModel, rails: int = RAILS) -> FabricGraph:
    graph = FabricGraph()
    for node in model.nodes():
        # the HCAs as a report carries them: their GUIDs are normalised when UFM's join asks
        hcas = tuple(RdmaDevice(f"mlx5_{hca}", node_guid=ca_guid(node, hca)) for hca in range(rails))
        graph.set_node_facts(node, NodeFacts(hcas=hcas))
    return graph


def bench(hosts: int = 10_000, switches: int = 600, rails: int = RAILS, radix: int = RADIX) -> dict[str, object]:
    """The answer the adapter asks for (the active ports), then the whole listing for comparison."""
    model = fabric_model(hosts, switches, rails)
    whole = listings(model, radix=radix)
    answers = {"active": {**whole, "ports": active_ports(whole["ports"])}, "whole": whole}
    load = os.getloadavg()[0]
    rows = {name: _timed(model, rails, {k: json.dumps(v).encode() for k, v in data.items()}, active_only=name == "active")
            for name, data in answers.items()}  # fmt: skip
    row, whole_row = rows["active"], rows["whole"]
    return {
        "bench": "ufm_parse_and_merge",
        "requested": f"ports?{ufm.ACTIVE_FILTER}",
        "hosts": row.pop("hosts"),
        "hcas_per_host": rails,
        "switches": row.pop("switches"),
        **row,
        "whole_listing": {k: v for k, v in whole_row.items() if k not in ("hosts", "switches", "nodes_placed")},
        "switch_ports_listed_at_least": radix,
        "load_average_1m": [round(load, 2), round(os.getloadavg()[0], 2)],  # before, after
    }


def _timed(model: ClusterModel, rails: int, bodies: dict[str, bytes], *, active_only: bool) -> dict[str, object]:
    """Best and median of three polls from the bytes to the facts in the graph, as the poller and the
    source run them: `from_bodies`, `remember` against the previous poll's facts (the same fabric:
    the steady state), `ufm_graph.apply`."""
    previous = ufm.from_bodies(bodies, active_only=active_only)  # the last poll (not timed)
    phases: dict[str, list[float]] = {"read": [], "merge": [], "cpu": [], "wall": []}
    for _ in range(3):
        graph = graph_with_reports(model, rails)  # not timed: the reports are already in the graph
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        fabric = ufm.remember(previous, ufm.from_bodies(bodies, active_only=active_only))
        read = time.perf_counter()
        ufm_graph.apply(graph, fabric)
        done = time.perf_counter()
        for name, value in (("read", read - wall), ("merge", done - read), ("wall", done - wall),
                            ("cpu", time.process_time() - cpu)):  # fmt: skip
            phases[name].append(value)
        del fabric
    placed = sum(1 for n in graph.nodes if graph.attached_switches(n))
    return {
        "hosts": previous.host_count(),
        "switches": previous.switch_count(),
        "ports": len(previous.ports),
        "cables": len(previous.links),
        "response_mib": round(sum(len(b) for b in bodies.values()) / 2**20, 1),
        "nodes_placed": placed,
        "seconds_best": {k: round(min(v), 3) for k, v in phases.items()},
        "seconds_median": {k: round(statistics.median(v), 3) for k, v in phases.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--switches", type=int, default=600)
    parser.add_argument("--hcas", type=int, nargs="+", default=[1, RAILS, 8], help="HCAs (rails) per host")
    parser.add_argument("--radix", type=int, default=RADIX, help="ports UFM lists per switch at least (unused "
                        "ones Down/Polling); 0: only the cabled ones")  # fmt: skip
    args = parser.parse_args()
    for rails in args.hcas:
        print(json.dumps(bench(args.hosts, args.switches, rails, args.radix)), flush=True)


if __name__ == "__main__":
    main()
