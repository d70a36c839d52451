"""An RDMA node where hardware cannot exist (this kernel has no CONFIG_INFINIBAND: no HCA, no
soft-RoCE): a sysfs tree of one RoCE device whose port sits on a given netdev, laid out as the
kernel's `class/infiniband` (Documentation/ABI/stable/sysfs-class-infiniband, the GID table as
rdma_rxe fills it: index 0 the link-local GID, then RoCE v1 and v2 entries of each address), and
a bin directory whose `ib_write_lat`/`ib_write_bw` are the perftest stand-in
(tests/lab/perftest_standin.py). The agent reads the tree through its real RDMA probe and runs
the stand-in through its real adapter."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "perftest_standin.py"


def _sysfs_gid(ip: ipaddress.IPv6Address) -> str:
    raw = ip.packed.hex()
    return ":".join(raw[i : i + 4] for i in range(0, 32, 4))


def roce_sysfs(root: Path, *, netdev: str, address: str, device: str = "rxe0", state: str = "4: ACTIVE",
               link_layer: str = "Ethernet") -> Path:  # fmt: skip
    """`root` (a sysfs root) with `class/infiniband/<device>` on `netdev`; returns `root`."""
    dev = root / "class" / "infiniband" / device
    port = dev / "ports" / "1"
    files = {
        dev / "node_guid": "5054:00ff:fe12:3456",
        dev / "sys_image_guid": "5054:00ff:fe12:3456",
        dev / "fw_ver": "0.0.0",
        dev / "node_desc": f"{device} stand-in",
        port / "state": state,
        port / "phys_state": "5: LinkUp" if "ACTIVE" in state else "3: Disabled",
        port / "rate": "10 Gb/sec (1X QDR)",
        port / "link_layer": link_layer,
        port / "lid": "0x0",
        port / "sm_lid": "0x0",
    }
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    table = [("fe80:0000:0000:0000:5054:00ff:fe12:3456", "IB/RoCE v1"), ("fe80:0000:0000:0000:5054:00ff:fe12:3456", "RoCE v2"),
             (_sysfs_gid(mapped), "IB/RoCE v1"), (_sysfs_gid(mapped), "RoCE v2")]  # fmt: skip
    for i, (gid, kind) in enumerate(table):
        files[port / "gids" / str(i)] = gid
        files[port / "gid_attrs" / "types" / str(i)] = kind
        files[port / "gid_attrs" / "ndevs" / str(i)] = netdev
    files[port / "gids" / str(len(table))] = "0000:0000:0000:0000:0000:0000:0000:0000"
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def standin_bin(directory: Path) -> Path:
    """`directory` with `ib_write_lat` and `ib_write_bw` linked to the stand-in; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(STANDIN, 0o755)
    for tool in ("ib_write_lat", "ib_write_bw"):
        link = directory / tool
        if not link.exists():
            link.symlink_to(STANDIN)
    return directory
