"""PCIe link health of the GPUs and HCAs: a device whose link trained below the slot's maximum.

sysfs (Documentation/ABI/testing/sysfs-bus-pci, drivers/pci/pci-sysfs.c) gives every PCIe function
`current_link_speed` ("16.0 GT/s PCIe"), `max_link_speed`, `current_link_width` ("8") and
`max_link_width`. A width below the maximum is always degraded (lanes lost to a bad riser or
seating never come back by themselves). A speed below the maximum is degraded for HCAs; GPUs lower
their PCIe speed at idle to save power (ASPM / NVIDIA's dynamic link speed), so for a GPU only the
width is judged. Devices: the HCAs' PCI functions (`class/infiniband/<dev>/device`) and the GPUs'
bus ids (NVML) under `bus/pci/devices/`. A device without these files (virtual functions,
fixture trees without them) is not judged; no judged device at all is `absent`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.common.report import ComponentHealth, Finding, Health, ProbeResult
from agent.probes.pci_affinity import sysfs_bdf
from agent.probes.protocol import Cycle
from agent.probes.sysfs_attr import StrPath, read_text

_SPEED = re.compile(r"^(\d+(?:\.\d+)?)\s*GT/s")


def _gts(text: str | None) -> float | None:
    match = _SPEED.match(text or "")
    return float(match.group(1)) if match else None


def _width(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def read_max(path: StrPath) -> tuple[float | None, int | None]:
    """What the slot and device can do (fixed while the device is present)."""
    return _gts(read_text(os.path.join(path, "max_link_speed"))), _width(
        read_text(os.path.join(path, "max_link_width"))
    )


def link_finding(
    subject: str, path: StrPath, *, judge_speed: bool, maximum: tuple[float | None, int | None] | None = None
) -> Finding | bool | None:
    """The finding for one PCI function; False when its link attributes are not there."""
    top_speed, top_width = maximum or read_max(path)
    speed, width = (
        _gts(read_text(os.path.join(path, "current_link_speed"))),
        _width(read_text(os.path.join(path, "current_link_width"))),
    )
    if speed is None or top_speed is None or width is None or top_width is None:
        return False
    slow = judge_speed and speed < top_speed
    if width >= top_width and not slow:
        return None
    return Finding(
        component="pcie", subject=subject, kind="pcie-link", severity=Health.DEGRADED,
        value=f"{speed:g} GT/s x{width}", threshold=f"{top_speed:g} GT/s x{top_width}", window_s=0,
        reason=f"{subject}: PCIe link at {speed:g} GT/s x{width}, below its maximum {top_speed:g} GT/s x{top_width}",
    )  # fmt: skip


def devices(
    sysfs: Path, rdma: Iterable[Any], gpu_bus_ids: Iterable[tuple[int, str]]
) -> list[tuple[str, str, bool]]:
    """(subject, sysfs directory, judge speed) of each device to check (string paths: joined for
    every device each cycle, where pathlib objects cost more than the reads)."""
    root = os.fspath(sysfs)
    out = [(f"{d.name} {d.pci_address}", f"{root}/class/infiniband/{d.name}/device", True) for d in rdma]
    for index, bus_id in gpu_bus_ids:
        bdf = sysfs_bdf(bus_id)
        if bdf:
            out.append((f"gpu{index} {bdf}", f"{root}/bus/pci/devices/{bdf}", False))
    return out


class PcieProbe:
    name = "pcie"

    def __init__(self) -> None:
        self._max: dict[str, tuple[float | None, int | None]] = {}  # read once per device

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        nvml = cycle.value("nvml", None)
        gpus = [(g.index, g.pci_bus_id) for g in nvml.gpus] if nvml is not None else []
        judged = 0
        for subject, path, judge_speed in devices(cycle.config.sysfs, cycle.value("rdma"), gpus):
            if path not in self._max or None in self._max[path]:
                self._max[path] = read_max(path)
            finding = link_finding(subject, path, judge_speed=judge_speed, maximum=self._max[path])
            if finding is False:
                continue
            judged += 1
            if isinstance(finding, Finding):
                cycle.findings.append(finding)
        if not judged:
            return ProbeResult.absent("no PCIe link attributes for any GPU or HCA")
        return ProbeResult(judged, ComponentHealth(Health.OK))
