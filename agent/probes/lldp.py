"""The LLDP probe: which switch port each interface is cabled to, from frames heard on the wire.

LLDP is push-only: a neighbour announces itself every tx-interval with a TTL, and we believe it
until the TTL runs out or it sends a shutdown LLDPDU (TTL 0, 802.1AB 9.2.7.7). So the probe is a
table fed by a listener (`agent.adapters.raw_socket`) and read by the report: `observe` takes one
frame, `snapshot` returns the neighbours still alive. Time is a parameter (monotonic seconds), so
tests move the clock instead of sleeping.

Neighbours are keyed by interface and MSAP identifier (chassis ID + port ID, 802.1AB 9.2.7.7);
the reported `ttl` is the advertised hold time, not the seconds left, so a steady neighbour gives
the same report every probe (no API writes). A frame that cannot be parsed is counted and its
reason returned; it never removes what we knew.

A restarted agent has heard nothing yet, while its switches only speak every tx-interval (30 s by
default). So it `carry`s the neighbours its previous run published (read back from its own
NodeTopology): each is believed for one more TTL from the restart, unless a fresh frame on that
interface replaces it first. The agent never publishes "no neighbours" just because it restarted.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Set
from dataclasses import dataclass

from agent.common.report import ComponentHealth, Health, LldpNeighbour, ProbeResult
from agent.lldp import lldpcli
from agent.lldp.frame import LldpFrame, MalformedFrame, parse

MAX_NEIGHBOURS_PER_INTERFACE = 32  # a flood of forged chassis IDs must not grow memory without bound


@dataclass(frozen=True)
class _Entry:
    neighbour: LldpNeighbour
    expires: float


def neighbour_from_frame(interface: str, frame: LldpFrame) -> LldpNeighbour:
    return LldpNeighbour(
        interface=interface,
        chassis_id=frame.chassis_id,
        port_id=frame.port_id,
        ttl=frame.ttl,
        chassis_id_subtype=frame.chassis_id_subtype,
        port_id_subtype=frame.port_id_subtype,
        port_description=frame.port_description,
        system_name=frame.system_name,
        system_description=frame.system_description,
        management_addresses=tuple(m.address for m in frame.management_addresses),
        capabilities=frame.capabilities.enabled if frame.capabilities else None,
    )


class NeighbourTable:
    """Neighbours per interface with TTL expiry; safe to feed from one thread and read from another.

    `generation` grows whenever the neighbour set or a neighbour's content changes, so a listener
    can tell "changed" from "refreshed" without comparing snapshots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], _Entry] = {}
        self.generation = 0
        self.frames = Counter[str]()  # accepted frames per interface (metrics)
        self.rejected = Counter[str]()  # rejected frames per interface (metrics)
        self.last_reject: dict[str, str] = {}  # interface -> reason of its latest rejected frame
        self._held: frozenset[str] = frozenset()  # interfaces whose link is down (see `hold`)
        self._carried: set[tuple[str, str, str]] = set()  # entries from a previous run (see `carry`)

    def observe(self, interface: str, frame: bytes, now: float) -> str | None:
        """Takes one received frame; returns None, or the reason it was rejected."""
        try:
            parsed = parse(frame)
        except MalformedFrame as exc:
            with self._lock:
                self.rejected[interface] += 1
                self.last_reject[interface] = exc.reason
            return exc.reason
        with self._lock:
            self.frames[interface] += 1
            return self._store(neighbour_from_frame(interface, parsed), now)

    def _store(self, neighbour: LldpNeighbour, now: float) -> str | None:
        key = (neighbour.interface, neighbour.chassis_id, neighbour.port_id)
        if self._carried:
            self._replace_carried(key)
        old = self._entries.get(key)
        if neighbour.ttl == 0:
            if old:
                del self._entries[key]
                self.generation += 1
            return None
        if old is None and self._count(neighbour.interface) >= MAX_NEIGHBOURS_PER_INTERFACE:
            self.rejected[neighbour.interface] += 1
            reason = f"more than {MAX_NEIGHBOURS_PER_INTERFACE} neighbours on {neighbour.interface}"
            self.last_reject[neighbour.interface] = reason
            return reason
        self._entries[key] = _Entry(neighbour, now + neighbour.ttl)
        if old is None or old.neighbour != neighbour:
            self.generation += 1
        return None

    def _replace_carried(self, key: tuple[str, str, str]) -> None:
        """A frame heard on an interface replaces what a previous run said was there."""
        self._carried.discard(key)
        stale = [k for k in self._carried if k[0] == key[0]]
        for k in stale:
            self._carried.discard(k)
            if self._entries.pop(k, None) is not None:
                self.generation += 1

    def carry(self, neighbours: Iterable[LldpNeighbour], now: float) -> int:
        """Takes the neighbours a previous run of the agent reported (its NodeTopology, read back at
        start); returns how many were taken. Each lives one TTL from `now` (when it was last heard
        is not known; at most one TTL ago), or until a frame heard on its interface replaces it.
        A neighbour already heard in this run wins over the carried one."""
        taken = 0
        with self._lock:
            for neighbour in neighbours:
                key = (neighbour.interface, neighbour.chassis_id, neighbour.port_id)
                if neighbour.ttl <= 0 or key in self._entries:
                    continue
                if self._count(neighbour.interface) >= MAX_NEIGHBOURS_PER_INTERFACE:
                    continue
                self._entries[key] = _Entry(neighbour, now + neighbour.ttl)
                self._carried.add(key)
                taken += 1
            if taken:
                self.generation += 1
        return taken

    def drop_carried(self, keep: Set[str]) -> bool:
        """Drops carried neighbours of interfaces not in `keep` (a NIC renamed or no longer
        reported since the restart); True when any were dropped."""
        with self._lock:
            gone = [k for k in self._carried if k[0] not in keep]
            for key in gone:
                self._carried.discard(key)
                self._entries.pop(key, None)
            if gone:
                self.generation += 1
            return bool(gone)

    @property
    def carried(self) -> int:
        """How many neighbours from a previous run are still believed without a frame."""
        with self._lock:
            return sum(1 for key in self._carried if key in self._entries)

    def _count(self, interface: str) -> int:
        return sum(1 for key in self._entries if key[0] == interface)

    def expire(self, now: float) -> bool:
        """Drops neighbours whose TTL ran out; True when any did."""
        with self._lock:
            dead = [k for k, entry in self._entries.items() if entry.expires <= now and k[0] not in self._held]
            for key in dead:
                del self._entries[key]
            self._carried.difference_update(dead)
            if dead:
                self.generation += 1
            return bool(dead)

    def forget(self, interface: str) -> bool:
        """Drops every neighbour of an interface (it went away or down); True when any were known."""
        with self._lock:
            keys = [key for key in self._entries if key[0] == interface]
            for key in keys:
                del self._entries[key]
            self._carried.difference_update(keys)
            if keys:
                self.generation += 1
            return bool(keys)

    def hold(self, interfaces: frozenset[str], now: float) -> None:
        """Holds the neighbours of interfaces whose link is down: they do not expire while the
        link stays down, whoever calls `expire` (the listener does, every poll).

        A cut cable stops the frames, but the switch at the far end is still where that port is
        cabled: the aggregator must see "cabled to leaf1, link down" (an unhealthy member of
        leaf1), not a node that silently left its leaf once the TTL ran out. Expiry resumes,
        from a full TTL, once the link is back."""
        with self._lock:
            released = self._held - interfaces
            for key, entry in list(self._entries.items()):
                if key[0] in released:
                    self._entries[key] = _Entry(entry.neighbour, now + entry.neighbour.ttl)
            self._held = frozenset(interfaces)

    def snapshot(
        self, now: float, *, links_down: frozenset[str] | None = None
    ) -> ProbeResult[tuple[LldpNeighbour, ...]]:
        """The neighbours alive at `now`, sorted by interface, chassis ID and port ID.
        `links_down`, when given, replaces the set of held interfaces (see `hold`)."""
        if links_down is not None:
            self.hold(links_down, now)
        self.expire(now)
        with self._lock:
            neighbours = tuple(self._entries[key].neighbour for key in sorted(self._entries))
        return ProbeResult(neighbours, ComponentHealth(Health.OK))


def from_lldpcli_json(text: str) -> list[LldpNeighbour]:
    """Neighbours from `lldpcli -f json` / `-f json0` output; raises `lldpcli.LldpcliError`."""
    return lldpcli.parse_json(text)
