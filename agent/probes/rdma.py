"""RDMA probe: HCAs and their ports from sysfs `class/infiniband`.

Why sysfs and not libibverbs/umad: the kernel already exports every fact the fabric model needs
(Documentation/ABI/stable/sysfs-class-infiniband), reading it needs no device access, no
privileges and no native library in the agent image, and a fixture tree can stand in for a host.

Layout read here (per device `<dev>` under `class/infiniband/`):

    node_guid, sys_image_guid     "0c42:a103:000b:ccd6" (four groups of four hex digits)
    node_desc, fw_ver             free text
    device -> ../../../0000:0c:00.0   the PCI function; `device/numa_node` (-1: no affinity)
    device/net/<netdev>/dev_port  0-based port index of each netdev on that PCI function
    ports/<n>/state               "4: ACTIVE"      (IBTA PortState: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE)
    ports/<n>/phys_state          "5: LinkUp"      (PortPhysicalState: 2 Polling, 3 Disabled, ...)
    ports/<n>/rate                "400 Gb/sec (4X NDR)"
    ports/<n>/link_layer          "InfiniBand" | "Ethernet" (RoCE)
    ports/<n>/lid, sm_lid         "0x1a" (hex)
    ports/<n>/gids/<i>            "fe80:0000:...:0001" (unused entries are all zero)
    ports/<n>/gid_attrs/ndevs/<i> netdev of a RoCE GID
    ports/<n>/counters/*, counters_ext/*, hw_counters/*   error and traffic counters (metrics only;
                                  IB data counters count 4-octet words, as the IBTA PMA defines)

Absent hardware (no `class/infiniband` or an empty one) is ABSENT, but only on a real sysfs: a
`--sysfs` root without `class/` (the host's /sys not mounted where the flag points) is FAILED, as
"no RDMA here" would be a lie about a node whose HCAs we simply cannot see. A garbled or missing
file never raises: the value becomes None/"UNKNOWN" and the result is DEGRADED with a reason
naming the file.

`probe` reports port state as read; `judge` then gives each port and the component a health: an
ACTIVE port is ok; a port whose link never trained since boot (phys_state Polling or Disabled, its
`link_downed` counter still 0, never seen ACTIVE by this agent) was never cabled and is `unused`,
which is quiet (no alert, no unhealthy node); any other port that is not ACTIVE is in use and
down, which degrades the component (the probe itself worked: degraded, not failed). So the report,
the metrics and the HyperNode's Ready condition all say the same thing.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import NamedTuple, TypeVar

from agent.common.report import ComponentHealth, Health, ProbeResult, RdmaDevice, RdmaPort
from agent.probes.sysfs_attr import (
    Problems,
    StrPath,
    decode_text,
    list_dir,
    pci_address,
    read_bytes,
    read_int,
    read_text,
)

NO_DEVICES = "no RDMA devices"
UNKNOWN_STATE = "UNKNOWN"
UNKNOWN_PHYS_STATE = "Unknown"

_GUID = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){3}$")
_GID = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")
_ZERO_GID_BYTES = b"0000:0000:0000:0000:0000:0000:0000:0000"
_NUMBERED_STATE = re.compile(r"^(\d+):\s*([A-Za-z][A-Za-z0-9_ ]*)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*Gb/sec\b")
_LINK_LAYERS = ("InfiniBand", "Ethernet")
_COUNTER_DIRS = ("counters", "counters_ext", "hw_counters")
_T = TypeVar("_T")
_NOT_AVAILABLE = "N/A"  # e.g. "N/A (no PMA)" from iWARP devices: counter not supported
# PortPhysicalState of a link that never trained: no cable or no far end (2: Polling) or switched
# off (3: Disabled), IBTA vol. 1 14.2.5.6; mlx5 reports the same for RoCE ports.
UNTRAINED = frozenset({"Polling", "Disabled"})
ACTIVE = "ACTIVE"
join = os.path.join

PortKey = tuple[str, int]  # (device, port number)


class DeviceCache:
    """What sysfs says about an HCA that is fixed while the device stays registered, kept between
    cycles by the agent: GUIDs, firmware, PCI address and NUMA node of each device, and the names
    in its port, GID and counter directories (read every cycle, they were a third of the probe).

    Why this is safe: a device removed and registered again (hot-plug, firmware reset, driver
    reload) gets new sysfs directories, so every entry is keyed by its directory's inode number and
    change time (and a listing also by the directory's modification time, which a plain tree such
    as a fixture updates when an entry comes or goes). Facts whose reading found a problem are
    never kept: the problem is read and reported again next cycle. Values that do change while the
    device is up (port state, rate, LIDs, GIDs, counters, node_desc, netdevs) are read every cycle."""

    def __init__(self) -> None:
        self._facts: dict[str, tuple[tuple[int, int], _Fixed]] = {}
        self._listings: dict[str, tuple[tuple[int, int, int], list[str]]] = {}

    def fixed(self, path: str, problems: Problems) -> _Fixed:
        """`_read_fixed` once per incarnation of device directory `path`."""
        try:
            st = os.stat(path)
        except OSError:
            return _read_fixed(path, problems)
        key = (st.st_ino, st.st_ctime_ns)
        kept = self._facts.get(path)
        if kept is not None and kept[0] == key:
            return kept[1]
        before = len(problems.reasons)
        value = _read_fixed(path, problems)
        if len(problems.reasons) == before:
            self._facts[path] = (key, value)
        else:  # reported this cycle; read (and reported) again next cycle
            self._facts.pop(path, None)
        return value

    def list_dir(self, path: str) -> list[str] | None:
        """`list_dir(path)`, listed again only when the directory is a new one or has changed."""
        try:
            st = os.stat(path)
        except OSError:
            self._listings.pop(path, None)
            return None
        key = (st.st_ino, st.st_ctime_ns, st.st_mtime_ns)
        kept = self._listings.get(path)
        if kept is not None and kept[0] == key:
            return kept[1]
        names = list_dir(path)
        if names is None:
            self._listings.pop(path, None)
        else:
            self._listings[path] = (key, names)
        return names

    def forget_except(self, devices: AbstractSet[str]) -> None:
        """Drop what was kept for devices (directory paths) that are gone."""
        for table in (self._facts, self._listings):
            for path in [p for p in table if not any(p == d or p.startswith(d + "/") for d in devices)]:
                del table[path]


def probe(sysfs: Path, cache: DeviceCache | None = None) -> ProbeResult[tuple[RdmaDevice, ...]]:
    """All RDMA devices under `<sysfs>/class/infiniband` (sysfs is the host's /sys, injected);
    `cache` (the agent keeps one) spares re-reading what cannot change, see `DeviceCache`."""
    missing = missing_sysfs(sysfs)
    if missing:
        return ProbeResult.failed(missing)
    return probe_class_dir(sysfs / "class" / "infiniband", cache)


def missing_sysfs(sysfs: Path) -> str:
    """Why `sysfs` is not a sysfs root ("" when it is): every sysfs has `class/`."""
    if (sysfs / "class").is_dir():
        return ""
    what = "does not exist" if not sysfs.exists() else "has no class/ directory"
    return f"host sysfs root missing: {sysfs} {what} (is the host's /sys mounted there? see --sysfs)"


def probe_class_dir(class_dir: Path, cache: DeviceCache | None = None) -> ProbeResult[tuple[RdmaDevice, ...]]:
    """All RDMA devices in a bare `class/infiniband` directory."""
    names = list_dir(class_dir)
    if names is None:
        if class_dir.exists():
            return ProbeResult.failed(f"{class_dir}: cannot list RDMA devices")
        return ProbeResult.absent(NO_DEVICES)
    if not names:
        return ProbeResult.absent(NO_DEVICES)
    problems = Problems(class_dir)
    devices = []
    base = str(class_dir)
    for name in names:
        path = join(base, name)
        if not os.path.isdir(path):
            problems.add(path, "not a device directory (dangling link?)")
            continue
        devices.append(read_device(path, problems, cache))
    if cache is not None:
        cache.forget_except({join(base, name) for name in names})
    return _result(tuple(devices), problems)


def _result(devices: tuple[RdmaDevice, ...], problems: Problems) -> ProbeResult[tuple[RdmaDevice, ...]]:
    if problems.reasons:
        return ProbeResult(devices, ComponentHealth(Health.DEGRADED, "; ".join(problems.reasons)))
    return ProbeResult(devices, ComponentHealth(Health.OK))


def read_device(path: StrPath, problems: Problems, cache: DeviceCache | None = None) -> RdmaDevice:
    """One HCA (`class/infiniband/<dev>`). Paths are joined as strings: this runs for every
    port and counter file each cycle, where building pathlib objects cost more than the reads."""
    path = os.fspath(path)
    fixed = _read_fixed(path, problems) if cache is None else cache.fixed(path, problems)
    return RdmaDevice(
        name=os.path.basename(path),
        node_guid=fixed.node_guid,
        sys_image_guid=fixed.sys_image_guid,
        node_desc=read_text(join(path, "node_desc"), problems) or None,
        firmware=fixed.firmware,
        pci_address=fixed.pci_address,
        numa_node=fixed.numa_node,
        ports=_ports(path, problems, cache),
    )


class _Fixed(NamedTuple):
    """What of a device does not change while it is registered."""

    node_guid: str | None
    sys_image_guid: str | None
    firmware: str | None
    pci_address: str | None
    numa_node: int | None


def _read_fixed(path: str, problems: Problems) -> _Fixed:
    return _Fixed(
        node_guid=_guid(join(path, "node_guid"), problems),
        sys_image_guid=_guid(join(path, "sys_image_guid"), problems),
        firmware=read_text(join(path, "fw_ver"), problems) or None,
        pci_address=pci_address(join(path, "device")),
        numa_node=_numa_node(join(path, "device", "numa_node"), problems),
    )


def _guid(path: str, problems: Problems) -> str | None:
    text = read_text(path, problems)
    if not text:
        return None
    if not _GUID.match(text.lower()):
        problems.add(path, f"not a GUID: {text[:40]!r}")
        return None
    return text.lower()


def _numa_node(path: str, problems: Problems) -> int | None:
    node = read_int(path, problems)
    return node if node is not None and node >= 0 else None


def _ports(device: str, problems: Problems, cache: DeviceCache | None = None) -> tuple[RdmaPort, ...]:
    ports_dir = join(device, "ports")
    names = list_dir(ports_dir) if cache is None else cache.list_dir(ports_dir)
    if names is None:
        problems.add(ports_dir, "missing: device has no ports directory")
        return ()
    ports = []
    for name in names:
        if not name.isdigit():
            problems.add(join(ports_dir, name), "not a port number")
            continue
        ports.append(read_port(device, int(name), problems, cache))
    return tuple(ports)


def read_port(device: StrPath, number: int, problems: Problems, cache: DeviceCache | None = None) -> RdmaPort:
    """One port (`class/infiniband/<dev>/ports/<n>`)."""
    device = os.fspath(device)
    path = join(device, "ports", str(number))
    link_layer = read_text(join(path, "link_layer"), problems, required=True)
    if link_layer is not None and link_layer not in _LINK_LAYERS:
        problems.add(join(path, "link_layer"), f"unknown link layer: {link_layer[:40]!r}")
    return RdmaPort(
        port=number,
        state=_state(join(path, "state"), problems, UNKNOWN_STATE),
        phys_state=_state(join(path, "phys_state"), problems, UNKNOWN_PHYS_STATE),
        rate_gbps=_rate(join(path, "rate"), problems),
        link_layer=link_layer or "unknown",
        lid=read_int(join(path, "lid"), problems, base=16),
        sm_lid=read_int(join(path, "sm_lid"), problems, base=16),
        netdev=_netdev(device, path, number, problems),
        gids=_gids(join(path, "gids"), problems, cache),
        counters=_counters(path, problems, cache),
    )


def parse_state(text: str) -> str | None:
    """`"4: ACTIVE"` -> `"ACTIVE"`, `"5: LinkUp"` -> `"LinkUp"`; anything else None (the kernel
    always writes the number and the IBTA name, drivers/infiniband/core/sysfs.c)."""
    match = _NUMBERED_STATE.match(text)
    return match.group(2).strip() if match else None


def parse_rate(text: str) -> float | None:
    """`"400 Gb/sec (4X NDR)"` -> 400.0, `"2.5 Gb/sec (1X SDR)"` -> 2.5; anything else None."""
    match = _RATE.match(text)
    return float(match.group(1)) if match else None


def _read_parsed(path: str, problems: Problems, parse: Callable[[str], _T | None], what: str) -> _T | None:
    """A required attribute through `parse`; absent or unparsable (recorded as `not WHAT`) is None."""
    text = read_text(path, problems, required=True)
    if text is None:
        return None
    value = parse(text)
    if value is None:
        problems.add(path, f"not {what}: {text[:40]!r}")
    return value


def _state(path: str, problems: Problems, unknown: str) -> str:
    state = _read_parsed(path, problems, parse_state, "a port state")
    return unknown if state is None else state


def _rate(path: str, problems: Problems) -> float | None:
    return _read_parsed(path, problems, parse_rate, "a rate")


def _gids(path: str, problems: Problems, cache: DeviceCache | None) -> tuple[str, ...]:
    gids = []
    for index in (list_dir(path) if cache is None else cache.list_dir(path)) or ():
        entry = join(path, index)
        raw = read_bytes(entry)  # unpopulated entries may refuse to read: not a problem
        if raw is None or raw.strip() in (b"", _ZERO_GID_BYTES):  # most of a 128..256-entry table
            continue
        text = decode_text(raw, entry, problems)
        if text is not None and not _GID.match(text.lower()):
            problems.add(entry, f"not a GID: {text[:60]!r}")
        elif text is not None:
            gids.append(text.lower())
    return tuple(gids)


def _netdev(device: str, port_dir: str, port: int, problems: Problems) -> str | None:
    """The netdev of a port: a RoCE port names it in its GID table; otherwise the netdev on the
    same PCI function whose `dev_port` is this port's 0-based index (IPoIB: ib0 on port 1)."""
    roce = read_text(join(port_dir, "gid_attrs", "ndevs", "0"))
    if roce:
        return roce
    net = join(device, "device", "net")
    candidates = []
    names = list_dir(net) or []
    for name in names:
        dev_port = read_int(join(net, name, "dev_port"), problems)
        if dev_port == port - 1 or (dev_port is None and len(names) == 1):
            candidates.append(name)
    # IPoIB child interfaces (ib0.8001) share the parent's dev_port: prefer the parent.
    candidates.sort(key=lambda n: ("." in n, len(n), n))
    return candidates[0] if candidates else None


def _counters(port: str, problems: Problems, cache: DeviceCache | None) -> dict[str, int]:
    counters: dict[str, int] = {}
    for directory in _COUNTER_DIRS:
        folder = join(port, directory)
        for name in (list_dir(folder) if cache is None else cache.list_dir(folder)) or ():
            value = _counter(join(folder, name), problems)
            if value is not None:
                counters.setdefault(name, value)
    return counters


def _counter(path: str, problems: Problems) -> int | None:
    raw = read_bytes(path)  # write-only or unsupported counters refuse to read: skip quietly
    if raw is None:
        return None
    try:
        return int(raw)  # the common case, without decoding
    except ValueError:
        pass
    text = decode_text(raw, path, problems)
    if text is not None and text != "" and not text.startswith(_NOT_AVAILABLE):
        problems.add(path, f"not a counter value: {text[:40]!r}")
    return None


# --- judging port state -------------------------------------------------------------------------


def active_ports(devices: Iterable[RdmaDevice]) -> set[PortKey]:
    """The ports that are ACTIVE now (the agent remembers them: a port once up is in use)."""
    return {(d.name, p.port) for d in devices for p in d.ports if p.state == ACTIVE}


def port_health(device: str, port: RdmaPort, *, seen_active: AbstractSet[PortKey]) -> Health | None:
    """ok, unused or failed (see the module docstring); None when the state could not be read."""
    if port.state == ACTIVE:
        return Health.OK
    if port.state == UNKNOWN_STATE:
        return None
    trained_once = (device, port.port) in seen_active or bool(port.counters.get("link_downed"))
    if port.phys_state in UNTRAINED and not trained_once:
        return Health.UNUSED
    return Health.FAILED


def judge(
    result: ProbeResult[tuple[RdmaDevice, ...]], *, seen_active: AbstractSet[PortKey] = frozenset()
) -> ProbeResult[tuple[RdmaDevice, ...]]:
    """`result` with each port's health set, and the component's health from the ports."""
    if not result.value:
        return result
    devices = tuple(_judged(device, seen_active) for device in result.value)
    return ProbeResult(devices, _component(devices, result.health))


def _judged(device: RdmaDevice, seen_active: AbstractSet[PortKey]) -> RdmaDevice:
    ports = tuple(
        dataclasses.replace(port, health=port_health(device.name, port, seen_active=seen_active))
        for port in device.ports
    )
    return dataclasses.replace(device, ports=ports)


def _component(devices: tuple[RdmaDevice, ...], read: ComponentHealth) -> ComponentHealth:
    """Degraded when ports in use are down (the probe itself worked: not `failed`), unused when
    every port is unused, else what reading sysfs gave."""
    ports = [(d.name, p) for d in devices for p in d.ports]
    down = [f"{name} port {p.port} {p.state} (phys_state {p.phys_state})"
            for name, p in ports if p.health is Health.FAILED]  # fmt: skip
    if down:
        return ComponentHealth(Health.DEGRADED, "; ".join([*down, *([read.reason] if read.reason else [])]))
    if read.state is Health.OK and ports and all(p.health is Health.UNUSED for _, p in ports):
        unused = ", ".join(f"{name} port {p.port}" for name, p in ports)
        return ComponentHealth(Health.UNUSED, f"no RDMA port cabled: {unused}")
    return read
