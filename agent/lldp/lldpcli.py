"""Parsers for what a host lldpd prints: `lldpcli -f json`, `-f json0` and `-f keyvalue`.

Some nodes already run lldpd (often for the switch team); reading it is cheaper than a second
listener and works where the NIC hides LLDP frames from the kernel. The three output formats
carry the same facts in different shapes:

- `json` collapses single-element lists and keys the chassis by its name, so an interface list
  with one entry becomes an object, and `mgmt-ip` is a string or a list;
- `json0` keeps every list and puts names in `"name"` / `"value"` members;
- `keyvalue` prints `lldp.<interface>.<path>=<value>` lines, with multi-line values continuing
  on lines of their own (a Cisco system description).

All three end in the same `LldpNeighbour` the raw-frame path builds (lldpd's subtype names,
capability names). A TTL that lldpd did not print is reported as 0 (unknown).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from agent.common.input_limits import InputLimitError, ascii_int, load_json, scalar_text
from agent.common.report import LldpNeighbour

CHASSIS_ID_TYPES = ("chassis", "ifalias", "port", "mac", "ip", "ifname", "local", "unhandled")
PORT_ID_TYPES = ("ifalias", "port", "mac", "ip", "ifname", "agent-circuit-id", "local", "unhandled")


MAX_OUTPUT = 4 << 20  # bytes of lldpcli output: a host with 64 ports of neighbours prints ~200 KB
MAX_LINES = 200_000  # keyvalue lines
MAX_LINE = 4096  # characters in one keyvalue line (an LLDP TLV holds at most 511 bytes)


class LldpcliError(ValueError):
    """Output that is not lldpcli json/json0/keyvalue, with the reason."""


def parse_json(text: str) -> list[LldpNeighbour]:
    """Neighbours from `lldpcli -f json` or `-f json0` output (the format is detected). Every field
    the neighbour gets is text (or None) whatever type lldpcli printed it as, so the agent never
    publishes a value its own reader (`agent.common.report.report_from_spec`) would refuse."""
    try:
        doc = load_json(text, "lldpcli JSON", max_bytes=MAX_OUTPUT)
    except json.JSONDecodeError as exc:
        raise LldpcliError(f"not JSON: {exc}") from exc
    except (InputLimitError, ValueError) as exc:
        raise LldpcliError(str(exc)) from None
    if not isinstance(doc, Mapping) or "lldp" not in doc:
        raise LldpcliError('lldpcli JSON has no top-level "lldp" member')
    try:
        if isinstance(doc["lldp"], list):
            return [n for top in doc["lldp"] for n in _json0_interfaces(top)]
        return list(_json_interfaces(doc["lldp"]))
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
        raise LldpcliError(f"unexpected lldpcli JSON shape: {exc!r}") from exc


# --- json -------------------------------------------------------------------------------------


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _json_interfaces(lldp: Mapping[str, Any]) -> Iterator[LldpNeighbour]:
    for entry in _as_list(lldp.get("interface")):
        for ifname, body in entry.items():
            neighbour = _json_neighbour(ifname, body)
            if neighbour:
                yield neighbour


def _json_chassis(chassis: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any]]:
    """`chassis` is {name: {...}} when the neighbour sent a system name, else the body itself."""
    if isinstance(chassis.get("id"), Mapping) and "type" in chassis["id"]:
        return None, chassis
    name, body = next(iter(chassis.items()), (None, {}))
    return name, body if isinstance(body, Mapping) else {}


def _json_neighbour(ifname: str, body: Mapping[str, Any]) -> LldpNeighbour | None:
    name, chassis = _json_chassis(body.get("chassis") or {})
    port = body.get("port") or {}
    chassis_id, port_id = chassis.get("id") or {}, port.get("id") or {}
    chassis_value, port_value = scalar_text(chassis_id.get("value")), scalar_text(port_id.get("value"))
    if chassis_value is None or port_value is None:
        return None
    return LldpNeighbour(
        interface=ifname,
        chassis_id=chassis_value,
        chassis_id_subtype=scalar_text(chassis_id.get("type")),
        port_id=port_value,
        port_id_subtype=scalar_text(port_id.get("type")),
        ttl=_ttl(port.get("ttl", chassis.get("ttl"))),
        port_description=scalar_text(port.get("descr")),
        system_name=name,
        system_description=scalar_text(chassis.get("descr")),
        management_addresses=_texts(_as_list(chassis.get("mgmt-ip"))),
        capabilities=_enabled(chassis.get("capability")),
    )


def _texts(values: list[Any]) -> tuple[str, ...]:
    """The text values of a list (a nested list or an object where an address belongs is dropped)."""
    return tuple(t for t in map(scalar_text, values) if t is not None)


def _enabled(capabilities: Any) -> tuple[str, ...] | None:
    """Enabled capabilities of `"capability": [{"type": "Bridge", "enabled": true}, ...]` (json
    and json0 alike; json collapses a single one into an object); None when none were sent."""
    listed = [c for c in _as_list(capabilities) if isinstance(c, Mapping) and scalar_text(c.get("type")) is not None]
    return tuple(str(scalar_text(c["type"])) for c in listed if c.get("enabled")) if listed else None


def _ttl(value: Any) -> int:
    """Seconds as lldpd prints them (ASCII digits, at most 65535 in LLDP); 0 when unknown."""
    seconds = ascii_int(value.strip() if isinstance(value, str) else value, max_digits=5)
    return seconds if seconds is not None else 0


# --- json0 ------------------------------------------------------------------------------------


def _values(items: Any) -> list[str]:
    found = (scalar_text(item.get("value")) for item in _as_list(items) if isinstance(item, Mapping))
    return [value for value in found if value is not None]


def _first(items: Any) -> str | None:
    values = _values(items)
    return values[0] if values else None


def _only(items: Any) -> Mapping[str, Any]:
    """The first object of a json0 list (json0 wraps every member in a list)."""
    first: Any = next(iter(_as_list(items)), {})
    return first if isinstance(first, Mapping) else {}


def _json0_interfaces(top: Mapping[str, Any]) -> Iterator[LldpNeighbour]:
    for entry in _as_list(top.get("interface")):
        chassis, port = _only(entry.get("chassis")), _only(entry.get("port"))
        chassis_id, port_id = _only(chassis.get("id")), _only(port.get("id"))
        chassis_value, port_value = scalar_text(chassis_id.get("value")), scalar_text(port_id.get("value"))
        interface = scalar_text(entry.get("name"))
        if chassis_value is None or port_value is None or interface is None:
            continue
        yield LldpNeighbour(
            interface=interface,
            chassis_id=chassis_value,
            chassis_id_subtype=scalar_text(chassis_id.get("type")),
            port_id=port_value,
            port_id_subtype=scalar_text(port_id.get("type")),
            ttl=_ttl(_first(port.get("ttl")) or _first(chassis.get("ttl"))),
            port_description=_first(port.get("descr")),
            system_name=_first(chassis.get("name")),
            system_description=_first(chassis.get("descr")),
            management_addresses=tuple(_values(chassis.get("mgmt-ip"))),
            capabilities=_enabled(chassis.get("capability")),
        )


# --- keyvalue ---------------------------------------------------------------------------------

# The interface name may itself hold dots (eth0.100), so it ends where a known top-level key starts:
# the first `.<key>` (followed by a dot or the `=`) after at least one character of name. Found by
# one search of the line's left side (linear; a lazy group before an unbounded one was quadratic).
_KEYWORD = re.compile(r"\.(?:via|rid|age|chassis|port|vlan|ppvid|pi|lldp-med|unknown-tlvs)(?=\.|$)")


_CAPABILITY = re.compile(r"^chassis\.[A-Za-z-]+\.enabled$")  # lldp.eno1.chassis.Bridge.enabled=on


def _keyvalue_line(line: str) -> tuple[str, str, str] | None:
    """(interface, key, value) of an `lldp.<interface>.<key>=<value>` line; None for any other."""
    left, equals, value = line.partition("=")
    if not equals or not left.startswith("lldp."):
        return None
    found = _KEYWORD.search(left, 6)  # "lldp." and one character of interface name at least
    if found is None:
        return None
    return left[5 : found.start()], left[found.start() + 1 :], value


def _keyvalue_records(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """Groups lines into one record per neighbour: (interface, [(key, value), ...]).

    A second `via` for an interface starts its next neighbour; a line that is not `lldp.` (and not
    a `#` comment) continues the previous value, as lldpcli prints multi-line values verbatim."""
    records: list[tuple[str, list[tuple[str, list[str]]]]] = []
    by_interface: dict[str, list[tuple[str, list[str]]]] = {}
    has_via: set[int] = set()  # id() of the records holding a `via` already
    last: list[tuple[str, list[str]]] | None = None
    lines = text.splitlines()
    if len(text) > MAX_OUTPUT or len(lines) > MAX_LINES:
        raise LldpcliError(f"lldpcli keyvalue output of {len(text)} characters, {len(lines)} lines: more than lldpd prints")
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE:
            raise LldpcliError(f"lldpcli keyvalue line {number}: {len(line)} characters (at most {MAX_LINE})")
        parsed = _keyvalue_line(line)
        if parsed is None:
            if last and line.strip() and not line.startswith("#"):
                last[-1][1].append(line)  # joined once at the end: no copy per continuation line
            continue
        ifname, key, value = parsed
        pairs = by_interface.get(ifname)
        if pairs is None or (key == "via" and id(pairs) in has_via):
            pairs = by_interface[ifname] = []
            records.append((ifname, pairs))
        if key == "via":
            has_via.add(id(pairs))
        pairs.append((key, [value]))
        last = pairs
    return [(ifname, [(key, "\n".join(parts)) for key, parts in pairs]) for ifname, pairs in records]


def _keyvalue_neighbour(ifname: str, pairs: list[tuple[str, str]]) -> LldpNeighbour | None:
    first: dict[str, str] = {}
    addresses: list[str] = []
    for key, value in pairs:
        first.setdefault(key, value)
        if key == "chassis.mgmt-ip":
            addresses.append(value)
    chassis_type = next((t for t in CHASSIS_ID_TYPES if f"chassis.{t}" in first), None)
    port_type = next((t for t in PORT_ID_TYPES if f"port.{t}" in first), None)
    if chassis_type is None or port_type is None:
        return None
    return LldpNeighbour(
        interface=ifname,
        chassis_id=first[f"chassis.{chassis_type}"],
        chassis_id_subtype=chassis_type,
        port_id=first[f"port.{port_type}"],
        port_id_subtype=port_type,
        ttl=_ttl(first.get("port.ttl", first.get("chassis.ttl"))),
        port_description=first.get("port.descr"),
        system_name=first.get("chassis.name"),
        system_description=first.get("chassis.descr"),
        management_addresses=tuple(addresses),
        capabilities=_enabled_keyvalue(pairs),
    )


def _enabled_keyvalue(pairs: list[tuple[str, str]]) -> tuple[str, ...] | None:
    """`chassis.Bridge.enabled=on` lines -> ("Bridge", ...); None when there are none."""
    listed = [(key.split(".")[1], value) for key, value in pairs if _CAPABILITY.match(key)]
    return tuple(name for name, value in listed if value == "on") if listed else None


def parse_keyvalue(text: str) -> list[LldpNeighbour]:
    """Neighbours from `lldpcli -f keyvalue` output; entries without chassis and port IDs (a
    VLAN-only fragment) are skipped."""
    out = []
    for ifname, pairs in _keyvalue_records(text):
        neighbour = _keyvalue_neighbour(ifname, pairs)
        if neighbour:
            out.append(neighbour)
    return out
