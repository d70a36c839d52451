"""A user-space Ethernet hub with a delay per egress port, run inside a lab switch namespace.

Why not `tc qdisc ... netem delay`: this lab's kernel has no sch_netem (only tbf and htb load), so
the per-tier latency a real fabric has is added here instead: every frame that arrives on one
port is sent out of every other port after that port's delay (AF_PACKET sockets, one per port).
A hub, not a learning switch: the lab is a tree of a few ports, so flooding costs nothing and
cannot loop. A port may also have a rate (PORT=MS/MBIT): its frames leave one after another, each
taking its wire time at that rate (a slow or congested uplink: tc tbf would do it in a kernel
with sch_tbf on a veth, but a rate on the hub keeps the lab in one place).
Usage: delay_switch.py PORT=MS[/MBIT] [...]; runs until killed.
"""

from __future__ import annotations

import heapq
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # linux/if_packet.h: a frame this host sent, seen by its own tap


def ports(argv: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """PORT=MS[/MBIT] arguments -> (port -> delay in seconds, port -> rate in bytes a second)."""
    delays, rates = {}, {}
    for name, spec in (arg.split("=", 1) for arg in argv):
        ms, _, mbit = spec.partition("/")
        delays[name] = float(ms) / 1000
        if mbit:
            rates[name] = float(mbit) * 1e6 / 8
    return delays, rates


def main(argv: list[str]) -> None:
    delays, rates = ports(argv)
    free_at = dict.fromkeys(delays, 0.0)  # when each rate-limited port has sent its queue
    socks = {}
    for name in delays:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.bind((name, 0))
        socks[name] = s
    port_of = {s: name for name, s in socks.items()}
    queue: list[tuple[float, int, str, bytes]] = []
    seq = 0
    print("ready", flush=True)
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        ready, _, _ = select.select(list(socks.values()), [], [], timeout)
        now = time.monotonic()
        for s in ready:
            frame, address = s.recvfrom(65535)
            if address[2] == PACKET_OUTGOING:
                continue
            for out, delay in delays.items():
                if out != port_of[s]:
                    seq += 1
                    leave = now + delay
                    if out in rates:  # behind the frames queued on that port, then its own wire time
                        leave = free_at[out] = max(leave, free_at[out]) + (len(frame) + 24) / rates[out]
                    heapq.heappush(queue, (leave, seq, out, frame))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, frame = heapq.heappop(queue)
            socks[out].send(frame)


if __name__ == "__main__":
    main(sys.argv[1:])
