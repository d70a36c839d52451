"""Grey-failure arithmetic shared by the grey probes: counter rates over a sliding window, flap
counting with a hold-down, the finding latch and folding findings into component health.

Pure: time is passed in (the agent's monotonic clock), nothing is read from the host here.

Counters: the kernel's IB port counters are the IBTA PMA PortCounters (16- or 32-bit, saturating)
or PortCountersExtended (64-bit) and the driver's `hw_counters`; all of them can go back to zero
(a driver reload, `perfquery -R`, an HCA reset) and a narrow one may wrap. A reading lower than the
previous one is therefore never a negative rate: it counts as `reading` increments since the
reset (the lowest honest estimate; NVIDIA NVSentinel's NIC monitor does the same).

Latch: a Finding's `value` is the figure measured when the finding first appeared or last changed
severity. The NodeTopology holds health states, not counters, so a port whose error rate wanders
from 12/min to 14/min keeps serialising to the same bytes and causes no API write; the live figure
is in the metrics (`hypertopo_*_degraded` and the counters themselves).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.common.report import ComponentHealth, Finding, Health

GREY_COMPONENTS = ("rdma", "net", "nvml", "pcie")


@dataclass(frozen=True)
class RateLimit:
    """Degraded above `degraded`, failed above `failed` (increments per minute over the window)."""

    degraded: float
    failed: float

    def judge(self, per_min: float) -> Health | None:
        if per_min > self.failed:
            return Health.FAILED
        if per_min > self.degraded:
            return Health.DEGRADED
        return None


# IB/RoCE port counters watched for rates, per minute over `error_window_s`. Sources (README,
# "Grey-failure health"): NVIDIA NVSentinel's NIC health monitor defaults (link counter detection,
# appendix A): symbol_error and port_rcv_errors > 10/s, link_error_recovery > 5/min,
# local_ack_timeout_err > 1/s, roce_slow_restart > 10/s as warnings; link_downed,
# excessive_buffer_overrun_errors, local_link_integrity_errors and rnr_nak_retry_err fatal on any
# increase. Here a warning is `degraded` at the same rate, and `failed` at ten times it; the
# "fatal on any increase" counters are degraded on any increase in the window (one link_downed is a
# flap, not a dead port: the port's own state says when it is down) and failed above 10/min.
DEFAULT_ERROR_LIMITS: Mapping[str, RateLimit] = {
    "symbol_error": RateLimit(600, 6000),
    "port_rcv_errors": RateLimit(600, 6000),
    "link_error_recovery": RateLimit(5, 50),
    "link_downed": RateLimit(0, 10),
    "local_link_integrity_errors": RateLimit(0, 10),
    "excessive_buffer_overrun_errors": RateLimit(0, 10),
    "rnr_nak_retry_err": RateLimit(0, 10),
    "local_ack_timeout_err": RateLimit(60, 600),
    "roce_slow_restart": RateLimit(600, 6000),
}
# NVLink per-link error counters (NVML nvmlDeviceGetNvLinkErrorCounter): no vendor publishes a
# rate; replays and recoveries are rare on a healthy link and each costs bandwidth, CRC errors come
# in bursts. Chosen defaults, per minute over the window.
DEFAULT_NVLINK_LIMITS: Mapping[str, RateLimit] = {
    "crc_flit": RateLimit(100, 1000),
    "crc_data": RateLimit(100, 1000),
    "replay": RateLimit(10, 100),
    "recovery": RateLimit(0, 10),
}


@dataclass(frozen=True)
class GreyConfig:
    """Windows and thresholds of the grey probes (agent CLI: --error-window, --flap-window,
    --flap-limit, --flap-hold-down, --error-limit COUNTER=DEGRADED[:FAILED])."""

    error_window_s: float = 300.0
    error_limits: Mapping[str, RateLimit] = field(default_factory=lambda: dict(DEFAULT_ERROR_LIMITS))
    nvlink_limits: Mapping[str, RateLimit] = field(default_factory=lambda: dict(DEFAULT_NVLINK_LIMITS))
    # carrier_changes / port state changes: NVSentinel warns above 2 per interval; one down-up is 2
    flap_window_s: float = 600.0
    flap_limit: int = 2
    flap_hold_down_s: float = 600.0

    def __post_init__(self) -> None:
        if (
            min(self.error_window_s, self.flap_window_s) <= 0
            or self.flap_hold_down_s < 0
            or self.flap_limit < 0
        ):
            raise ValueError("grey-failure windows must be positive, limits and hold-down not negative")


def parse_limit(text: str) -> tuple[str, RateLimit]:
    """`symbol_error=60:600` (degraded and failed per minute; failed defaults to 10x degraded)."""
    name, sep, numbers = text.partition("=")
    try:
        degraded_text, _, failed_text = numbers.partition(":")
        degraded = float(degraded_text)
        failed = float(failed_text) if failed_text else degraded * 10 if degraded else 10.0
    except ValueError:
        raise ValueError(f"--error-limit wants COUNTER=DEGRADED[:FAILED] per minute, not {text!r}") from None
    if not sep or not name or degraded < 0 or failed < degraded:
        raise ValueError(f"--error-limit wants COUNTER=DEGRADED[:FAILED] per minute, not {text!r}")
    return name, RateLimit(degraded, failed)


def per_minute_text(value: float) -> str:
    """A rate quantised for humans: `12/min`, `0.4/min`."""
    return f"{value:.0f}/min" if value >= 10 else f"{value:.1f}/min"


class CounterWindow:
    """Increments of one counter over the last `window_s` seconds, resets and wraps handled."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: int | None = None
        self._started: float | None = None
        self._deltas: deque[tuple[float, int]] = deque()
        self._total = 0  # sum of the deltas in the window, kept as they come and go (read per cycle)

    def add(self, now: float, reading: int) -> None:
        if self._last is not None:
            delta = reading - self._last if reading >= self._last else reading  # reset or wrap
            if delta:
                self._deltas.append((now, delta))
                self._total += delta
        else:
            self._started = now
        self._last = reading
        while self._deltas and self._deltas[0][0] <= now - self.window_s:
            self._total -= self._deltas.popleft()[1]

    def increments(self) -> int:
        return self._total

    def last_change(self) -> float | None:
        return self._deltas[-1][0] if self._deltas else None

    def per_minute(self, now: float) -> float:
        """Increments per minute over the window (over the time seen, while the window fills)."""
        if self._started is None:
            return 0.0
        span = min(self.window_s, now - self._started)
        return self.increments() * 60.0 / span if span > 0 else 0.0


