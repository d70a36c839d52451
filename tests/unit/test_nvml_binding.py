"""The real NVML binding: absent without libnvidia-ml, and its translation of pynvml's answers.

On a machine without the NVIDIA driver (CI) `open_backend()` must say None and the probe absent;
on a GPU machine it must open and the probe must see GPUs. The translation tests run the real
`PynvmlBackend` over the real pynvml module (its error classes, constants and ctypes structs)
with only the C entry points replaced, so error names, struct decoding and the fabric-info
fallback are checked without a GPU.
"""

from __future__ import annotations

import ctypes
import uuid
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.adapters.nvml_binding import PynvmlBackend, open_backend
from agent.common.report import GpuFabric, Health
from agent.probes import nvml
from agent.probes.nvml_backend import NvmlError, XidEvent


def libnvidia_ml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_without_libnvidia_ml_the_backend_is_none_and_the_probe_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if libnvidia_ml_loads():
        backend = open_backend()
        assert backend is not None, "libnvidia-ml loads, so NVML must open"
        result = nvml.probe(backend, sysfs=Path("/sys"))
        assert result.health.state != Health.FAILED, result.health.reason
        return
    caplog.set_level("INFO", logger="agent.adapters.nvml_binding")
    assert open_backend() is None
    assert "NVML absent" in caplog.text and "Library Not Found" in caplog.text
    result = nvml.probe(open_backend(), sysfs=Path("/sys"))
    assert result.health.state == Health.ABSENT
    assert result.health.reason == "NVML library not found"


class Shim:
    """The pynvml module with some C entry points replaced."""

    def __init__(self, **overrides: Any) -> None:
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(pynvml)) | set(self.__dict__))


def raising(code: int) -> Any:
    def fn(*args: object) -> None:
        raise pynvml.NVMLError(code)

    return fn


def fill_fabric(state: int, status: int, clique: int, cluster: uuid.UUID) -> Any:
    def fn(handle: object, ref: Any) -> int:
        info = ref._obj
        info.clusterUuid[:] = list(cluster.bytes)
        info.state, info.status, info.cliqueId = state, status, clique
        return 0

    return fn


def test_pynvml_errors_become_nvml_errors_naming_call_and_error() -> None:
    backend = PynvmlBackend(Shim(nvmlDeviceGetNvLinkState=raising(pynvml.NVML_ERROR_GPU_IS_LOST)))
    with pytest.raises(NvmlError) as caught:
        backend.link_state(object(), 3)
    assert (caught.value.call, caught.value.name) == ("nvmlDeviceGetNvLinkState", "GPU_IS_LOST")


def test_fabric_info_is_read_with_the_versioned_call() -> None:
    cluster = uuid.UUID("5c1d6a2e-8f47-4b0a-9e3c-7d2b1f6a9e40")
    shim = Shim(
        nvmlDeviceGetGpuFabricInfoV=fill_fabric(3, 0, 32766, cluster), nvmlDeviceGetGpuFabricInfo=None
    )
    assert PynvmlBackend(shim).fabric_info(object()) == GpuFabric(str(cluster), 32766, "completed", "success")


def test_fabric_info_falls_back_to_the_old_call_when_the_driver_lacks_the_versioned_one() -> None:
    cluster = uuid.UUID(int=0)
    shim = Shim(
        nvmlDeviceGetGpuFabricInfoV=raising(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
        nvmlDeviceGetGpuFabricInfo=fill_fabric(2, pynvml.NVML_ERROR_TIMEOUT, 0, cluster),
    )
    fabric = PynvmlBackend(shim).fabric_info(object())
    assert fabric == GpuFabric("00000000-0000-0000-0000-000000000000", 0, "in-progress", "TIMEOUT")


def test_fabric_info_not_supported_is_passed_on_as_not_supported() -> None:
    shim = Shim(nvmlDeviceGetGpuFabricInfoV=raising(pynvml.NVML_ERROR_NOT_SUPPORTED))
    with pytest.raises(NvmlError) as caught:
        PynvmlBackend(shim).fabric_info(object())
    assert caught.value.name == "NOT_SUPPORTED"


def test_bus_ids_come_back_as_text_and_remote_types_as_words() -> None:
    info = pynvml.nvmlPciInfo_t()
    info.busId = b"00000000:18:00.0"
    types = {0: pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, 1: pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, 2: 0xFF}
    shim = Shim(
        nvmlDeviceGetPciInfo=lambda h: info,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: info,
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda h, link: types[link],
        nvmlDeviceGetNumaNodeId=lambda h: -1,
    )
    backend = PynvmlBackend(shim)
    assert backend.pci_bus_id(object()) == "00000000:18:00.0"
    assert backend.link_remote_pci_bus_id(object(), 0) == "00000000:18:00.0"
    assert [backend.link_remote_type(object(), link) for link in range(3)] == ["gpu", "nvswitch", "unknown"]
    assert backend.numa_node(object()) is None


def test_xid_wait_timeout_is_none_and_an_event_names_gpu_and_xid() -> None:
    event = pynvml.c_nvmlEventData_t()
    event.eventData = 79
    answers: list[Any] = [pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT), event]

    def wait(event_set: object, timeout_ms: int) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    shim = Shim(
        nvmlEventSetCreate=lambda: "set",
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceRegisterEvents=lambda h, types, s: None,
        nvmlEventSetWait=wait,
        nvmlDeviceGetIndex=lambda h: 1,
    )
    backend = PynvmlBackend(shim)
    assert backend.register_xid_events() == 2
    assert backend.wait_xid(10) is None
    assert backend.wait_xid(10) == XidEvent(gpu_index=1, xid=79)


def test_error_counters_map_to_nvml_dl_counter_codes() -> None:
    asked: list[int] = []

    def counter(handle: object, link: int, code: int) -> int:
        asked.append(code)
        return 7

    backend = PynvmlBackend(Shim(nvmlDeviceGetNvLinkErrorCounter=counter))
    values = [
        backend.link_error_counter(object(), 0, c) for c in ("replay", "recovery", "crc_flit", "crc_data")
    ]
    assert values == [7, 7, 7, 7]
    assert asked == [
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
        pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    ]
