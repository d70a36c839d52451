"""The host probe: procfs fixture trees, prometheus/procfs's real archive, and the live host."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import ttar

from agent.common.report import Health, HostInfo
from agent.probes import host

MEMINFO = "MemTotal:       2113475584 kB\nMemFree:        2000000000 kB\n"
CPUINFO = "".join(f"processor\t: {i}\nvendor_id\t: AuthenticAMD\n\n" for i in range(224))


def procfs(root: Path, **files: str | bytes) -> Path:
    defaults: dict[str, str | bytes] = {
        "sys/kernel/hostname": "gpu-node-017\n",
        "sys/kernel/osrelease": "6.8.0-1015-nvidia\n",
        "meminfo": MEMINFO,
        "cpuinfo": CPUINFO,
    }
    for name, content in {**defaults, **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def test_a_gpu_node_procfs_gives_its_hostname_kernel_cpus_and_memory(tmp_path: Path) -> None:
    result = host.probe(procfs(tmp_path))
    assert result.health.state is Health.OK
    # 2113475584 kB (a 2 TiB DGX-class node) * 1024 bytes
    assert result.value == HostInfo("gpu-node-017", "6.8.0-1015-nvidia", 224, 2113475584 * 1024)


def test_cpus_fall_back_to_stat_lines_when_cpuinfo_is_missing(tmp_path: Path) -> None:
    root = procfs(tmp_path)
    (root / "cpuinfo").unlink()
    (root / "stat").write_text("cpu  1 2 3\ncpu0 1 2 3\ncpu1 1 2 3\ncpu2 1 2 3\nintr 5\n")
    result = host.probe(root)
    assert result.value is not None and result.value.cpus == 3


def test_missing_and_garbled_files_degrade_naming_each_and_keep_the_rest(tmp_path: Path) -> None:
    root = procfs(tmp_path, meminfo="MemTotal: lots\n", cpuinfo=b"\x00\x01")
    (root / "sys" / "kernel" / "osrelease").unlink()
    result = host.probe(root)
    assert result.health.state is Health.DEGRADED
    for name in (
        "meminfo: no 'MemTotal: N kB' line",
        "sys/kernel/osrelease: missing",
        "cpuinfo: no processor",
    ):
        assert name in result.health.reason
    assert result.value == HostInfo("gpu-node-017", "", 0, 0)


def test_empty_hostname_is_called_out(tmp_path: Path) -> None:
    result = host.probe(procfs(tmp_path, **{"sys/kernel/hostname": "\n"}))
    assert result.health.state is Health.DEGRADED and "sys/kernel/hostname: empty" in result.health.reason


def test_no_procfs_at_all_is_a_failed_probe(tmp_path: Path) -> None:
    result = host.probe(tmp_path / "nope")
    assert result.value is None and result.health.state is Health.FAILED
    assert "procfs not found" in result.health.reason


def test_prometheus_procfs_archive_gives_its_cpus_and_memory(shared_data: Path, tmp_path: Path) -> None:
    archive = shared_data / "sysfs" / "procfs_fixtures.ttar"
    proc = ttar.extract(archive, tmp_path) / "fixtures" / "proc"
    meminfo = (proc / "meminfo").read_text()
    mem_kb = int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemTotal:")))
    processors = sum(
        1 for line in (proc / "cpuinfo").read_text().splitlines() if line.startswith("processor")
    )
    result = host.probe(proc)
    assert result.value is not None
    assert (
        (result.value.cpus, result.value.memory_bytes) == (processors, mem_kb * 1024) == (8, 15666184 * 1024)
    )
    # that archive has no sys/kernel/hostname or osrelease: degraded, not an exception
    assert result.health.state is Health.DEGRADED and "sys/kernel/hostname" in result.health.reason


def test_live_host_agrees_with_psutil_and_uname() -> None:
    result = host.probe()
    assert result.health.state is Health.OK, result.health.reason
    assert result.value == HostInfo(
        os.uname().nodename,
        os.uname().release,
        psutil.cpu_count(logical=True) or 0,
        psutil.virtual_memory().total,
    )