class Windows:
    """One CounterWindow per (subject, counter), made on first sight and dropped when unseen."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._windows: dict[tuple[str, str], CounterWindow] = {}

    def add(self, now: float, subject: str, counter: str, reading: int) -> CounterWindow:
        key = (subject, counter)
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = CounterWindow(self.window_s)
        window.add(now, reading)
        return window

    def forget_except(self, seen: Iterable[tuple[str, str]]) -> None:
        keep = set(seen)
        for key in [k for k in self._windows if k not in keep]:
            del self._windows[key]


def rate_findings(
    *,
    component: str,
    subject: str,
    windows: Windows,
    counters: Mapping[str, int],
    limits: Mapping[str, RateLimit],
    now: float,
    kind: str = "error-rate",
) -> list[Finding]:
    """Feeds one subject's counter readings into its windows and returns a finding per counter
    whose rate is above its limit."""
    found = []
    for name, limit in limits.items():
        reading = counters.get(name)
        if reading is None:
            continue
        rate = windows.add(now, subject, name, reading).per_minute(now)
        severity = limit.judge(rate)
        if severity is None:
            continue
        bound = limit.failed if severity is Health.FAILED else limit.degraded
        found.append(
            Finding(
                component=component,
                subject=subject,
                kind=kind,
                severity=severity,
                value=f"{name} {per_minute_text(rate)}",
                threshold=f"> {per_minute_text(bound)}",
                window_s=int(windows.window_s),
                reason=f"{subject}: {name} at {per_minute_text(rate)} over {int(windows.window_s)} s "
                f"(above {per_minute_text(bound)}, {severity.value})",
            )
        )
    return found


class FlapTracker:
    """Counts transitions (carrier changes, port state changes) per subject over a window; a
    subject above `limit` transitions is flapping, and stays so for `hold_down_s` after its last
    transition, so a link that flaps every few minutes never ping-pongs between ok and degraded."""

    def __init__(self, component: str, *, window_s: float, limit: int, hold_down_s: float) -> None:
        self.component = component
        self.windows = Windows(window_s)
        self.limit = limit
        self.hold_down_s = hold_down_s
        self._flapping: set[str] = set()
        self._last_change: dict[str, float] = {}

    @classmethod
    def configured(cls, component: str, grey: GreyConfig) -> FlapTracker:
        """A tracker with the agent's --flap-window, --flap-limit and --flap-hold-down."""
        return cls(component, window_s=grey.flap_window_s, limit=grey.flap_limit, hold_down_s=grey.flap_hold_down_s)

    def observe(self, now: float, subject: str, transitions_total: int) -> Finding | None:
        window = self.windows.add(now, subject, "transitions", transitions_total)
        count, last = window.increments(), window.last_change()
        if last is not None:
            self._last_change[subject] = last
        if count > self.limit:
            self._flapping.add(subject)
        elif subject in self._flapping and now - self._last_change.get(subject, now) >= self.hold_down_s:
            self._flapping.discard(subject)  # quiet for a whole hold-down: recovered
        return self._finding(subject, count) if subject in self._flapping else None

    def _finding(self, subject: str, count: int) -> Finding:
        window = int(self.windows.window_s)
        return Finding(
            component=self.component,
            subject=subject,
            kind="flapping",
            severity=Health.DEGRADED,
            value=f"{count} changes",
            threshold=f"> {self.limit} in {window} s, held {int(self.hold_down_s)} s",
            window_s=window,
            reason=f"{subject}: link flapping ({count} state changes in {window} s); "
            f"held degraded until {int(self.hold_down_s)} s after the last change",
        )

    def forget_except(self, subjects: Iterable[str]) -> None:
        keep = set(subjects)
        self.windows.forget_except((s, "transitions") for s in keep)
        self._flapping &= keep
        for subject in [s for s in self._last_change if s not in keep]:
            del self._last_change[subject]


