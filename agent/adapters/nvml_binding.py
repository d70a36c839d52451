"""The real `NvmlBackend`, over nvidia-ml-py's `pynvml`.

Why an adapter: pynvml is a ctypes veneer over libnvidia-ml.so.1, which exists only where the
NVIDIA driver is installed. Everything here is translation: pynvml's per-code exception classes
become `NvmlError(call, NAME)`; ctypes structs become the report's dataclasses; byte strings become
text. The probe never sees pynvml.

Version tolerance: nvidia-ml-py and the driver's libnvidia-ml move independently. GPU fabric info
is read with the versioned `nvmlDeviceGetGpuFabricInfoV` (a struct whose first field is its
version) and falls back to the older `nvmlDeviceGetGpuFabricInfo` when the library or the binding
predates it (FUNCTION_NOT_FOUND / missing attribute).
"""

from __future__ import annotations

import ctypes
import logging
import uuid as uuidlib
from collections.abc import Callable
from typing import Any, TypeVar

from agent.common.report import GpuFabric
from agent.probes.nvml_backend import CALLS, NvmlBackend, NvmlError, RemoteType, XidEvent

log = logging.getLogger(__name__)

R = TypeVar("R")

_FABRIC_STATES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}


def _error_names(pynvml: Any) -> dict[int, str]:
    """NVML_ERROR_GPU_IS_LOST = 15 -> {15: "GPU_IS_LOST"}, from whatever codes this pynvml knows."""
    prefix = "NVML_ERROR_"
    names = (k for k in dir(pynvml) if k.startswith(prefix))
    return {getattr(pynvml, k): k[len(prefix) :] for k in names if isinstance(getattr(pynvml, k), int)}


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """`NvmlBackend` over an initialised pynvml (see `open_backend`)."""

    def __init__(self, pynvml: Any) -> None:
        self._nv = pynvml
        self._names = _error_names(pynvml)
        self.max_links: int = int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))
        self._event_set: Any = None

    def _run(self, method: str, fn: Callable[..., R], *args: object) -> R:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise NvmlError(CALLS[method], self._names.get(exc.value, f"ERROR_{exc.value}")) from exc

    def close(self) -> None:
        if self._event_set is not None:
            self._run("register_xid_events", self._nv.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._nv.nvmlShutdown()

    def driver_version(self) -> str:
        return _text(self._run("driver_version", self._nv.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(self._run("device_count", self._nv.nvmlDeviceGetCount))

    def handle(self, index: int) -> Any:
        return self._run("handle", self._nv.nvmlDeviceGetHandleByIndex, index)

    def name(self, handle: Any) -> str:
        return _text(self._run("name", self._nv.nvmlDeviceGetName, handle))

    def uuid(self, handle: Any) -> str:
        return _text(self._run("uuid", self._nv.nvmlDeviceGetUUID, handle))

    def pci_bus_id(self, handle: Any) -> str:
        info = self._run("pci_bus_id", self._nv.nvmlDeviceGetPciInfo, handle)
        return _text(info.busId)

    def numa_node(self, handle: Any) -> int | None:
        node = int(self._run("numa_node", self._nv.nvmlDeviceGetNumaNodeId, handle))
        return node if node >= 0 else None

    def link_state(self, handle: Any, link: int) -> bool:
        return bool(self._run("link_state", self._nv.nvmlDeviceGetNvLinkState, handle, link))

    def link_version(self, handle: Any, link: int) -> int:
        return int(self._run("link_version", self._nv.nvmlDeviceGetNvLinkVersion, handle, link))

    def link_remote_type(self, handle: Any, link: int) -> RemoteType:
        kind = self._run("link_remote_type", self._nv.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        if kind == self._nv.NVML_NVLINK_DEVICE_TYPE_GPU:
            return "gpu"
        if kind == self._nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            return "nvswitch"
        return "unknown"

    def link_remote_pci_bus_id(self, handle: Any, link: int) -> str:
        info = self._run("link_remote_pci_bus_id", self._nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        return _text(info.busId)

    def link_error_counter(self, handle: Any, link: int, counter: str) -> int:
        code = getattr(self._nv, f"NVML_NVLINK_ERROR_DL_{counter.upper()}")
        fn = self._nv.nvmlDeviceGetNvLinkErrorCounter
        return int(self._run("link_error_counter", fn, handle, link, code))

    def fabric_info(self, handle: Any) -> GpuFabric:
        info = self._fabric_struct(handle)
        status = int(info.status)
        return GpuFabric(
            cluster_uuid=str(uuidlib.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=_FABRIC_STATES.get(int(info.state), "unknown"),
            status="success" if status == 0 else self._names.get(status, f"ERROR_{status}"),
            health_mask=int(info.healthMask) if hasattr(info, "healthMask") else None,
        )

    def _fabric_struct(self, handle: Any) -> Any:
        versioned = getattr(self._nv, "c_nvmlGpuFabricInfoV_t", None)
        if versioned is not None and hasattr(self._nv, "nvmlDeviceGetGpuFabricInfoV"):
            info = versioned()
            try:
                self._run("fabric_info", self._nv.nvmlDeviceGetGpuFabricInfoV, handle, ctypes.byref(info))
                return info
            except NvmlError as exc:
                if exc.name != "FUNCTION_NOT_FOUND":
                    raise
        info = self._nv.c_nvmlGpuFabricInfo_t()
        self._run("fabric_info", self._nv.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info))
        return info

    def uncorrected_ecc(self, handle: Any) -> int:
        nv = self._nv
        fn = nv.nvmlDeviceGetTotalEccErrors
        args = (handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        return int(self._run("uncorrected_ecc", fn, *args))

    def register_xid_events(self) -> int:
        nv = self._nv
        if self._event_set is None:
            self._event_set = self._run("register_xid_events", nv.nvmlEventSetCreate)
        registered = 0
        for index in range(self.device_count()):
            try:
                handle = self.handle(index)
                self._run(
                    "register_xid_events",
                    nv.nvmlDeviceRegisterEvents,
                    handle,
                    nv.nvmlEventTypeXidCriticalError,
                    self._event_set,
                )
                registered += 1
            except NvmlError as exc:  # e.g. NOT_SUPPORTED on a GPU without event support
                log.warning("GPU %d: no XID events: %s", index, exc)
        return registered

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        if self._event_set is None:
            raise NvmlError(CALLS["wait_xid"], "UNINITIALIZED")
        try:
            data = self._run("wait_xid", self._nv.nvmlEventSetWait, self._event_set, timeout_ms)
        except NvmlError as exc:
            if exc.name == "TIMEOUT":
                return None
            raise
        index = int(self._run("wait_xid", self._nv.nvmlDeviceGetIndex, data.device))
        return XidEvent(gpu_index=index, xid=int(data.eventData))


def load_backend() -> tuple[NvmlBackend | None, str]:
    """Initialises NVML: the backend, or None and why (logged too) when the library or driver is
    not there; the reason travels into the nvml component's health (`agent.probes.nvidia_pci`)."""
    try:
        import pynvml
    except ImportError as exc:
        reason = f"nvidia-ml-py not importable ({exc})"
        log.info("NVML absent: %s", reason)
        return None, reason
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("NVML absent: %s", exc)
        return None, str(exc)
    except OSError as exc:  # a broken libnvidia-ml.so that dlopen finds but cannot load
        log.info("NVML absent: %s", exc)
        return None, str(exc)
    return PynvmlBackend(pynvml), ""


def open_backend() -> NvmlBackend | None:
    """`load_backend` without the reason (the reason is logged)."""
    return load_backend()[0]
