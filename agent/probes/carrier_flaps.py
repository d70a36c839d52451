"""Grey health of network links: carrier flapping.

The kernel counts every carrier transition of a netdev (IFLA_CARRIER_CHANGES over rtnetlink, the
same number as `/sys/class/net/<if>/carrier_changes`); more than `--flap-limit` in `--flap-window`
seconds is flapping, and the link stays degraded for `--flap-hold-down` seconds after its last
change, so a link that bounces every few minutes never ping-pongs between ok and degraded.
IPoIB netdevs flap with their HCA port, which the port-errors probe already judges: they are left
to it.
"""

from __future__ import annotations

from typing import Any

from agent.common.report import ComponentHealth, Health, ProbeResult
from agent.probes.grey import FlapTracker
from agent.probes.protocol import Cycle


class CarrierFlapProbe:
    name = "carrier-flaps"

    def __init__(self) -> None:
        self._flaps: FlapTracker | None = None

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        if self._flaps is None:
            self._flaps = FlapTracker.configured("net", cycle.config.grey)
        reported = {i.name for i in cycle.value("net")}
        watched = []
        for record in cycle.host.last_links:
            if (
                record.name not in reported
                or record.carrier_changes is None
                or record.link_type == "infiniband"
            ):
                continue
            watched.append(record.name)
            flap = self._flaps.observe(cycle.now, record.name, record.carrier_changes)
            if flap is not None:
                cycle.findings.append(flap)
        self._flaps.forget_except(watched)
        return ProbeResult(len(watched), ComponentHealth(Health.OK))
