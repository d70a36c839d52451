"""The scheduler's Prometheus metrics (registry injected; served on :9732 by
`agent.common.adapters.endpoints.serve`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

RECOVERY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 4 * 3600.0)


class _WholeTime:
    """`hypertopo_gang_whole_time_ratio`, read at scrape time from the gang watch: one series per
    gang it tracks, none once the gang ended (so the series count follows the live gangs)."""

    def __init__(self, ratios: Callable[[], Mapping[tuple[str, str], float]]) -> None:
        self.read = ratios

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "hypertopo_gang_whole_time_ratio",
            "Per gang: time with every member Running and FabricHealthy True over the time since it first ran whole.",
            labels=["namespace", "podgroup"])
        for (namespace, name), ratio in sorted(self.read().items()):
            family.add_metric([namespace, name], ratio)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.decisions = Counter(
            "hypertopo_scheduler_decisions", "Placement decisions by result (scheduled, unschedulable, waiting).",
            ["result"], registry=registry)
        self.decision_seconds = Histogram(
            "hypertopo_scheduler_decision_duration_seconds", "Time of one gang placement decision (core + filters).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0), registry=registry)
        self.bind_seconds = Histogram(
            "hypertopo_scheduler_gang_bind_duration_seconds", "Time to bind a whole gang (rollback included).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0), registry=registry)
        self.binds = Counter(
            "hypertopo_scheduler_binds", "Pod bindings by result (bound, failed, rolled_back).", ["result"],
            registry=registry)
        self.evictions = Counter(
            "hypertopo_scheduler_evictions", "Fault-driven evictions by outcome (evicted, blocked, gone, error).",
            ["outcome"], registry=registry)
        self.pending = Gauge("hypertopo_scheduler_pending_pods", "Pods of this scheduler waiting for a node.",
                             registry=registry)
        self.is_leader = Gauge("hypertopo_scheduler_is_leader",
                               "1 while this replica holds the scheduler's Lease (only the leader binds).",
                               registry=registry)
        self.failed_nodes = Gauge("hypertopo_scheduler_fabric_failed_nodes",
                                  "Nodes the scheduler treats as failed by the fabric.", registry=registry)
        self.gang_health = Gauge("hypertopo_gang_fabric_healthy",
                                 "Gangs hypertopo schedules or remediates, by their FabricHealthy status.", ["status"],
                                 registry=registry)
        self.recovery_seconds = Histogram(
            "hypertopo_gang_recovery_seconds",
            "Fault seen on a gang -> every replacement bound (stage=bound) -> every member Running (stage=running).",
            ["stage"], buckets=RECOVERY_BUCKETS, registry=registry)
        self.tier_after_recovery = Counter(
            "hypertopo_gang_tier_after_recovery",
            "Recoveries by the gang's tier (lowest HyperNode holding every member) before the fault and once bound again.",
            ["tier_before", "tier_after"], registry=registry)
        self.breaker_open = Gauge("hypertopo_remediation_breaker_open",
                                  "1 while the fault-storm breaker holds fault evictions back.", registry=registry)
        self.breaker_trips = Counter("hypertopo_remediation_breaker_trips",
                                     "Times the fault-storm breaker opened.", registry=registry)
        self.breaker_recent = Gauge("hypertopo_remediation_breaker_failed_in_window",
                                    "Nodes that failed within the breaker's window.", registry=registry)
        self.breaker_threshold = Gauge("hypertopo_remediation_breaker_threshold",
                                       "Nodes failing within the window that open the breaker.", registry=registry)
        self.breaker_withheld = Counter("hypertopo_remediation_breaker_withheld_evictions",
                                        "Fault evictions the open breaker held back: queued ones withdrawn when it "
                                        "opened, and evictions of preemptible pods from a gang's spares while open.",
                                        registry=registry)
        self.spares_reserved = Gauge("hypertopo_spare_nodes_reserved",
                                     "Nodes reserved as warm spares for gangs (hypertopo.io/spare-nodes).",
                                     registry=registry)
        self.spares_borrowed = Gauge("hypertopo_spare_nodes_borrowed",
                                     "Reserved spare nodes running preemptible pods (evicted first when needed).",
                                     registry=registry)
        self.spare_gangs = Gauge("hypertopo_spare_gangs", "Gangs holding at least one reserved spare node.",
                                 registry=registry)

    def watch_gangs(self, ratios: Callable[[], Mapping[tuple[str, str], float]]) -> None:
        """Serves the per-gang whole-time ratios (`_WholeTime`) from `ratios`."""
        self.registry.register(_WholeTime(ratios))
