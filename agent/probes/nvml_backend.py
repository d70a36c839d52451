"""The small surface of NVML that hypertopo uses, as a typed Protocol.

Why a protocol: NVML is a C library that exists only on GPU machines. Everything the agent derives
from it (NVLink topology, fabric clique, GPU health) is pure logic over a handful of answers, so the
probe takes any object with these methods: the real binding (`agent.adapters.nvml_binding`, over
nvidia-ml-py) on GPU nodes, a deterministic fake (`agent.probes.nvml_fake`) everywhere else.

Each method mirrors exactly one NVML call (named in `CALLS`), and a failing call raises
`NvmlError` carrying that call and NVML's error name (`NOT_SUPPORTED`, `GPU_IS_LOST`, ...) so the
probe can say precisely what failed, and can treat `NOT_SUPPORTED` as "feature absent".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from agent.common.report import GpuFabric

RemoteType = Literal["gpu", "nvswitch", "unknown"]

# NVLink DL error counters (nvmlNvLinkErrorCounter_t): replay, recovery, CRC flit, CRC data.
ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")

# Backend method -> the NVML function it stands for (used in error reasons).
CALLS: Mapping[str, str] = {
    "driver_version": "nvmlSystemGetDriverVersion",
    "device_count": "nvmlDeviceGetCount",
    "handle": "nvmlDeviceGetHandleByIndex",
    "name": "nvmlDeviceGetName",
    "uuid": "nvmlDeviceGetUUID",
    "pci_bus_id": "nvmlDeviceGetPciInfo",
    "numa_node": "nvmlDeviceGetNumaNodeId",
    "link_state": "nvmlDeviceGetNvLinkState",
    "link_version": "nvmlDeviceGetNvLinkVersion",
    "link_remote_type": "nvmlDeviceGetNvLinkRemoteDeviceType",
    "link_remote_pci_bus_id": "nvmlDeviceGetNvLinkRemotePciInfo",
    "link_error_counter": "nvmlDeviceGetNvLinkErrorCounter",
    "fabric_info": "nvmlDeviceGetGpuFabricInfoV",
    "uncorrected_ecc": "nvmlDeviceGetTotalEccErrors",
    "register_xid_events": "nvmlDeviceRegisterEvents",
    "wait_xid": "nvmlEventSetWait",
}

# Error names (NVML_ERROR_<NAME> without the prefix) that the probe reads as "no such thing".
NOT_SUPPORTED = "NOT_SUPPORTED"
NO_SUCH_LINK = frozenset({NOT_SUPPORTED, "INVALID_ARGUMENT"})
GPU_IS_LOST = "GPU_IS_LOST"


class NvmlError(Exception):
    """One NVML call failed: `call` is the NVML function, `name` the NVML error name."""

    def __init__(self, call: str, name: str) -> None:
        super().__init__(f"{call}: {name}")
        self.call = call
        self.name = name


@dataclass(frozen=True)
class XidEvent:
    """A critical XID event (nvmlEventTypeXidCriticalError): which GPU and which XID."""

    gpu_index: int
    xid: int


class DeviceHandle(Protocol):
    """Opaque per-GPU handle (an nvmlDevice_t for the real binding)."""


class NvmlBackend(Protocol):
    """Exactly the NVML calls hypertopo needs. Every method may raise `NvmlError`."""

    max_links: int  # NVML_NVLINK_MAX_LINKS of the library in use

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def handle(self, index: int) -> DeviceHandle: ...

    def name(self, handle: DeviceHandle) -> str: ...

    def uuid(self, handle: DeviceHandle) -> str: ...

    def pci_bus_id(self, handle: DeviceHandle) -> str:
        """NVML's bus id form: `00000000:18:00.0` (8-digit domain, upper-case hex)."""
        ...

    def numa_node(self, handle: DeviceHandle) -> int | None:
        """The GPU's NUMA node; None when the platform reports none (-1)."""
        ...

    def link_state(self, handle: DeviceHandle, link: int) -> bool:
        """True when the link is active. NOT_SUPPORTED / INVALID_ARGUMENT: no such link."""
        ...

    def link_version(self, handle: DeviceHandle, link: int) -> int: ...

    def link_remote_type(self, handle: DeviceHandle, link: int) -> RemoteType: ...

    def link_remote_pci_bus_id(self, handle: DeviceHandle, link: int) -> str: ...

    def link_error_counter(self, handle: DeviceHandle, link: int, counter: str) -> int:
        """One of `ERROR_COUNTERS`."""
        ...

    def fabric_info(self, handle: DeviceHandle) -> GpuFabric:
        """Multi-node NVLink fabric membership; NOT_SUPPORTED on GPUs without it (HGX H100)."""
        ...

    def uncorrected_ecc(self, handle: DeviceHandle) -> int:
        """Volatile (since driver load) total of uncorrected ECC errors."""
        ...

    def register_xid_events(self) -> int:
        """Registers every GPU for critical XID events; returns how many GPUs were registered."""
        ...

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        """Blocks up to `timeout_ms` for the next XID event; None on timeout."""
        ...
