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
* **closes** once, for `hold_seconds` on end (default 600), both the failed in the window and the
  nodes failed now stay below the threshold; or at once when an operator asks
  (`operator_close`), which also forgets the window so the nodes failed then are not counted
  again. A large outage that stays failed keeps it open until a person closes it.

Pure: the failed set, the tree and the time are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from aggregator.placement.topology import Topology

OPEN, CLOSED = "Open", "Closed"


@dataclass(frozen=True)
class BreakerPolicy:
    enabled: bool = True
    window_seconds: float = 300.0
    hold_seconds: float = 600.0
    fraction: float = 0.10
    threshold_nodes: int = 0  # 0: derived from the tree (module docstring)


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
        if recent >= limit or len(current) >= limit:
            self.calm_since = None
            return None
        self.calm_since = now if self.calm_since is None else self.calm_since
        if now - self.calm_since < self.policy.hold_seconds:
            return None
        return self._close("StormCleared", f"fewer than {limit} nodes failed for {self.policy.hold_seconds:.0f}s "
                                           f"({recent} within the window, {len(current)} now): fault evictions resume")

    def operator_close(self, now: float) -> Change | None:
        """An operator closes it: remediation resumes, and the nodes failed so far are not counted again."""
        self.entered.clear()
        if self.state == CLOSED:
            return None
        return self._close("OperatorClosed", f"closed by an operator ({len(self._failed)} nodes failed now): "
                                             "fault evictions resume")

    def _close(self, reason: str, message: str) -> Change:
        self.state, self.opened_at, self.calm_since = CLOSED, None, None
        return Change(CLOSED, reason, message)

    def next_look(self, now: float) -> float | None:
        """Seconds until the hold-down could end (None: nothing is timed)."""
        if self.state != OPEN or self.calm_since is None:
            return None
        return max(0.0, self.calm_since + self.policy.hold_seconds - now)
