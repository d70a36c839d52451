"""A breaker against fault storms: fault evictions stop while too many nodes fail at once.

Why: one failed node or one dead leaf switch is what fault remediation is for. A whole spine's
nodes, or a tenth of the cluster, failing within minutes is far more often a false alarm (a
monitoring fault, a switch reboot, an aggregator that lost its feed) than that many real faults,
and acting on it would evict every gang it touches. So the breaker opens, remediation evicts
nothing more (no pod evictions, no Volcano RestartJob, no moves off degraded nodes), and it waits
for the storm to end instead.

The rule, precisely (all counts are distinct nodes):

* **failed in the window**: the nodes that *entered* the failed set (the rescheduler's
  `failed_nodes`: the fabric taint, a failed HyperNode) within the last `window_seconds`
  (default 300). A node that fails, heals and fails again counts once.
* **threshold**: `threshold_nodes` when set, else `max(floor, min(spine, tenth))` on the tree the
  scheduler sees: `spine` is the node count of the largest HyperNode on the second tier from the
  bottom ("a whole spine's worth"; every node when the tree has one tier), `tenth` is
  `ceil(fraction x nodes)` (fraction default 0.10) and `floor` is the largest lowest-tier
  HyperNode's node count plus one, so a whole leaf failing (a single switch fault) never opens it.
* **opens** when failed in the window reaches the threshold.
* **settles**: a node is acted on only `settle_seconds` (default 3) after it entered the failed
  set. The failures of one storm reach the scheduler as separate watch events (one taint or one
  HyperNode condition at a time, over a second or two); without the wait the first of them would
  be evicted for before the rest are counted. A single fault is remediated that much later.
* **closes** once the nodes failed now have stayed below the threshold for `hold_seconds` on end
  (default 600; any return to the threshold starts the hold-down again), or at once when an
  operator asks (`operator_close`). Either way the failures counted so far are forgotten, so the
  same storm does not open it again; only new failures count. A large outage that stays failed
  keeps it open until a person closes it.

Pure: the failed set, the tree and the time are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aggregator.placement.core.topology import Topology

OPEN, CLOSED = "Open", "Closed"


@dataclass(frozen=True)
class BreakerPolicy:
    enabled: bool = True
    window_seconds: float = 300.0
    hold_seconds: float = 600.0
    fraction: float = 0.10
    threshold_nodes: int = 0  # 0: derived from the tree (module docstring)
    settle_seconds: float = 3.0  # a newly failed node is acted on only this long after it failed


def threshold(topology: Topology, policy: BreakerPolicy) -> int:
    """The number of nodes failing within the window that opens the breaker."""
    if policy.threshold_nodes > 0:
        return policy.threshold_nodes
    seen = len(topology.node_leaf)
    tiers = topology.tiers
    leaf_sizes = [len(topology.domains[d].nodes) for d in topology.by_tier.get(tiers[0], ())] if tiers else []
    floor = max(leaf_sizes, default=0) + 1
    if len(tiers) > 1:
        spine = max((len(topology.nodes_of(d)) for d in topology.by_tier[tiers[1]]), default=seen)
    else:
        spine = seen
    tenth = math.ceil(policy.fraction * seen)
    return max(floor, min(spine, tenth), 1)


@dataclass(frozen=True)
class Change:
    """A transition of the breaker: its new state and why, in words."""

    state: str
    reason: str  # StormDetected, StormCleared, OperatorClosed
    message: str


@dataclass
class Breaker:
    policy: BreakerPolicy
    state: str = CLOSED
    opened_at: float | None = None
    calm_since: float | None = None  # since when the close conditions have held (while open)
    entered: dict[str, float] = field(default_factory=dict)  # node -> when it last entered the failed set
    _failed: frozenset[str] = frozenset()
    last: tuple[int, int, int] = (0, 0, 0)  # (failed in window, failed now, threshold) at the last look

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    def observe(self, failed: Iterable[str], limit: int, now: float) -> Change | None:
        """Looks at the failed set at `now` with threshold `limit`; the transition, if any."""
        current = frozenset(failed)
        for node in current - self._failed:
            self.entered[node] = now
        self._failed = current
        for node in [n for n, t in self.entered.items() if now - t > self.policy.window_seconds]:
            del self.entered[node]
        recent = len(self.entered)
        self.last = (recent, len(current), limit)
        if not self.policy.enabled:
            return None
        if self.state == CLOSED:
            if recent < limit:
                return None
            self.state, self.opened_at, self.calm_since = OPEN, now, None
            return Change(OPEN, "StormDetected",
                          f"{recent} nodes failed within {self.policy.window_seconds:.0f}s (threshold {limit}, "
                          f"{len(current)} failed now): fault evictions stopped")
        if len(current) >= limit:
            self.calm_since = None
            return None
        self.calm_since = now if self.calm_since is None else self.calm_since
        if now - self.calm_since < self.policy.hold_seconds:
            return None
        return self._close("StormCleared", f"fewer than {limit} nodes failed for {self.policy.hold_seconds:.0f}s "
                                           f"({len(current)} now): fault evictions resume")

    def operator_close(self, now: float) -> Change | None:
        """An operator closes it: remediation resumes, and the nodes failed so far are not counted again."""
        if self.state == CLOSED:
            self.entered.clear()
            return None
        return self._close("OperatorClosed", f"closed by an operator ({len(self._failed)} nodes failed now): "
                                             "fault evictions resume")

    def _close(self, reason: str, message: str) -> Change:
        """Closes; the failures counted so far are forgotten (they were the storm). A node still
        failed counts as settled: remediation acts on it at once."""
        self.entered.clear()
        self.state, self.opened_at, self.calm_since = CLOSED, None, None
        return Change(CLOSED, reason, message)

    def ripe(self, failed: Mapping[str, str], now: float) -> dict[str, str]:
        """The failed nodes remediation may act on now: none while open; else those failed for at
        least `settle_seconds` (a node failed before the window began has settled long ago)."""
        if self.state == OPEN:
            return {}
        if not self.policy.enabled:
            return dict(failed)
        settle = self.policy.settle_seconds
        return {n: why for n, why in failed.items() if now - self.entered.get(n, float("-inf")) >= settle}

    def next_look(self, now: float) -> float | None:
        """Seconds until something timed happens: the hold-down may end, or a failed node settles
        (None: nothing is timed)."""
        waits = []
        if self.state == OPEN and self.calm_since is not None:
            waits.append(self.calm_since + self.policy.hold_seconds - now)
        if self.state == CLOSED and self.policy.enabled:
            waits += [t + self.policy.settle_seconds - now for n, t in self.entered.items()
                      if n in self._failed and now - t < self.policy.settle_seconds]
        return max(0.0, min(waits)) if waits else None
