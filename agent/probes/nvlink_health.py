"""Grey health of NVLink: per-link error counter rates, and the GPU fabric health mask.

Counters: NVML's per-link DL error counters (nvmlDeviceGetNvLinkErrorCounter: replay, recovery,
CRC flit, CRC data), read by the nvml probe on every up link, kept per link in a window.

Fabric health: `nvmlDeviceGetGpuFabricInfoV` returns `healthMask`, 2-bit fields (nvml.h,
NVML_GPU_FABRIC_HEALTH_MASK_*: 0 not supported, 1 TRUE, 2 FALSE):
    bits 0-1  DEGRADED_BW               the GPU's NVLink bandwidth is degraded
    bits 2-3  ROUTE_RECOVERY            a route recovery is in progress
    bits 4-5  ROUTE_UNHEALTHY           some route to a peer is unhealthy
    bits 6-7  ACCESS_TIMEOUT_RECOVERY   recovering from an access timeout
A TRUE field is a finding on the GPU: degraded, except an unhealthy route, which is failed (peers
behind it cannot be reached). Higher fields (incorrect configuration, partition, GFM state) are
left alone here: the registration state and status already say when the fabric is not usable.
"""

from __future__ import annotations

from typing import Any

from agent.common.report import ComponentHealth, Finding, Health, ProbeResult
from agent.probes.grey import Windows, rate_findings
from agent.probes.protocol import Cycle

TRUE, FALSE = 1, 2
# field -> (shift, severity, reason)
HEALTH_FIELDS: dict[str, tuple[int, Health, str]] = {
    "degraded_bw": (0, Health.DEGRADED, "NVLink fabric bandwidth degraded"),
    "route_recovery": (2, Health.DEGRADED, "NVLink fabric route recovery in progress"),
    "route_unhealthy": (4, Health.FAILED, "NVLink fabric route unhealthy"),
    "access_timeout_recovery": (6, Health.DEGRADED, "NVLink fabric recovering from an access timeout"),
}


def decode_health_mask(mask: int) -> list[tuple[str, Health, str]]:
    """The fields of a health mask that are TRUE (name, severity, reason)."""
    return [
        (name, sev, why) for name, (shift, sev, why) in HEALTH_FIELDS.items() if (mask >> shift) & 3 == TRUE
    ]


def encode_health_mask(mask: int | None, **bits: bool) -> int:
    """`mask` with the named fields set TRUE or FALSE (for the fake and tests)."""
    out = mask or 0
    for name, value in bits.items():
        shift = HEALTH_FIELDS[name][0]
        out = (out & ~(3 << shift)) | ((TRUE if value else FALSE) << shift)
    return out


def fabric_findings(gpus: Any) -> list[Finding]:
    found = []
    for gpu in gpus:
        mask = gpu.fabric.health_mask if gpu.fabric is not None else None
        for name, severity, why in decode_health_mask(mask or 0):
            found.append(
                Finding(
                    component="nvml", subject=f"gpu{gpu.index}", kind="fabric-health", severity=severity,
                    value=f"{name}=true (mask 0x{mask:x})", threshold=f"{name}=false", window_s=0,
                    reason=f"gpu{gpu.index}: {why} (fabric health mask 0x{mask:x})",
                )
            )  # fmt: skip
    return found


class NvlinkHealthProbe:
    name = "nvlink-health"

    def __init__(self) -> None:
        self._windows: Windows | None = None

    def run(self, cycle: Cycle) -> ProbeResult[Any]:
        grey = cycle.config.grey
        if self._windows is None:
            self._windows = Windows(grey.error_window_s)
        nvml = cycle.value("nvml", None)
        gpus = nvml.gpus if nvml is not None else ()
        seen = []
        for gpu in gpus:
            for link in gpu.nvlinks:
                subject = f"gpu{gpu.index}/nvlink{link.link}"
                seen += [(subject, c) for c in link.error_counters]
                cycle.findings += rate_findings(
                    component="nvml", subject=subject, windows=self._windows, counters=link.error_counters,
                    limits=grey.nvlink_limits, now=cycle.now, kind="nvlink-errors",
                )  # fmt: skip
        cycle.findings += fabric_findings(gpus)
        self._windows.forget_except(seen)
        return ProbeResult(len(seen), ComponentHealth(Health.OK))
