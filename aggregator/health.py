"""Health: from each member node's state to a HyperNode's `Ready` and `FabricDegraded` conditions,
with flap damping.

A scheduler placing a gang on a domain needs to know whether the domain can carry it: a rack with
a failed NVLink switch tray, or a leaf whose nodes lost their RDMA ports, should stop attracting
jobs. So each member is judged from what its agent reports (failed NVLink / RDMA / link health),
from its Node's Ready condition, and from whether its agent is alive at all (an agent gone or a
missing report means we do not know, which is not the same as healthy). A domain is Ready=False
once its unhealthy members exceed a threshold (a fraction below 1, or a count from 1 up), Unknown
when the unknown members could push it over, True otherwise.

Grey failures are kept apart from failures: a port that trained at half rate, symbol errors that
climb, a link that flaps, a PCIe link below its maximum, an NVLink fabric reporting degraded
bandwidth still carry traffic, only slower. Counting them against `Ready` would take capacity out
of service for a slowdown; ignoring them would let the scheduler put a job across one bad link
that throttles every collective. So an agent's grey findings (`NodeReport.findings`, the
components it marks `degraded` for them) make a member *degraded*, which feeds a second
condition, `FabricDegraded` (True once degraded members exceed their own threshold), while `Ready`
stays about failures. A `degraded` component the agent explains with no grey finding keeps its
older meaning (a port or link in use is down, an NVLink is down): a failure.

Conditions flip only after the new state has held for `hold_down_seconds` (a link that flaps
every few seconds must not make the scheduler thrash), and `lastTransitionTime` moves only on a
real transition. Time is a parameter (`now`, seconds since the epoch), never read from a clock.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from agent.common.report import ComponentHealth, Health, NodeReport
from aggregator.graph import FabricFault

FABRIC_COMPONENTS = {"nvml": "NVLink", "rdma": "RDMA", "net": "link", "pcie": "PCIe"}
GREY_ONLY = frozenset({"pcie"})  # components whose `degraded` is always a grey finding
MAX_NAMED = 5
MAX_FINDINGS = 3  # per node in a message
MAX_TEXT = 300  # characters of one problem or finding in a message
_MORE = re.compile(r"and \d+ more")  # the agent's summary of findings past the third
READY = "Ready"
FABRIC_DEGRADED = "FabricDegraded"


class MemberState(enum.StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class MemberHealth:
    state: MemberState
    problems: tuple[str, ...] = ()  # e.g. ("NVLink failed: link 3 down", "Node NotReady")
    causes: frozenset[str] = frozenset()  # "NVLink", "RDMA", "link", "NodeNotReady", "AgentGone", ...
    # grey findings, whatever `state` is: ("RDMA mlx5_0/1 error-rate: ...",) and their components
    degraded: tuple[str, ...] = ()
    degraded_causes: frozenset[str] = frozenset()

    @property
    def is_degraded(self) -> bool:
        return bool(self.degraded)


HEALTHY = MemberHealth(MemberState.HEALTHY)
MISSING = MemberHealth(MemberState.UNKNOWN, ("no NodeTopology report",), frozenset({"ReportMissing"}))
# one instance: while agents roll out, every node may be without one at once (three objects a node)
AGENT_GONE = MemberHealth(MemberState.UNKNOWN, ("agent not running",), frozenset({"AgentGone"}))


def member_health(
    report: NodeReport | None, *, node_ready: bool | None, agent_alive: bool | None
) -> MemberHealth:
    """One node's health. `None` for node_ready/agent_alive means "not tracked"."""
    if agent_alive is False:
        return AGENT_GONE
    if report is None:
        return MISSING
    if node_ready is not False and all_clear(report):
        return HEALTHY  # the common case, decided without building anything
    grey = grey_findings(report)
    problems, causes = _component_problems(report, grey)
    domain = report.nvml.domain if report.nvml else None
    if domain is not None and domain.state != "completed" and "NVLink" not in causes:
        problems.append(f"NVLink fabric {domain.state}")
        causes.add("NVLink")
    if node_ready is False:
        problems.append("Node NotReady")
        causes.add("NodeNotReady")
    degraded = tuple(text for items in grey.values() for text in items)
    degraded_causes = frozenset(FABRIC_COMPONENTS.get(c, c) for c in grey)
    if problems:
        return MemberHealth(MemberState.UNHEALTHY, tuple(problems), frozenset(causes), degraded, degraded_causes)
    if degraded:
        return MemberHealth(MemberState.HEALTHY, (), frozenset(), degraded, degraded_causes)
    return HEALTHY


_BAD = (Health.FAILED, Health.DEGRADED)


