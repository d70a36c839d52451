"""NVIDIA UFM's REST API as a fabric source: switches, cables, HCA ports and their state.

Many InfiniBand sites run UFM and keep no `ibnetdiscover` dumps; UFM already holds the subnet
manager's view and serves it as JSON. Volcano's own discovery reads one listing,
`GET /ufmRest/resources/ports`, and from each "Computer IB Port" only `system_name` and
`peer_node_name` (a host and the switch it is cabled to), which yields leaves and one flat spine.
Here the same listing is read for everything it says, and two more where UFM serves them:

* ports (`/resources/ports`): one object per port with `guid` (port GUID), `number`, `dname`,
  `name` ("<guid>_<number>"), `system_guid`/`systemID`, `system_name`, `node_description`
  ("host mlx5_0"), `description` ("Switch IB Port" / "Computer IB Port"), `logical_state`
  ("Active", "Armed", "Initialize", "Down"), `physical_state` ("Link Up", "Polling", "Disabled"),
  `active_speed` (per lane, "25.0 Gbps" or a rate name such as "NDR"), `active_width` ("4x"),
  optional `enabled_speed`/`enabled_width` lists, and the far end: `peer` ("<guid>_<number>"),
  `peer_guid`, `peer_port`/`peer_port_dname`, `peer_node_name`;
* links (`/resources/links`): `source_guid`/`source_port` and `destination_guid`/`destination_port`
  per cable, the subnet manager's cabling even where a port object lacks its peer;
* systems (`/resources/systems`): `system_name`, `guid`, `type` ("switch", "host", "gateway",
  "router"), which tells switches from hosts without guessing from port descriptions;
* unhealthy ports (`/app/unhealthy_ports`): the ports UFM's subnet manager marks unhealthy
  (`UnhealthyGUID`, `UnhealthyPortNumber`, `Condition`: high BER, flapping, set by hand).

The documented listings are whole JSON arrays (no pages), so a large fabric is one large response;
`parse` takes what `json.loads` gave, `from_bodies` the bytes. Structural garbage (not an array, an item that is not an
object) raises UfmError naming the listing and the item, so the adapter keeps its last good facts;
an item without a usable GUID is skipped and counted in `warnings`.

A large fabric's answer is large (10,000 hosts with four HCAs each: 80,000 ports, 100 MiB of
JSON), so `from_bodies` reads the bytes as UFM sent them: ports and systems in UFM's documented
spelling are read field by field across the whole listing in C loops, anything else item by item.

`remember` carries the cabling of a port that went down from the previous snapshot, because UFM
drops the peer of a port without a link: the fault must stay on the node the cable served, and the
node in its domain. What the facts mean for the graph (joins to nodes, health) is
`aggregator.sources.ufm_graph`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import attrgetter, itemgetter, methodcaller
from pathlib import Path
from typing import Any, NamedTuple

from aggregator.graph import normalise_guid

PORTS_PATH = "/resources/ports"
LINKS_PATH = "/resources/links"
SYSTEMS_PATH = "/resources/systems"
UNHEALTHY_PATH = "/app/unhealthy_ports"  # ports UFM (OpenSM) marks unhealthy: high BER, flapping, manual

# InfiniBand per-lane rates by name (IBTA: SDR 2.5 ... XDR 200 Gb/s per lane)
_LANE_GBPS = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0,
              "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}  # fmt: skip
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(g|gb|gbps|gb/s)?\s*$", re.I)
_WIDTH = re.compile(r"^\s*(\d+)\s*x\s*$", re.I)
SWITCH, HOST, OTHER = "switch", "host", "other"


class UfmError(ValueError):
    """A UFM response that is not the documented shape (which listing, which item, why)."""


Key = tuple[str, int]  # a port: (port GUID, port number)


class UfmPort(NamedTuple):
    """One port as UFM lists it. A named tuple, not a class of its own: a large fabric's poll builds
    100,000 of them, and the poller compares two polls' ports to see whether anything changed."""

    guid: str  # port GUID, normalised
    number: int
    system_guid: str
    system_name: str
    kind: str  # SWITCH | HOST | OTHER (gateways, routers)
    node_description: str = ""
    dname: str = ""
    logical_state: str = ""
    physical_state: str = ""
    gbps: float | None = None  # active rate: per-lane speed x width
    capacity_gbps: float | None = None  # highest enabled speed x width, if UFM lists them
    peer: Key | None = None  # (peer port GUID, peer port number)
    peer_node_name: str = ""  # the far end's system name (what Volcano reads)
    up: bool = True  # Active and Link Up (a port listed without any state counts as up: older data)

    @property
    def key(self) -> Key:
        return (self.guid, self.number)

    def label(self) -> str:
        where = self.node_description or self.system_name or self.guid
        return f"{where} port {self.dname or self.number}"


