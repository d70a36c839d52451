"""Health: from each member node's state to a HyperNode's `Ready` condition, with flap damping.

A scheduler placing a gang on a domain needs to know whether the domain can carry it: a rack with
a failed NVLink switch tray, or a leaf whose nodes lost their RDMA ports, should stop attracting
jobs. So each member is judged from what its agent reports (failed NVLink / RDMA / link health),
from its Node's Ready condition, and from whether its agent is alive at all (an agent gone or a
missing report means we do not know, which is not the same as healthy). A domain is Ready=False
once its unhealthy members exceed a threshold (a fraction below 1, or a count from 1 up), Unknown
when the unknown members could push it over, True otherwise.

Conditions flip only after the new state has held for `hold_down_seconds` (a link that flaps
every few seconds must not make the scheduler thrash), and `lastTransitionTime` moves only on a
real transition. Time is a parameter (`now`, seconds since the epoch), never read from a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent.report import Health, NodeReport

FABRIC_COMPONENTS = {"nvml": "NVLink", "rdma": "RDMA", "net": "link"}
MAX_NAMED = 5


class MemberState(enum.StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class MemberHealth:
    state: MemberState
    problems: tuple[str, ...] = ()  # e.g. ("NVLink failed: link 3 down", "Node NotReady")
    causes: frozenset[str] = frozenset()  # "NVLink", "RDMA", "link", "NodeNotReady", "AgentGone", ...


HEALTHY = MemberHealth(MemberState.HEALTHY)
MISSING = MemberHealth(MemberState.UNKNOWN, ("no NodeTopology report",), frozenset({"ReportMissing"}))


def member_health(
    report: NodeReport | None, *, node_ready: bool | None, agent_alive: bool | None
) -> MemberHealth:
    """One node's health. `None` for node_ready/agent_alive means "not tracked"."""
    if agent_alive is False:
        return MemberHealth(MemberState.UNKNOWN, ("agent not running",), frozenset({"AgentGone"}))
    if report is None:
        return MemberHealth(MemberState.UNKNOWN, ("no NodeTopology report",), frozenset({"ReportMissing"}))
    problems: list[str] = []
    causes: set[str] = set()
    for component, label in FABRIC_COMPONENTS.items():
        health = report.health.get(component)
        if health is not None and health.state in (Health.FAILED, Health.DEGRADED):
            detail = f": {health.reason}" if health.reason else ""
            problems.append(f"{label} {health.state.value}{detail}")
            causes.add(label)
    domain = report.nvml.domain if report.nvml else None
    if domain is not None and domain.state != "completed" and "NVLink" not in causes:
        problems.append(f"NVLink fabric {domain.state}")
        causes.add("NVLink")
    if node_ready is False:
        problems.append("Node NotReady")
        causes.add("NodeNotReady")
    if problems:
        return MemberHealth(MemberState.UNHEALTHY, tuple(problems), frozenset(causes))
    return HEALTHY


@dataclass(frozen=True)
class Threshold:
    """How many unhealthy members a domain tolerates: a fraction (0 <= v < 1) or a count (v >= 1)."""

    value: float = 0.0

    def __post_init__(self) -> None:
        if self.value < 0 or (self.value >= 1 and self.value != int(self.value)):
            raise ValueError(
                f"threshold must be a fraction in [0, 1) or a whole count >= 1, not {self.value}"
            )

    def exceeded(self, bad: int, total: int) -> bool:
        if self.value >= 1:
            return bad > self.value
        return total > 0 and bad / total > self.value

    def describe(self) -> str:
        return f"{int(self.value)} nodes" if self.value >= 1 else f"{self.value:.0%} of nodes"


