"""One probe cycle: run every probe, each timed and isolated, and build the NodeReport.

The probes themselves are pure and promise never to raise, but the agent must survive a probe that
breaks that promise (a bug, an NVML binding that throws, a sysfs tree that changes under it): here an
exception in one probe becomes that component's `failed` health with the exception text, and the
other probes still run. Each cycle also records per-probe success and duration, which the metrics
exporter serves (like node_exporter's `scrape_collector_success`).

The probes are the list `PROBES` ((module, class) of each, in the order they run; see
agent.probes.protocol): adding one is one new module plus one line there. Each module is imported
when the agent first runs its probe, so a missing or broken module is one failed probe, not an agent
that cannot start. Grey-failure findings the probes add roll up into the components they name
(agent.probes.grey.fold_all), through the latch that keeps an unchanged finding byte-identical.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agent.common.report import COMPONENTS, ComponentHealth, Health, NodeReport, ProbeResult
from agent.probes.grey import GreyConfig, fold_all, latch
from agent.probes.protocol import Cycle, Probe

log = logging.getLogger(__name__)

T = TypeVar("T")

NVML_MODES = ("auto", "off")
FAKE_PREFIX = "fake:"


class ConfigError(ValueError):
    """A configuration value that cannot be used (bad usage), with the reason."""


def check_nvml_mode(mode: str) -> str:
    """`auto` (real NVML when present), `off`, or `fake:PROFILE` (the deterministic fake)."""
    if mode in NVML_MODES or (mode.startswith(FAKE_PREFIX) and len(mode) > len(FAKE_PREFIX)):
        return mode
    raise ConfigError(f"--nvml must be auto, off or fake:PROFILE, not {mode!r}")


@dataclass(frozen=True)
class CollectConfig:
    node_name: str
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    nvml: str = "auto"
    interfaces: re.Pattern[str] | None = None  # names to report; None: the fabric interfaces
    lldp_wait: float = 0.0
    lldpd_socket: Path | None = None  # a host lldpd's control socket, read as a second LLDP source
    lldpcli: str = "lldpcli"
    grey: GreyConfig = field(default_factory=GreyConfig)

    def __post_init__(self) -> None:
        check_nvml_mode(self.nvml)
        if self.lldp_wait < 0:
            raise ConfigError("--lldp-wait must not be negative")


@dataclass(frozen=True)
class ProbeStat:
    """How one probe went in the last cycle: `success` is false only when it failed."""

    probe: str
    success: bool
    duration_seconds: float
    error: str = ""


@dataclass(frozen=True)
class Snapshot:
    """The latest report and its per-probe stats, swapped in as one reference."""

    report: NodeReport
    stats: Mapping[str, ProbeStat]
    finished_at: float = 0.0
    xid_totals: Mapping[int, Mapping[int, int]] = field(default_factory=dict)  # GPU index -> XID -> count
    cycles: int = 0  # probe cycles run so far, this one included


def open_nvml_backend(mode: str) -> tuple[Any, str]:
    """The NVML backend for a mode, and why there is none: (None, "") when off, (None, reason)
    when libnvidia-ml cannot be loaded."""
    if mode == "off":
        return None, ""
    if mode.startswith(FAKE_PREFIX):
        from agent.probes.nvml_fake import FakeNvml

        return FakeNvml(mode[len(FAKE_PREFIX) :]), ""
    from agent.adapters.nvml_binding import load_backend

    return load_backend()


def _failure_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def timed(name: str, probe: Callable[[], ProbeResult[T]]) -> tuple[ProbeResult[T], ProbeStat]:
    """Runs one probe; an exception becomes a failed result carrying its text."""
    start = time.perf_counter()
    try:
        result = probe()
    except Exception as exc:  # isolation is the point: one probe never stops the rest
        log.warning("probe %s raised: %s", name, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        result = ProbeResult.failed(f"probe raised {_failure_text(exc)}")
    elapsed = time.perf_counter() - start
    failed = result.health.state is Health.FAILED
    return result, ProbeStat(name, not failed, elapsed, result.health.reason if failed else "")


# The probes, in the order they run ((module, class); a class takes no arguments). Later probes read
# what earlier ones found (nvml reads rdma for GPU-NIC affinity, lldp reads net, the grey probes
# read rdma, net and nvml). A new probe is one new module and one line here.
PROBES: tuple[tuple[str, str], ...] = (
    ("agent.collect", "HostProbe"),
    ("agent.collect", "RdmaProbe"),
    ("agent.collect", "NetProbe"),
    ("agent.collect", "NvmlProbe"),
    ("agent.collect", "LldpProbe"),
    ("agent.probes.port_errors", "PortErrorProbe"),
    ("agent.probes.link_training", "LinkTrainingProbe"),
    ("agent.probes.carrier_flaps", "CarrierFlapProbe"),
    ("agent.probes.nvlink_health", "NvlinkHealthProbe"),
    ("agent.probes.pcie", "PcieProbe"),
)


class _Broken:
    """Stands in for a probe whose module or class cannot be loaded: that probe fails, no other."""

    def __init__(self, name: str, error: str) -> None:
        self.name, self.error = name, error

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        return ProbeResult.failed(self.error)


def load_probe(spec: tuple[str, str]) -> Probe:
    module, cls = spec
    try:
        probe: Probe = getattr(importlib.import_module(module), cls)()
        return probe
    except Exception as exc:  # one broken probe module is that probe failing
        return _Broken(
            cls.removesuffix("Probe").lower() or module,
            f"cannot load probe {module}.{cls}: {_failure_text(exc)}",
        )


class Prober:
    """Owns what outlives one cycle (the NVML backend, the LLDP neighbour table) and runs cycles.

    `links` returns the netlink link records (default: a fresh netlink dump); `nvml_backend`
    overrides the backend chosen by `config.nvml` (tests pass a prepared fake)."""

    def __init__(
        self,
        config: CollectConfig,
        *,
        links: Callable[[], Sequence[Any]] | None = None,
        nvml_backend: Any = None,
        clock: Callable[[], float] = time.monotonic,
        probes: Sequence[tuple[str, str]] = PROBES,
        link_modes: Callable[[str], list[str]] | None = None,
    ) -> None:
        self._link_modes = link_modes
        self._link_mode_cache: dict[tuple[str, str | None], list[str]] = {}
        self.config = config
        self._probe_specs = tuple(probes)
        self._probes: list[Probe] | None = None  # loaded on the first cycle
        self._links = links
        self._last_links: Sequence[Any] = ()
        self._clock = clock
        self._backend = nvml_backend
        self._backend_error = ""
        self._backend_missing = ""  # why libnvidia-ml could not be loaded (no backend, no error)
        if nvml_backend is None:
            self._backend, self._backend_missing, self._backend_error = self._open_backend()
        self._table: Any = None
        self.xid_watcher: Any = None  # an agent.probes.nvml.XidWatcher the runner started, if any
        # The LLDP listener feeding the neighbour table (agent.adapters.raw_socket.LldpListener),
        # or why none could be started: its socket errors are the lldp component's health.
        self.lldp_listener: Any = None
        self.lldp_failure = ""
        self._rdma_seen_active: set[tuple[str, int]] = set()  # RDMA ports seen ACTIVE since start
        self._rdma_cache: Any = None  # agent.probes.rdma.DeviceCache: fixed HCA facts between cycles
        self._nvml_links: Any = None  # agent.probes.nvml.LinkCache: NVLink facts kept between cycles
        self._lock = threading.Lock()
        self.latest: Snapshot | None = None

    def _open_backend(self) -> tuple[Any, str, str]:
        """(backend, why it could not be loaded, the error that broke opening it)."""
        try:
            return (*open_nvml_backend(self.config.nvml), "")
        except Exception as exc:  # a broken NVML is the nvml component failing
            log.warning("cannot open NVML (%s): %s", self.config.nvml, exc)
            return None, "", f"cannot open NVML: {_failure_text(exc)}"

    def link_modes(self, name: str) -> list[str]:
        """The link modes a NIC supports (ethtool; tests replace the reader). Asked once per
        interface name and MAC: what a NIC supports does not change while it is plugged in, and
        an ethtool query costs more than the rest of the net probe."""
        if self._link_modes is None:
            from agent.adapters.netlink import supported_link_modes

            self._link_modes = supported_link_modes
        mac = next((r.mac for r in self._last_links if r.name == name), None)
        key = (name, mac)
        if key not in self._link_mode_cache:
            if len(self._link_mode_cache) > 4096:  # interfaces come and go (veths): stay bounded
                self._link_mode_cache.clear()
            self._link_mode_cache[key] = self._link_modes(name)
        return self._link_mode_cache[key]

    @property
    def last_links(self) -> Sequence[Any]:
        """The netlink link records the net probe read this cycle."""
        return self._last_links

    @property
    def nvml_backend(self) -> Any:
        return self._backend

    def neighbour_table(self) -> Any:
        """The LLDP neighbour table the raw-socket listener feeds (made on first use)."""
        if self._table is None:
            from agent.probes.lldp import NeighbourTable

            self._table = NeighbourTable()
        return self._table

    def restore(self, previous: NodeReport) -> int:
        """Carries what a previous run of this agent knew and this run cannot see yet (the report it
        published, read back from the API at start): its LLDP neighbours, each for one TTL unless a
        fresh frame replaces it (NeighbourTable.carry), and the RDMA ports it had seen in use, so a
        port that went down across the restart is still judged failed, not unused. Returns how many
        neighbours were carried."""
        in_use = {
            (d.name, p.port)
            for d in previous.rdma
            for p in d.ports
            if p.state == "ACTIVE" or p.health in (Health.OK, Health.FAILED)
        }
        with self._lock:
            self._rdma_seen_active |= in_use
            return int(self.neighbour_table().carry(previous.lldp, self._clock()))

    def collect(self) -> NodeReport:
        """One full probe cycle; never raises for a probe's sake. Serialised across threads."""
        with self._lock:
            if self._probes is None:
                self._probes = [load_probe(spec) for spec in self._probe_specs]
            cycle = Cycle(now=self._clock(), config=self.config, host=self)
            stats: dict[str, ProbeStat] = {}
            for probe in self._probes:
                result, stats[probe.name] = timed(probe.name, lambda p=probe: p.run(cycle))  # type: ignore[misc]
                cycle.results[probe.name] = result
            report = self._report(cycle)
            totals = self.xid_watcher.counts() if self.xid_watcher is not None else {}
            cycles = self.latest.cycles + 1 if self.latest else 1
            self.latest = Snapshot(report, stats, self._clock(), totals, cycles)
            return report

    def _report(self, cycle: Cycle) -> NodeReport:
        health = {name: cycle.results[name].health for name in COMPONENTS if name in cycle.results}
        # A grey probe that itself failed (a bug, an unreadable tree) is not node health: it shows
        # in hypertopo_probe_success; the components keep what their own probes said.
        findings = latch(self.latest.report.findings if self.latest else (), cycle.findings)
        return NodeReport(
            node_name=self.config.node_name,
            health=fold_all(health, findings),
            host=cycle.value("host", None),
            nvml=cycle.value("nvml", None),
            rdma=tuple(cycle.value("rdma")),
            interfaces=tuple(cycle.value("net")),
            lldp=tuple(cycle.value("lldp")),
            findings=findings,
        )

    def probe_rdma(self) -> ProbeResult[Any]:
        from agent.probes import rdma

        if self._rdma_cache is None:
            self._rdma_cache = rdma.DeviceCache()
        read = rdma.probe(self.config.sysfs, self._rdma_cache)
        self._rdma_seen_active |= rdma.active_ports(read.value or ())  # once up, a port is in use
        return rdma.judge(read, seen_active=self._rdma_seen_active)

    def probe_net(self, rdma_devices: Sequence[Any] = ()) -> ProbeResult[Any]:
        from agent.probes import net

        if self._links is None:
            from agent.adapters.netlink import dump_links

            self._links = dump_links
        self._last_links = self._links()
        include = self.config.interfaces  # None: the fabric interfaces only (agent.probes.net)
        rdma_netdevs = {p.netdev for d in rdma_devices for p in d.ports if p.netdev}
        return net.probe(self._last_links, sysfs=self.config.sysfs, include=include,
                         fabric_only=include is None, rdma_netdevs=rdma_netdevs)  # fmt: skip

    def probe_nvml(self, rdma_devices: Sequence[Any]) -> ProbeResult[Any]:
        if self._backend_error:
            return ProbeResult.failed(self._backend_error)
        if self.config.nvml == "off":  # asked not to look: GPUs on the bus or not
            return ProbeResult.absent("NVML off (--nvml=off)")
        from agent.probes import nvml

        xids = self.xid_watcher.recent() if self.xid_watcher is not None else None
        if self._nvml_links is None:
            self._nvml_links = nvml.LinkCache()
        return nvml.probe(
            self._backend,
            sysfs=self.config.sysfs,
            rdma=tuple(rdma_devices),
            xids=xids,
            cache=self._nvml_links,
            now=self._clock(),
            load_error=self._backend_missing,
        )

    def probe_lldp(self, interfaces: Sequence[Any]) -> ProbeResult[Any]:
        from agent.probes import net

        # Neighbours of links that lost carrier are held: where a cut cable was plugged stays known.
        down = net.links_down(self._last_links, interfaces)
        table = self.neighbour_table()
        if interfaces:  # carried neighbours only of NICs still reported (a failed net probe says nothing)
            table.drop_carried({i.name for i in interfaces})
        result: ProbeResult[Any] = table.snapshot(self._clock(), links_down=down)
        if self.lldp_failure:
            result = ProbeResult(result.value, ComponentHealth(Health.FAILED, self.lldp_failure))
        elif self.lldp_listener is not None:
            result = self.lldp_listener.judge(result, net.lldp_quiet(self._last_links, interfaces))
        if self.config.lldpd_socket is None:
            return result
        return merge_lldpd(result, self._read_lldpd(), self.config.interfaces)

    def _read_lldpd(self) -> ProbeResult[Any]:
        from agent.adapters.lldpd_socket import LldpdReader

        reader = LldpdReader(self.config.lldpd_socket or Path(), lldpcli=self.config.lldpcli)
        return reader.probe()


