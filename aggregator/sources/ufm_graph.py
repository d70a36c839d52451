"""UFM's fabric facts (aggregator.sources.ufm) into the fabric graph: switch cabling, HCA ports
attached to their switch, and the faults UFM sees on nodes' cables.

Joining to Kubernetes nodes: an HCA port belongs to the node whose NodeTopology report carries its
port GUID or its system GUID (as for ibnetdiscover). Only when no report carries either does UFM's
`system_name` stand in for the host name (`HostNames` compares it with node names, as for dump
hosts): the agent's GUID wins, the name is the fallback for nodes without an agent.

Port state is health: a port in use (it has, or had, a cable) that is not Active/Link Up is a
failure of the node on either end's HCA, whether the HCA's side or the switch's side reports it;
an Active port below the rate its cable should carry (the enabled speed and width of both ends,
else the fabric's most common rate on host cables), or with an end UFM marks unhealthy, is a grey
failure.

A 10,000-host fabric has 40,000 host cables and more; the lookups run in C loops where they can,
and the attachments reach the graph at once.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import chain, compress
from operator import attrgetter, itemgetter

from agent.common.input_limits import clean_name
from aggregator.graph import FabricFault, FabricGraph
from aggregator.sources.ibnetdiscover import HostNames
from aggregator.sources.ufm import UfmFabric
from aggregator.sources.ufm_items import HOST, SWITCH, Key, UfmPort

_GUID, _SYSTEM, _KIND = itemgetter(0), attrgetter("system_guid"), attrgetter("kind")  # UfmPort fields


def switch_names(fabric: UfmFabric) -> dict[str, str]:
    """Switch system GUID -> switch ID: UFM's system name (blanks around it dropped), or "ib-<guid>"
    when it has none, an unusable one (a control character: `leaf1\\n` is not `leaf1`; longer than a
    DNS name) or two switches share it (the ibnetdiscover source names switches the same way)."""
    wanted = {s.guid: (clean_name(s.name) or f"ib-{s.guid}") for s in fabric.systems.values() if s.kind == SWITCH}
    counts = Counter(wanted.values())
    return {guid: (name if counts[name] == 1 else f"ib-{guid}") for guid, name in wanted.items()}


@dataclass
class _Join:
    """Who an HCA port belongs to: a reported GUID's node, else the system name's node. Collects
    the attachments, handed to the graph at once (`commit`)."""

    hosts: HostNames
    by_guid: dict[str, str]  # reported GUID -> node
    by_key: dict[str, str]  # node name as compared (HostNames.key) -> node
    by_name: set[str] = field(default_factory=set)  # system names placed by name (fallback)
    guids: dict[str, set[str]] = field(default_factory=dict)  # HCA port/system GUID -> switches
    names: dict[str, set[str]] = field(default_factory=dict)  # host name -> switches

    @classmethod
    def of(cls, graph: FabricGraph, hosts: HostNames) -> _Join:
        by_guid = {g: node for node in sorted(graph.facts) for g in graph.facts[node].guids}
        found: dict[str, list[str]] = {}
        for node in sorted(graph.nodes):
            found.setdefault(hosts.key(node), []).append(node)
        return cls(hosts, by_guid, {k: v[0] for k, v in found.items() if len(v) == 1})

    def reported(self, port: UfmPort) -> str | None:
        return self.by_guid.get(port.guid) or self.by_guid.get(port.system_guid)

    def reported_all(self, ports: list[UfmPort]) -> list[str | None]:
        """`reported` of each port (by port GUID in one C loop; by system GUID where that fails)."""
        found: list[str | None] = list(map(self.by_guid.get, map(_GUID, ports)))
        if None in found:
            found = [node or self.by_guid.get(port.system_guid) for node, port in zip(found, ports, strict=True)]
        return found

    def host(self, port: UfmPort) -> str | None:
        """The node a port's system name (else its node description) names, compared as dump hosts
        are (lower-cased, `--strip-domain`); a name matching no node stays lower-cased, as a dump
        host's does, so UFM and a dump name one host alike."""
        name = clean_name(port.system_name) or self.hosts.host_of(port.node_description) or ""
        if not name:
            return None
        return self.by_key.get(self.hosts.key(name), name.lower())

    def node(self, port: UfmPort) -> str | None:
        return self.reported(port) or self.host(port)

    def attach(self, hcas: list[UfmPort], switches: list[str]) -> None:
        """Each HCA port (by its port and its system GUID; by name when no report carries either)
        cabled to the switch beside it."""
        guids = self.guids
        for guid, switch in chain(zip(map(_GUID, hcas), switches, strict=True), zip(map(_SYSTEM, hcas), switches, strict=True)):
            found = guids.get(guid)
            if found is None:
                guids[guid] = {switch}
            else:
                found.add(switch)
        for port, switch, node in zip(hcas, switches, self.reported_all(hcas), strict=True):
            host = self.host(port) if node is None else None
            if host:
                self.names.setdefault(host, set()).add(switch)
                self.by_name.add(host)

    def commit(self, graph: FabricGraph) -> None:
        """The attachments into the graph, in bulk (GUIDs are normalised already)."""
        for found, into in ((self.guids, graph.attached_by_guid), (self.names, graph.attached_by_host)):
            if not into:
                into.update(found)
                continue
            for key, switches in found.items():
                have = into.get(key)
                if have is None:
                    into[key] = switches
                else:
                    have |= switches