class UfmSystem(NamedTuple):
    guid: str
    name: str
    kind: str


@dataclass
class UfmFabric:
    ports: dict[Key, UfmPort] = field(default_factory=dict)
    systems: dict[str, UfmSystem] = field(default_factory=dict)  # system GUID -> system
    links: set[tuple[Key, Key]] = field(default_factory=set)  # cables: (lower port key, higher port key)
    unhealthy: dict[Key, str] = field(default_factory=dict)  # port key -> UFM's condition
    warnings: list[str] = field(default_factory=list)

    def switch_count(self) -> int:
        return sum(1 for s in self.systems.values() if s.kind == SWITCH)

    def host_count(self) -> int:
        return sum(1 for s in self.systems.values() if s.kind == HOST)


def cable(a: Key, b: Key) -> tuple[Key, Key]:
    """A cable between two ports, the same whichever end is named first."""
    return (a, b) if a < b else (b, a)


# --- parsing ---------------------------------------------------------------------------------------


def _items(data: Any, listing: str) -> list[Mapping[str, Any]]:
    """The objects of a listing: a JSON array, as documented (an object is an error page)."""
    if not isinstance(data, list):
        raise UfmError(f"{listing}: expected a JSON array of objects, got {type(data).__name__}")
    if set(map(type, data)) <= {dict}:  # what json.loads gives: checked at C speed
        return data
    for index, item in enumerate(data):
        if not isinstance(item, Mapping):
            raise UfmError(f"{listing}[{index}]: expected an object, got {type(item).__name__}: {str(item)[:80]!r}")
    return data


