"""LLDP listener on AF_PACKET raw sockets: feeds received frames into a `NeighbourTable`.

One socket per interface, bound with protocol ETH_P_LLDP (0x88cc) so the kernel hands us only
LLDP frames, and joined to the LLDP multicast groups with PACKET_ADD_MEMBERSHIP so a NIC that
filters multicast still passes them up. Needs CAP_NET_RAW (not `privileged`).

The loop waits at most `poll_s` in `select`, so `stop()` returns promptly; it drains every ready
socket, expires neighbours whose TTL ran out, and calls `on_change` once per batch when the
table's content changed. An interface that cannot be opened (not there yet, down, gone, or no
CAP_NET_RAW) is retried every `retry_s`; its reason is kept in `errors`, and `judge` turns those
reasons into the LLDP component's health, so a listener that cannot listen is reported as failing,
never as an "ok" with no neighbours. A change of `errors` also calls `on_change`, so the report
says so within one probe cycle. Nothing here raises out of the thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterable

from agent.background import BackgroundThread
from agent.common.report import ComponentHealth, Health, LldpNeighbour, ProbeResult
from agent.lldp.frame import ETHERTYPE_LLDP, LLDP_MULTICASTS
from agent.probes.lldp import NeighbourTable

log = logging.getLogger(__name__)

SOL_PACKET = 263  # linux/socket.h
PACKET_ADD_MEMBERSHIP = 1  # linux/if_packet.h
PACKET_MR_MULTICAST = 0
PACKET_OUTGOING = 4  # sll_pkttype of frames this host sent
_MAX_FRAME = 9216 + 18  # jumbo MTU + header and tag


def open_lldp_socket(interface: str) -> socket.socket:
    """A non-blocking AF_PACKET socket on `interface` receiving only LLDP frames."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETHERTYPE_LLDP))
    try:
        sock.bind((interface, ETHERTYPE_LLDP))
        ifindex = socket.if_nametoindex(interface)
        for group in LLDP_MULTICASTS:
            # struct packet_mreq { int mr_ifindex; unsigned short mr_type, mr_alen; unsigned char mr_address[8]; }
            mreq = struct.pack("iHH8s", ifindex, PACKET_MR_MULTICAST, len(group), group)
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def open_error(exc: OSError) -> str:
    """Why a raw socket could not be opened, with the fix when it is a missing capability."""
    text = exc.strerror or str(exc)
    if exc.errno in (errno.EPERM, errno.EACCES):
        return f"{text} (raw sockets need CAP_NET_RAW: add it to the agent container's capabilities)"
    return text


