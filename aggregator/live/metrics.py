"""The aggregator's /metrics, /healthz and /readyz (port 9731).

What an operator needs to trust the controller: how many HyperNodes per tier are Ready, how long a
reconcile takes, how many API writes it makes (an idle cluster must show none), how many agents are
stale, and which replica leads. The registry is injected so tests read a fresh one.
HyperNode counts are a snapshot replaced after each reconcile and exported by a collector, so a
scrape never sees a half-updated set.

The cluster-state gauges (HyperNodes, stale agents, name clashes) are exported by the leader only.
Every replica keeps warm caches and could count the same HyperNodes, but with the shipped two
replicas a dashboard's `sum` and the alerts would then see every HyperNode twice; a standby (and a
leader that lost its lease) exports none of them, so a plain `sum` over all replicas is the truth.
Per-replica facts (is_leader, reconcile timings, API writes, errors) are exported by every replica.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from aggregator.tree.explain import EMPTY_REASONS, NODE_REASONS, Explanation

PREFIX = "hypertopo_aggregator"


CONDITION_TYPES = ("Ready", "FabricDegraded")  # aggregator.health.READY, FABRIC_DEGRADED


def _condition_of(obj: Mapping[str, Any], kind: str = "Ready") -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status", "Unknown"))
    return "Unknown"


def _ready_of(obj: Mapping[str, Any]) -> str:
    return _condition_of(obj, "Ready")


class _ClusterState(Collector):
    """HyperNodes by tier / tier name / Ready, stale agents and name clashes, as one snapshot;
    nothing at all while withdrawn (this replica does not lead)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] | None = None  # None: withdrawn
        self._conditions: Counter[tuple[str, str, str, str]] = Counter()  # tier, name, type, status
        self._stale_agents = 0
        self._clashes = 0

    def publish(self, hypernodes: Iterable[Mapping[str, Any]], *, stale_agents: int, clashes: int) -> None:
        counts: Counter[tuple[str, str, str]] = Counter()
        conditions: Counter[tuple[str, str, str, str]] = Counter()
        for obj in hypernodes:
            spec = obj.get("spec") or {}
            tier, name = str(spec.get("tier", "")), str(spec.get("tierName", ""))
            counts[(tier, name, _ready_of(obj))] += 1
            for kind in CONDITION_TYPES:
                conditions[(tier, name, kind, _condition_of(obj, kind))] += 1
        with self._lock:
            self._counts, self._stale_agents, self._clashes = counts, stale_agents, clashes
            self._conditions = conditions

    def withdraw(self) -> None:
        with self._lock:
            self._counts = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            counts, stale, clashes = self._counts, self._stale_agents, self._clashes
            conditions = self._conditions
        if counts is None:
            return
        family = GaugeMetricFamily(
            f"{PREFIX}_hypernodes",
            "HyperNodes owned by hypertopo, by tier, tier name and Ready condition status (leader only)",
            labels=["tier", "tier_name", "ready"],
        )
        for (tier, name, ready), count in sorted(counts.items()):
            family.add_metric([tier, name, ready], count)
        yield family
        by_condition = GaugeMetricFamily(
            f"{PREFIX}_hypernode_conditions",
            "HyperNodes owned by hypertopo, by tier, tier name, condition type (Ready, FabricDegraded) "
            "and its status (leader only)",
            labels=["tier", "tier_name", "condition", "status"],
        )
        for (tier, name, kind, status), count in sorted(conditions.items()):
            by_condition.add_metric([tier, name, kind, status], count)
        yield by_condition
        yield GaugeMetricFamily(
            f"{PREFIX}_stale_agents",
            "Nodes with a NodeTopology whose agent pod is missing or not Ready (leader only)",
            value=stale,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_hypernode_name_clashes",
            "Desired HyperNode names taken by objects without hypertopo's ownership labels (leader only)",
            value=clashes,
        )


class AggregatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._state = _ClusterState()
        r.register(self._state)
        self.reconcile_seconds = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Time of one reconcile: pipeline compute, diff and the API writes it needed",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.api_writes = PromCounter(
            f"{PREFIX}_api_writes", "Successful API writes by verb and resource", ["verb", "resource"], registry=r
        )
        self.reconcile_errors = PromCounter(
            f"{PREFIX}_reconcile_errors", "Reconcile steps that failed (API errors, clashes)", ["kind"], registry=r
        )
        self.is_leader = Gauge(f"{PREFIX}_is_leader", "1 while this replica holds the leader lease", registry=r)
        self.tree_empty_reason = Gauge(
            f"{PREFIX}_tree_empty_reason",
            "1 for the reason the HyperNode tree is empty (no_fabric_source, no_lldp_neighbours, ...; "
            "aggregator.tree.explain), 0 for every other reason; all 0 while the tree has HyperNodes",
            ["reason"],
            registry=r,
        )
        self.nodes_unplaced = Gauge(
            f"{PREFIX}_nodes_unplaced", "Nodes in no HyperNode, by reason (aggregator.tree.explain)", ["reason"], registry=r
        )
        self.structure_held_nodes = Gauge(
            f"{PREFIX}_structure_held_nodes",
            "Nodes whose report lost cabling (LLDP neighbours, RDMA devices, NVLink domain) and whose previous "
            "structural facts are kept for --structural-hold-down (aggregator.live.structural_hold)",
            registry=r,
        )

    def count_write(self, verb: str, resource: str) -> None:
        self.api_writes.labels(verb=verb, resource=resource).inc()

    def publish_state(
        self, hypernodes: Sequence[Mapping[str, Any]], *, stale_agents: int = 0, clashes: int = 0
    ) -> None:
        """The leader's view of the cluster after a reconcile (replaces the last one)."""
        self._state.publish(hypernodes, stale_agents=stale_agents, clashes=clashes)

    def withdraw_state(self) -> None:
        """This replica does not lead (any more): export no cluster-state gauges."""
        self._state.withdraw()

    def publish_explanation(self, explanation: Explanation) -> None:
        """Why the tree is empty (one reason at 1) and how many nodes are in no HyperNode, by reason."""
        for reason in EMPTY_REASONS:
            self.tree_empty_reason.labels(reason=reason).set(1 if explanation.empty_reason == reason else 0)
        for reason in NODE_REASONS:
            self.nodes_unplaced.labels(reason=reason).set(len(explanation.unplaced.get(reason, ())))

    def set_leader(self, leading: bool) -> None:
        self.is_leader.set(1 if leading else 0)
        if not leading:
            self.withdraw_state()