def _text(item: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = item.get(key)
        if value is not None and value != "":
            return value.strip() if isinstance(value, str) else str(value).strip()
    return ""


_HEX16 = re.compile(r"[0-9a-f]{16}")


def _guid(text: str) -> str | None:
    if _HEX16.fullmatch(text):  # UFM's own spelling: 16 lower-case hex digits
        return text
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    if not digits or len(digits) > 16 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return normalise_guid(digits)


def _int(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return None


@functools.cache
def lane_gbps(text: str) -> float | None:
    """"25.0 Gbps", "25", "EDR", "HDR" -> Gb/s per lane; None when unreadable."""
    name = text.strip().upper()
    if name in _LANE_GBPS:
        return _LANE_GBPS[name]
    match = _NUMBER.match(text)
    return float(match.group(1)) if match else None


@functools.cache
def lanes(text: str) -> int | None:
    match = _WIDTH.match(text)
    return int(match.group(1)) if match else None


@functools.cache
def _rate(speed: Any, width: Any) -> float | None:
    """Active speed x width, as listed (a null speed or width of a port without a link: None)."""
    per_lane, count = lane_gbps(_str(speed)), lanes(_str(width))
    return per_lane * count if per_lane is not None and count is not None else None


@functools.cache
def _best_rate(speeds: tuple[Any, ...], widths: tuple[Any, ...]) -> float | None:
    best_speed = max((g for g in (lane_gbps(str(s)) for s in speeds) if g is not None), default=None)
    best_width = max((w for w in (lanes(str(x)) for x in widths) if w is not None), default=None)
    return best_speed * best_width if best_speed is not None and best_width is not None else None


def _capacity(speeds: Any, widths: Any) -> float | None:
    if type(speeds) is not list or type(widths) is not list:
        return None
    try:
        return _best_rate(tuple(speeds), tuple(widths))  # a few distinct lists: cached
    except TypeError:  # unhashable items: not rates
        return None


@functools.cache
def _kind_from_description(description: str) -> str:
    text = description.lower()
    if "switch" in text:
        return SWITCH
    if "computer" in text or "host" in text or "hca" in text:
        return HOST
    return OTHER


@functools.cache
def _kind_of_system(value: str) -> str:
    text = value.lower()
    return SWITCH if text == "switch" else HOST if text in ("host", "computer", "server") else OTHER


@functools.cache
def _is_up(logical: str, physical: str) -> bool:
    return logical.lower() in ("", "active") and physical.lower().replace(" ", "") in ("", "linkup")


def _port_name(text: str) -> Key | None:
    """"<guid>_<number>" (UFM's port names) -> (normalised GUID, number)."""
    guid, sep, number = text.rpartition("_")
    if not sep or not number.isdigit():
        return None
    normal = _guid(guid)
    return (normal, int(number)) if normal is not None else None


def _peer(item: Mapping[str, Any]) -> Key | None:
    """The far end: `peer` "<guid>_<number>" in UFM's own spelling the short way, else any of the
    spellings UFM versions use."""
    peer = item.get("peer")
    if type(peer) is str and len(peer) > 17 and peer[16] == "_" and _HEX16.match(peer) and peer[17:].isdigit():
        guid = item.get("peer_guid")
        if guid is None or guid == peer[:16]:
            return (peer[:16], int(peer[17:]))
    guid = _guid(_text(item, "peer_guid"))
    port = _int(_text(item, "peer_port_number", "peer_port"))
    if guid is not None and port is not None:
        return (guid, port)
    return _port_name(_text(item, "peer", "peer_port_name"))


def _str(value: Any) -> str:
    return value if type(value) is str else "" if value is None else str(value)


def _identity(item: Mapping[str, Any]) -> Key | None:
    """(port GUID, number) in any spelling UFM versions use; None without a usable GUID."""
    guid = item.get("guid")
    if type(guid) is not str or not _HEX16.fullmatch(guid):
        guid = _guid(_text(item, "guid", "port_guid"))
    number = item.get("number")
    if type(number) is not int:
        number = _int(number if number is not None else item.get("physical_port_number", ""))
    if guid is not None and number is not None:
        return (guid, number)
    named = _port_name(_text(item, "name", "port_name"))
    if named is None:
        return None
    return (guid or named[0], number if number is not None else named[1])


class _PortReader:
    """Turns port objects into UfmPorts, remembering what repeats across ports (system GUIDs)."""

    def __init__(self, kinds: Mapping[str, str]) -> None:
        self.kinds = kinds
        self.systems: dict[str, str] = {}  # systemID as listed -> normalised system GUID

    def system_guid(self, item: Mapping[str, Any], port_guid: str) -> str:
        listed = item.get("systemID") or item.get("system_guid") or item.get("system_id")
        if listed == port_guid:
            return port_guid
        if type(listed) is str:
            known = self.systems.get(listed)
            if known is None:
                known = self.systems[listed] = _guid(listed) or ""
            return known or port_guid
        return _guid(_str(listed)) or port_guid

    def __call__(self, item: Mapping[str, Any]) -> UfmPort | None:
        get = item.get
        guid, number = get("guid"), get("number")
        if type(number) is not int or type(guid) is not str or not _HEX16.fullmatch(guid):
            found = _identity(item)
            if found is None:
                return None
            guid, number = found
        system_guid = self.system_guid(item, guid)
        logical, physical = _str(get("logical_state")), _str(get("physical_state"))
        return UfmPort(
            guid,
            number,
            system_guid,
            _str(get("system_name")),
            self.kinds.get(system_guid) or _kind_from_description(_str(get("description"))),
            _str(get("node_description")),
            _str(get("dname")),
            logical,
            physical,
            _rate(get("active_speed"), get("active_width")),
            _capacity(get("enabled_speed"), get("enabled_width")),
            _peer(item),
            _str(get("peer_node_name")),
            _is_up(logical, physical),
        )


def parse(ports: Any, *, links: Any = None, systems: Any = None, unhealthy: Any = None) -> UfmFabric:
    """The listings as `json.loads` returned them (all but ports optional)."""
    fabric = UfmFabric()
    kinds = _add_systems(fabric, systems) if systems is not None else {}
    _add_ports(fabric, ports, kinds)
    _add_peer_cables(fabric)
    if links is not None:
        _add_links(fabric, links)
    for item in _items(unhealthy, "unhealthy_ports") if unhealthy is not None else ():
        _add_unhealthy(fabric, item)
    return fabric


def _add_systems(fabric: UfmFabric, systems: Any) -> dict[str, str]:
    """The systems listing; returns system GUID -> kind (switch, host, other)."""
    items = _items(systems, "systems")
    usual = _systems_at_once(items)
    if usual is not None:
        fabric.systems.update(zip(map(_GUID, usual), usual, strict=True))
        return {system.guid: system.kind for system in usual}
    kinds: dict[str, str] = {}
    for item in items:
        guid = _guid(_text(item, "guid", "system_guid"))
        if guid is None:
            fabric.warnings.append(f"systems: {_text(item, 'system_name') or '?'} has no GUID, skipped")
            continue
        kind = _kind_of_system(_text(item, "type"))
        kinds[guid] = kind
        fabric.systems[guid] = UfmSystem(guid, _text(item, "system_name", "name"), kind)
    return kinds


def _systems_at_once(items: list[Mapping[str, Any]]) -> list[UfmSystem] | None:
    """The systems listing in UFM's documented spelling (`guid`, `type`, `system_name`), read field by
    field in C loops as the ports are; None when a system strays from it."""
    try:
        guids, types, names = (list(map(itemgetter(key), items)) for key in ("guid", "type", "system_name"))
        if not (_all_guids(guids) and set(map(type, types)) | set(map(type, names)) <= {str}):
            return None
        if "" in names or list(map(str.strip, names)) != names or list(map(str.strip, types)) != types:
            return None  # names to trim, or to take from `name`: the item-by-item way
    except (KeyError, TypeError):
        return None
    return list(map(_new_system, zip(guids, names, map(_kind_of_system, types), strict=True)))


_new_system = functools.partial(tuple.__new__, UfmSystem)


def _add_ports(fabric: UfmFabric, ports: Any, kinds: Mapping[str, str]) -> None:
    items = _items(ports, "ports")
    read = _ports_at_once(items, kinds)
    if read is None:  # some port strays from UFM's usual spelling: port by port
        parsed = list(map(_PortReader(kinds), items))
        kept: list[UfmPort] = list(filter(None, parsed))
        read = (list(map(_KEY, kept)), kept)
    fabric.ports.update(zip(*read, strict=True))
    kept, systems = read[1], fabric.systems
    if set(map(_SYSTEM, kept)).difference(systems):  # systems the systems listing did not give (or none)
        for port in kept:
            if port.system_guid not in systems:
                systems[port.system_guid] = UfmSystem(port.system_guid, port.system_name, port.kind)
    if len(kept) < len(items):
        fabric.warnings.append(f"ports: {len(items) - len(kept)} port(s) without a GUID or number skipped")


_KEY, _SYSTEM = itemgetter(slice(0, 2)), attrgetter("system_guid")  # a UfmPort's key is its first two fields
_GUID = itemgetter(0)  # a UfmPort's port GUID; a UfmSystem's GUID
_FIELDS = ("guid", "number", "systemID", "system_name", "node_description", "dname", "logical_state",
           "physical_state", "active_speed", "active_width", "enabled_speed", "enabled_width")  # fmt: skip
_TEXTS = ("system_name", "node_description", "dname", "logical_state", "physical_state")
_new_port = functools.partial(tuple.__new__, UfmPort)


def _ports_at_once(items: list[Mapping[str, Any]], kinds: Mapping[str, str]) -> tuple[list[Key], list[UfmPort]] | None:
    """(keys, ports) of a listing in UFM's documented spelling, read field by field across all ports
    (each step one loop in C: itemgetter, and map over cached functions) rather than port by port,
    which costs a large fabric's poll several times more. None when any port strays from that
    spelling (a field missing, a GUID in another notation, a number as text): the port-by-port
    reading (`_PortReader`), which knows every spelling, takes the listing then."""
    try:
        column = {key: list(map(itemgetter(key), items)) for key in _FIELDS}
        if not _usual_spelling(column):
            return None
        guids, numbers = column["guid"], column["number"]
        kind = list(map(kinds.get, column["systemID"]))
        if None in kind:  # a system the systems listing does not give: told by the port's description
            said = map(_str, map(methodcaller("get", "description"), items))
            kind = [k or _kind_from_description(d) for k, d in zip(kind, said, strict=True)]
        rate = list(map(_rate, column["active_speed"], column["active_width"]))
        enabled = list(map(_best_rate, map(tuple, column["enabled_speed"]), map(tuple, column["enabled_width"])))
        up = list(map(_is_up, column["logical_state"], column["physical_state"]))
        keys = list(zip(guids, numbers, strict=True))  # the port keys; peers found by name are these same tuples
        peer = _peers(items, dict(zip(map("{}_{}".format, guids, numbers), keys, strict=True)))
        peer_name = list(map(methodcaller("get", "peer_node_name", ""), items))
    except (KeyError, TypeError):  # a field missing; a list where a name belongs
        return None
    if not set(map(type, peer_name)) <= {str}:
        peer_name = list(map(_str, peer_name))
    fields = (guids, numbers, column["systemID"], column["system_name"], kind, column["node_description"],
              column["dname"], column["logical_state"], column["physical_state"], rate, enabled, peer, peer_name, up)  # fmt: skip
    return keys, list(map(_new_port, zip(*fields, strict=True)))


def _usual_spelling(column: Mapping[str, list[Any]]) -> bool:
    """GUIDs as 16 lower-case hex digits, numbers as numbers, names as text, enabled rates as lists."""
    texts = all(set(map(type, column[key])) <= {str} for key in _TEXTS)
    lists = set(map(type, column["enabled_speed"])) | set(map(type, column["enabled_width"])) <= {list}
    return (texts and lists and set(map(type, column["number"])) <= {int}
            and _all_guids(column["guid"]) and _all_guids(column["systemID"]))  # fmt: skip


_HEX = re.compile(r"[0-9a-f]*")


def _all_guids(texts: list[str]) -> bool:
    """Every text 16 lower-case hex digits: each 16 long, and all of them together hex digits (one
    regular-expression match over the lot instead of one per GUID). A text that is no string
    raises TypeError."""
    return set(map(len, texts)) <= {16} and _HEX.fullmatch("".join(texts)) is not None


def _peers(items: list[Mapping[str, Any]], by_name: Mapping[str, Key]) -> list[Key | None]:
    """Each port's far end: UFM's `peer` is the far port's name ("<guid>_<number>"), so a port of
    the listing is found by name; any other spelling, or a port not listed, the long way."""
    found: list[Key | None] = list(map(by_name.get, map(methodcaller("get", "peer"), items)))
    for index in [i for i, key in enumerate(found) if key is None]:  # no peer (no link), or unlisted
        item = items[index]
        if "peer" in item or "peer_guid" in item or "peer_port_name" in item:  # not a port without a link
            found[index] = _peer(item)
    return found


def _add_peer_cables(fabric: UfmFabric) -> None:
    """The cables the ports' own peer fields give (each found from both ends: kept once)."""
    ports, links = fabric.ports, fabric.links
    for key, port in ports.items():
        peer = port.peer
        if peer is None:
            continue
        other = ports.get(peer)
        if other is not None and (key < peer or other.peer != key):
            links.add((key, peer) if key < peer else (peer, key))


def _add_links(fabric: UfmFabric, links: Any) -> None:
    """The links listing: the subnet manager's cabling, for ports whose objects name no peer."""
    ports, cables = fabric.ports, fabric.links
    for index, item in enumerate(_items(links, "links")):
        ends = []
        for side in ("source", "destination"):
            end = _link_end(item, side)
            if end not in ports:
                guid, port = end if end is not None else (item.get(f"{side}_guid"), item.get(f"{side}_port"))
                fabric.warnings.append(f"links[{index}]: {side} port {guid}_{port} is not in the port listing")
                break
            ends.append(end)
        else:
            cables.add(cable(*ends))


def _link_end(item: Mapping[str, Any], side: str) -> Key | None:
    """One end of a link object: `<side>_guid` and `<side>_port` (a number or its text), else
    `<side>_port_name` ("<guid>_<number>")."""
    guid, port = item.get(f"{side}_guid"), item.get(f"{side}_port")
    if type(guid) is str and _HEX16.fullmatch(guid):
        if type(port) is int:
            return (guid, port)
        if type(port) is str and port.isdigit():
            return (guid, int(port))
    normal, number = _guid(_str(guid)), _int(_str(port))
    if normal is not None and number is not None:
        return (normal, number)
    return _port_name(_text(item, f"{side}_port_name"))


def _add_unhealthy(fabric: UfmFabric, item: Mapping[str, Any]) -> None:
    """One entry of UFM's unhealthy-port list (`UnhealthyGUID`, `UnhealthyPortNumber`, `Condition`
    as a string or a list, `State`)."""
    guid, number = _guid(_text(item, "UnhealthyGUID")), _int(_text(item, "UnhealthyPortNumber"))
    if guid is None or number is None or (guid, number) not in fabric.ports:
        fabric.warnings.append(f"unhealthy_ports: port {_text(item, 'UnhealthyPort') or guid} is not in the port listing")
        return
    condition = item.get("Condition")
    text = ", ".join(str(c) for c in condition) if isinstance(condition, list) else _str(condition)
    fabric.unhealthy[(guid, number)] = text or "unhealthy"


# --- from the bytes UFM sends ---------------------------------------------------------------------------


class UfmDecodeError(UfmError):
    """A listing's body that is not JSON at all (an HTML error page, a truncated answer)."""

    def __init__(self, listing: str, message: str) -> None:
        super().__init__(f"{listing}: {message}")
        self.listing = listing
        self.reason = message


def _decoded(listing: str, body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        start = body[:60].decode("utf-8", "replace")
        raise UfmDecodeError(listing, f"not JSON ({exc}); it starts {start!r}") from exc


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Decoded listings are trees of dicts, lists and strings, and a parsed fabric is tuples: no
    reference cycles for Python's cyclic garbage collector to find. Yet allocating millions of them
    sets off its full collections, each walking the whole process heap again (for a 10,000-host
    fabric with four HCAs each, that doubled the decoding time). It is paused while the listings are
    decoded and parsed; whatever survives is collected as usual afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def from_bodies(bodies: Mapping[str, bytes]) -> UfmFabric:
    """The listings as UFM sent them ({"ports": b"[...]", "links": ..., ...}), decoded and parsed:
    what the adapter does with each poll's answers. The links listing repeats the cables the port
    objects' peer fields give (UFM lists a link between two active ports, and both name their peer),
    so it is decoded only when some active port names no peer (an older UFM, or a trimmed port
    listing); otherwise its body is not read at all, garbage or not. Raises UfmDecodeError for a
    body that is not JSON, UfmError for JSON that is not the documented shape."""
    if "ports" not in bodies:
        raise UfmError("ports: the port listing is required")
    with _collector_paused():
        decoded = {name: _decoded(name, body) for name, body in bodies.items() if name != "links"}
        fabric = parse(decoded.pop("ports"), systems=decoded.get("systems"), unhealthy=decoded.get("unhealthy_ports"))
        del decoded  # freed here, inside the clock of whoever times this
        if "links" in bodies and any(p.up and p.peer is None for p in fabric.ports.values()):
            _add_links(fabric, _decoded("links", bodies["links"]))
    return fabric


def remember(previous: UfmFabric | None, current: UfmFabric) -> UfmFabric:
    """`current`, plus the cables of `previous` whose ports are still listed but no longer linked
    (UFM drops the peer of a port that lost its link): the fault stays on the node it served."""
    if previous is None:
        return current
    linked = set(chain.from_iterable(current.links))
    kept = {
        link
        for link in previous.links - current.links
        if all(key in current.ports and key not in linked for key in link)
        and not all(current.ports[key].up for key in link)
    }
    if not kept:
        return current
    return replace(current, links=current.links | kept)


def summary(fabric: UfmFabric) -> str:
    down = sum(1 for p in fabric.ports.values() if not p.up)
    return (f"{fabric.switch_count()} switches, {fabric.host_count()} hosts, {len(fabric.ports)} ports "
            f"({down} not active), {len(fabric.links)} cables")  # fmt: skip


def from_listings(listings: Mapping[str, Any]) -> UfmFabric:
    """`parse` over {"ports": ..., "links": ..., "systems": ..., "unhealthy_ports": ...} (what the
    adapter fetched, or a file holds)."""
    if "ports" not in listings:
        raise UfmError("ports: the port listing is required")
    return parse(listings["ports"], links=listings.get("links"), systems=listings.get("systems"),
                 unhealthy=listings.get("unhealthy_ports"))  # fmt: skip


def load_file(path: str) -> UfmFabric:
    """Listings saved from UFM: a JSON file {"ports": [...], "links": [...], "systems": [...]}, or a
    directory of ports.json (required), links.json, systems.json and unhealthy_ports.json (what `curl -o` of each
    listing saves). Raises UfmError naming the file."""
    root = Path(path)
    try:
        if root.is_dir():
            listings = {
                name: json.loads((root / f"{name}.json").read_text(encoding="utf-8"))
                for name in ("ports", "links", "systems", "unhealthy_ports")
                if name == "ports" or (root / f"{name}.json").exists()
            }
        else:
            listings = json.loads(root.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UfmError(f"{path}: cannot read UFM listings: {exc}") from exc
    if not isinstance(listings, dict):
        raise UfmError(f"{path}: expected an object with the listings ports, links, systems")
    try:
        return from_listings(listings)
    except UfmError as exc:
        raise UfmError(f"{path}: {exc}") from exc
