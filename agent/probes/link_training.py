"""Grey health of link training: a port or NIC that came up slower than it can run.

InfiniBand: sysfs has the rate the port trained at (`ports/<n>/rate`, "200 Gb/sec (2X NDR)") but
not the port's maximum (that is PortInfo LinkWidthSupported/LinkSpeedSupported, a MAD away), so an
ACTIVE port is compared with the rate most ACTIVE ports of the same HCA model (`hca_type`, else
`board_id`) and link layer on this node run at: one ConnectX-7 at 200 Gb/s beside seven at 400 is
degraded; a node whose HCAs all trained slow looks uniform here (the fabric sources see that).

Ethernet: a physical NIC's `speed` (sysfs, Mb/s) against the fastest link mode its driver
supports (ethtool link modes through netlink, `cycle.host.link_modes`). A NIC whose driver lists
no modes is not judged.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.common.report import ComponentHealth, Finding, Health, ProbeResult
from agent.probes.protocol import Cycle
from agent.probes.sysfs_attr import read_text

_MODE_SPEED = re.compile(r"^(\d+)base")


def max_mode_mbps(modes: Iterable[str]) -> int | None:
    """The fastest of ethtool's link mode names (`400000baseCR4/Full` -> 400000)."""
    speeds = [int(m.group(1)) for m in (_MODE_SPEED.match(mode) for mode in modes) if m]
    return max(speeds) if speeds else None


def _model(device_dir: Path) -> str:
    for attr in ("hca_type", "board_id"):
        text = read_text(device_dir / attr)
        if text:
            return text
    return ""


def ib_findings(
    devices: Iterable[Any], class_dir: Path, models: dict[str, str] | None = None
) -> list[Finding]:
    """`models` caches each device's model by name and GUID (it never changes under a device)."""
    models = {} if models is None else models
    ports = []
    for device in devices:
        key = f"{device.name} {device.node_guid}"
        model = models[key] if key in models else models.setdefault(key, _model(class_dir / device.name))
        for port in device.ports:
            if port.state == "ACTIVE" and port.rate_gbps:
                ports.append((device.name, model, port))
    found = []
    for device_name, model, port in ports:
        peers = Counter(p.rate_gbps for _, m, p in ports if m == model and p.link_layer == port.link_layer)
        usual, count = peers.most_common(1)[0]
        if count < 2 or port.rate_gbps >= usual:
            continue
        rate_text = read_text(class_dir / device_name / "ports" / str(port.port) / "rate") or ""
        subject = f"{device_name}/{port.port}"
        found.append(
            Finding(
                component="rdma", subject=subject, kind="link-training", severity=Health.DEGRADED,
                value=f"{port.rate_gbps:g} Gb/s", threshold=f"{usual:g} Gb/s", window_s=0,
                reason=f"{subject} trained at {rate_text or f'{port.rate_gbps:g} Gb/sec'}, below the "
                f"{usual:g} Gb/s of {count} {model or 'same-model'} ports on this node",
            )
        )  # fmt: skip
    return found


def ethernet_findings(interfaces: Iterable[Any], link_modes: Any) -> list[Finding]:
    found = []
    for interface in interfaces:
        if interface.kind != "physical" or not interface.speed_mbps or interface.oper_state != "up":
            continue
        best = max_mode_mbps(link_modes(interface.name))
        if best is None or interface.speed_mbps >= best:
            continue
        found.append(
            Finding(
                component="net", subject=interface.name, kind="link-training", severity=Health.DEGRADED,
                value=f"{interface.speed_mbps // 1000:g} Gb/s" if interface.speed_mbps >= 1000
                else f"{interface.speed_mbps} Mb/s",
                threshold=f"{best // 1000:g} Gb/s" if best >= 1000 else f"{best} Mb/s", window_s=0,
                reason=f"{interface.name} runs at {interface.speed_mbps} Mb/s, its NIC supports {best} Mb/s",
            )
        )  # fmt: skip
    return found


class LinkTrainingProbe:
    name = "link-training"

    def __init__(self) -> None:
        self._models: dict[str, str] = {}

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        if len(self._models) > 1024:
            self._models.clear()
        found = ib_findings(cycle.value("rdma"), cycle.config.sysfs / "class" / "infiniband", self._models)
        found += ethernet_findings(cycle.value("net"), cycle.host.link_modes)
        cycle.findings += found
        return ProbeResult(len(found), ComponentHealth(Health.OK))
