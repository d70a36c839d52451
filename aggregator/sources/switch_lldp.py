"""Switch LLDP tables as a fabric source: switch-to-switch cabling on Ethernet/RoCE fabrics.

On RoCE fabrics there is no subnet manager to ask; but network operating systems that run lldpd
(SONiC, Cumulus) can export `lldpcli -f json0 show neighbors`, one file per switch. Each
neighbour that is itself a switch (it announces the Bridge or Router capability, or is not a known
node) gives a switch-to-switch link; a neighbour that is a known node gives that node's cabling, and
a host that is no Node (it announces capabilities without Bridge or Router, and is no table's
switch) still makes its switch a leaf (`fabric_hosts`), so levels and names never depend on which
hosts are Nodes.

The switch a file belongs to is named by its `local-chassis` section when the file has one
(`lldpcli -f json0 show chassis` output merged in), else by the file name (`leaf1.json` -> leaf1).
Both lldpd JSON flavours are read: `json0` (every value a list) and `json` (single values bare).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.common.input_limits import InputLimitError, load_json, scalar_text
from aggregator import crosscheck
from aggregator.graph import FabricGraph
from aggregator.sources import Cluster, Source
from aggregator.sources.nodetopology import switch_id

MAX_TABLE = 16 << 20  # bytes of one switch's table: a 128-port switch's lldpcli JSON is ~1 MB


class SwitchLldpError(ValueError):
    """A file that is not lldpcli JSON output."""


@dataclass(frozen=True)
class SwitchNeighbour:
    local_port: str
    name: str  # neighbour's system name, else chassis ID
    port: str
    is_switch: bool | None  # from announced capabilities; None when none were announced


@dataclass(frozen=True)
class SwitchTable:
    switch: str
    neighbours: tuple[SwitchNeighbour, ...]


def _items(value: Any) -> list[Any]:
    """json0 wraps everything in lists; json does not (and uses dicts keyed by name)."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _text(value: Any) -> str:
    """The first value's text (a list or an object where text belongs: none)."""
    for item in _items(value):
        if isinstance(item, Mapping):
            return scalar_text(item.get("value", "")) or ""
        return scalar_text(item) or ""
    return ""


def _interfaces(lldp: Any) -> list[tuple[str, Mapping[str, Any]]]:
    found: list[tuple[str, Mapping[str, Any]]] = []
    for section in _items(lldp):
        for iface in _items(section.get("interface") if isinstance(section, Mapping) else None):
            if isinstance(iface, Mapping) and "name" in iface:
                name = scalar_text(iface["name"])
                if name is not None:
                    found.append((name, iface))
            elif isinstance(iface, Mapping):  # json flavour: {"swp1": {...}}
                found.extend((str(k), v) for k, v in iface.items() if isinstance(v, Mapping))
    return found


def _chassis(section: Any) -> tuple[str, str, bool | None]:
    """(system name, chassis id, is-switch) of a chassis section in either flavour."""
    for chassis in _items(section):
        if not isinstance(chassis, Mapping):
            continue
        if "id" not in chassis and len(chassis) == 1:  # json flavour: {"spine1": {...}}
            ((name, body),) = chassis.items()
            _, cid, caps = _chassis(body)
            return str(name), cid, caps
        capabilities = [c for c in _items(chassis.get("capability")) if isinstance(c, Mapping)]
        enabled = {str(c.get("type")) for c in capabilities if c.get("enabled")}
        is_switch = bool(enabled & {"Bridge", "Router"}) if capabilities else None
        return _text(chassis.get("name")), _text(chassis.get("id")), is_switch
    return "", "", None


