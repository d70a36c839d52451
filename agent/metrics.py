"""The agent's /metrics: a prometheus_client custom collector over the latest probe snapshot.

The NodeTopology object carries stable facts and health only; everything that moves (error counters,
XID counts, probe durations, publish counts) is served here instead. The collector keeps no state of
its own: each scrape maps the latest `Snapshot` (an immutable report + per-probe stats) and the
publisher's counters to metric families, so a scrape never waits for a probe.

Labels follow dcgm-exporter where they overlap (`gpu`, `UUID`, `pci_bus_id`, `Hostname`), so
dashboards can join the two exporters; names carry the `hypertopo_` prefix and base-unit suffixes
(`_seconds`, `_bytes_per_second`, `_total`). dcgm-exporter's `modelName` is the one label kept out:
`promtool check metrics` rejects camelCase label names, so the model is `model_name` on
`hypertopo_gpu_info` only (join on `UUID`), which also keeps every per-link series shorter.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.collect import Snapshot
from agent.common.report import Finding, Gpu, Health, NodeReport

FABRIC_STATES = ("not-supported", "not-started", "in-progress", "completed")
HEALTH_STATES = tuple(h.value for h in Health)
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "Hostname"]
# sysfs counter names that count errors (IB `counters/` and mlx5 `hw_counters/`); the data and
# packet counters are traffic, which node_exporter already serves.
RDMA_ERROR_COUNTER = re.compile(r"err|discard|drop|downed|integrity|overrun|violation|timeout|out_of_")


@dataclass(frozen=True)
class PublishCounts:
    writes: int = 0
    errors: int = 0


def package_version() -> str:
    try:
        return metadata.version("hypertopo")
    except metadata.PackageNotFoundError:
        return "unknown"


class AgentMetrics(Collector):
    """Yields the agent's metric families from `snapshot()` and `publish_counts()` at scrape time."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot | None],
        publish_counts: Callable[[], PublishCounts] = PublishCounts,
        *,
        version: str | None = None,
        python_version: str | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._publish_counts = publish_counts
        self._version = version or package_version()
        self._python = python_version or platform.python_version()

    def collect(self) -> Iterator[Metric]:
        yield self._build_info()
        yield from self._publish()
        snap = self._snapshot()
        if snap is None:
            return
        yield from probe_families(snap)
        yield from health_families(snap.report)
        yield from gpu_families(snap.report, snap.xid_totals)
        yield from rdma_families(snap.report)
        yield from interface_families(snap.report)
        yield from degraded_families(snap.report)

    def _build_info(self) -> Metric:
        info = GaugeMetricFamily(
            "hypertopo_build_info", "hypertopo agent build; value is 1.", labels=["version", "python_version"]
        )
        info.add_metric([self._version, self._python], 1)
        return info

    def _publish(self) -> Iterator[Metric]:
        counts = self._publish_counts()
        writes = CounterMetricFamily(
            "hypertopo_publish_writes", "NodeTopology applies accepted by the API server.", counts.writes
        )
        errors = CounterMetricFamily(
            "hypertopo_publish_errors",
            "NodeTopology applies that failed (retried with backoff).",
            counts.errors,
        )
        yield from (writes, errors)


def probe_families(snap: Snapshot) -> Iterator[Metric]:
    success = GaugeMetricFamily(
        "hypertopo_probe_success",
        "Whether the probe ran without failing in the last cycle.",
        labels=["probe"],
    )
    duration = GaugeMetricFamily(
        "hypertopo_probe_duration_seconds", "How long the probe took in the last cycle.", labels=["probe"]
    )
    for name, stat in sorted(snap.stats.items()):
        success.add_metric([name], 1 if stat.success else 0)
        duration.add_metric([name], stat.duration_seconds)
    cycles = CounterMetricFamily(
        "hypertopo_probe_cycles", "Probe cycles run (at start, on events, on the interval).", snap.cycles
    )
    yield from (success, duration, cycles)


def health_families(report: NodeReport) -> Iterator[Metric]:
    component = GaugeMetricFamily(
        "hypertopo_component_health",
        "Per-component health state (1 for the current state); absent means no such hardware.",
        labels=["component", "state"],
    )
    for name, health in sorted(report.health.items()):
        for state in HEALTH_STATES:
            component.add_metric([name, state], 1 if health.state.value == state else 0)
    yield component


def _gpu_labels(report: NodeReport, gpu: Gpu) -> list[str]:
    return [str(gpu.index), gpu.uuid, gpu.pci_bus_id, report.node_name]


