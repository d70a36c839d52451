"""Reads tcpdump's verbose LLDP decode (the `*.out` files beside the captures, or a live
`tcpdump -v` run) into the facts the tests compare with: per packet, its timestamp and, for LLDP
packets, the chassis ID, port ID and system name exactly as tcpdump printed them."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PACKET = re.compile(r"^\s*(?:\d+\s+)?(?:(\d{4}-\d\d-\d\d) )?(\d\d:\d\d:\d\d\.\d{6}) (.*)$")
_ID_LINE = re.compile(r"^\s+Subtype (.+?) \((\d+)\): (.*)$")
_SYSTEM_NAME = re.compile(r"^\s+System Name TLV \(5\), length \d+: (.*)$")


@dataclass
class DecodedPacket:
    time: str  # "YYYY-MM-DD HH:MM:SS.ffffff" (date empty when tcpdump printed none)
    summary: str
    chassis_id: str | None = None
    port_id: str | None = None
    system_name: str | None = None

    @property
    def is_lldp(self) -> bool:
        return "LLDP, length" in self.summary


def _id_value(subtype: str, value: str) -> str:
    # "Network address (5): AFI IPv4 (1): 172.16.10.109" -> the address itself
    if subtype == "Network address":
        return value.rsplit(": ", 1)[-1]
    return value


def parse_decode(text: str) -> list[DecodedPacket]:
    packets: list[DecodedPacket] = []
    expecting: str | None = None  # "chassis" / "port" after the TLV header line
    for line in text.splitlines():
        head = _PACKET.match(line)
        if head and not line.startswith("\t"):
            packets.append(DecodedPacket(time=f"{head[1] or ''} {head[2]}".strip(), summary=head[3]))
            expecting = None
            continue
        if not packets:
            continue
        packet = packets[-1]
        if "Chassis ID TLV (1)" in line:
            expecting = "chassis"
        elif "Port ID TLV (2)" in line:
            expecting = "port"
        elif (ident := _ID_LINE.match(line)) and expecting:
            value = _id_value(ident[1], ident[3])
            if expecting == "chassis" and packet.chassis_id is None:
                packet.chassis_id = value
            elif expecting == "port" and packet.port_id is None:
                packet.port_id = value
            expecting = None
        elif (name := _SYSTEM_NAME.match(line)) and packet.system_name is None:
            packet.system_name = name[1]
    return packets
