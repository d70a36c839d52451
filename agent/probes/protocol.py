"""What a probe is: a named object the agent runs once per cycle, in the order of the probe list
(`agent.collect.PROBES`), that reads what earlier probes found from the cycle and returns a
ProbeResult. Adding one is one new module with a class that has `name` and `run`, plus one line in
that list.

A probe named after a health component (`agent.common.report.COMPONENTS`) gives that component its health;
any probe may add grey-failure findings to `cycle.findings`, which roll up into the components they
name. Long-lived state (rate windows, the NVML backend) lives on the probe object, made once per
agent; the host (`cycle.host`, the Prober) gives access to what the agent opened for every probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.common.report import Finding, ProbeResult


@dataclass
class Cycle:
    """One probe cycle as the probes see it."""

    now: float  # the agent's monotonic clock, seconds
    config: Any  # agent.collect.CollectConfig
    host: Any  # agent.collect.Prober: what outlives a cycle and is shared between probes
    results: dict[str, ProbeResult[Any]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def value(self, name: str, default: Any = ()) -> Any:
        """The value an earlier probe returned (`default` when it was absent, failed or not run)."""
        result = self.results.get(name)
        return default if result is None or result.value is None else result.value


class Probe(Protocol):
    name: str

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        """Never meant to raise (the collector still isolates one that does)."""
        ...
