"""UFM's port and system objects read into records (`UfmPort`, `UfmSystem`), in every spelling UFM
versions use (aggregator.sources.ufm puts them together into a fabric).

UFM's documented spelling (16 lower-case hex digit GUIDs, numbers as numbers, the guide's field
names) is read field by field across a whole listing, each step one loop in C, since a large
fabric's port listing has 100,000 objects; a listing with any object spelled otherwise is read
object by object by the reader that knows every spelling (`_PortReader`), which is also the
reference both readers are tested against.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from operator import attrgetter, itemgetter, methodcaller
from typing import Any, NamedTuple

from agent.common.input_limits import ascii_int, scalar_text, short
from aggregator.graph import normalise_guid

# InfiniBand per-lane rates by name (IBTA: SDR 2.5 ... XDR 200 Gb/s per lane)
_LANE_GBPS = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0,
              "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}  # fmt: skip
_NUMBER = re.compile(r"^\s*(\d{1,6}(?:\.\d{1,6})?)\s*(g|gb|gbps|gb/s)?\s*$", re.I | re.A)
_WIDTH = re.compile(r"^\s*(\d{1,3})\s*x\s*$", re.I | re.A)
_CACHED = 4096  # distinct spellings remembered: UFM uses a handful; a hostile one cannot grow memory
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


def _items(data: Any, listing: str) -> list[Mapping[str, Any]]:
    """The objects of a listing: a JSON array, as documented (an object is an error page)."""
    if not isinstance(data, list):
        raise UfmError(f"{listing}: expected a JSON array of objects, got {type(data).__name__}")
    if set(map(type, data)) <= {dict}:  # what json.loads gives: checked at C speed
        return data
    for index, item in enumerate(data):
        if not isinstance(item, Mapping):
            plain = not isinstance(item, (list, dict)) and not (isinstance(item, int) and item.bit_length() > 128)
            shown = repr(str(item)[:80]) if plain else short(item, 80)  # never a nested list printed whole
            raise UfmError(f"{listing}[{index}]: expected an object, got {type(item).__name__}: {shown}")
    return data


def _text(item: Mapping[str, Any], *keys: str) -> str:
    """The first of `keys` holding a string or a number, as stripped text; a list or an object
    where text belongs counts as absent (never its printed form)."""
    for key in keys:
        value = scalar_text(item.get(key))
        if value:
            return value.strip()
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
    """A port number: an int, or ASCII digits (never Unicode digits, a bool or a float)."""
    return ascii_int(value)


@functools.lru_cache(maxsize=_CACHED)
def lane_gbps(text: str) -> float | None:
    """"25.0 Gbps", "25", "EDR", "HDR" -> Gb/s per lane; None when unreadable."""
    name = text.strip().upper()
    if name in _LANE_GBPS:
        return _LANE_GBPS[name]
    match = _NUMBER.match(text)
    return float(match.group(1)) if match else None


@functools.lru_cache(maxsize=_CACHED)
def lanes(text: str) -> int | None:
    match = _WIDTH.match(text)
    return int(match.group(1)) if match else None


def _rate(speed: Any, width: Any) -> float | None:
    """Active speed x width, as listed (a null speed or width of a port without a link: None;
    a list or an object: None)."""
    if not (type(speed) in _SCALARS and type(width) in _SCALARS):
        return None
    return _scalar_rate(speed, width)


_SCALARS = frozenset({str, int, float, type(None)})


@functools.lru_cache(maxsize=_CACHED)
def _scalar_rate(speed: Any, width: Any) -> float | None:
    per_lane, count = lane_gbps(_str(speed)), lanes(_str(width))
    return per_lane * count if per_lane is not None and count is not None else None


@functools.lru_cache(maxsize=_CACHED)
def _best_rate(speeds: tuple[Any, ...], widths: tuple[Any, ...]) -> float | None:
    best_speed = max((g for g in (lane_gbps(_str(s)) for s in speeds) if g is not None), default=None)
    best_width = max((w for w in (lanes(_str(x)) for x in widths) if w is not None), default=None)
    return best_speed * best_width if best_speed is not None and best_width is not None else None


def _capacity(speeds: Any, widths: Any) -> float | None:
    if type(speeds) is not list or type(widths) is not list:
        return None
    try:
        return _best_rate(tuple(speeds), tuple(widths))  # a few distinct lists: cached
    except TypeError:  # unhashable items: not rates
        return None


@functools.lru_cache(maxsize=_CACHED)
def _kind_from_description(description: str) -> str:
    text = description.lower()
    if "switch" in text:
        return SWITCH
    if "computer" in text or "host" in text or "hca" in text:
        return HOST
    return OTHER


@functools.lru_cache(maxsize=_CACHED)
def _kind_of_system(value: str) -> str:
    text = value.lower()
    return SWITCH if text == "switch" else HOST if text in ("host", "computer", "server") else OTHER


@functools.lru_cache(maxsize=_CACHED)
def _is_up(logical: str, physical: str) -> bool:
    return logical.lower() in ("", "active") and physical.lower().replace(" ", "") in ("", "linkup")


def _port_name(text: str) -> Key | None:
    """"<guid>_<number>" (UFM's port names) -> (normalised GUID, number)."""
    guid, sep, number = text.rpartition("_")
    port = ascii_int(number) if sep else None
    if port is None:
        return None
    normal = _guid(guid)
    return (normal, port) if normal is not None else None


def _peer(item: Mapping[str, Any]) -> Key | None:
    """The far end: `peer` "<guid>_<number>" in UFM's own spelling the short way, else any of the
    spellings UFM versions use."""
    peer = item.get("peer")
    if type(peer) is str and len(peer) > 17 and peer[16] == "_" and _HEX16.match(peer):
        guid, number = item.get("peer_guid"), ascii_int(peer[17:])
        if (guid is None or guid == peer[:16]) and number is not None:
            return (peer[:16], number)
    guid = _guid(_text(item, "peer_guid"))
    port = _int(_text(item, "peer_port_number", "peer_port"))
    if guid is not None and port is not None:
        return (guid, port)
    return _port_name(_text(item, "peer", "peer_port_name"))


def _str(value: Any) -> str:
    """Text of a field: a string as it is, a number as its digits, anything else (null, a list, an
    object) empty: never the printed form of a nested value."""
    return value if type(value) is str else scalar_text(value) or ""


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
