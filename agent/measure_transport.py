"""Which transport the measuring probe uses (`--measure-transport auto|udp|rdma`), and the RDMA
device, port and GID index it would use on the fabric interface.

Why RDMA where a node has it: a UDP round trip crosses the kernel's stack on both ends (tens of
microseconds), an RDMA write ping-pong does not (a few), so on an RDMA fabric only RDMA shows what
a job's traffic sees, and a congested RoCE priority class or a mis-set PFC shows only there. Why
UDP otherwise: it needs nothing but this agent on both ends.

`auto` takes RDMA when the fabric interface is the netdev of an ACTIVE RDMA port (read from sysfs
by the agent's own RDMA probe, agent.probes.rdma) and both perftest tools are on PATH; else UDP,
with the reason logged. `rdma` insists: a node without either is a one-line usage error, not a
silent downgrade. The GID index matters on RoCE: perftest 4.5 uses index 0 when given none, which
on RoCE is the link-local (fe80) GID that does not route across a layer-3 fabric; the index here is
that of the interface address's RoCE v2 GID (::ffff:a.b.c.d), else its RoCE v1 one.

Reads sysfs under an injected root and opens (then closes) the verbs device file; no sockets, no
subprocesses.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from agent.probes.rdma import ACTIVE, probe
from agent.probes.sysfs_attr import list_dir, read_text

TRANSPORTS = ("auto", "udp", "rdma")
TOOLS = ("ib_write_lat", "ib_write_bw")
MAX_GIDS = 1024  # a GID table has 16..256 entries on real HCAs


@dataclass(frozen=True, slots=True)
class RdmaEndpoint:
    """What perftest's `-d`, `-i` and `-x` name: device, port (1-based), GID index (None: give
    none, InfiniBand addresses by LID)."""

    device: str
    port: int
    gid_index: int | None
    link_layer: str


def _gid_of(address: str) -> str | None:
    """The RoCE GID sysfs shows for an address: IPv4 mapped into IPv6, or the IPv6 address itself,
    in sysfs's notation (eight groups of four hex digits)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.version == 4:
        ip = ipaddress.IPv6Address(f"::ffff:{ip}")
    raw = ip.packed.hex()
    return ":".join(raw[i : i + 4] for i in range(0, 32, 4))


def roce_gid_index(port_dir: Path, address: str) -> int | None:
    """The index of `address`'s GID in a port's table, its RoCE v2 entry first."""
    wanted = _gid_of(address)
    names = list_dir(port_dir / "gids") or []
    found: list[tuple[int, int]] = []  # (0 for RoCE v2 else 1, index)
    for name in names[:MAX_GIDS]:
        if not name.isdigit() or (read_text(port_dir / "gids" / name) or "").lower() != wanted:
            continue
        kind = read_text(port_dir / "gid_attrs" / "types" / name) or ""
        found.append((0 if "v2" in kind.lower() else 1, int(name)))
    return min(found)[1] if found else None


def find_endpoint(sysfs: Path, interface: str | None, address: str) -> tuple[RdmaEndpoint | None, str]:
    """The RDMA port on the fabric interface, or None and why not (for the log)."""
    if not interface:
        return None, "no fabric interface known (give --measure-fabric an interface or its address)"
    devices = probe(sysfs).value or ()
    ports = [(d, p) for d in devices for p in d.ports if p.netdev == interface]
    if not ports:
        return None, f"no RDMA port on {interface} (sysfs {sysfs}/class/infiniband)"
    active = [(d, p) for d, p in ports if p.state == ACTIVE]
    if not active:
        d, p = ports[0]
        return None, f"RDMA port {d.name}/{p.port} on {interface} is {p.state}, not ACTIVE"
    device, port = active[0]
    if port.link_layer != "Ethernet":
        return RdmaEndpoint(device.name, port.port, None, port.link_layer), ""
    port_dir = sysfs / "class" / "infiniband" / device.name / "ports" / str(port.port)
    index = roce_gid_index(port_dir, address)
    if index is None:
        return None, f"RoCE port {device.name}/{port.port} has no GID for {address}"
    return RdmaEndpoint(device.name, port.port, index, port.link_layer), ""


def verbs_device_problem(sysfs: Path, device: str, dev: Path = Path("/dev")) -> str:
    """Why this process cannot open the verbs device of an RDMA device ("" when it can, or when
    sysfs names none: then perftest itself will say).

    Why: sysfs is readable in any container, but perftest needs /dev/infiniband/uverbsN open for
    reading and writing, which a container has only when the device is mounted and its cgroup
    allows it (an RDMA device plugin's resource, or the runtime's device rules). Without this
    check a pod that sees the port in sysfs would choose RDMA, and every peer's gate would fail to
    start its server, round after round."""
    verbs = sysfs / "class" / "infiniband_verbs"
    for name in (list_dir(verbs) or [])[:MAX_GIDS]:
        if (read_text(verbs / name / "ibdev") or "") != device:
            continue
        path = dev / "infiniband" / name
        try:
            os.close(os.open(path, os.O_RDWR))
        except OSError as exc:
            return f"cannot open {path} for {device} ({exc.strerror}; mount the host's /dev/infiniband and allow the device)"
        return ""
    return ""


def missing_tools(path: str | None = None) -> list[str]:
    """The perftest tools not found on PATH (`path`: a PATH string, default the environment's)."""
    from shutil import which

    return [t for t in TOOLS if which(t, path=path if path is not None else os.environ.get("PATH")) is None]


def choose(requested: str, endpoint: RdmaEndpoint | None, why_not: str, missing: list[str]) -> tuple[str, str]:
    """("rdma" | "udp", why): `auto` takes RDMA when both an endpoint and the tools are there;
    `rdma` without them is a ValueError in one line; `udp` is UDP."""
    if requested not in TRANSPORTS:
        raise ValueError(f"--measure-transport {requested!r}: not one of {', '.join(TRANSPORTS)}")
    if requested == "udp":
        return "udp", "asked for"
    problem = why_not if endpoint is None else ""
    if not problem and missing:
        problem = f"perftest not installed ({', '.join(missing)} not on PATH; Debian: apt install perftest)"
    if problem and requested == "rdma":
        raise ValueError(f"--measure-transport rdma: {problem}")
    if problem:
        return "udp", problem
    assert endpoint is not None
    gid = "" if endpoint.gid_index is None else f" GID index {endpoint.gid_index}"
    return "rdma", f"{endpoint.device} port {endpoint.port} ({endpoint.link_layer}){gid}"
