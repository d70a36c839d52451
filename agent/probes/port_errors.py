"""Grey health of RDMA ports: error counter rates over a window, and port state flapping.

Reads the ports the rdma probe found this cycle (their counters from `counters/`, `counters_ext/`
and `hw_counters/`, Documentation/ABI/stable/sysfs-class-infiniband) and keeps one window per
port and counter (agent.probes.grey). A port whose link never trained (`unused`) is skipped: its
counters say nothing about a cable that is not there. State flapping counts the port's state
changes this agent saw between cycles; `link_downed` increments between two cycles (a flap
shorter than the interval) are in the error rates.
"""

from __future__ import annotations

from typing import Any

from agent.common.report import ComponentHealth, Health, ProbeResult
from agent.probes.grey import FlapTracker, Windows, rate_findings
from agent.probes.protocol import Cycle


class PortErrorProbe:
    name = "port-errors"

    def __init__(self) -> None:
        self._windows: Windows | None = None
        self._flaps: FlapTracker | None = None
        self._states: dict[str, tuple[str, int]] = {}  # port -> (last state, changes seen)

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        grey = cycle.config.grey
        if self._windows is None or self._flaps is None:
            self._windows = Windows(grey.error_window_s)
            self._flaps = FlapTracker.configured("rdma", grey)
        subjects = []
        for device in cycle.value("rdma"):
            for port in device.ports:
                if port.health is Health.UNUSED:
                    continue
                subject = f"{device.name}/{port.port}"
                subjects.append(subject)
                cycle.findings += rate_findings(
                    component="rdma", subject=subject, windows=self._windows, counters=port.counters,
                    limits=grey.error_limits, now=cycle.now,
                )  # fmt: skip
                flap = self._flaps.observe(cycle.now, subject, self._changes(subject, port.state))
                if flap is not None:
                    cycle.findings.append(flap)
        self._windows.forget_except((s, c) for s in subjects for c in grey.error_limits)
        self._flaps.forget_except(subjects)
        return ProbeResult(len(subjects), ComponentHealth(Health.OK))

    def _changes(self, subject: str, state: str) -> int:
        last, changes = self._states.get(subject, (state, 0))
        changes += state != last
        self._states[subject] = (state, changes)
        return changes
