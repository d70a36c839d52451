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
from dataclasses import dataclass

from agent.common.report import LldpNeighbour, NodeReport, NvLinkDomain

log = logging.getLogger(__name__)

DEFAULT_SECONDS = 120.0  # one LLDP TTL at the usual settings (tx-interval 30 s x tx-hold 4)
RDMA, NVLINK = "rdma", "nvlink"  # keys of the held facts besides "lldp:<interface>"


@dataclass(slots=True)
class _Known:
    """One node: the last report admitted and what it became (held facts put back: the facts in
    effect), and since when each missing fact is held. References only: at 100,000 nodes the hold
    costs one small object per node."""

    given: NodeReport
    facts: NodeReport
    missing_since: dict[str, float] | None = None


def _by_interface(neighbours: Iterable[LldpNeighbour]) -> dict[str, list[LldpNeighbour]]:
    out: dict[str, list[LldpNeighbour]] = {}
    for n in neighbours:
        out.setdefault(n.interface, []).append(n)
    return out


def _domain(report: NodeReport) -> NvLinkDomain | None:
    return report.nvml.domain if report.nvml else None


class StructuralHold:
    """`admit` each node's latest report; it returns the report to build the tree from. Call
    `due(now)` each cycle for the nodes whose held facts ran out (admit them again), and wake at
    `next_deadline()`. `seconds` <= 0 turns the hold off."""

    def __init__(self, seconds: float = DEFAULT_SECONDS) -> None:
        self.seconds = seconds
        self._known: dict[str, _Known] = {}
        self._holding: set[str] = set()  # nodes with a held fact: every cycle looks at these only

    def admit(self, name: str, report: NodeReport | None, now: float) -> NodeReport | None:
        """The report with the facts it lost within the hold-down put back (the very same object
        when nothing is held, or when neither it nor the hold changed since the last call)."""
        if report is None or self.seconds <= 0:
            self.forget(name)
            return report
        known = self._known.get(name)
        if known is None:
            self._known[name] = _Known(report, report)
            return report
        if known.given is report and not self._expired(known, now):
            return known.facts
        held: dict[str, float] = dict(known.missing_since or {})
        facts = self._merge(name, report, known.facts, held, now)
        self._known[name] = _Known(report, facts, held or None)
        if held:
            self._holding.add(name)
        else:
            self._holding.discard(name)
        return facts

    def forget(self, name: str) -> None:
        self._known.pop(name, None)
        self._holding.discard(name)

    def retain(self, names: Iterable[str]) -> None:
        """Forgets every node not in `names` (their reports are gone)."""
        keep = set(names)
        for name in [n for n in self._known if n not in keep]:
            self.forget(name)

    def due(self, now: float) -> set[str]:
        """The nodes with a held fact whose hold-down has run out at `now`."""
        return {name for name in self._holding if self._expired(self._known[name], now)}

    def next_deadline(self) -> float | None:
        """When the earliest held fact runs out (None: nothing is held)."""
        starts = [t for name in self._holding for t in (self._known[name].missing_since or {}).values()]
        return min(starts) + self.seconds if starts else None

    def held(self) -> dict[str, list[str]]:
        """Node -> the facts held for it now ("lldp:ib0", "rdma", "nvlink")."""
        return {name: sorted(self._known[name].missing_since or ()) for name in sorted(self._holding)}

    @property
    def holding(self) -> int:
        """How many nodes have a held fact now."""
        return len(self._holding)

    def _expired(self, known: _Known, now: float) -> bool:
        return bool(known.missing_since) and any(
            now - since >= self.seconds for since in (known.missing_since or {}).values()
        )

    def _keep(self, name: str, held: dict[str, float], key: str, now: float) -> bool:
        """Whether a missing fact is still held (starting its hold-down now if it just went)."""
        return bool(self._still_held(name, held, (key,), now))

    def _still_held(self, name: str, held: dict[str, float], keys: Iterable[str], now: float) -> list[str]:
        """Those of the missing facts `keys` still held (a hold-down starts now for those that just
        went); one log line per node and event, not per fact."""
        kept, started, ended = [], [], []
        for key in keys:
            since = held.setdefault(key, now)
            if since == now:
                started.append(key)
            if now - since < self.seconds:
                kept.append(key)
            else:
                ended.append(key)
                del held[key]
        if started and log.isEnabledFor(logging.INFO):
            log.info("node %s: its report lost %s; keeping the previous facts for %.0fs",
                     name, ", ".join(started), self.seconds)  # fmt: skip
        if ended:
            log.info("node %s: %s missing for %.0fs; the tree follows the report now", name, ", ".join(ended),
                     self.seconds)  # fmt: skip
        return kept

    def _merge(self, name: str, report: NodeReport, before: NodeReport, held: dict[str, float], now: float) -> NodeReport:
        """`report` with what `before` (the facts in effect) had and it lacks, while held."""
        changes: dict[str, object] = {}
        lldp = self._merge_lldp(name, report, before, held, now)
        if lldp is not None:
            changes["lldp"] = lldp
        if report.rdma or not before.rdma:
            held.pop(RDMA, None)
        elif self._keep(name, held, RDMA, now):
            changes["rdma"] = before.rdma
        old = before.nvml
        if _domain(report) is not None or old is None or old.domain is None:
            held.pop(NVLINK, None)
        elif self._keep(name, held, NVLINK, now):
            changes["nvml"] = old if report.nvml is None else dataclasses.replace(report.nvml, domain=old.domain)
        return dataclasses.replace(report, **changes) if changes else report  # type: ignore[arg-type]

    def _merge_lldp(
        self, name: str, report: NodeReport, before: NodeReport, held: dict[str, float], now: float
    ) -> tuple[LldpNeighbour, ...] | None:
        """The report's neighbours plus those of interfaces it lost while held; None: its own."""
        reported = {n.interface for n in report.lldp}
        for key in [k for k in held if k.startswith("lldp:") and k[5:] in reported]:
            del held[key]  # heard again on that interface
        if report.lldp == before.lldp:
            return None
        lost = {f"lldp:{i}": ns for i, ns in _by_interface(before.lldp).items() if i not in reported}
        kept = [n for key in self._still_held(name, held, lost, now) for n in lost[key]]
        if not kept:
            return None
        return tuple(sorted((*report.lldp, *kept), key=lambda n: (n.interface, n.chassis_id, n.port_id)))
