"""The aggregator's copy of a node report: the fields it reads, equal parts shared between nodes.

Why: the aggregator keeps every node's parsed report for as long as it runs, and at 100,000 nodes
each byte per report is 100 kB. A report carries much that the agent publishes for operators
(`kubectl get nodetopology -o yaml`) and no aggregator module reads: per-GPU UUIDs and PCI
addresses, interface MACs, port LIDs and rates, HCA node descriptions, the host's kernel. Those
are half of a parsed 8-GPU, 8-HCA report, and because each names its node, the parts that hold them
(an `Interface`, a `Gpu`) differ on every node and can never be shared.

`trim_report` drops them: each field below is set back to its default, and every other field is
kept as reported. What the aggregator reads, and so keeps:

- `node_name`, `health` (member health), `findings` (grey failures), `measurements` and
  `probe_address` (the measured fabric);
- `nvml.domain` (the multi-node NVLink clique, its state): `nvml.gpus` and the driver are dropped;
- `rdma`: each device's name, node and system image GUIDs, PCI function, and its ports' numbers,
  states, netdevs and the GIDs that carry a GUID the device's own GUIDs do not (the GUIDs fabric
  dumps and UFM join on, the netdevs that say which interfaces are fabric NICs); `node_desc`,
  LIDs, rates and the GIDs that add no GUID are dropped, so an InfiniBand port (one GID, the
  node GUID in it) is equal on every node of a kind;
- `interfaces`: name, state, kind, PCI function and bond master (which interfaces are fabric
  NICs); MAC, MTU and speed are dropped, so an interface is equal on every node of a kind;
- `lldp`: interface, chassis ID, port ID, system name and capabilities (which switch, whether it
  is one); TTL, subtypes, descriptions and management addresses are dropped.
`host` is dropped whole. tests/live/test_slim_records.py builds trees, health, cross-checks, fabric
joins and explanations from whole and trimmed reports and finds them equal.

`share_report` then replaces equal value parts (NVLink domain, component health, interfaces,
per-kind empty maps, repeated strings) by one shared instance each.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agent.common.report import (
    ComponentHealth,
    GpuFabric,
    Interface,
    LldpNeighbour,
    NodeReport,
    NvLink,
    NvLinkDomain,
    NvmlReport,
    RdmaDevice,
    RdmaPort,
)
from aggregator.graph import NULL_GUID, _gid_guid, normalise_guid, port_guids

# report parts shared between reports when equal: value objects, never a node's own identity
SHARED_CLASSES = (NvLink, ComponentHealth, GpuFabric, NvLinkDomain, NvmlReport, Interface, RdmaPort)
EMPTY: Mapping[str, Any] = MappingProxyType({})  # every empty map of a report (counters, ...): one, read-only
# one node's own names (GUIDs, UUIDs, MACs): never equal to another's, so not worth a shared-table entry
# (the node's name is interned all the same: its Node and NodeTopology records hold the same string)
OWN_FIELDS = frozenset({"hostname", "uuid", "node_guid", "sys_image_guid", "node_desc", "mac", "gids"})
SHARED_LIMIT = 200_000  # parts remembered; past it the table starts over (sharing is an economy only)


def trim_report(report: NodeReport) -> NodeReport:
    """The report less the fields no aggregator module reads (module docstring)."""
    nvml = report.nvml
    return dataclasses.replace(
        report,
        host=None,
        nvml=None if nvml is None else NvmlReport("", (), nvml.domain),
        rdma=tuple(_device(d) for d in report.rdma),
        interfaces=tuple(_interface(i) for i in report.interfaces),
        lldp=tuple(_neighbour(n) for n in report.lldp),
    )


def _device(device: RdmaDevice) -> RdmaDevice:
    node_guid, image_guid = device.node_guid, device.sys_image_guid
    known = {NULL_GUID, *(normalise_guid(g) for g in (node_guid, image_guid) if g)}
    return dataclasses.replace(
        device,
        sys_image_guid=node_guid if image_guid == node_guid else image_guid,  # one string, not two equal ones
        node_desc=None,
        ports=tuple(_port(p, known) for p in device.ports),
    )


def _port(port: RdmaPort, known: set[str]) -> RdmaPort:
    """The port less LIDs and rate, and less the GIDs that add no GUID to the device's
    (`graph.hca_guids`, their one reader, through `graph.port_guids`): an InfiniBand port's GID
    holds its port GUID, most often the node GUID the device already names; a RoCE port's GIDs
    are addresses and add none. The port is then equal on every node of a kind, and shared."""
    adds = set(port_guids(port)) - known
    gids = tuple(g for g in port.gids if _gid_guid(g) in adds) if adds else ()
    return dataclasses.replace(port, lid=None, sm_lid=None, rate_gbps=None, gids=gids)


def _interface(interface: Interface) -> Interface:
    return dataclasses.replace(interface, mac=None, mtu=None, speed_mbps=None)


def _neighbour(neighbour: LldpNeighbour) -> LldpNeighbour:
    return LldpNeighbour(neighbour.interface, neighbour.chassis_id, neighbour.port_id, 0,
                         system_name=neighbour.system_name, capabilities=neighbour.capabilities)  # fmt: skip


# -- sharing equal parts of parsed reports -----------------------------------------------------------

_shared: dict[Any, Any] = {}  # key -> the shared instance
_shared_ids: set[int] = set()  # ids of the shared instances (alive: _shared holds them)


def share_report(report: NodeReport) -> NodeReport:
    """The same report, its equal value parts replaced by one shared instance each (see the module
    docstring). Reports are frozen and never mutated, so sharing cannot leak a change from one node
    to another; each part is rebuilt before the report is handed to anyone."""
    if len(_shared) > SHARED_LIMIT:
        _shared.clear()
        _shared_ids.clear()
    shared: NodeReport = _share(report)
    return shared


def _share(value: Any) -> Any:
    if type(value) is str:
        return sys.intern(value)
    if type(value) is tuple:
        items = tuple(_share(v) for v in value)
        return _canonical(("tuple", *(_key(v) for v in items)), items)
    if type(value) is dict:
        return _share_map(value) if value else EMPTY
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _share_instance(value)
    return value


def _share_map(value: dict[Any, Any]) -> Mapping[Any, Any]:
    """One read-only map per distinct content (a healthy node's `health` is every healthy node's)."""
    items = {_share(k): _share(v) for k, v in value.items()}
    return _canonical(("map", *(part for k, v in items.items() for part in (_key(k), _key(v)))),
                      MappingProxyType(items))  # fmt: skip


def _share_instance(value: Any) -> Any:
    fields = {f.name: _share(getattr(value, f.name)) if f.name not in OWN_FIELDS else getattr(value, f.name)
              for f in dataclasses.fields(value)}
    for name, new in fields.items():
        if new is not getattr(value, name):
            object.__setattr__(value, name, new)  # a fresh parse nobody else holds yet
    if not isinstance(value, SHARED_CLASSES):
        return value
    return _canonical((type(value), *(_key(v) for v in fields.values())), value)


def _canonical(key: tuple[Any, ...], value: Any) -> Any:
    """The shared instance equal to `value` (it becomes that instance when it is the first)."""
    if None in key:
        return value
    found = _shared.setdefault(key, value)
    if found is value:
        _shared_ids.add(id(value))
    return found


def _key(value: Any) -> Any:
    """A hashable stand-in for a part: shared parts by identity, plain values by type and value,
    None when the part cannot be compared cheaply (then what holds it is not shared)."""
    if id(value) in _shared_ids:
        return ("id", id(value))
    if value is EMPTY or value == ():
        return ("empty", type(value))
    if value is None or isinstance(value, (str, int, float)):
        return ("v", type(value), value)
    return None
