"""Network interface probe: netlink's link table joined with what only sysfs knows.

Why two sources: rtnetlink (RTM_GETLINK) gives the authoritative, atomic link table (name, MAC,
operstate, MTU, link kind, master) and is what the agent watches for changes; sysfs
`class/net/<if>/` adds the facts netlink lacks: the link speed and the PCI function behind the
interface (`device` symlink), which ties an interface to its HCA and GPU. The netlink side is
filled by `agent.adapters.netlink` into plain `LinkRecord`s, so this module stays pure and a test
can feed it records built from `ip -j link` output.

Loopback is never reported. `speed` is Mb/s as the kernel reports it (`ethtool_link_ksettings`);
a down link answers EINVAL and many virtual links -1: both mean "unknown", so None.

What is reported: the agent reports its fabric interfaces (`fabric_only`): physical NICs (sysfs
`class/net/<if>/device` exists, or the class entry links into a real device rather than
`devices/virtual`), IPoIB netdevs and the netdevs of RDMA ports (a RoCE bond included). A pod's
veth, a CNI bridge, `kube-ipvs0`, tunnels and dummies are none of these, so pod churn changes
nothing in the report and costs no API write. `include` (the agent's `--interfaces REGEX`) reports
every interface whose name matches, whatever it is.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from agent.common.report import ComponentHealth, Health, Interface, ProbeResult
from agent.probes.sysfs_attr import Problems, pci_address, read_text

NO_INTERFACES = "no network interfaces"
NO_FABRIC_INTERFACES = "no physical or RDMA network interfaces (--interfaces all reports every one)"
IFF_UP = 0x1  # include/uapi/linux/if.h: administratively up
IFF_LOOPBACK = 0x8
# Kinds whose lost carrier is a cabling or switch-port fault. Bridges, tunnels and dummies report
# "down" for reasons of their own (an empty bridge), so they are never a fabric fault.
CARRIER_KINDS = frozenset({"physical", "infiniband", "veth", "bond"})
_BOND_KINDS = ("bond", "team")
_SPEED_UNKNOWN = {-1, 0xFFFFFFFF}  # SPEED_UNKNOWN, and the same value read as unsigned
T = TypeVar("T")
_SAFE_NAME = re.compile(r"^[^/\x00\s]{1,15}$")  # IFNAMSIZ - 1, no path separators


@dataclass(frozen=True)
class LinkRecord:
    """One link as rtnetlink reports it (filled by `agent.adapters.netlink.dump_links`)."""

    index: int
    name: str
    mac: str | None = None
    oper_state: str = "unknown"  # IFLA_OPERSTATE lowercased: "up", "down", "lowerlayerdown", ...
    mtu: int | None = None
    kind: str | None = None  # IFLA_INFO_KIND: "veth", "bond", "vlan", "bridge", "ipoib", ...
    master: str | None = None  # name of the IFLA_MASTER link
    link_type: str | None = None  # "ether", "infiniband", "loopback", ... (ip's names for ARPHRD_*)
    flags: int = 0  # IFF_* flags
    carrier_changes: int | None = None  # IFLA_CARRIER_CHANGES: carrier up/down transitions since creation


def probe(
    links: Sequence[LinkRecord],
    *,
    sysfs: Path,
    include: re.Pattern[str] | None = None,
    fabric_only: bool = False,
    rdma_netdevs: Collection[str] = (),
) -> ProbeResult[tuple[Interface, ...]]:
    """Interfaces for the given links (loopback dropped; `include` keeps names it finds a match in;
    `fabric_only` keeps physical NICs and RDMA netdevs, see `is_fabric`)."""
    by_name: dict[str, LinkRecord] = {}
    problems = Problems(sysfs / "class" / "net")
    for record in links:
        if not _SAFE_NAME.match(record.name) or record.name in (".", ".."):
            problems.reasons.append(f"link {record.index}: unusable interface name {record.name[:40]!r}")
        elif record.name in by_name:
            problems.reasons.append(
                f"{record.name}: reported twice (indexes {by_name[record.name].index}, {record.index})"
            )
        else:
            by_name[record.name] = record
    chosen = [
        r
        for r in by_name.values()
        if not _is_loopback(r)
        and (include is None or include.search(r.name))
        and (not fabric_only or is_fabric(r, sysfs, rdma_netdevs))
    ]
    if not chosen:
        if include is not None and include.pattern:
            return ProbeResult.absent(f"no interface matches {include.pattern!r}")
        return ProbeResult.absent(NO_FABRIC_INTERFACES if fabric_only else NO_INTERFACES)
    chosen.sort(key=lambda r: r.index)
    interfaces = tuple(_interface(r, by_name, sysfs, problems) for r in chosen)
    problems.reasons.extend(
        f"{i.name}: link down (administratively up, no carrier)"
        for i, r in zip(interfaces, chosen, strict=True)
        if carrier_lost(i, r)
    )
    if problems.reasons:
        return ProbeResult(interfaces, ComponentHealth(Health.DEGRADED, "; ".join(problems.reasons)))
    return ProbeResult(interfaces, ComponentHealth(Health.OK))


def carrier_lost(interface: Interface, record: LinkRecord) -> bool:
    """An interface someone set up whose link is not there: a cut cable or a dead switch port
    (RFC 2863 operStatus down / lowerLayerDown while the admin status is up)."""
    return (
        bool(record.flags & IFF_UP)
        and interface.oper_state in ("down", "lowerlayerdown")
        and interface.kind in CARRIER_KINDS
    )


def links_down(links: Sequence[LinkRecord], interfaces: Sequence[Interface]) -> frozenset[str]:
    """Names of the reported interfaces whose carrier is lost."""
    records = {r.name: r for r in links}
    return frozenset(i.name for i in interfaces if i.name in records and carrier_lost(i, records[i.name]))


def is_fabric(record: LinkRecord, sysfs: Path, rdma_netdevs: Collection[str] = ()) -> bool:
    """A physical NIC or an RDMA netdev: what can be cabled to the fabric and stays put while pods
    come and go. IPoIB links (ARPHRD_INFINIBAND) always sit on an HCA; a RoCE bond has no device
    of its own but is its HCA port's netdev."""
    if _is_loopback(record):
        return False
    if record.name in rdma_netdevs or record.link_type == "infiniband" or record.kind == "ipoib":
        return True
    return is_physical(sysfs / "class" / "net" / record.name)


