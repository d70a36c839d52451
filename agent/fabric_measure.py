"""The agent's measuring loop (`run --measure-fabric ADDRESS`): re-plan when the tree changes,
time round trips to this node's planned peers, latch them into the report, export them.

Why a loop of its own, beside the probe loop: a round to ten peers at 20 probes each takes a
second or more, and a lost probe waits its timeout; the probe loop must keep answering link events
in under a second. So measuring runs in its own thread every `interval` (default 300 s: the cost
is `plan size x count x 2` datagrams of 64 bytes a round, see README "Measured fabric"), and the
probe loop stamps the latest latched measurements onto each report it publishes. Every
`burst_every` rounds a round also sends each peer a short train of large datagrams whose arrival
rate is the path's bandwidth (agent.adapters.udp_probe `burst`), carried in the measurements until
the next train.

What to probe and whom to answer come from this node's row of the probe plan, which the
aggregator computes from the HyperNode tree and publishes in the node's own NodeTopology status
(agent.common.measure_rows): peers with their probe addresses, and the addresses of the nodes whose plan
names this node, so a responder is open to the dozen nodes that will probe it, not to the cluster.
The row's source (one GET of the node's own NodeTopology) and the transport are parameters:
adapters in production, plain objects in tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.common.api_error import ApiError
from agent.common.measure_rows import PlanRow
from agent.common.report import Measurement, NodeReport
from agent.probes.fabric_rtt import RttTransport, latch, summarise

log = logging.getLogger(__name__)


@dataclass
class FabricMeasure:
    """One node's measuring state; `round()` does one round, `run()` repeats it."""

    node: str
    address: str
    transport: RttTransport
    row_source: Callable[[], PlanRow | None]  # this node's published plan row (None: none yet)
    count: int = 20
    interval: float = 300.0
    burst_every: int = 0  # rounds between bandwidth trains (0: never; the transport must have `burst`)
    burst_count: int = 32  # datagrams in a train
    clock: Callable[[], float] = time.time
    digest: str = ""  # of the tree the row was planned from
    peers: tuple[tuple[str, str], ...] = ()  # (node, probe address)
    probers: frozenset[str] = frozenset()  # addresses of the nodes whose plan names this one
    measurements: tuple[Measurement, ...] = ()
    live: dict[str, Measurement] = field(default_factory=dict)  # last round, unlatched (metrics)
    rounds: int = 0
    bandwidth: dict[str, int] = field(default_factory=dict)  # peer -> last train's Mbit/s, carried between trains

    def replan(self, row: PlanRow | None) -> None:
        """Takes the published row (no row yet: nothing to probe, nobody answered)."""
        if row is None:
            self.peers, self.probers, self.digest = (), frozenset(), ""
            return
        if row.tree != self.digest:
            log.info("fabric probe plan: %d peers, %d probers (tree %s)", len(row.peers), len(row.probers), row.tree)
        self.peers, self.probers, self.digest = row.peers, row.probers, row.tree

    def round(self) -> tuple[Measurement, ...]:
        self.replan(self.row_source())
        current = []
        burst = getattr(self.transport, "burst", None)
        trains = burst is not None and self.burst_every > 0 and self.rounds % self.burst_every == 0
        for peer, peer_address in self.peers:
            rtts = self.transport.round_trips(peer_address, self.count)
            used = getattr(self.transport, "used", self.transport.name)  # RDMA falls back to UDP per peer
            m = summarise(peer, rtts, when=self.clock(), transport=used)
            if trains and burst is not None:
                self._train(peer, burst(peer_address, self.burst_count))
            current.append(replace(m, bandwidth_mbps=self.bandwidth.get(peer)))
        self.live = {m.peer: m for m in current}
        self.measurements = latch(self.measurements, current)
        self.rounds += 1
        return self.measurements

    def _train(self, peer: str, mbps: float | None) -> None:
        if mbps is None:
            self.bandwidth.pop(peer, None)
        else:
            self.bandwidth[peer] = max(1, round(mbps))

    def allowed(self) -> frozenset[str]:
        return self.probers

    def stamp(self, report: NodeReport) -> NodeReport:
        """The report with this node's probe address and latched measurements."""
        return replace(report, measurements=self.measurements, probe_address=self.address)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.round()
            except (ApiError, OSError, ValueError) as exc:  # the API away, a bad row: the next round tries again
                log.warning("fabric measuring round failed: %s", exc)
            stop.wait(self.interval)


class MeasureMetrics(Collector):
    """hypertopo_fabric_rtt_p50/p99_seconds and _loss_ratio per peer, from the last round."""

    def __init__(self, measure: FabricMeasure) -> None:
        self._measure = measure

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        live = list(self._measure.live.values())
        families = (
            ("p50_seconds", "median round trip to a fabric peer, last round", lambda m: m.p50_us / 1e6),
            (
                "p99_seconds",
                "99th percentile round trip to a fabric peer, last round",
                lambda m: m.p99_us / 1e6,
            ),
            (
                "loss_ratio",
                "share of fabric probes to a peer lost, last round",
                lambda m: m.loss_percent / 100,
            ),
        )
        for suffix, text, value in families:
            g = GaugeMetricFamily(f"hypertopo_fabric_rtt_{suffix}", text, labels=["peer", "transport"])
            for m in live:
                g.add_metric([m.peer, m.transport], value(m))
            yield g
        bandwidth = GaugeMetricFamily(
            "hypertopo_fabric_bandwidth_bits_per_second",
            "rate of the last bandwidth train to a fabric peer, as it arrived",
            labels=["peer"],
        )
        for peer, mbps in sorted(self._measure.bandwidth.items()):
            bandwidth.add_metric([peer], mbps * 1e6)
        yield bandwidth
        failures = getattr(self._measure.transport, "failures", None)
        if failures is not None:  # the RDMA transport: runs that failed and were measured over UDP instead
            yield CounterMetricFamily(
                "hypertopo_fabric_rdma_fallbacks",
                "RDMA probe runs (perftest) that failed and were measured over UDP instead",
                value=failures,
            )
        yield GaugeMetricFamily(
            "hypertopo_fabric_probe_peers",
            "peers in this node's fabric probe plan",
            value=len(self._measure.peers),
        )
