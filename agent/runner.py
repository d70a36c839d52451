"""`hypertopo-agent run`: probe on start, on events and on a timer; publish; serve /metrics.

Why events: a link that goes down must reach the NodeTopology object (and from there the
HyperNode's Ready condition) in under a second, not at the next 30 s poll. Netlink link events,
LLDP neighbour changes and XID events each poke the loop; a burst of pokes (a bond flapping all its
slaves, a switch reboot) is coalesced by a short debounce into one probe cycle.

Threads: the main thread runs the probe loop; the publisher has its own thread so an API server
that is away never delays probing or /metrics; the HTTP server and the watchers (netlink, LLDP raw
socket, XID) run in theirs. A watcher that cannot start (no root for AF_PACKET, no NVML events)
is logged and the agent carries on with timer probes.

Restarts lose nothing: before its first write the publisher reads back the NodeTopology the
previous run published, and the prober carries its LLDP neighbours (each for one more TTL, unless a
fresh frame replaces it) and its RDMA ports in use. Switches speak only every tx-interval (30 s by
default), so without this a rollout would publish every node without cabling at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector

from agent.collect import Prober, describe
from agent.common.adapters.endpoints import Endpoint, serve
from agent.common.adapters.endpoints import parse_listen as parse_listen  # the CLI validates --listen with it
from agent.common.report import NodeReport, node_topology_object, report_from_spec
from agent.fabric_measure import FabricMeasure, MeasureMetrics
from agent.metrics import AgentMetrics
from agent.publish import Publisher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunConfig:
    interval: float = 30.0
    listen: tuple[str, int] = ("0.0.0.0", 9730)
    debounce: float = 0.1
    ready_grace: float = 300.0  # /readyz stays ready this long while the API server is away
    watch: bool = True  # start the netlink, LLDP and XID watchers
    carry_over: bool = True  # read back the previous run's NodeTopology and carry its neighbours


class Agent:
    """The long-running agent: wires the prober, publisher, watchers and HTTP server together."""

    def __init__(
        self,
        prober: Prober,
        publisher: Publisher,
        config: RunConfig = RunConfig(),
        *,
        measure: FabricMeasure | None = None,
    ) -> None:
        self.prober = prober
        self.publisher = publisher
        self.config = config
        self.measure = measure  # --measure-fabric: its own thread, stamped onto every report
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AgentMetrics(lambda: prober.latest, publisher.counts))
        if measure is not None:
            self.registry.register(MeasureMetrics(measure))
        ProcessCollector(namespace="hypertopo", registry=self.registry)
        self.stop_event = threading.Event()
        self._poke = threading.Event()
        self._watchers: list[Any] = []
        self._threads: list[threading.Thread] = []
        self._server: Endpoint | None = None
        self._lldp: Any = None
        self._cycle_lock = threading.Lock()  # a probe and its submit, against the carry-over's
        self.cycles = 0
        self.carried = 0  # LLDP neighbours carried over from the previous run

    # -- events --------------------------------------------------------------------------------
    def poke(self, *_: object) -> None:
        """Asks for a probe cycle soon (any thread; extra arguments from callbacks are ignored)."""
        self._poke.set()

    def stop(self) -> None:
        self.stop_event.set()
        self._poke.set()
        self.publisher.wake()

    # -- health --------------------------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        if self.prober.latest is None:
            return False, "first probe not done"
        since = self.publisher.failing_since
        if since is not None and time.monotonic() - since >= self.config.ready_grace:
            return (
                False,
                f"publishing failing for {time.monotonic() - since:.0f}s: {self.publisher.last_error}",
            )
        return True, "ok"

    # -- lifecycle -----------------------------------------------------------------------------
    def run(self) -> None:
        """Runs until `stop()` (e.g. from a signal handler); then stops every thread."""
        self.serve()
        if self.config.carry_over:
            self.publisher.expect_read_back(self.prober.config.node_name, self.carry_over)
        self._spawn("publisher", lambda: self.publisher.run(self.stop_event))
        if self.measure is not None:
            measure = self.measure
            self._spawn("fabric-measure", lambda: measure.run(self.stop_event))
        previous: NodeReport | None = None
        try:
            previous = self.cycle(previous)
            if self.config.watch:
                self.start_watchers(previous)
            while not self.stop_event.is_set():
                self._poke.wait(timeout=self.config.interval)
                if self._poke.is_set() and not self.stop_event.is_set():
                    self.stop_event.wait(self.config.debounce)  # coalesce a burst of events
                self._poke.clear()
                if not self.stop_event.is_set():
                    previous = self.cycle(previous)
        finally:
            self.shutdown()

    def cycle(self, previous: NodeReport | None) -> NodeReport:
        with self._cycle_lock:
            report = self.prober.collect()
            if self.measure is not None:
                report = self.measure.stamp(report)
            self.publisher.submit(node_topology_object(report))
        self.cycles += 1
        if previous is None or previous.health != report.health:
            log.info("node %s health: %s", report.node_name, describe(report.health))
        if self._lldp is not None and previous is not None and previous.interfaces != report.interfaces:
            self._lldp.set_interfaces(lldp_interfaces(report))  # a NIC came or went
        return report

    def carry_over(self, stored: Mapping[str, Any] | None) -> None:
        """Takes over what the previous run published (the publisher's read-back, on its thread,
        before any write). A probe already submitted lacked the carried neighbours, so the
        report is probed again and submitted under the same lock: no submit made without them
        can follow."""
        if stored is None:
            return
        spec = dict(stored.get("spec") or {})
        spec.setdefault("nodeName", self.prober.config.node_name)
        spec.setdefault("health", {})
        try:
            previous = report_from_spec(spec)
        except (TypeError, ValueError) as exc:  # WireError names the field
            log.warning("previous NodeTopology unreadable, nothing carried over: %s", exc)
            return
        with self._cycle_lock:
            self.carried = self.prober.restore(previous)
            if self.prober.latest is not None:
                self.publisher.submit(node_topology_object(self.prober.collect()))
        log.info("carried over %d LLDP neighbours from the previous run's report", self.carried)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def serve(self) -> None:
        self._server = serve(self.registry, self.config.listen, {"/healthz": lambda: True, "/readyz": self.ready})

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.port

    def shutdown(self) -> None:
        self.stop()
        for watcher in self._watchers:
            _quietly(f"stopping {type(watcher).__name__}", watcher.stop)
        if self._server is not None:
            self._server.shutdown()
        for thread in self._threads:
            thread.join(timeout=5)
        log.info("agent stopped after %d probe cycles", self.cycles)

    # -- watchers ------------------------------------------------------------------------------
    def start_watchers(self, report: NodeReport) -> None:
        self._start_watcher("netlink link watcher", self._link_watcher)
        if not self._start_watcher("LLDP listener", lambda: self._lldp_listener(lldp_interfaces(report))):
            self.prober.lldp_failure = "LLDP listener not started (see the agent log)"
            self.poke()
        if self.prober.nvml_backend is not None:
            self._start_watcher("XID watcher", self._xid_watcher)

    def _start_watcher(self, what: str, factory: Callable[[], Any]) -> bool:
        try:
            watcher = factory()
        except Exception as exc:  # a missing watcher costs latency, never the agent
            log.warning("%s not started: %s; relying on --interval probes", what, exc)
            return False
        if watcher is not None:
            self._watchers.append(watcher)
            log.debug("%s started", what)
        return True

    def _link_watcher(self) -> Any:
        from agent.adapters.netlink import LinkWatcher

        watcher = LinkWatcher(self.poke)
        watcher.start()
        return watcher

    def _lldp_listener(self, interfaces: list[str]) -> Any:
        from agent.adapters.raw_socket import LldpListener

        listener = LldpListener(interfaces, self.prober.neighbour_table(), self.poke)
        listener.start()
        self._lldp = self.prober.lldp_listener = listener
        return listener

    def _xid_watcher(self) -> Any:
        from agent.probes.nvml import XidWatcher

        watcher = XidWatcher(self.prober.nvml_backend, self.poke)
        if not watcher.start():
            raise RuntimeError(watcher.error or "NVML refused XID events")
        self.prober.xid_watcher = watcher
        return watcher


def lldp_interfaces(report: NodeReport) -> list[str]:
    """Where LLDP frames can arrive: every reported interface but loopback (the probe drops it too)."""
    return [i.name for i in report.interfaces if i.name != "lo"]


def _quietly(what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as exc:  # shutting down: report and go on
        log.warning("%s: %s", what, exc)