def latch(previous: Sequence[Finding], current: Sequence[Finding]) -> tuple[Finding, ...]:
    """The findings to publish: a finding whose severity did not change keeps the value, threshold
    and reason it was first published with (no churn); new or re-graded ones go out as measured.
    Sorted, so the order of probes never changes the object."""
    before = {f.key: f for f in previous}
    out = []
    for finding in current:
        old = before.get(finding.key)
        out.append(old if old is not None and old.severity is finding.severity else finding)
    return tuple(sorted(out, key=lambda f: f.key))


def fold(health: ComponentHealth, findings: Sequence[Finding]) -> ComponentHealth:
    """A component's health with its findings: a hard failure the probe saw stays `failed` (its own
    reason first); otherwise the worst finding decides, and the reason lists the findings."""
    if not findings:
        return health
    worst = Health.FAILED if any(f.severity is Health.FAILED for f in findings) else Health.DEGRADED
    summary = "; ".join(f.reason for f in findings[:3])
    if len(findings) > 3:
        summary += f"; and {len(findings) - 3} more"
    if health.state is Health.FAILED:
        return ComponentHealth(Health.FAILED, f"{health.reason}; {summary}" if health.reason else summary)
    if health.state is Health.DEGRADED and health.reason:
        summary = f"{health.reason}; {summary}"
    return ComponentHealth(worst, summary)


def fold_all(
    health: Mapping[str, ComponentHealth], findings: Sequence[Finding]
) -> dict[str, ComponentHealth]:
    out = dict(health)
    for component in {f.component for f in findings}:
        own = [f for f in findings if f.component == component]
        out[component] = fold(out.get(component, ComponentHealth(Health.OK)), own)
    return out
