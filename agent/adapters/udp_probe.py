"""UDP round trips on the fabric NIC's address: the responder that answers peers and the prober
that times them (agent.probes.fabric_rtt.RttTransport).

Why UDP: it needs no privileges, no RDMA stack and no peer process beyond this agent, and it
crosses the same switches as a job's traffic when both ends bind the fabric address. It is not
what an RDMA job sees (no verbs, no GPUDirect): where a node has RDMA, agent.adapters.rdma_probe
runs perftest instead, its session requests arriving here (`gate`) past the same checks.

The responder is exposed to the fabric, so it is narrow: bound to one address (and, with root,
to that interface with SO_BINDTODEVICE), it answers only datagrams of exactly the probe layout
(`MAGIC`, a sequence number, a nonce: PACKET_SIZE bytes) from senders the allow-list names (the
probe addresses cluster nodes publish), and at most `rate` a second (a token bucket), so it can
be neither an amplifier nor a reflector for anyone else.

Bandwidth (less often, `burst`): the prober sends a train of BURST_SIZE-byte datagrams back to
back; the responder answers none of them, it only notes when the first and the last arrived (the
kernel's receive timestamps, SO_TIMESTAMPNS, so a busy responder thread does not compress the
train) and how many, per sender and train, and tells the prober on a 64-byte query. The train's
dispersion at the receiver is the path's narrowest rate (a packet-train estimate): a rate-limited
or congested uplink shows as a train that arrives slowly. Trains are accepted only from allowed
senders and at most `burst_rate` datagrams a second (their own token bucket), the answer is as
small as the query, and at most MAX_TRAINS trains are remembered.
"""

from __future__ import annotations

