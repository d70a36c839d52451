"""A fixture host for the agent runtime tests and benchmark: an HGX H100 board (the NVML fake)
with 8 InfiniBand HCAs (the RDMA sysfs fixture tree), their netdevs, and one LLDP neighbour.

Links are what rtnetlink would report for that tree; the LLDP frame is built TLV by TLV as a
switch sends it (IEEE 802.1AB-2016 clause 8), so the neighbour table parses a real frame.
"""

from __future__ import annotations

import struct
from pathlib import Path

from agent.collect import CollectConfig, Prober
from agent.probes.net import LinkRecord
from agent.probes.nvml_fake import FakeNvml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
HGX_SYSFS = FIXTURES / "sysfs" / "hgx-h100-ib"
NODE = "gpu-node-1"

LINKS = (
    LinkRecord(1, "lo", oper_state="unknown", mtu=65536, link_type="loopback"),
    LinkRecord(2, "eno1", mac="b8:3f:d2:10:00:01", oper_state="up", mtu=9000, link_type="ether"),
    *(
        LinkRecord(3 + i, f"ib{i}", oper_state="up", mtu=4092, kind="ipoib", link_type="infiniband")
        for i in range(8)
    ),
)


def _tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", (kind << 9) | len(value)) + value


def lldp_frame(system_name: str = "leaf-a1", port: str = "Ethernet1/7") -> bytes:
    """An Ethernet frame carrying one LLDPDU: chassis (MAC), port (ifname), TTL, names, End."""
    header = bytes.fromhex("0180c200000eb83fd2aabb0188cc")
    body = (
        _tlv(1, b"\x04" + bytes.fromhex("b83fd2aabb00"))  # chassis ID, subtype 4: MAC address
        + _tlv(2, b"\x05" + port.encode())  # port ID, subtype 5: interface name
        + _tlv(3, struct.pack("!H", 120))  # TTL
        + _tlv(4, b"uplink to " + NODE.encode())  # port description
        + _tlv(5, system_name.encode())  # system name
        + _tlv(0, b"")  # end of LLDPDU
    )
    return header + body


def fixture_prober(fake: FakeNvml | None = None, *, node: str = NODE) -> Prober:
    """A prober over the fixture host; the neighbour table already holds one neighbour on eno1."""
    fake = fake or FakeNvml("hgx-h100")
    config = CollectConfig(node_name=node, sysfs=HGX_SYSFS, nvml="fake:hgx-h100")
    prober = Prober(config, links=lambda: LINKS, nvml_backend=fake, clock=lambda: 1000.0)
    reason = prober.neighbour_table().observe("eno1", lldp_frame(), 1000.0)
    assert reason is None, reason
    return prober
