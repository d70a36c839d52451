"""A deterministic NVML fake named after real machines, with fault injection.

Why: CI machines have no GPUs, yet the NVML probe, the metrics, the aggregator's NVLink domains and
the benchmarks all need realistic NVML answers. `FakeNvml` implements `NvmlBackend` with the
answers two real machines give:

- `hgx-h100`: an 8-GPU HGX H100 board (DGX H100 class). "NVIDIA H100 80GB HBM3" at the PCI bus
  ids of a real capture (nvidia-smi -q of 8x H100 SXM, ../shared/data/nvidia-smi), GPUs 0-3 on
  NUMA node 0 and 4-7 on node 1 (nvidia-smi topo -m of the same board type), 18 NVLink 4 links per
  GPU spread 5/4/4/5 over the board's 4 NVSwitches (which sit on PCI as bridges at 05:00.0-08:00.0).
  No multi-node fabric: fabric info is NOT_SUPPORTED.
- `gb200-nvl72`: one compute tray of a GB200 NVL72 rack: 4 B200 GPUs behind two Grace CPUs
  (PCI domains 8, 9, 0x18, 0x19), 18 NVLink 5 links each, one to each NVSwitch chip of the rack's
  9 switch trays (those are not on this tray's PCI bus: remote PCI info is NOT_SUPPORTED), and a
  completed fabric registration whose clique the 18 trays of the rack share.

Faults for tests: a link down, an XID event, a call failing with an NVML error, ECC errors, a
fabric state, a GPU lost.
"""

from __future__ import annotations

import dataclasses
import queue
import uuid
from dataclasses import dataclass

from agent.common.report import GpuFabric
from agent.probes.nvml_backend import CALLS, ERROR_COUNTERS, NvmlError, RemoteType, XidEvent

# nvmlGpuFabricInfoV_t.healthMask of a healthy GB200 tray: every 2-bit field "FALSE" (2): degraded
# bandwidth (bits 0-1), route recovery (2-3), route unhealthy (4-5), access timeout recovery (6-7)
HEALTHY_FABRIC_MASK = 0b10101010

DEFAULT_CLUSTER_UUID = "5c1d6a2e-8f47-4b0a-9e3c-7d2b1f6a9e40"
DEFAULT_CLIQUE_ID = 32766
MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in NVML 12.8+: links past a GPU's own count do not exist
_UUID_NAMESPACE = uuid.UUID("6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b")


@dataclass(frozen=True)
class Profile:
    product: str
    driver: str
    bus_ids: tuple[str, ...]
    numa: tuple[int, ...]
    link_version: int
    switch_of_link: tuple[int, ...]  # per NVLink: which NVSwitch it reaches
    switch_bus_ids: tuple[str, ...] | None  # None: remote PCI info not supported
    multi_node: bool