import contextlib
import functools
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
TRAIN_MAGIC, QUERY_MAGIC, REPORT_MAGIC = b"HTBW", b"HTBQ", b"HTBR"
SESSION_MAGIC = b"HTRQ"  # an RDMA session request, handed to the gate (agent.adapters.rdma_probe)
_TRAIN = struct.Struct("!4sQI")  # magic, nonce, sequence
_QUERY = struct.Struct("!4sQ")  # magic, nonce
_REPORT = struct.Struct("!4sQIQ")  # magic, nonce, datagrams received, first-to-last nanoseconds
BURST_SIZE = 1200  # a train datagram: below any fabric MTU, large enough that its time on the wire counts
WIRE_OVERHEAD = 8 + 20 + 14  # UDP, IPv4 and Ethernet headers: what a link carries beyond the payload
MAX_TRAINS = 64
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; the control message has the same number
_TIMESPEC = struct.Struct("@qq")


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
        burst_rate: float = 2000.0,
        gate: Callable[[bytes, str, Callable[[bytes], None]], None] | None = None,
    ) -> None:
        self.sock = _bind(address, port, interface)
        self.gate = gate  # RDMA session requests go there, past the same allow-list and bucket
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.allowed = allowed
        self.bucket = TokenBucket(rate, burst)
        self.trains_bucket = TokenBucket(burst_rate, 256)
        self.trains: dict[tuple[str, int], list[int]] = {}  # (sender, nonce) -> [first ns, last ns, count]
        self.answered = 0
        self.refused = 0
        self.train_datagrams = 0
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
                data, ancillary, _, sender = self.sock.recvmsg(BURST_SIZE + 1, 64)
            except OSError:
                continue
            if len(data) == BURST_SIZE and data.startswith(TRAIN_MAGIC):
                self._train(data, sender[0], _arrival(ancillary))
            elif len(data) == PACKET_SIZE and data.startswith(QUERY_MAGIC) and self._acceptable(data, sender[0]):
                self.sock.sendto(self._report(data, sender[0]), sender)
                self.answered += 1
            elif len(data) == PACKET_SIZE and data.startswith(MAGIC) and self._acceptable(data, sender[0]):
                self.sock.sendto(data, sender)
                self.answered += 1
            elif (
                self.gate is not None
                and len(data) == PACKET_SIZE
                and data.startswith(SESSION_MAGIC)
                and self._acceptable(data, sender[0])
            ):
                self.gate(data, sender[0], functools.partial(self._send, to=sender))
                self.answered += 1
            else:
                self.refused += 1

    def _send(self, data: bytes, *, to: tuple[str, int]) -> None:
        """A reply from another thread (the gate's); the socket may have closed meanwhile."""
        with contextlib.suppress(OSError):
            self.sock.sendto(data, to)

    def _train(self, data: bytes, sender: str, arrived: int) -> None:
        if sender not in self.allowed() or not self.trains_bucket.allow(time.monotonic()):
            self.refused += 1
            return
        _, nonce, _ = _TRAIN.unpack_from(data)
        seen = self.trains.get((sender, nonce))
        if seen is None:
            if len(self.trains) >= MAX_TRAINS:
                del self.trains[next(iter(self.trains))]
            self.trains[(sender, nonce)] = [arrived, arrived, 1]
        else:
            seen[1], seen[2] = arrived, seen[2] + 1
        self.train_datagrams += 1

    def _report(self, query: bytes, sender: str) -> bytes:
        _, nonce = _QUERY.unpack_from(query)
        first, last, count = self.trains.pop((sender, nonce), (0, 0, 0))
        return _REPORT.pack(REPORT_MAGIC, nonce, count, max(0, last - first)).ljust(PACKET_SIZE, b"\0")

    def _acceptable(self, data: bytes, sender: str) -> bool:
        return sender in self.allowed() and self.bucket.allow(time.monotonic())

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve, name="fabric-probe-responder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops answering; the socket closes once the serving thread has left it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.sock.close()


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The kernel's receive time of a datagram (nanoseconds), else now (no timestamp delivered)."""
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
            seconds, nanos = _TIMESPEC.unpack_from(payload)
            return int(seconds * 1_000_000_000 + nanos)
    return time.time_ns()


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
        self.trains: list[tuple[str, int, int, int]] = []  # (peer, sent, received, first-to-last ns): recent

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

    def burst(self, peer_address: str, count: int) -> float | None:
        """A train of `count` datagrams to the peer, then a query for how it arrived: the path's
        rate in Mbit/s (wire bytes between the first and the last arrival), None when fewer than
        two arrived or the peer did not answer."""
        sock = _bind(self.address, 0, self.interface)
        nonce = int.from_bytes(os.urandom(8), "big")
        peer = (peer_address, self.port)
        del self.trains[:-63]  # what the last rounds' trains did, for logs and tests; bounded
        try:
            for seq in range(count):
                try:
                    sock.sendto(_TRAIN.pack(TRAIN_MAGIC, nonce, seq).ljust(BURST_SIZE, b"\0"), peer)
                except OSError:
                    break
                self.sent += 1
            time.sleep(self.timeout)  # the train's tail through the fabric's queues
            report = self._ask(sock, peer, _QUERY.pack(QUERY_MAGIC, nonce).ljust(PACKET_SIZE, b"\0"), nonce)
        finally:
            sock.close()
        self.trains.append((peer_address, count, *(report or (0, 0))))
        if report is None or report[0] < 2 or report[1] <= 0:
            return None
        received, span_ns = report
        return (received - 1) * (BURST_SIZE + WIRE_OVERHEAD) * 8 / (span_ns / 1e9) / 1e6

    def _ask(self, sock: socket.socket, peer: tuple[str, int], query: bytes, nonce: int) -> tuple[int, int] | None:
        try:
            sock.sendto(query, peer)
            self.sent += 1
        except OSError:
            return None
        deadline = time.perf_counter() + self.timeout
        while (left := deadline - time.perf_counter()) > 0:
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                break
            data, sender = sock.recvfrom(PACKET_SIZE + 1)
            if len(data) == PACKET_SIZE and data.startswith(REPORT_MAGIC) and sender[0] == peer[0]:
                _, answered_nonce, received, span = _REPORT.unpack_from(data)
                if answered_nonce == nonce:
                    return received, span
        return None

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