def _component_problems(
    report: NodeReport, grey: Mapping[str, tuple[str, ...]]
) -> tuple[list[str], set[str]]:
    """The failures of the fabric components (grey-only ones left out), and their labels."""
    problems: list[str] = []
    causes: set[str] = set()
    for component, label in FABRIC_COMPONENTS.items():
        health = report.health.get(component)
        if health is None or health.state not in _BAD:
            continue
        hard = _hard_reason(component, health, grey.get(component, ()))
        if hard is not None:
            problems.append(f"{label} {health.state.value}{': ' + hard if hard else ''}")
            causes.add(label)
    return problems, causes


def all_clear(report: NodeReport) -> bool:
    """No finding, no fabric component failed or degraded, the NVLink fabric (if any) complete:
    what `member_health` would find healthy, checked without building its messages."""
    if getattr(report, "findings", ()):
        return False
    get = report.health.get
    for component in FABRIC_COMPONENTS:
        found = get(component)
        if found is not None and found.state in _BAD:
            return False
    nvml = report.nvml
    domain = nvml.domain if nvml else None
    return domain is None or domain.state == "completed"


def with_fabric_faults(health: MemberHealth, faults: Sequence[FabricFault]) -> MemberHealth:
    """A member's health with the faults a fabric manager (UFM) sees on its cables added, as the
    agent's own report would count them: a failure makes it unhealthy (even a member whose agent is
    silent: the fault is known), a grey failure makes it degraded."""
    if not faults:
        return health
    failures = tuple(f.text for f in faults if f.failure)
    greys = tuple(f.text for f in faults if not f.failure)
    degraded = (*health.degraded, *greys)
    degraded_causes = health.degraded_causes | {f.cause for f in faults if not f.failure}
    if failures:
        known = health.problems if health.state is MemberState.UNHEALTHY else ()
        causes = (health.causes if health.state is MemberState.UNHEALTHY else frozenset())
        return MemberHealth(MemberState.UNHEALTHY, (*known, *failures),
                            causes | {f.cause for f in faults if f.failure}, degraded, degraded_causes)  # fmt: skip
    return replace(health, degraded=degraded, degraded_causes=degraded_causes)


def grey_findings(report: NodeReport) -> dict[str, tuple[str, ...]]:
    """Component -> its grey findings as text ("RDMA mlx5_0/1 error-rate: ..."), sorted by component.

    Only findings whose component the agent marks `degraded` count: a finding under a `failed`
    component is part of that failure (Ready says it), and one under an `ok` component is stale."""
    out: dict[str, list[str]] = {}
    for finding in getattr(report, "findings", ()):
        component = str(finding.component)
        health = report.health.get(component)
        if finding.severity is not Health.DEGRADED or health is None or health.state is not Health.DEGRADED:
            continue
        label = FABRIC_COMPONENTS.get(component, component)
        detail = finding.reason or f"{finding.value} (threshold {finding.threshold}, {finding.window_s}s window)"
        out.setdefault(component, []).append(f"{label} {finding.subject} {finding.kind}: {detail}")
    return {c: tuple(out[c]) for c in sorted(out)}


def _hard_reason(component: str, health: ComponentHealth, grey: tuple[str, ...]) -> str | None:
    """The failure in a failed or degraded component, or None when it is only grey.

    `failed` is always a failure. `degraded` is grey when grey findings explain it (PCIe has no
    other kind); otherwise it is the older "a port, link or NVLink in use is down", a failure.
    Where findings and a down port share one component, the agent writes the probe's own reason
    first, then the findings' reasons and "and N more", joined with "; " (agent.probes.grey.fold):
    what is left once those are taken out is the failure."""
    if health.state is Health.FAILED:
        return health.reason
    if component in GREY_ONLY:
        return None
    if not grey:
        return health.reason
    text = health.reason
    for stated in sorted({t.split(": ", 1)[-1] for t in grey}, key=len, reverse=True):
        text = text.replace(stated, "")
    rest = [part.strip() for part in text.split(";") if part.strip() and not _MORE.fullmatch(part.strip())]
    return "; ".join(rest) if rest else None


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