@dataclass(frozen=True)
class Condition:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition: float = 0.0

    def to_wire(self, observed_generation: int | None = None) -> dict[str, object]:
        stamp = datetime.fromtimestamp(self.last_transition, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        wire: dict[str, object] = {
            "type": "Ready",
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": stamp,
        }
        if observed_generation is not None:
            wire["observedGeneration"] = observed_generation
        return wire


def _named(items: list[tuple[str, MemberHealth]]) -> str:
    shown = "; ".join(f"{node}: {', '.join(h.problems)}" for node, h in items[:MAX_NAMED])
    more = len(items) - MAX_NAMED
    return shown + (f"; and {more} more" if more > 0 else "")


def _reason(bad: list[tuple[str, MemberHealth]], default: str) -> str:
    causes = set().union(*(h.causes for _, h in bad))
    single = {
        "NVLink": "NVLinkFailed",
        "RDMA": "RDMAFailed",
        "link": "LinkFailed",
        "NodeNotReady": "NodesNotReady",
        "AgentGone": "AgentsGone",
        "ReportMissing": "ReportsMissing",
    }
    return single[next(iter(causes))] if len(causes) == 1 and next(iter(causes)) in single else default


def evaluate(members: Iterable[str], health: Mapping[str, MemberHealth], threshold: Threshold) -> Condition:
    """The Ready condition a domain deserves now (before hold-down)."""
    bad: list[tuple[str, MemberHealth]] = []
    unknown: list[tuple[str, MemberHealth]] = []
    total = 0
    for node in members:
        total += 1
        state = health.get(node, MISSING)
        if state.state is MemberState.UNHEALTHY:
            bad.append((node, state))
        elif state.state is MemberState.UNKNOWN:
            unknown.append((node, state))
    return judge(total, bad, unknown, threshold)


def judge(
    total: int,
    bad: list[tuple[str, MemberHealth]],
    unknown: list[tuple[str, MemberHealth]],
    threshold: Threshold,
) -> Condition:
    """The condition for a domain of `total` nodes with these unhealthy and unknown members."""
    bad = sorted(bad, key=lambda item: item[0])
    unknown = sorted(unknown, key=lambda item: item[0])
    limit = threshold.describe()
    if threshold.exceeded(len(bad), total):
        return Condition(
            "False",
            _reason(bad, "MembersUnhealthy"),
            f"{len(bad)} of {total} nodes unhealthy (tolerates {limit}): {_named(bad)}",
        )
    if threshold.exceeded(len(bad) + len(unknown), total):
        return Condition(
            "Unknown",
            _reason(unknown, "MembersUnknown"),
            f"{len(unknown)} of {total} nodes not reporting (tolerates {limit}): "
            f"{_named(unknown)}; check the hypertopo-agent pods on them",
        )
    if bad or unknown:
        return Condition(
            "True",
            "WithinThreshold",
            f"{len(bad)} unhealthy and {len(unknown)} unknown of {total} nodes, "
            f"within tolerance ({limit}): {_named(bad + unknown)}",
        )
    return Condition("True", "MembersHealthy", f"all {total} nodes healthy")


@dataclass
class _Track:
    published: Condition
    pending: Condition | None = None
    pending_since: float = 0.0


@dataclass
class HoldDown:
    """Publishes a new condition status only after it held `seconds`; keeps lastTransitionTime."""

    seconds: float = 0.0
    tracks: dict[str, _Track] = field(default_factory=dict)

    def observe(self, key: str, wanted: Condition, now: float) -> Condition:
        track = self.tracks.get(key)
        if track is None:  # first sight: nothing to damp against
            published = Condition(wanted.status, wanted.reason, wanted.message, now)
            self.tracks[key] = _Track(published)
            return published
        current = track.published
        if wanted.status == current.status:
            track.pending = None
            track.published = Condition(wanted.status, wanted.reason, wanted.message, current.last_transition)
            return track.published
        if track.pending is None or track.pending.status != wanted.status:
            track.pending, track.pending_since = wanted, now
        if now - track.pending_since >= self.seconds:
            track.published = Condition(wanted.status, wanted.reason, wanted.message, now)
            track.pending = None
        return track.published

    def forget(self, keep: Iterable[str]) -> None:
        """Drops tracks of domains that no longer exist."""
        alive = set(keep)
        for key in [k for k in self.tracks if k not in alive]:
            del self.tracks[key]

    def next_deadline(self) -> float | None:
        """When a pending change will be due (so a controller can recompute then)."""
        due = [t.pending_since + self.seconds for t in self.tracks.values() if t.pending is not None]
        return min(due) if due else None
