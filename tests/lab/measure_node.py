"""One lab host's fabric measuring round, run inside its namespace: the agent's real loop
(agent.fabric_measure) with the real UDP responder and prober on the host's fabric address, and
with `--rdma-sysfs` the agent's RDMA transport and gate chosen by its own `auto` logic (the
perftest tools are whatever `ib_write_lat`/`ib_write_bw` PATH gives: the stand-in in the lab).

Reads the lab (domains, addresses) from a JSON file, answers from start to `--end-at`, measures
once at `--start-at` (so every responder is up first), and writes what it measured, what it sent
and answered, and the fabric NIC's transmitted-packet count over the run, as JSON."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agent.adapters.udp_probe import DEFAULT_PORT, UdpResponder, UdpTransport
from agent.common.measure_rows import rows
from agent.common.report import to_wire
from agent.fabric_measure import FabricMeasure
from agent.measure_cli import _transport
from agent.measure_plan import Domain


def tx_packets(nic: str) -> int:
    return int(Path(f"/sys/class/net/{nic}/statistics/tx_packets").read_text())


def main() -> None:
    args = argparse.ArgumentParser()
    for flag in ("--node", "--address", "--lab", "--out", "--nic"):
        args.add_argument(flag, required=True)
    for flag in ("--start-at", "--end-at"):
        args.add_argument(flag, type=float, required=True)
    args.add_argument("--count", type=int, default=20)
    args.add_argument("--trains", type=int, default=0, help="datagrams in a bandwidth train to each peer (0: none)")
    args.add_argument("--rdma-sysfs", default=None, help="a sysfs root with an RDMA port on --nic: transport auto")
    opts = args.parse_args()
    lab = json.loads(Path(opts.lab).read_text())
    domains = [Domain(d["name"], d["tier"], tuple(d["children"])) for d in lab["domains"]]
    addresses = lab["addresses"]
    udp = UdpTransport(opts.address, timeout=1.0, gap=0.005)
    transport, gate = udp, None
    if opts.rdma_sysfs:  # the agent's own choice and wiring (--measure-transport auto), as `run` does it
        choice = argparse.Namespace(measure_transport="auto", sysfs=opts.rdma_sysfs, measure_port=DEFAULT_PORT)
        transport, gate = _transport(choice, opts.address, opts.nic, udp)
    row = rows(domains, addresses).get(opts.node)  # what the aggregator publishes in its status
    measure = FabricMeasure(opts.node, opts.address, transport, lambda: row, count=opts.count,
                            burst_every=1 if opts.trains else 0, burst_count=opts.trains or 32)  # fmt: skip
    measure.replan(row)
    before = tx_packets(opts.nic)
    responder = UdpResponder(opts.address, allowed=measure.allowed, rate=1000, burst=100, burst_rate=100_000,
                             gate=gate)  # fmt: skip
    responder.start()
    time.sleep(max(0.0, opts.start_at - time.time()))
    measured = measure.round()
    time.sleep(max(0.0, opts.end_at - time.time()))
    responder.stop()
    result = {
        "measurements": [to_wire(m) for m in measured],
        "peers": [peer for peer, _ in measure.peers],
        "probers": sorted(n for n, a in addresses.items() if a in measure.probers),
        "sent": udp.sent,
        "answered": responder.answered,
        "train_datagrams": responder.train_datagrams,
        "trains": udp.trains,  # (peer address, sent, received, first-to-last ns)
        "refused": responder.refused,
        "tx_packets": tx_packets(opts.nic) - before,
        "transport": type(transport).__name__,
        "rdma_failures": getattr(transport, "failures", 0),
        "rdma_served": getattr(getattr(gate, "__self__", None), "served", 0),
    }
    Path(opts.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
