"""UDP round trips on the fabric NIC's address: the responder that answers peers and the prober
that times them (agent.probes.fabric_rtt.RttTransport).

Why UDP: it needs no privileges, no RDMA stack and no peer process beyond this agent, and it
crosses the same switches as a job's traffic when both ends bind the fabric address. It is not
what an RDMA job sees (no verbs, no GPUDirect); an RDMA transport (perftest's ib_write_lat, or
verbs) would implement the same interface where a node has it; none is built here.

The responder is exposed to the fabric, so it is narrow: bound to one address (and, with root,
to that interface with SO_BINDTODEVICE), it answers only datagrams of exactly the probe layout
(`MAGIC`, a sequence number, a nonce: PACKET_SIZE bytes) from senders the allow-list names (the
probe addresses cluster nodes publish), and at most `rate` a second (a token bucket), so it can
be neither an amplifier nor a reflector for anyone else.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

from agent.probes.fabric_rtt import TokenBucket

log = logging.getLogger(__name__)

MAGIC = b"HTPR"
_LAYOUT = struct.Struct("!4sIQ")  # magic, sequence, nonce
PACKET_SIZE = 64  # padded: a small frame, the size a latency probe is about
DEFAULT_PORT = 9731


def _packet(seq: int, nonce: int) -> bytes:
    return _LAYOUT.pack(MAGIC, seq, nonce).ljust(PACKET_SIZE, b"\0")


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _bind(address: str, port: int, interface: str | None) -> socket.socket:
    sock = socket.socket(_family(address), socket.SOCK_DGRAM)
    if interface:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        except OSError as exc:  # needs CAP_NET_RAW: the address binding still holds
            log.warning("probe socket not tied to %s (%s); bound to %s only", interface, exc, address)
    sock.bind((address, port))
    return sock


class UdpResponder:
    """Echoes probe datagrams from allowed senders; `answered`/`refused` count what it did."""

    def __init__(
        self,
        address: str,
        *,
        port: int = DEFAULT_PORT,
        allowed: Callable[[], frozenset[str]],
        rate: float = 50.0,
        burst: float = 20.0,
        interface: str | None = None,
    ) -> None:
        self.sock = _bind(address, port, interface)
        self.allowed = allowed
        self.bucket = TokenBucket(rate, burst)
        self.answered = 0
        self.refused = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def serve(self) -> None:
        """Answers until `stop()`; a refused or malformed datagram is dropped silently (no reply
        tells a scanner anything)."""
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.2)
            if not ready:
                continue
            try:
                data, sender = self.sock.recvfrom(PACKET_SIZE + 1)
            except OSError:
                continue
            if self._acceptable(data, sender[0]):
                self.sock.sendto(data, sender)
                self.answered += 1
            else:
                self.refused += 1

    def _acceptable(self, data: bytes, sender: str) -> bool:
        return (
            len(data) == PACKET_SIZE
            and data.startswith(MAGIC)
            and sender in self.allowed()
            and self.bucket.allow(time.monotonic())
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve, name="fabric-probe-responder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops answering; the socket closes once the serving thread has left it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.sock.close()


class UdpTransport:
    """Times round trips from `address` (the fabric NIC's) to a peer's responder, one probe at a
    time, each waiting at most `timeout` seconds, `gap` seconds apart (paced, never a burst)."""

    name = "udp"

    def __init__(
        self,
        address: str,
        *,
        port: int = DEFAULT_PORT,
        timeout: float = 0.5,
        gap: float = 0.01,
        interface: str | None = None,
    ) -> None:
        self.address = address
        self.port = port
        self.timeout = timeout
        self.gap = gap
        self.interface = interface
        self.sent = 0

    def round_trips(self, peer_address: str, count: int) -> list[float | None]:
        sock = _bind(self.address, 0, self.interface)
        nonce = int.from_bytes(os.urandom(8), "big")
        try:
            out = []
            for seq in range(count):
                out.append(self._one(sock, (peer_address, self.port), seq, nonce))
                self.sent += 1
                time.sleep(self.gap)
            return out
        finally:
            sock.close()

    def _one(self, sock: socket.socket, peer: tuple[str, int], seq: int, nonce: int) -> float | None:
        packet = _packet(seq, nonce)
        start = time.perf_counter()
        try:
            sock.sendto(packet, peer)
        except OSError:
            return None
        deadline = start + self.timeout
        while (left := deadline - time.perf_counter()) > 0:
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                break
            data, sender = sock.recvfrom(PACKET_SIZE + 1)
            if data == packet and sender[0] == peer[0]:
                return time.perf_counter() - start
        return None