def apply(graph: FabricGraph, fabric: UfmFabric, hosts: HostNames | None = None) -> list[str]:
    """Switch-to-switch cables, HCA ports attached to their switch (by GUID, and by system name for
    ports no report carries), and the faults UFM sees on nodes' cables. Returns warnings."""
    join = _Join.of(graph, hosts or HostNames())
    names = switch_names(fabric)
    host_cables = _cables(graph, fabric, names)
    by_name = {name: name for name in names.values()}
    hca_ports = list(compress(fabric.ports.values(), map(HOST.__eq__, map(_KIND, fabric.ports.values()))))
    cabled = set(chain.from_iterable(fabric.links))  # Volcano's minimal data: a host port naming its switch only
    named = [p for p in hca_ports if p.peer_node_name in by_name and p.up and (p.guid, p.number) not in cabled]
    join.attach([hca for hca, _, _ in host_cables] + named,
                [switch for _, _, switch in host_cables] + [by_name[port.peer_node_name] for port in named])  # fmt: skip
    join.commit(graph)
    graph.switches.update(names.values())
    for node, faults in port_faults(fabric, host_cables, join).items():
        graph.add_fabric_faults(node, faults)
    return _unmatched(graph, hca_ports, join) if graph.nodes else []


HostCable = tuple[UfmPort, UfmPort, str]  # (HCA port, switch port, switch ID)


def _cables(graph: FabricGraph, fabric: UfmFabric, names: Mapping[str, str]) -> list[HostCable]:
    """Switch-to-switch cables into the graph; returns the host cables."""
    ends = list(map(fabric.ports.__getitem__, chain.from_iterable(fabric.links)))  # a, b, a, b, ...
    switch = list(map(names.get, map(_SYSTEM, ends)))
    host_cables = []
    for a, b, sa, sb in zip(ends[0::2], ends[1::2], switch[0::2], switch[1::2], strict=True):
        if sa and sb:
            graph.add_switch_link(sa, sb)
        elif sa:
            if b.kind == HOST:
                host_cables.append((b, a, sa))
        elif sb and a.kind == HOST:
            host_cables.append((a, b, sb))
    return host_cables


def _expected_rate(host_cables: list[HostCable]) -> float | None:
    """The fabric's usual rate on host cables (the most common active rate), for ports whose
    enabled rates UFM does not list."""
    ends = chain.from_iterable((hca, switch) for hca, switch, _ in host_cables)
    rates = Counter(p.gbps for p in ends if p.up and p.gbps is not None)
    return rates.most_common(1)[0][0] if rates else None