def gpu_families(report: NodeReport, xid_totals: Mapping[int, Mapping[int, int]]) -> Iterator[Metric]:
    """GPU families; XID counts are the watcher's cumulative totals (the report holds a window)."""
    gpus = report.nvml.gpus if report.nvml else ()
    if not gpus:
        return
    yield _gpu_info(report, gpus)
    yield from _nvlink_families(report, gpus)
    yield from _gpu_fabric_families(report, gpus)
    yield from _gpu_health_families(report, gpus, xid_totals)


def _gpu_info(report: NodeReport, gpus: Iterable[Gpu]) -> Metric:
    info = GaugeMetricFamily(
        "hypertopo_gpu_info",
        "GPUs on the node with their closest RDMA devices; value is 1.",
        labels=[*GPU_LABELS, "model_name", "numa_node", "nics"],
    )
    for gpu in gpus:
        numa = "" if gpu.numa_node is None else str(gpu.numa_node)
        info.add_metric([*_gpu_labels(report, gpu), gpu.name, numa, ",".join(gpu.nics)], 1)
    return info


def _nvlink_families(report: NodeReport, gpus: Iterable[Gpu]) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "hypertopo_nvlink_up",
        "NVLink link state per GPU and link (1 up, 0 down).",
        labels=[*GPU_LABELS, "link", "remote_type"],
    )
    errors = CounterMetricFamily(
        "hypertopo_nvlink_errors",
        "NVLink error counters per GPU and link, by counter.",
        labels=[*GPU_LABELS, "link", "counter"],
    )
    for gpu in gpus:
        base = _gpu_labels(report, gpu)
        for link in gpu.nvlinks:
            up.add_metric([*base, str(link.link), link.remote_type or ""], 1 if link.state == "up" else 0)
            for counter, value in sorted(link.error_counters.items()):
                errors.add_metric([*base, str(link.link), counter], value)
    yield from (up, errors)


def _gpu_fabric_families(report: NodeReport, gpus: Iterable[Gpu]) -> Iterator[Metric]:
    state = GaugeMetricFamily(
        "hypertopo_gpu_fabric_state",
        "Multi-node NVLink fabric registration state per GPU (1 for the current state).",
        labels=[*GPU_LABELS, "state"],
    )
    info = GaugeMetricFamily(
        "hypertopo_gpu_fabric_info",
        "Multi-node NVLink fabric membership per GPU (cluster UUID and clique); value is 1.",
        labels=[*GPU_LABELS, "cluster_uuid", "clique_id", "status"],
    )
    for gpu in gpus:
        if gpu.fabric is None:
            continue
        base = _gpu_labels(report, gpu)
        for name in FABRIC_STATES:
            state.add_metric([*base, name], 1 if gpu.fabric.state == name else 0)
        fab = gpu.fabric
        info.add_metric([*base, fab.cluster_uuid, str(fab.clique_id), fab.status], 1)
    yield from (state, info)


def _gpu_health_families(
    report: NodeReport, gpus: Iterable[Gpu], xid_totals: Mapping[int, Mapping[int, int]]
) -> Iterator[Metric]:
    xid = CounterMetricFamily(
        "hypertopo_gpu_xid_events",
        "XID events seen per GPU since the agent started, by XID.",
        labels=[*GPU_LABELS, "xid"],
    )
    ecc = CounterMetricFamily(
        "hypertopo_gpu_uncorrected_ecc_errors",
        "Uncorrected ECC errors per GPU (volatile).",
        labels=GPU_LABELS,
    )
    health = GaugeMetricFamily(
        "hypertopo_gpu_health", "GPU health state (1 for the current state).", labels=[*GPU_LABELS, "state"]
    )
    for gpu in gpus:
        base = _gpu_labels(report, gpu)
        for code, count in sorted(xid_totals.get(gpu.index, {}).items()):
            xid.add_metric([*base, str(code)], count)
        if gpu.uncorrected_ecc is not None:
            ecc.add_metric(base, gpu.uncorrected_ecc)
        for name in HEALTH_STATES:
            health.add_metric([*base, name], 1 if gpu.health.state.value == name else 0)
    yield from (xid, ecc, health)


