"""What the aggregator refused of the reports, as metrics (aggregator.crosscheck).

A report the cross-checks refuse (one filed under another node's name, duplicate HCA GUIDs, LLDP
neighbours or an NVLink clique the fabric contradicts, a switch table entry the named host's own
report denies) is a standing fact of the inputs until the report changes. Its line is among the
pipeline's warnings (logged by the controller when they change, printed by `render`); here each is
counted once when it first appears (`hypertopo_aggregator_reports_refused_total{reason}`), not every
reconcile, and the ones standing now are a gauge (`hypertopo_aggregator_refused_claims{reason}`), so
an alert can fire on a node that keeps lying. The leader alone counts (a standby computes the same
findings; counted twice, a `sum` would double them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from aggregator.crosscheck import REASONS
from aggregator.graph import Finding

PREFIX = "hypertopo_aggregator"


class Refusals:
    """`on_new(finding)`: called once for each refusal when it first appears (the controller writes
    a Warning event on the refused report's NodeTopology)."""

    def __init__(self, registry: CollectorRegistry, on_new: Callable[[Finding], None] = lambda _: None) -> None:
        self.on_new = on_new
        self.refused = PromCounter(
            f"{PREFIX}_reports_refused",
            "Claims of NodeTopology reports refused by the cross-checks, counted when first seen, by reason",
            ["reason"],
            registry=registry,
        )
        self.standing = Gauge(
            f"{PREFIX}_refused_claims",
            "Claims of NodeTopology reports refused by the cross-checks now, by reason (leader only)",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:  # every series from the start: a rate() sees the first refusal
            self.refused.labels(reason=reason)
            self.standing.labels(reason=reason).set(0)
        self._seen: frozenset[Finding] = frozenset()

    def observe(self, findings: Iterable[Finding]) -> None:
        """One reconcile's findings: the new ones counted, the standing ones exported."""
        now = frozenset(findings)
        for finding in sorted(now - self._seen):
            self.refused.labels(reason=finding.reason).inc()
            self.on_new(finding)
        counts = Counter(f.reason for f in now)
        for reason in {*REASONS, *counts}:
            self.standing.labels(reason=reason).set(counts.get(reason, 0))
        self._seen = now
