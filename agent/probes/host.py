"""Host probe: hostname, kernel release, logical CPUs and memory total.

Why procfs first: the agent runs in a container with the host's /proc mounted (e.g. at
/host/proc), and tests feed it fixture trees, so every fact is read from the injected procfs root:
`sys/kernel/hostname`, `sys/kernel/osrelease`, `cpuinfo` (one `processor` line per logical CPU;
`stat`'s `cpuN` lines when cpuinfo is unreadable) and `meminfo` (`MemTotal:` in kB). psutil is used
only when the root is the live `/proc` of this process, where it reads the same kernel interfaces.

Note: `sys/kernel/hostname` answers for the UTS namespace of the reader, so a pod without
hostNetwork sees its own name; the agent names its report after `--node-name`, not this.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

from agent.common.report import ComponentHealth, Health, HostInfo, ProbeResult
from agent.probes.sysfs_attr import Problems, read_text

LIVE_PROCFS = Path("/proc")
_MEMTOTAL = re.compile(r"^MemTotal:\s+(\d+)\s*kB\s*$", re.MULTILINE)
_PROCESSOR = re.compile(r"^processor\s*:", re.MULTILINE)
_STAT_CPU = re.compile(r"^cpu\d+\s", re.MULTILINE)


def probe(procfs: Path = LIVE_PROCFS) -> ProbeResult[HostInfo]:
    """Host facts from `procfs`; missing or garbled files degrade the result, naming the file."""
    if not procfs.is_dir():
        return ProbeResult.failed(f"{procfs}: procfs not found")
    problems = Problems(procfs)
    live = _is_live(procfs)
    uname = os.uname() if live else None
    info = HostInfo(
        hostname=_kernel_text(procfs / "sys" / "kernel" / "hostname", problems, uname and uname.nodename),
        kernel=_kernel_text(procfs / "sys" / "kernel" / "osrelease", problems, uname and uname.release),
        cpus=(psutil.cpu_count(logical=True) or 0) if live else _cpus(procfs, problems),
        memory_bytes=int(psutil.virtual_memory().total) if live else _memory(procfs / "meminfo", problems),
    )
    if problems.reasons:
        return ProbeResult(info, ComponentHealth(Health.DEGRADED, "; ".join(problems.reasons)))
    return ProbeResult(info, ComponentHealth(Health.OK))


def _is_live(procfs: Path) -> bool:
    try:
        return procfs.resolve() == LIVE_PROCFS
    except OSError:
        return False


def _kernel_text(path: Path, problems: Problems, fallback: str | None) -> str:
    """The file's text; on the live host uname(2) answers when the file cannot."""
    text = read_text(path, problems, required=fallback is None)
    if text:
        return text
    if fallback is None and text == "":
        problems.add(path, "empty")
    return fallback or ""


def _cpus(procfs: Path, problems: Problems) -> int:
    cpuinfo = read_text(procfs / "cpuinfo")
    if cpuinfo:
        count = len(_PROCESSOR.findall(cpuinfo))
        if count:
            return count
    stat = read_text(procfs / "stat")
    count = len(_STAT_CPU.findall(stat)) if stat else 0
    if not count:
        problems.add(procfs / "cpuinfo", "no processor entries (and none in stat)")
    return count


def _memory(path: Path, problems: Problems) -> int:
    text = read_text(path, problems, required=True)
    match = _MEMTOTAL.search(text) if text else None
    if match is None:
        if text is not None:
            problems.add(path, "no 'MemTotal: N kB' line")
        return 0
    return int(match.group(1)) * 1024
