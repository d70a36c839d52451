"""The scheduler's Prometheus metrics (registry injected; served on :9732 by
`agent.adapters.endpoints.serve`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