def is_physical(node: Path) -> bool:
    """sysfs says a netdev is a device's: `device` links to its parent (PCI, USB, a VM's virtio),
    or the `class/net` entry itself links into a real device's directory, not `devices/virtual`
    where veths, bridges, bonds, tunnels, dummies and loopback live."""
    if (node / "device").exists():
        return True
    try:
        parts = PurePosixPath(os.readlink(node)).parts
    except OSError:  # not a link (a plain directory in a fixture tree) or not there
        return False
    if "devices" not in parts:
        return False
    below = parts[parts.index("devices") + 1 :]
    return bool(below) and below[0] != "virtual"


def lldp_quiet(links: Sequence[LinkRecord], interfaces: Sequence[Interface]) -> frozenset[str]:
    """Reported interfaces where a listener that cannot listen is no LLDP fault: administratively
    down ones (someone turned them off; the net probe does not count them either) and non-fabric
    links that are not up (`kube-ipvs0`, an empty bridge, a down dummy): no switch talks on them."""
    records = {r.name: r for r in links}
    quiet = set()
    for interface in interfaces:
        record = records.get(interface.name)
        if record is None:
            continue
        admin_down = not record.flags & IFF_UP
        idle = interface.oper_state != "up" and interface.kind not in CARRIER_KINDS
        if admin_down or idle:
            quiet.add(interface.name)
    return frozenset(quiet)


def _is_loopback(record: LinkRecord) -> bool:
    return bool(record.flags & IFF_LOOPBACK) or record.link_type == "loopback" or record.name == "lo"


def _interface(
    record: LinkRecord, by_name: dict[str, LinkRecord], sysfs: Path, problems: Problems
) -> Interface:
    node = sysfs / "class" / "net" / record.name
    pci = pci_address(node / "device")
    return Interface(
        name=record.name,
        mac=record.mac or None,
        oper_state=record.oper_state.lower(),
        mtu=record.mtu,
        speed_mbps=_speed(node / "speed", problems),
        pci_address=pci,
        bond_master=_bond_master(record, by_name),
        kind=_kind(record, has_device=(node / "device").exists()),
    )


def _speed(path: Path, problems: Problems) -> int | None:
    text = read_text(path, problems)  # a down link refuses the read (EINVAL): unknown, not a problem
    if not text:
        return None
    try:
        speed = int(text)
    except ValueError:
        problems.add(path, f"not a speed: {text[:40]!r}")
        return None
    return None if speed in _SPEED_UNKNOWN or speed < 0 else speed


def _bond_master(record: LinkRecord, by_name: dict[str, LinkRecord]) -> str | None:
    master = by_name.get(record.master) if record.master else None
    return master.name if master is not None and master.kind in _BOND_KINDS else None


def _kind(record: LinkRecord, *, has_device: bool) -> str | None:
    """netlink's link kind when it names one; else IPoIB or a physical device when sysfs shows a
    parent device; else None (a software link netlink did not describe)."""
    if record.kind:
        return record.kind
    if record.link_type == "infiniband":
        return "infiniband"
    return "physical" if has_device else None


def records_from_ip_json(text: str) -> list[LinkRecord]:
    """`ip -j [-d] link` output -> LinkRecords (for captures and tests). Raises ValueError with
    the reason when the text is not that output."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of links")
    return [_record_from_ip(entry, position) for position, entry in enumerate(data)]


def _field(entry: dict[str, Any], key: str, kind: type[T]) -> T | None:
    value = entry.get(key)
    return value if isinstance(value, kind) else None


def _record_from_ip(entry: Any, position: int) -> LinkRecord:
    if not isinstance(entry, dict) or not isinstance(entry.get("ifname"), str):
        raise ValueError(f"link #{position}: needs at least 'ifname'")
    info = _field(entry, "linkinfo", dict) or {}
    flags = _field(entry, "flags", list) or []
    return LinkRecord(
        index=_field(entry, "ifindex", int) or position,
        name=entry["ifname"],
        mac=_field(entry, "address", str),
        oper_state=(_field(entry, "operstate", str) or "unknown").lower(),
        mtu=_field(entry, "mtu", int),
        kind=_field(info, "info_kind", str),
        master=_field(entry, "master", str),
        link_type=_field(entry, "link_type", str),
        flags=(IFF_LOOPBACK if "LOOPBACK" in flags else 0) | (IFF_UP if "UP" in flags else 0),
    )
