"""GPU-to-NIC PCIe affinity from the sysfs PCI hierarchy.

Why: GPUDirect RDMA is only fast between a GPU and a NIC behind the same PCIe switch (nvidia-smi
topo's PIX/PXB); across the CPU's root complex it goes through host memory. A scheduler that
wants rail-aligned placement needs, per GPU, the NICs that share its deepest switch.

How: `/sys/bus/pci/devices/<bdf>` is a symlink into `/sys/devices/pci<domain>:<bus>/...`, one path
component per bridge between the host bridge and the device (Documentation/ABI/testing/sysfs-bus-pci
and drivers/pci/probe.c name them by bus:device.function). Two devices share every bridge in their
common path prefix, so the deepest shared bridge is the longest common prefix. Sharing only the host
bridge (`pci0000:17`) is not affinity: the path must share at least one PCI bridge or port.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.common.report import RdmaDevice

_BDF = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def sysfs_bdf(bus_id: str) -> str | None:
    """NVML's `00000000:18:00.0` or lspci's `18:00.0` -> sysfs's `0000:18:00.0` (None if not a BDF)."""
    match = _BDF.match(bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def bridge_path(sysfs: Path, bus_id: str) -> tuple[str, ...] | None:
    """The chain of PCI components from the host bridge down to the device's parent bridge.

    Read from the `bus/pci/devices/<bdf>` link text (not resolved against the real root), so a
    fixture tree works wherever it lies. None when the device is not in sysfs."""
    bdf = sysfs_bdf(bus_id)
    if bdf is None:
        return None
    try:
        target = os.readlink(sysfs / "bus" / "pci" / "devices" / bdf)
    except OSError:
        return None
    parts = [p for p in target.split("/") if p not in ("", ".", "..")]
    roots = [i for i, p in enumerate(parts) if p.startswith("pci")]
    if not roots or parts[-1].lower() != bdf:
        return None
    return tuple(p.lower() for p in parts[roots[0] : -1])


def _shared_depth(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    depth = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        depth += 1
    return depth


def closest_nics(
    sysfs: Path, gpu_bus_ids: Sequence[str], rdma: Sequence[RdmaDevice]
) -> Mapping[str, tuple[str, ...]]:
    """For each GPU bus id, the RDMA device names that share its deepest PCI bridge (sorted).

    A GPU that shares no bridge below the host bridge with any NIC maps to ()."""
    nic_paths: list[tuple[str, tuple[str, ...]]] = []
    for device in rdma:
        path = bridge_path(sysfs, device.pci_address) if device.pci_address else None
        if path is not None:
            nic_paths.append((device.name, path))
    result: dict[str, tuple[str, ...]] = {}
    for bus_id in gpu_bus_ids:
        gpu_path = bridge_path(sysfs, bus_id)
        result[bus_id] = _deepest(gpu_path, nic_paths) if gpu_path else ()
    return result


def _deepest(gpu_path: tuple[str, ...], nic_paths: Sequence[tuple[str, tuple[str, ...]]]) -> tuple[str, ...]:
    depths = [(_shared_depth(gpu_path, path), name) for name, path in nic_paths]
    best = max((d for d, _ in depths), default=0)
    if best < 2:  # only the host bridge (or nothing) in common: no PCIe switch/port shared
        return ()
    return tuple(sorted((name for d, name in depths if d == best), key=_natural))


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)