@functools.lru_cache(maxsize=256)
def _stamp(seconds: float) -> str:
    """RFC 3339 of a transition time; the same few instants recur across every domain's conditions."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Condition:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition: float = 0.0
    type: str = READY  # READY or FABRIC_DEGRADED

    def to_wire(self, observed_generation: int | None = None) -> dict[str, object]:
        stamp = _stamp(self.last_transition)
        wire: dict[str, object] = {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": stamp,
        }
        if observed_generation is not None:
            wire["observedGeneration"] = observed_generation
        return wire


def _named(items: list[tuple[str, MemberHealth]], *, grey: bool = False) -> str:
    """Five nodes with their problems (one per component: all of them) or findings (three each),
    then a count; a message stays far below the API's 32 KiB limit on a condition message even for
    a node whose GPUs have 18 bad links each."""
    shown = "; ".join(f"{node}: {_first(h.degraded) if grey else _first(h.problems, len(h.problems))}"
                      for node, h in items[:MAX_NAMED])
    more = len(items) - MAX_NAMED
    return shown + (f"; and {more} more" if more > 0 else "")


def _first(texts: tuple[str, ...], keep: int = MAX_FINDINGS) -> str:
    shown = ", ".join(text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..." for text in texts[:keep])
    return shown + (f" (and {len(texts) - keep} more)" if len(texts) > keep else "")


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


DEGRADED_REASONS = {"NVLink": "NVLinkDegraded", "RDMA": "RDMADegraded", "link": "LinkDegraded", "PCIe": "PCIeDegraded",
                    "latency": "LatencyDegraded", "bandwidth": "BandwidthDegraded"}  # fmt: skip


def judge_degraded(total: int, degraded: list[tuple[str, MemberHealth]], threshold: Threshold) -> Condition:
    """The FabricDegraded condition for a domain of `total` nodes with these degraded members.

    True once they exceed `threshold` (reason by component when all share one), False otherwise;
    the message names the nodes and their findings (five, then a count). Members that do not
    report are `Ready`'s business (Unknown there), not a grey failure here."""
    degraded = sorted(degraded, key=lambda item: item[0])
    limit = threshold.describe()
    if threshold.exceeded(len(degraded), total):
        causes = set().union(*(h.degraded_causes for _, h in degraded))
        reason = DEGRADED_REASONS.get(next(iter(causes)), "MembersDegraded") if len(causes) == 1 else "MembersDegraded"
        message = f"{len(degraded)} of {total} nodes degraded (tolerates {limit}): {_named(degraded, grey=True)}"
        return Condition("True", reason, message, type=FABRIC_DEGRADED)
    if degraded:
        message = (f"{len(degraded)} of {total} nodes degraded, within tolerance ({limit}): "
                   f"{_named(degraded, grey=True)}")
        return Condition("False", "WithinThreshold", message, type=FABRIC_DEGRADED)
    return Condition("False", "NoDegradedMembers", f"no degraded members among {total} nodes", type=FABRIC_DEGRADED)


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
    # keys whose track has a change pending: the deadline is looked for among these only (every
    # update asks for it, and a cluster has thousands of tracks, nearly all settled)
    pending: set[str] = field(default_factory=set)

    def observe(self, key: str, wanted: Condition, now: float) -> Condition:
        track = self.tracks.get(key)
        if track is None:  # first sight: nothing to damp against
            published = replace(wanted, last_transition=now)
            self.tracks[key] = _Track(published)
            return published
        current = track.published
        if wanted.status == current.status:
            track.pending = None
            self.pending.discard(key)
            track.published = replace(wanted, last_transition=current.last_transition)
            return track.published
        if track.pending is None or track.pending.status != wanted.status:
            track.pending, track.pending_since = wanted, now
            self.pending.add(key)
        if now - track.pending_since >= self.seconds:
            track.published = replace(wanted, last_transition=now)
            track.pending = None
            self.pending.discard(key)
        return track.published

    def forget(self, keep: Iterable[str]) -> None:
        """Drops tracks of domains that no longer exist."""
        alive = keep if isinstance(keep, Mapping | Set) else set(keep)
        for key in [k for k in self.tracks if k not in alive]:
            del self.tracks[key]
            self.pending.discard(key)

    def next_deadline(self) -> float | None:
        """When a pending change will be due (so a controller can recompute then)."""
        tracks = self.tracks
        return min((tracks[k].pending_since + self.seconds for k in self.pending), default=None)


@dataclass
class DegradedConditions:
    """`FabricDegraded` for every domain: its threshold, its own hold-down state, and the set of
    degraded members kept current node by node (a domain's check is a set intersection, so one
    node's change costs only its own domains)."""

    threshold: Threshold = field(default_factory=Threshold)
    hold: HoldDown = field(default_factory=HoldDown)
    members: set[str] = field(default_factory=set)

    def reset(self, health: Mapping[str, MemberHealth], domains: Iterable[str]) -> None:
        """After a full rebuild: every member's health, and the domains that still exist."""
        self.members = {n for n, h in health.items() if h.degraded}  # is_degraded, 100,000 times
        self.hold.forget(domains)

    def note(self, node: str, health: MemberHealth) -> None:
        """One member's health changed."""
        if health.is_degraded:
            self.members.add(node)
        else:
            self.members.discard(node)

    def condition(self, key: str, nodes: Set[str], health: Mapping[str, MemberHealth], now: float) -> Condition:
        wanted = judge_degraded(len(nodes), [(n, health[n]) for n in nodes & self.members], self.threshold)
        return self.hold.observe(key, wanted, now)
