"""Sends every frame of the given captures out of one interface through an AF_PACKET socket, in
order, as a switch would put them on the wire: `lldp_netns_sender.py IFACE CAPTURE...`. The netns
tests run it inside the "switch" namespace to replay real (and malformed) LLDP at the listener."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pcap_files as pcap


def main(interface: str, captures: list[str]) -> None:
    sent = 0
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((interface, 0))
        for name in captures:
            for record in pcap.read(Path(name)).records:
                if len(record.data) >= 14:  # anything shorter is no Ethernet frame to send
                    sock.send(record.data)
                    sent += 1
    print(sent, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
