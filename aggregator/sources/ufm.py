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
spelling are read field by field across the whole listing in C loops, anything else item by item
(`aggregator.sources.ufm_items`, where the port and system records are).

The adapter asks for the active ports only (`ports?active=true`, as NVIDIA's own UFM plugins do):
a switch lists all its ports, cabled or not, and most of a large fabric's port listing is switch
ports never cabled, which say nothing about topology. `remember` carries the cabling of a port that
went down from the previous snapshot, because UFM drops the peer of a port without a link, and the
active listing drops the port: the fault must stay on the node the cable served, and the node in
its domain. What the facts mean for the graph (joins to nodes, health) is
`aggregator.sources.ufm_graph`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

from agent.common.input_limits import ascii_int
from aggregator.collector import collector_paused
from aggregator.sources.ufm_items import (
    _GUID,
    _HEX16,
    _KEY,
    _SYSTEM,
    HOST,
    SWITCH,
    Key,
    UfmError,
    UfmPort,
    UfmSystem,
    _guid,
    _int,
    _items,
    _kind_of_system,
    _port_name,
    _PortReader,
    _ports_at_once,
    _str,
    _systems_at_once,
    _text,
)

PORTS_PATH = "/resources/ports"
ACTIVE_FILTER = "active=true"  # UFM's "Get all active ports": Active, Armed and Initialize ports only
LINKS_PATH = "/resources/links"
SYSTEMS_PATH = "/resources/systems"
UNHEALTHY_PATH = "/app/unhealthy_ports"  # ports UFM (OpenSM) marks unhealthy: high BER, flapping, manual


@dataclass
class UfmFabric:
    ports: dict[Key, UfmPort] = field(default_factory=dict)
    systems: dict[str, UfmSystem] = field(default_factory=dict)  # system GUID -> system
    links: set[tuple[Key, Key]] = field(default_factory=set)  # cables: (lower port key, higher port key)
    unhealthy: dict[Key, str] = field(default_factory=dict)  # port key -> UFM's condition
    warnings: list[str] = field(default_factory=list)
    active_only: bool = False  # the ports listing holds the active ports only (`ports?active=true`)
    systems_listed: bool = False  # `systems` came from the systems listing, not only from the ports

    def switch_count(self) -> int:
        return sum(1 for s in self.systems.values() if s.kind == SWITCH)

    def host_count(self) -> int:
        return sum(1 for s in self.systems.values() if s.kind == HOST)


def cable(a: Key, b: Key) -> tuple[Key, Key]:
    """A cable between two ports, the same whichever end is named first."""
    return (a, b) if a < b else (b, a)


# --- parsing ---------------------------------------------------------------------------------------
def parse(
    ports: Any, *, links: Any = None, systems: Any = None, unhealthy: Any = None, active_only: bool = False
) -> UfmFabric:
    """The listings as `json.loads` returned them (all but ports optional); `active_only`: the ports
    listing was asked for with UFM's active filter (a port missing from it is not up)."""
    fabric = UfmFabric(active_only=active_only, systems_listed=systems is not None)
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
        if type(port) is str and (number := ascii_int(port)) is not None:
            return (guid, number)
    normal, number = _guid(_str(guid)), _int(_str(port))
    if normal is not None and number is not None:
        return (normal, number)
    return _port_name(_text(item, f"{side}_port_name"))


def _add_unhealthy(fabric: UfmFabric, item: Mapping[str, Any]) -> None:
    """One entry of UFM's unhealthy-port list (`UnhealthyGUID`, `UnhealthyPortNumber`, `Condition`
    as a string or a list, `State`)."""
    guid, number = _guid(_text(item, "UnhealthyGUID")), _int(_text(item, "UnhealthyPortNumber"))
    if guid is None or number is None or (guid, number) not in fabric.ports:
        if fabric.active_only and guid is not None and number is not None:
            return  # marked, then down: not among the active ports (the cable's fault is `remember`'s)
        fabric.warnings.append(f"unhealthy_ports: port {_text(item, 'UnhealthyPort') or guid} is not in the port listing")
        return
    condition = item.get("Condition")
    text = ", ".join(map(_str, condition)) if isinstance(condition, list) else _str(condition)
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
    except RecursionError:  # nested past the interpreter's limit: a body no UFM sends
        raise UfmDecodeError(listing, "JSON nested too deep to be a UFM listing") from None
    except ValueError as exc:
        start = body[:60].decode("utf-8", "replace")
        raise UfmDecodeError(listing, f"not JSON ({exc}); it starts {start!r}") from exc


def from_bodies(bodies: Mapping[str, bytes], *, active_only: bool = False) -> UfmFabric:
    """The listings as UFM sent them ({"ports": b"[...]", "links": ..., ...}), decoded and parsed:
    what the adapter does with each poll's answers. The links listing repeats the cables the port
    objects' peer fields give (UFM lists a link between two active ports, and both name their peer),
    so it is decoded only when some active port names no peer (an older UFM, or a trimmed port
    listing); otherwise its body is not read at all, garbage or not. `active_only`: the ports body is
    UFM's active-ports listing (`ports?active=true`). Raises UfmDecodeError for a body that is not
    JSON, UfmError for JSON that is not the documented shape."""
    if "ports" not in bodies:
        raise UfmError("ports: the port listing is required")
    with collector_paused():  # decoded listings, parsed fabrics: no cycles (it doubled decoding)
        decoded = {name: _decoded(name, body) for name, body in bodies.items() if name != "links"}
        fabric = parse(decoded.pop("ports"), systems=decoded.get("systems"), unhealthy=decoded.get("unhealthy_ports"),
                       active_only=active_only)  # fmt: skip
        del decoded  # freed here, inside the clock of whoever times this
        if "links" in bodies and any(p.up and p.peer is None for p in fabric.ports.values()):
            _add_links(fabric, _decoded("links", bodies["links"]))
    return fabric


def remember(previous: UfmFabric | None, current: UfmFabric) -> UfmFabric:
    """`current`, plus the cables of `previous` that lost their link: the fault stays on the node the
    cable served, and the node in its domain. UFM drops the peer of a port that lost its link, and
    its active-ports listing (`active_only`) drops the port itself. So a cable of the previous
    snapshot no longer cabled now is kept when each end is either listed and linked to nothing
    else, or (active listing only) missing while its system is still known: such an end is down,
    and stands in the facts as its last record marked Down (`_down`), so its fault reads as a port
    listed Down does. In the whole listing a missing port was removed, and its cable goes; so does
    a cable whose ends are all listed and up."""
    if previous is None:
        return current
    gone = previous.links - current.links
    if not gone:
        return current
    ports, linked = current.ports, set(chain.from_iterable(current.links))
    missing: dict[Key, UfmPort] = {}
    kept = set()
    for link in gone:
        absent = [key for key in link if key not in ports]
        if any(key in linked for key in link if key in ports):
            continue  # an end cabled elsewhere now
        if not absent and all(ports[key].up for key in link):
            continue  # both ends listed and up
        if absent and not all(_filtered_out(previous, current, key) for key in absent):
            continue  # a port UFM no longer has at all: removed, and its cable with it
        kept.add(link)
        missing.update((key, _down(previous.ports[key])) for key in absent)
    if not kept:
        return current
    return replace(current, links=current.links | kept, ports={**ports, **missing} if missing else ports)


ABSENT_STATE = "? (not among UFM's active ports)"  # what is known of the light on a port the filter left out


def _filtered_out(previous: UfmFabric, current: UfmFabric, key: Key) -> bool:
    """A port the active-ports listing left out because it is not up (not one UFM forgot): its
    system is still listed (or, without the systems listing, cannot be told gone)."""
    port = previous.ports.get(key)
    return current.active_only and port is not None and (not current.systems_listed or port.system_guid in current.systems)


def _down(port: UfmPort) -> UfmPort:
    """A port left out of the active listing, as the port listing would show it: logically Down (the
    filter keeps Active, Armed and Initialize: Down is the only state left), light unknown, no rate,
    no peer."""
    if not port.up and port.logical_state == "Down":
        return port  # already remembered so: the same record, so an unchanged fabric compares equal
    return port._replace(logical_state="Down", physical_state=ABSENT_STATE, gbps=None, peer=None, peer_node_name="", up=False)


def summary(fabric: UfmFabric) -> str:
    down = sum(1 for p in fabric.ports.values() if not p.up)
    return (f"{fabric.switch_count()} switches, {fabric.host_count()} hosts, {len(fabric.ports)} ports "
            f"({down} not active), {len(fabric.links)} cables")  # fmt: skip


def from_listings(listings: Mapping[str, Any], *, active_only: bool = False) -> UfmFabric:
    """`parse` over {"ports": ..., "links": ..., "systems": ..., "unhealthy_ports": ...} (what the
    adapter fetched, or a file holds; `active_only`: ports is the active-ports listing)."""
    if "ports" not in listings:
        raise UfmError("ports: the port listing is required")
    return parse(listings["ports"], links=listings.get("links"), systems=listings.get("systems"),
                 unhealthy=listings.get("unhealthy_ports"), active_only=active_only)  # fmt: skip


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
    except (OSError, ValueError, RecursionError) as exc:
        reason = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise UfmError(f"{path}: cannot read UFM listings: {reason}") from None
    if not isinstance(listings, dict):
        raise UfmError(f"{path}: expected an object with the listings ports, links, systems")
    try:
        return from_listings(listings)
    except UfmError as exc:
        raise UfmError(f"{path}: {exc}") from exc