class HostProbe:
    name = "host"

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        from agent.probes import host

        return host.probe(cycle.config.procfs)


class RdmaProbe:
    name = "rdma"

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        result: ProbeResult[Any] = cycle.host.probe_rdma()
        return result


class NetProbe:
    name = "net"

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        result: ProbeResult[Any] = cycle.host.probe_net(cycle.value("rdma"))
        return result


class NvmlProbe:
    name = "nvml"

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        result: ProbeResult[Any] = cycle.host.probe_nvml(cycle.value("rdma"))
        return result


class LldpProbe:
    name = "lldp"

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        result: ProbeResult[Any] = cycle.host.probe_lldp(cycle.value("net"))
        return result


def merge_lldpd(
    raw: ProbeResult[Any], lldpd: ProbeResult[Any], include: re.Pattern[str] | None
) -> ProbeResult[Any]:
    """Neighbours heard on the raw sockets plus those the host lldpd knows (NICs whose firmware
        consumes LLDP never pass frames to the kernel, but a host lldpd may still see them through
        the driver). An lldpd that cannot be read degrades the component with the reason; it never hides
    what the raw sockets saw."""
    seen = {(n.interface, n.chassis_id, n.port_id): n for n in raw.value or ()}
    for n in lldpd.value or ():
        if include is None or include.search(n.interface):
            seen.setdefault((n.interface, n.chassis_id, n.port_id), n)
    neighbours = tuple(seen[key] for key in sorted(seen))
    lldpd_ok = lldpd.health.state is Health.OK
    if raw.health.state is Health.FAILED:  # raw sockets deaf: lldpd is the only source left
        reason = f"raw sockets: {raw.health.reason}"
        if not lldpd_ok:
            reason += f"; host lldpd: {lldpd.health.reason}"
            return ProbeResult(neighbours, ComponentHealth(Health.FAILED, reason))
        return ProbeResult(neighbours, ComponentHealth(Health.DEGRADED, reason))
    if not lldpd_ok:  # asked for, so a missing socket is worth saying
        return ProbeResult(neighbours, ComponentHealth(Health.DEGRADED, f"host lldpd: {lldpd.health.reason}"))
    return ProbeResult(neighbours, raw.health)


def failed_components(report: NodeReport) -> list[str]:
    return sorted(name for name, h in report.health.items() if h.state is Health.FAILED)


def describe(health: Mapping[str, ComponentHealth]) -> str:
    """`nvml=absent (no NVML library), rdma=ok, ...` for one log line."""
    parts = []
    for name, h in sorted(health.items()):
        parts.append(f"{name}={h.state.value}" + (f" ({h.reason})" if h.reason else ""))
    return ", ".join(parts)
