"""Runs the real NVML binding through the probe on a GPU machine and writes the result as JSON.

Why: CI has no GPUs, so the fake stands in there; this script is how the real binding is checked
when a GPU machine is at hand, and its output is kept as a fixture with a note of the machine.

    python tests/gpu/run_real_nvml.py --out nvml-report.json [--sysfs /sys] [--xid-seconds 5]

The JSON holds: `machine` (hostname, kernel, driver, GPU names: the note to keep with the
fixture), `health`, `wire` (what would go into the NodeTopology spec), `full` (every field,
counters included), `xid` (what the watcher saw), `timing_ms` (probe duration), and `grey` (issue
10): per GPU the raw fabric health mask and its decoded fields, the PCIe link attributes from sysfs
(current and max speed and width), the NVLink error counters of two reads `--grey-seconds` apart,
and the findings and component health of two full agent probe cycles over the real NVML binding
and the host's sysfs (`--grey-seconds 0` skips it). Exit status:
0 when NVML answered (even degraded), 1 when the probe is absent or failed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.adapters.nvml_binding import open_backend
from agent.collect import CollectConfig, Prober
from agent.common.report import Health, to_wire
from agent.probes import nvml, rdma
from agent.probes.nvlink_health import decode_health_mask
from agent.probes.pci_affinity import sysfs_bdf

PCIE_ATTRS = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")


def pcie_link(sysfs: Path, bus_id: str) -> dict[str, str | None]:
    bdf = sysfs_bdf(bus_id)
    path = sysfs / "bus" / "pci" / "devices" / (bdf or "none")
    out: dict[str, str | None] = {"bdf": bdf}
    for attr in PCIE_ATTRS:
        try:
            out[attr] = (path / attr).read_text().strip()
        except OSError as exc:
            out[attr] = f"unreadable: {exc.strerror}"
    return out


def grey_capture(backend: Any, sysfs: Path, seconds: float) -> dict[str, Any]:
    """Two agent cycles `seconds` apart over the real binding: what the grey probes see."""
    prober = Prober(CollectConfig(platform.node(), sysfs=sysfs), nvml_backend=backend)
    first = prober.collect()
    time.sleep(seconds)
    second = prober.collect()
    gpus = second.nvml.gpus if second.nvml else ()
    before = {g.index: g for g in (first.nvml.gpus if first.nvml else ())}
    per_gpu = []
    for gpu in gpus:
        mask = gpu.fabric.health_mask if gpu.fabric else None
        per_gpu.append(
            {
                "index": gpu.index,
                "fabric": full(gpu.fabric) if gpu.fabric else None,
                "health_mask": mask,
                "health_mask_true": [name for name, _, _ in decode_health_mask(mask or 0)],
                "pcie": pcie_link(sysfs, gpu.pci_bus_id),
                "nvlink_errors_first": {
                    link.link: dict(link.error_counters) for link in before[gpu.index].nvlinks
                }
                if gpu.index in before
                else {},
                "nvlink_errors_second": {link.link: dict(link.error_counters) for link in gpu.nvlinks},
            }
        )
    stats = prober.latest.stats if prober.latest else {}
    return {
        "seconds_between": seconds,
        "gpus": per_gpu,
        "findings": [to_wire(f) for f in second.findings],
        "health": {k: to_wire(v) for k, v in second.health.items()},
        "probe_ms": {k: round(v.duration_seconds * 1000, 3) for k, v in stats.items()},
    }


def full(value: Any) -> Any:
    """Every dataclass field, metric-only counters included (mapping keys as text)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: full(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): full(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [full(v) for v in value]
    return getattr(value, "value", value)


def watch_xids(backend: nvml.NvmlBackend, seconds: float) -> dict[str, Any]:
    if seconds <= 0:
        return {"watched_s": 0}
    events: list[tuple[int, int]] = []
    watcher = nvml.XidWatcher(backend, lambda gpu, xid: events.append((gpu, xid)))
    started = watcher.start()
    time.sleep(seconds)
    watcher.stop()
    return {"watched_s": seconds, "started": started, "error": watcher.error, "events": events}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sysfs", type=Path, default=Path("/sys"))
    parser.add_argument("--xid-seconds", type=float, default=0.0)
    parser.add_argument(
        "--grey-seconds", type=float, default=5.0, help="between the two grey cycles (0: skip)"
    )
    args = parser.parse_args(argv)

    backend = open_backend()
    devices = rdma.probe(args.sysfs)
    started = time.perf_counter()
    result = nvml.probe(backend, sysfs=args.sysfs, rdma=devices.value or ())
    elapsed_ms = (time.perf_counter() - started) * 1000
    report = result.value
    out = {
        "machine": {
            "hostname": platform.node(),
            "kernel": platform.release(),
            "driver": report.driver_version if report else None,
            "gpus": [g.name for g in report.gpus] if report else [],
            "rdma": [d.name for d in devices.value or ()],
        },
        "health": to_wire(result.health),
        "wire": to_wire(report) if report else None,
        "full": full(report) if report else None,
        "xid": watch_xids(backend, args.xid_seconds) if backend else None,
        "timing_ms": round(elapsed_ms, 2),
        "grey": grey_capture(backend, args.sysfs, args.grey_seconds)
        if backend and args.grey_seconds > 0
        else None,
    }
    args.out.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"{args.out}: {result.health.state.value} {result.health.reason}".rstrip())
    return 0 if result.health.state in (Health.OK, Health.DEGRADED) else 1


if __name__ == "__main__":
    sys.exit(main())