def parse_table(text: str, *, default_name: str) -> SwitchTable:
    """One switch's table; SwitchLldpError for anything that is not lldpcli JSON within bounds."""
    try:
        doc = load_json(text, "lldpcli JSON", max_bytes=MAX_TABLE)
    except json.JSONDecodeError as exc:
        raise SwitchLldpError(f"not JSON (line {exc.lineno}): {exc.msg}") from exc
    except (InputLimitError, ValueError) as exc:
        raise SwitchLldpError(str(exc)) from None
    if not isinstance(doc, Mapping) or not ({"lldp", "local-chassis"} & set(doc)):
        raise SwitchLldpError("expected lldpcli JSON with an 'lldp' or 'local-chassis' section")
    local_name, local_id, _ = _chassis(
        [
            c
            for s in _items(doc.get("local-chassis"))
            if isinstance(s, Mapping)
            for c in _items(s.get("chassis"))
        ]
    )
    switch = switch_id(local_name, local_id) if (local_name or local_id) else default_name
    neighbours = []
    for port_name, iface in _interfaces(doc.get("lldp")):
        name, cid, is_switch = _chassis(iface.get("chassis"))
        port = next((p for p in _items(iface.get("port")) if isinstance(p, Mapping)), {})
        neighbours.append(SwitchNeighbour(port_name, switch_id(name, cid), _text(port.get("id")), is_switch))
    return SwitchTable(switch, tuple(neighbours))


def load_files(paths: Iterable[str]) -> list[SwitchTable]:
    tables = []
    for path in paths:
        stem = os.path.basename(path).split(".")[0]
        try:
            with open(path, encoding="utf-8") as handle:
                tables.append(parse_table(handle.read(), default_name=stem))
        except (OSError, UnicodeDecodeError, SwitchLldpError) as exc:
            raise SwitchLldpError(f"{path}: {exc}") from exc
    return tables


def fabric_hosts(tables: Iterable[SwitchTable]) -> frozenset[str]:
    """The neighbours that are hosts whichever hosts are Nodes: those announcing capabilities
    without Bridge or Router, that no table belongs to and that no entry announces as a switch.

    They are cabled as a dump's CAs are (`FabricGraph.attach_host`), so the leaves, and every level
    above them (aggregator.tiers.levels.fabric_hosts_on), do not move with the set of Nodes."""
    tables = tuple(tables)
    switches = {t.switch for t in tables}
    switches.update(n.name for t in tables for n in t.neighbours if n.is_switch)
    return frozenset(n.name for t in tables for n in t.neighbours if n.is_switch is False) - switches


def apply(graph: FabricGraph, tables: Iterable[SwitchTable]) -> None:
    tables = tuple(tables)
    hosts = fabric_hosts(tables)
    for table in tables:
        graph.switches.add(table.switch)
        for neighbour in table.neighbours:
            if neighbour.name in graph.nodes and neighbour.is_switch is not True:
                # anyone on a port can announce any host name: the host's own report must not object
                if crosscheck.table_entry_confirmed(graph, table.switch, neighbour.local_port, neighbour.name):
                    graph.attach_host(neighbour.name, table.switch)
            elif neighbour.name in hosts:
                # a host that is no Node (storage, login, not yet joined): it makes its switch a leaf,
                # as a dump's CA does, and is placed in no HyperNode (only Nodes are)
                graph.attach_host(neighbour.name, table.switch)
            elif neighbour.is_switch is not False:
                graph.add_switch_link(table.switch, neighbour.name)


class SwitchTables(Source):
    """Switches' own LLDP tables (one file per switch) as a source."""

    name = "switch-lldp"

    def __init__(self, tables: Iterable[SwitchTable]) -> None:
        self.tables = tuple(tables)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        parser.add_argument(
            "--switch-lldp",
            nargs="+",
            metavar="FILE",
            help="`lldpcli -f json0 show neighbors` output of switches, one file per switch "
            "(named after the switch unless it holds a local-chassis section)",
        )

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> SwitchTables | None:
        paths = getattr(options, "switch_lldp", None) or []
        return cls(load_files(paths)) if paths else None

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        apply(graph, self.tables)