def rdma_families(report: NodeReport) -> Iterator[Metric]:
    if not report.rdma:
        return
    port_labels = ["device", "port", "link_layer", "netdev"]
    up = GaugeMetricFamily(
        "hypertopo_rdma_port_up",
        "RDMA port state is ACTIVE (1) or not (0); ports never cabled (health unused) are left out.",
        labels=port_labels,
    )
    info = GaugeMetricFamily(
        "hypertopo_rdma_port_info",
        "RDMA port logical and physical state and health (ok, failed, unused); value is 1.",
        labels=[*port_labels, "state", "phys_state", "health"],
    )
    rate = GaugeMetricFamily(
        "hypertopo_rdma_port_rate_bytes_per_second", "RDMA port link rate.", labels=port_labels
    )
    errors = CounterMetricFamily(
        "hypertopo_rdma_port_errors",
        "RDMA port error counters from sysfs, by counter.",
        labels=[*port_labels, "counter"],
    )
    for dev in report.rdma:
        for port in dev.ports:
            labels = [dev.name, str(port.port), port.link_layer, port.netdev or ""]
            if port.health is not Health.UNUSED:  # a port never cabled is not a port down
                up.add_metric(labels, 1 if port.state == "ACTIVE" else 0)
            health = port.health.value if port.health else ""
            info.add_metric([*labels, port.state, port.phys_state, health], 1)
            if port.rate_gbps is not None:
                rate.add_metric(labels, port.rate_gbps * 1e9 / 8)
            for counter, value in sorted(port.counters.items()):
                if RDMA_ERROR_COUNTER.search(counter):
                    errors.add_metric([*labels, counter], value)
    yield from (up, info, rate, errors)


def interface_families(report: NodeReport) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "hypertopo_interface_up",
        "Network interface operational state is up (1) or not (0).",
        labels=["interface", "kind"],
    )
    for iface in report.interfaces:
        up.add_metric([iface.name, iface.kind or ""], 1 if iface.oper_state == "up" else 0)
    neighbours = GaugeMetricFamily(
        "hypertopo_lldp_neighbour_info",
        "LLDP neighbour seen on an interface (the switch and port it is cabled to); value is 1.",
        labels=["interface", "chassis_id", "port_id", "system_name", "port_description"],
    )
    for n in report.lldp:
        neighbours.add_metric(
            [n.interface, n.chassis_id, n.port_id, n.system_name or "", n.port_description or ""], 1
        )
    yield from (up, neighbours)


def _findings_by(report: NodeReport, component: str) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for finding in report.findings:
        if finding.component == component:
            out.setdefault(finding.subject, []).append(finding)
    return out


def degraded_families(report: NodeReport) -> Iterator[Metric]:
    """`hypertopo_*_degraded`: 1 where a grey-failure finding (agent.probes.grey) stands, with the
    labels of the matching health metric, so alerts and dashboards join them; and one
    `hypertopo_grey_finding` sample per finding with its kind and severity."""
    component = GaugeMetricFamily(
        "hypertopo_component_degraded", "Component health is degraded (1) or not (0).", labels=["component"]
    )
    for name, health in sorted(report.health.items()):
        component.add_metric([name], 1 if health.state is Health.DEGRADED else 0)
    gpu = GaugeMetricFamily(
        "hypertopo_gpu_degraded", "A grey-failure finding stands on the GPU or its NVLinks (1) or not (0).",
        labels=GPU_LABELS,
    )  # fmt: skip
    nvml = _findings_by(report, "nvml")
    for g in report.nvml.gpus if report.nvml else ():
        mine = any(s == f"gpu{g.index}" or s.startswith(f"gpu{g.index}/") for s in nvml)
        gpu.add_metric(_gpu_labels(report, g), 1 if mine else 0)
    port = GaugeMetricFamily(
        "hypertopo_rdma_port_degraded", "A grey-failure finding stands on the RDMA port (1) or not (0).",
        labels=["device", "port", "link_layer", "netdev"],
    )  # fmt: skip
    rdma = _findings_by(report, "rdma")
    for dev in report.rdma:
        for p in dev.ports:
            if p.health is not Health.UNUSED:
                degraded = f"{dev.name}/{p.port}" in rdma
                port.add_metric([dev.name, str(p.port), p.link_layer, p.netdev or ""], 1 if degraded else 0)
    iface = GaugeMetricFamily(
        "hypertopo_interface_degraded", "A grey-failure finding stands on the interface (1) or not (0).",
        labels=["interface", "kind"],
    )  # fmt: skip
    net = _findings_by(report, "net")
    for i in report.interfaces:
        iface.add_metric([i.name, i.kind or ""], 1 if i.name in net else 0)
    finding = GaugeMetricFamily(
        "hypertopo_grey_finding", "A grey-failure finding in the NodeTopology; value is 1.",
        labels=["component", "subject", "kind", "severity"],
    )  # fmt: skip
    for f in report.findings:
        finding.add_metric([f.component, f.subject, f.kind, f.severity.value], 1)
    yield from (component, gpu, port, iface, finding)