def port_faults(fabric: UfmFabric, host_cables: list[HostCable], join: _Join) -> dict[str, list[FabricFault]]:
    """Node -> faults on its cables: a down end is a failure, a slow one a grey failure."""
    usual = functools.cache(lambda: _expected_rate(host_cables))  # only for cables without enabled rates
    marks = fabric.unhealthy
    out: dict[str, list[FabricFault]] = {}
    for hca, switch, _ in host_cables:
        if _plainly_healthy(hca, switch) and (not marks or (hca.key not in marks and switch.key not in marks)):
            continue
        fault = _link_fault((hca, switch), usual, marks)
        node = join.node(hca) if fault is not None else None
        if node is not None and fault is not None:
            out.setdefault(node, []).append(fault)
    return {node: sorted(faults, key=lambda f: f.text) for node, faults in out.items()}


def _plainly_healthy(hca: UfmPort, switch: UfmPort) -> bool:
    """Both ends up at the rate both are enabled for: the usual cable, decided without more ado."""
    a, b, enabled_a, enabled_b = hca.gbps, switch.gbps, hca.capacity_gbps, switch.capacity_gbps
    if not (hca.up and switch.up) or a is None or b is None or enabled_a is None or enabled_b is None:
        return False
    return min(a, b) >= min(enabled_a, enabled_b)


def _marked(ports: tuple[UfmPort, UfmPort], marks: Mapping[Key, str]) -> FabricFault | None:
    """A cable with an end UFM marks unhealthy (high BER, flapping, set by hand): a grey failure."""
    found = [(p, marks[p.key]) for p in sorted(ports, key=_by_key) if p.key in marks]
    if not found:
        return None
    said = "; ".join(f"{p.label()}: {why}" for p, why in found)
    return FabricFault(failure=False, cause="RDMA", text=f"RDMA {ports[0].label()} marked unhealthy (UFM: {said})")


def _link_fault(
    ports: tuple[UfmPort, UfmPort], usual: Callable[[], float | None], marks: Mapping[Key, str]
) -> FabricFault | None:
    """The fault on a host cable (HCA end first), if any."""
    hca, switch = ports
    if not (hca.up and switch.up):
        states = "; ".join(
            f"{p.label()}: {p.logical_state or '?'}/{p.physical_state or '?'}" for p in sorted(ports, key=_by_key) if not p.up
        )
        return FabricFault(failure=True, cause="RDMA", text=f"RDMA {hca.label()} down (UFM: {states})")
    if hca.capacity_gbps is not None and switch.capacity_gbps is not None:
        expected: float | None = min(hca.capacity_gbps, switch.capacity_gbps)
    else:
        expected = usual()
    rates = [p.gbps for p in ports if p.gbps is not None]
    if expected is None or not rates or min(rates) >= expected:
        return _marked(ports, marks)
    return FabricFault(
        failure=False,
        cause="RDMA",
        text=f"RDMA {hca.label()} rate: {min(rates):g} Gb/s below the {expected:g} Gb/s its cable should carry (UFM)",
    )


def _by_key(port: UfmPort) -> Key:
    return port.key


def _unmatched(graph: FabricGraph, hca_ports: list[UfmPort], join: _Join) -> list[str]:
    """Hosts UFM names that are no node, nodes that no UFM host names or reports the GUID of."""
    reported = join.reported_all(hca_ports)
    matched = set(reported) | {n for n in join.by_name if n in graph.nodes}
    unreported = [p for p, node in zip(hca_ports, reported, strict=True) if node is None]
    lost_hosts = sorted({p.system_name for p in unreported if join.host(p) not in graph.nodes} - {""})
    lost_nodes = sorted(n for n in graph.nodes if n not in matched)
    warnings = []
    if lost_hosts:
        warnings.append(
            f"{len(lost_hosts)} hosts in UFM match no node (e.g. {', '.join(lost_hosts[:3])}; nodes are named like "
            f"{', '.join(sorted(graph.nodes)[:2])}): see --strip-domain"
        )
    if lost_nodes:
        warnings.append(f"{len(lost_nodes)} of {len(graph.nodes)} nodes match no host in UFM (e.g. {', '.join(lost_nodes[:3])})")
    return warnings