PROFILES: dict[str, Profile] = {
    "hgx-h100": Profile(
        product="NVIDIA H100 80GB HBM3",
        driver="565.57.01",
        bus_ids=tuple(f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        link_version=4,
        switch_of_link=(0,) * 5 + (1,) * 4 + (2,) * 4 + (3,) * 5,
        switch_bus_ids=tuple(f"00000000:{b:02X}:00.0" for b in range(5, 9)),
        multi_node=False,
    ),
    "gb200-nvl72": Profile(
        product="NVIDIA GB200",
        driver="570.124.06",
        bus_ids=("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"),
        numa=(0, 0, 1, 1),
        link_version=5,
        switch_of_link=tuple(range(18)),
        switch_bus_ids=None,
        multi_node=True,
    ),
}


@dataclass(frozen=True)
class FakeHandle:
    index: int


class FakeNvml:
    """`NvmlBackend` with the answers of a real machine profile (see module docstring)."""

    def __init__(
        self, profile: str, *, cluster_uuid: str | None = None, clique_id: int | None = None, node: str = ""
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"unknown NVML fake profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
        self.profile = PROFILES[profile]
        self.max_links = MAX_LINKS
        self._uuids = [
            f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{profile}/{node}/{i}')}" for i in range(self.gpus)
        ]
        self._down: set[tuple[int, int]] = set()
        self._ecc: dict[int, int] = {}
        self._link_errors: dict[tuple[int, int, str], int] = {}
        self._fabric: dict[int, GpuFabric | None] = {}
        self._failures: dict[tuple[str, int | None], str] = {}
        self._events: queue.Queue[XidEvent] = queue.Queue()
        self._registered = False
        if self.profile.multi_node:
            fabric = GpuFabric(
                cluster_uuid=cluster_uuid or DEFAULT_CLUSTER_UUID,
                clique_id=DEFAULT_CLIQUE_ID if clique_id is None else clique_id,
                state="completed",
                status="success",
                health_mask=HEALTHY_FABRIC_MASK,
            )
            self._fabric = dict.fromkeys(range(self.gpus), fabric)

    @property
    def gpus(self) -> int:
        return len(self.profile.bus_ids)

    # --- fault injection ---------------------------------------------------------------------

    def set_link(self, gpu: int, link: int, *, up: bool) -> None:
        (self._down.discard if up else self._down.add)((gpu, link))

    def inject_xid(self, gpu: int, xid: int) -> None:
        self._events.put(XidEvent(gpu, xid))

    def fail(self, method: str, error: str = "UNKNOWN", *, gpu: int | None = None) -> None:
        """Makes backend `method` raise NVML error `error` (for one GPU, or for all)."""
        if method not in CALLS:
            raise ValueError(f"no backend method {method!r}")
        self._failures[(method, gpu)] = error

    def heal(self) -> None:
        self._failures.clear()

    def lose_gpu(self, gpu: int) -> None:
        """Every per-GPU call on `gpu` raises GPU_IS_LOST, as after XID 79."""
        for method in CALLS:
            if method not in ("driver_version", "device_count", "register_xid_events", "wait_xid"):
                self._failures[(method, gpu)] = "GPU_IS_LOST"

    def set_link_errors(self, gpu: int, link: int, **counters: int) -> None:
        """Sets NVLink DL error counters (`replay=`, `recovery=`, `crc_flit=`, `crc_data=`)."""
        for counter, value in counters.items():
            if counter not in ERROR_COUNTERS:
                raise ValueError(f"no NVLink error counter {counter!r}")
            self._link_errors[(gpu, link, counter)] = value

    def set_uncorrected_ecc(self, gpu: int, count: int) -> None:
        self._ecc[gpu] = count

    def set_fabric_health(self, gpu: int, **bits: bool) -> None:
        """Sets fabric health mask fields (`degraded_bw=`, `route_recovery=`, `route_unhealthy=`,
        `access_timeout_recovery=`: True or False, as a GB200 driver reports them)."""
        from agent.probes.nvlink_health import encode_health_mask

        fabric = self._fabric.get(gpu)
        if fabric is None:
            raise ValueError(f"GPU {gpu} has no fabric registration to set health on")
        self._fabric[gpu] = dataclasses.replace(
            fabric, health_mask=encode_health_mask(fabric.health_mask, **bits)
        )

    def set_fabric(self, gpu: int, fabric: GpuFabric | None) -> None:
        """None: the GPU answers NOT_SUPPORTED to fabric info."""
        self._fabric[gpu] = fabric

    # --- NvmlBackend ---------------------------------------------------------------------------

    def _check(self, method: str, gpu: int | None = None) -> None:
        error = self._failures.get((method, gpu)) or self._failures.get((method, None))
        if error:
            raise NvmlError(CALLS[method], error)

    def _index(self, method: str, handle: object) -> int:
        if not isinstance(handle, FakeHandle):
            raise NvmlError(CALLS[method], "INVALID_ARGUMENT")
        self._check(method, handle.index)
        return handle.index

    def _link(self, method: str, handle: object, link: int) -> int:
        index = self._index(method, handle)
        if not 0 <= link < len(self.profile.switch_of_link):
            raise NvmlError(CALLS[method], "INVALID_ARGUMENT")
        return index

    def driver_version(self) -> str:
        self._check("driver_version")
        return self.profile.driver

    def device_count(self) -> int:
        self._check("device_count")
        return self.gpus

    def handle(self, index: int) -> FakeHandle:
        self._check("handle", index)
        if not 0 <= index < self.gpus:
            raise NvmlError(CALLS["handle"], "INVALID_ARGUMENT")
        return FakeHandle(index)

    def name(self, handle: object) -> str:
        self._index("name", handle)
        return self.profile.product

    def uuid(self, handle: object) -> str:
        return self._uuids[self._index("uuid", handle)]

    def pci_bus_id(self, handle: object) -> str:
        return self.profile.bus_ids[self._index("pci_bus_id", handle)]

    def numa_node(self, handle: object) -> int | None:
        return self.profile.numa[self._index("numa_node", handle)]

    def link_state(self, handle: object, link: int) -> bool:
        return (self._link("link_state", handle, link), link) not in self._down

    def link_version(self, handle: object, link: int) -> int:
        self._link("link_version", handle, link)
        return self.profile.link_version

    def link_remote_type(self, handle: object, link: int) -> RemoteType:
        self._link("link_remote_type", handle, link)
        return "nvswitch"

    def link_remote_pci_bus_id(self, handle: object, link: int) -> str:
        self._link("link_remote_pci_bus_id", handle, link)
        if self.profile.switch_bus_ids is None:
            raise NvmlError(CALLS["link_remote_pci_bus_id"], "NOT_SUPPORTED")
        return self.profile.switch_bus_ids[self.profile.switch_of_link[link]]

    def link_error_counter(self, handle: object, link: int, counter: str) -> int:
        index = self._link("link_error_counter", handle, link)
        if counter not in ERROR_COUNTERS:
            raise NvmlError(CALLS["link_error_counter"], "INVALID_ARGUMENT")
        return self._link_errors.get((index, link, counter), 0)

    def fabric_info(self, handle: object) -> GpuFabric:
        fabric = self._fabric.get(self._index("fabric_info", handle))
        if fabric is None:
            raise NvmlError(CALLS["fabric_info"], "NOT_SUPPORTED")
        return fabric

    def uncorrected_ecc(self, handle: object) -> int:
        return self._ecc.get(self._index("uncorrected_ecc", handle), 0)

    def register_xid_events(self) -> int:
        self._check("register_xid_events")
        self._registered = True
        return self.gpus

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        self._check("wait_xid")
        if not self._registered:
            raise NvmlError(CALLS["wait_xid"], "UNINITIALIZED")
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None