class LldpListener(BackgroundThread):
    """Background thread: raw LLDP frames on `interfaces` -> `table`; `on_change()` on news."""

    thread_name = "lldp-listener"

    def __init__(
        self,
        interfaces: Iterable[str],
        table: NeighbourTable,
        on_change: Callable[[], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.2,
        retry_s: float = 5.0,
        opener: Callable[[str], socket.socket] = open_lldp_socket,
    ) -> None:
        super().__init__()
        self.table = table
        self._on_change = on_change
        self._clock = clock
        self._poll_s = poll_s
        self._retry_s = retry_s
        self._opener = opener
        self._wanted = frozenset(interfaces)
        self._sockets: dict[str, socket.socket] = {}
        self._selector = selectors.DefaultSelector()
        self._next_retry: dict[str, float] = {}
        self._seen_generation = table.generation
        self.errors: dict[str, str] = {}  # interface -> why it is not being listened on
        self._seen_errors: dict[str, str] = {}

    @property
    def listening(self) -> frozenset[str]:
        return frozenset(self._sockets)

    def probe(self, now: float | None = None) -> ProbeResult[tuple[LldpNeighbour, ...]]:
        """The LLDP component's result from this listener's table (see `judge`)."""
        return self.judge(self.table.snapshot(self._clock() if now is None else now))

    def judge(
        self, result: ProbeResult[tuple[LldpNeighbour, ...]], quiet: frozenset[str] = frozenset()
    ) -> ProbeResult[tuple[LldpNeighbour, ...]]:
        """`result` (the table's snapshot) with this listener's health: degraded when some
        interfaces cannot be listened on, failed when none can, absent when there is nothing to
        listen on. The neighbours already known are kept either way. Interfaces in `quiet`
        (administratively down, or non-fabric links that are down: `agent.probes.net.lldp_quiet`)
        cannot be heard by design, so their errors are no fault."""
        if not self._wanted:
            return ProbeResult(result.value, ComponentHealth(Health.ABSENT, "no interfaces to listen on"))
        errors = {name: reason for name, reason in self.errors.items() if name not in quiet}
        if not errors:
            return result
        reason = "; ".join(errors[name] for name in sorted(errors))
        if not self._sockets:
            return ProbeResult(result.value, ComponentHealth(Health.FAILED, reason))
        return ProbeResult(result.value, ComponentHealth(Health.DEGRADED, reason))

    def set_interfaces(self, interfaces: Iterable[str]) -> None:
        """Changes the interfaces to listen on; the loop opens and closes sockets to match."""
        self._wanted = frozenset(interfaces)

    def start(self) -> None:
        self._stop.clear()
        self._start_thread()

    def stop(self, timeout: float = 2.0) -> None:
        self._join(timeout)
        for interface in list(self._sockets):
            self._close(interface)
        self._selector.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # the listener must outlive any surprise; log it and go on
                log.exception("LLDP listener step failed")
                self._stop.wait(self._poll_s)

    def step(self) -> None:
        """One round: reconcile sockets, wait up to poll_s, drain, expire, notify."""
        self._reconcile(self._clock())
        if self._sockets:
            for key, _ in self._selector.select(self._poll_s):
                self._drain(key.data)
        else:
            self._stop.wait(self._poll_s)
        self.table.expire(self._clock())
        self._notify()

    def _reconcile(self, now: float) -> None:
        for interface in set(self._sockets) - self._wanted:
            self._close(interface)
            self.table.forget(interface)
        for interface in set(self.errors) - self._wanted:
            del self.errors[interface]
        for interface in self._wanted - set(self._sockets):
            if now < self._next_retry.get(interface, 0.0):
                continue
            try:
                sock = self._opener(interface)
            except OSError as exc:
                self.errors[interface] = f"cannot listen on {interface}: {open_error(exc)}"
                self._next_retry[interface] = now + self._retry_s
                continue
            self._sockets[interface] = sock
            self._selector.register(sock, selectors.EVENT_READ, interface)
            self.errors.pop(interface, None)
            self._next_retry.pop(interface, None)

    def _drain(self, interface: str) -> None:
        sock = self._sockets.get(interface)
        while sock is not None:
            try:
                data, address = sock.recvfrom(_MAX_FRAME)
            except BlockingIOError:
                return
            except OSError as exc:  # ENETDOWN when the link drops, ENODEV / ENXIO when it goes away
                self._lost(interface, exc)
                return
            if isinstance(address, tuple) and len(address) > 2 and address[2] == PACKET_OUTGOING:
                continue
            reason = self.table.observe(interface, data, self._clock())
            if reason:
                log.debug("LLDP frame on %s rejected: %s", interface, reason)

    def _lost(self, interface: str, exc: OSError) -> None:
        self.errors[interface] = f"receive on {interface} failed: {exc.strerror or exc}"
        self._close(interface)
        if exc.errno in (errno.ENODEV, errno.ENXIO):
            self.table.forget(interface)
        self._next_retry[interface] = self._clock() + min(self._retry_s, 1.0)

    def _close(self, interface: str) -> None:
        sock = self._sockets.pop(interface, None)
        if sock is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        sock.close()

    def _notify(self) -> None:
        generation, errors = self.table.generation, dict(self.errors)
        if generation == self._seen_generation and errors == self._seen_errors:
            return
        self._seen_generation, self._seen_errors = generation, errors
        try:
            self._on_change()
        except Exception:
            log.exception("LLDP on_change callback failed")
