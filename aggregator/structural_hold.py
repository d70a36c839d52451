"""Structural hold-down: a report that briefly lost its cabling does not reshape the tree.

Why: where a node is cabled (its LLDP neighbours), which HCAs it has (the GUIDs fabric dumps know
it by) and which NVLink clique it is in decide which HyperNodes exist and who is in them. An agent
that restarts, a switch that skips a few LLDP frames, an NVML that is not up yet after a driver
reload: each makes a report without some of those facts for seconds, and taken at its word it
would delete the node's leaf HyperNode (or move the node out of it) and re-create it, with a new
UID, when the facts come back. Volcano would see no topology meanwhile; during a rollout, on every
node at once. The agent carries its neighbours across its own restarts (agent.runner); this is the
aggregator's side, for every other way a report can lose them.

So, per node, the facts last in effect are kept, and a fact that goes missing is put back into the
node's report for `seconds` (default: at least one LLDP TTL) before the tree reshapes:
- the LLDP neighbours of each interface (an interface whose neighbours are replaced by others was
  recabled: that takes effect at once; only "nothing there any more" is held),
- the RDMA devices, when a report has none at all,
- the NVLink domain, when a report has none.
Health is never held: it is always the new report's, so a cut cable still turns Ready False at
once, with the node still in its leaf. A report that is gone (its Node deleted) is forgotten at
once. Time is a parameter, so tests move a fake clock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.report import LldpNeighbour, NodeReport, NvLinkDomain, NvmlReport, RdmaDevice

log = logging.getLogger(__name__)

DEFAULT_SECONDS = 120.0  # one LLDP TTL at the usual settings (tx-interval 30 s x tx-hold 4)
RDMA, NVLINK = "rdma", "nvlink"  # keys of the held facts besides "lldp:<interface>"


@dataclass
class _Known:
    """The structural facts last in effect for one node, and since when each missing one is held."""

    lldp: dict[str, tuple[LldpNeighbour, ...]] = field(default_factory=dict)
    rdma: tuple[RdmaDevice, ...] = ()
    nvml: NvmlReport | None = None  # the last report's nvml that named a domain
    missing_since: dict[str, float] = field(default_factory=dict)


def _by_interface(neighbours: Iterable[LldpNeighbour]) -> dict[str, tuple[LldpNeighbour, ...]]:
    out: dict[str, list[LldpNeighbour]] = {}
    for n in neighbours:
        out.setdefault(n.interface, []).append(n)
    return {name: tuple(items) for name, items in out.items()}


def _domain(report: NodeReport) -> NvLinkDomain | None:
    return report.nvml.domain if report.nvml else None


class StructuralHold:
    """`admit` each node's latest report; it returns the report to build the tree from. Call
    `due(now)` each cycle for the nodes whose held facts ran out (admit them again), and wake at
    `next_deadline()`. `seconds` <= 0 turns the hold off."""

    def __init__(self, seconds: float = DEFAULT_SECONDS) -> None:
        self.seconds = seconds
        self._known: dict[str, _Known] = {}
        self._admitted: dict[str, tuple[NodeReport, NodeReport]] = {}  # node -> (input, output)

    def admit(self, name: str, report: NodeReport | None, now: float) -> NodeReport | None:
        """The report with the facts it lost within the hold-down put back (the very same object
        when nothing is held, or when neither it nor the hold changed since the last call)."""
        if report is None or self.seconds <= 0:
            self.forget(name)
            return report
        cached = self._admitted.get(name)
        known = self._known.get(name)
        if cached is not None and cached[0] is report and known is not None and not self._expired(known, now):
            return cached[1]
        if known is None:
            known = self._known[name] = _Known()
        out = self._merge(name, report, known, now)
        self._admitted[name] = (report, out)
        return out

    def forget(self, name: str) -> None:
        self._known.pop(name, None)
        self._admitted.pop(name, None)

    def retain(self, names: Iterable[str]) -> None:
        """Forgets every node not in `names` (their reports are gone)."""
        keep = set(names)
        for name in [n for n in self._known if n not in keep]:
            self.forget(name)

    def due(self, now: float) -> set[str]:
        """The nodes with a held fact whose hold-down has run out at `now`."""
        return {name for name, known in self._known.items() if self._expired(known, now)}

    def next_deadline(self) -> float | None:
        """When the earliest held fact runs out (None: nothing is held)."""
        starts = [t for known in self._known.values() for t in known.missing_since.values()]
        return min(starts) + self.seconds if starts else None

    def held(self) -> dict[str, list[str]]:
        """Node -> the facts held for it now ("lldp:ib0", "rdma", "nvlink")."""
        return {name: sorted(k.missing_since) for name, k in self._known.items() if k.missing_since}

    def _expired(self, known: _Known, now: float) -> bool:
        return any(now - since >= self.seconds for since in known.missing_since.values())

    def _keep(self, name: str, known: _Known, key: str, now: float) -> bool:
        """Whether a missing fact is still held (starting its hold-down now if it just went)."""
        if key not in known.missing_since:
            known.missing_since[key] = now
            log.info("node %s: its report lost %s; keeping the previous facts for %.0fs", name, key, self.seconds)
        since = known.missing_since[key]
        if now - since < self.seconds:
            return True
        log.info("node %s: %s missing for %.0fs; the tree follows the report now", name, key, now - since)
        del known.missing_since[key]
        return False

    def _merge(self, name: str, report: NodeReport, known: _Known, now: float) -> NodeReport:
        reported = _by_interface(report.lldp)
        held_lldp: list[LldpNeighbour] = []
        for interface, neighbours in list(known.lldp.items()):
            key = f"lldp:{interface}"
            if interface in reported:
                known.missing_since.pop(key, None)
            elif self._keep(name, known, key, now):
                held_lldp.extend(neighbours)
            else:
                del known.lldp[interface]
        known.lldp.update(reported)
        changes: dict[str, object] = {}
        if held_lldp:
            changes["lldp"] = tuple(sorted((*report.lldp, *held_lldp),
                                           key=lambda n: (n.interface, n.chassis_id, n.port_id)))  # fmt: skip
        if report.rdma or not known.rdma:
            known.missing_since.pop(RDMA, None)
            known.rdma = report.rdma
        elif self._keep(name, known, RDMA, now):
            changes["rdma"] = known.rdma
        else:
            known.rdma = ()
        domain = _domain(report)
        if domain is not None or known.nvml is None:
            known.missing_since.pop(NVLINK, None)
            known.nvml = report.nvml if domain is not None else None
        elif self._keep(name, known, NVLINK, now):
            old: NvmlReport = known.nvml
            changes["nvml"] = old if report.nvml is None else dataclasses.replace(report.nvml, domain=old.domain)
        else:
            known.nvml = None
        return dataclasses.replace(report, **changes) if changes else report  # type: ignore[arg-type]
