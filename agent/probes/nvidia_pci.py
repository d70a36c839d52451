"""NVIDIA GPUs on the PCI bus, from sysfs: what tells a GPU node whose NVML is missing from a node
without GPUs.

Why: libnvidia-ml reaches a container only through the NVIDIA container runtime (the pod's
`runtimeClassName`, or the runtime being containerd's default) and only with the `utility` driver
capability. Without it NVML cannot be loaded and the node used to report `nvml: absent`, exactly
what a CPU node reports: its GPUs vanished from the topology without a word. sysfs shows the PCI
bus whatever the container runtime does, so a GPU on it and no NVML is a failure with a reason.

What counts: vendor 0x10de (NVIDIA) with PCI class 0x0300 (VGA-compatible controller) or 0x0302
(3D controller; every data-centre GPU) per the PCI Code and ID Assignment specification, read from
`bus/pci/devices/<bdf>/{vendor,class}` (Documentation/ABI/testing/sysfs-bus-pci). NVSwitches
(class 0x0680, bridge) are not GPUs. A GPU bound to `vfio-pci` or `pci-stub` is handed to a virtual
machine, not to this node's NVML, and is not counted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.common.report import NvmlReport, ProbeResult
from agent.probes.sysfs_attr import link_name, list_dir, read_int

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = frozenset({0x0300, 0x0302})  # base class 03 (display), subclass 00 (VGA) / 02 (3D)
PASSTHROUGH_DRIVERS = frozenset({"vfio-pci", "pci-stub"})
NOT_LOADED_HINT = (
    "is the pod's runtimeClassName the NVIDIA runtime and NVIDIA_DRIVER_CAPABILITIES includes utility?"
)
NO_DEVICES_HINT = "does the pod set NVIDIA_VISIBLE_DEVICES=all?"
NO_DRIVER_HINT = "no kernel driver is bound to them: is the NVIDIA driver installed on the host?"


@dataclass(frozen=True)
class PciGpu:
    """One NVIDIA GPU function on the bus and the kernel driver bound to it (None: none bound)."""

    bdf: str
    driver: str | None


def nvidia_gpus(sysfs: Path) -> tuple[PciGpu, ...]:
    """Every NVIDIA display/3D controller under `bus/pci/devices`, in bus order; () when the tree
    is not there (a sysfs without PCI, a fixture)."""
    root = os.path.join(sysfs, "bus", "pci", "devices")
    found = []
    for bdf in sorted(list_dir(root) or ()):  # fixed-width hex: plain order is bus order
        path = os.path.join(root, bdf)
        if read_int(os.path.join(path, "vendor"), base=16) != NVIDIA_VENDOR:
            continue
        pci_class = read_int(os.path.join(path, "class"), base=16)
        if pci_class is None or pci_class >> 8 not in GPU_CLASSES:
            continue
        found.append(PciGpu(bdf, link_name(os.path.join(path, "driver"))))
    return tuple(found)


def host_gpus(gpus: Sequence[PciGpu]) -> tuple[PciGpu, ...]:
    """The GPUs this node's NVML should see: those not handed to a virtual machine."""
    return tuple(g for g in gpus if g.driver not in PASSTHROUGH_DRIVERS)


def without_nvml(sysfs: Path, load_error: str) -> ProbeResult[NvmlReport]:
    """The nvml component when libnvidia-ml could not be loaded (`load_error` says why): failed when
    NVIDIA GPUs are on the PCI bus, absent (as on any GPU-less node) otherwise."""
    gpus = host_gpus(nvidia_gpus(sysfs))
    if not gpus:
        return ProbeResult.absent("NVML library not found")
    why = load_error or "library not found"
    hint = NO_DRIVER_HINT if all(g.driver is None for g in gpus) else NOT_LOADED_HINT
    return ProbeResult.failed(
        f"NVIDIA GPUs on the PCI bus ({len(gpus)}) but libnvidia-ml could not be loaded: {why}; {hint}"
    )


def unseen_by_nvml(sysfs: Path) -> ProbeResult[NvmlReport] | None:
    """When NVML loads but counts no GPU: failed if the PCI bus has some (the container was given
    the library but no devices), else None (a GPU-less node, absent as before)."""
    gpus = host_gpus(nvidia_gpus(sysfs))
    if not gpus:
        return None
    hint = NO_DRIVER_HINT if all(g.driver is None for g in gpus) else NO_DEVICES_HINT
    return ProbeResult.failed(f"NVIDIA GPUs on the PCI bus ({len(gpus)}) but NVML sees none; {hint}")
