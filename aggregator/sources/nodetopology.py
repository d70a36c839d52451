"""NodeTopology reports as graph facts: where a node is cabled and which NVLink clique it is in.

A node's own report is the most direct truth about its cabling: LLDP on each port names the
switch at the other end (by system name; by chassis ID when the switch announces no name), the
RDMA devices carry the GUIDs under which fabric dumps (ibnetdiscover, UFM) know the node, and the
GPUs' fabric info names the multi-node NVLink clique. A single-node NVLink board (HGX) is not a
multi-node domain, so it yields none.

Only the fabric's cables count. The DaemonSet listens on every interface, so an agent also hears
the rack's management switch on its management NIC; counted, that switch would split every
scalable unit by rack. So by default only neighbours heard on fabric NICs count: interfaces that
carry an RDMA device (its port's netdev, a slave of a bonded one, or a NIC sharing its PCI
function), or, when a pattern is given (`--fabric-interfaces`), interfaces whose name matches it.
A report without any RDMA device (an Ethernet-only node, an agent run with `--interfaces` on
plain NICs) cannot tell, so all its neighbours count. And a neighbour that announces
capabilities without Bridge or Router (a host's lldpd, a phone, an access point) is not a switch;
one that announces none (some switches send no System Capabilities TLV) is given the benefit.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Mapping
from typing import Any

from agent.common.input_limits import clean_name, scalar_text, visible
from agent.common.report import LldpNeighbour, NodeReport, WireError, report_from_spec
from aggregator.graph import FabricGraph, NodeFacts
from aggregator.sources import Cluster, Source, regex_option

ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def switch_id(system_name: str | None, chassis_id: str) -> str:
    """The ID a switch goes by: its LLDP system name (blanks around it dropped), else its chassis ID
    (lower-cased). A name with a control character or longer than a DNS name is no name (the
    chassis ID stands in), and a chassis ID with one is written with escapes: every source names a
    switch by this one rule (`agent.common.input_limits.clean_name`), so `leaf1` and `leaf1\\n` are one
    switch, and a look-alike is never another switch's name."""
    name = clean_name(system_name) if system_name else None
    return name or visible(chassis_id.strip().lower())


def nvlink_domain_id(report: NodeReport) -> str | None:
    """ "cluster-uuid/clique-id" of the node's multi-node NVLink clique, or None."""
    domain = report.nvml.domain if report.nvml else None
    if domain is None or not domain.cluster_uuid or domain.cluster_uuid == ZERO_UUID:
        return None
    return f"{domain.cluster_uuid}/{domain.clique_id}"


SWITCH_CAPABILITIES = frozenset({"Bridge", "Router"})


@functools.lru_cache(maxsize=16)
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def fabric_interfaces(report: NodeReport, pattern: str | None = None) -> frozenset[str] | None:
    """Names of the interfaces whose LLDP neighbours are fabric cabling; None: all of them."""
    if pattern is not None:
        wanted = _pattern(pattern)
        names = {i.name for i in report.interfaces} | {n.interface for n in report.lldp}
        return frozenset(name for name in names if wanted.search(name))
    if not report.rdma:
        return None
    netdevs = {p.netdev for d in report.rdma for p in d.ports if p.netdev}
    functions = {d.pci_address for d in report.rdma if d.pci_address}
    return frozenset(netdevs) | {
        i.name
        for i in report.interfaces
        if i.bond_master in netdevs or (i.pci_address is not None and i.pci_address in functions)
    }


def is_switch(neighbour: LldpNeighbour) -> bool:
    """False for a neighbour that announces capabilities and enables neither Bridge nor Router."""
    return neighbour.capabilities is None or bool(SWITCH_CAPABILITIES.intersection(neighbour.capabilities))


def cabled_switches(report: NodeReport, fabric_pattern: str | None = None) -> frozenset[str]:
    """IDs of the switches the node's fabric NICs are cabled to, from its LLDP neighbours."""
    if fabric_pattern is None and report.rdma:
        return _cabled_on_rdma_nics(report)
    return _switches_heard(report.lldp, fabric_interfaces(report, fabric_pattern))


def _switches_heard(neighbours: tuple[LldpNeighbour, ...], fabric: frozenset[str] | None) -> frozenset[str]:
    found = set()
    for n in neighbours:  # is_switch and switch_id inlined: once per neighbour of every node
        if fabric is not None and n.interface not in fabric:
            continue
        if n.capabilities is not None and SWITCH_CAPABILITIES.isdisjoint(n.capabilities):
            continue
        found.add(switch_id(n.system_name, n.chassis_id))
    return frozenset(found)


def _cabled_on_rdma_nics(report: NodeReport) -> frozenset[str]:
    """`cabled_switches` of a report with RDMA devices and no pattern, asked neighbour by
    neighbour: nearly every neighbour is heard on an RDMA port's own netdev, so the bonds and
    shared PCI functions (`fabric_interfaces`) are only worked out for a neighbour that is not."""
    netdevs = {p.netdev for d in report.rdma for p in d.ports}
    fabric: frozenset[str] | None = None
    found = set()
    for n in report.lldp:
        interface = n.interface
        if not interface or interface not in netdevs:
            if fabric is None:
                fabric = fabric_interfaces(report)
            if interface not in fabric:  # type: ignore[operator]  # a report with RDMA: a set
                continue
        if n.capabilities is not None and SWITCH_CAPABILITIES.isdisjoint(n.capabilities):
            continue
        found.add(switch_id(n.system_name, n.chassis_id))
    return frozenset(found)


# equal switch sets, one instance each: every node of a leaf group hears the same switches, and an
# 8-rail node's set is ~700 bytes, held per node for as long as the aggregator runs
_SWITCH_SETS: dict[frozenset[str], frozenset[str]] = {}
SWITCH_SETS_LIMIT = 100_000  # past it the table starts over (sharing is an economy only)


def _shared_set(switches: frozenset[str]) -> frozenset[str]:
    found = _SWITCH_SETS.get(switches)
    if found is None:
        if len(_SWITCH_SETS) >= SWITCH_SETS_LIMIT:
            _SWITCH_SETS.clear()
        found = _SWITCH_SETS[switches] = switches
    return found


def facts_of(report: NodeReport, fabric_pattern: str | None = None) -> NodeFacts:
    return NodeFacts(_shared_set(cabled_switches(report, fabric_pattern)), report.rdma, nvlink_domain_id(report))


def apply(graph: FabricGraph, report: NodeReport, fabric_pattern: str | None = None) -> None:
    """Replaces the node's facts in the graph by those of its (new) report."""
    graph.set_node_facts(report.node_name, facts_of(report, fabric_pattern))


class NodeReports(Source):
    """The agents' reports as a source: each node's cabling (LLDP on its fabric NICs), HCA GUIDs and
    NVLink clique. The reports themselves are the cluster's (listed and watched by `run`, read from
    files by `render`); this source says how they become facts (`--fabric-interfaces`)."""

    name = "nodetopology"

    def __init__(self, fabric_interfaces: str | None = None) -> None:
        self.fabric_interfaces = fabric_interfaces  # regex of the fabric NICs; None: the RDMA-capable ones
        # node -> report and node -> its facts, of the last build: a loaded source lives as long
        # as the controller, whose feed keeps each parsed (frozen) report until its resourceVersion
        # moves, so a rebuild (a node joining, a resync) re-reads only the reports that are new objects
        self._reports: dict[str, NodeReport] = {}
        self._facts: dict[str, NodeFacts] = {}

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        parser.add_argument(
            "--fabric-interfaces",
            metavar="REGEX",
            help="interfaces whose LLDP neighbours are fabric cabling (default: those carrying an RDMA "
            "device; every interface of a report without one)",
        )

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> NodeReports:
        return cls(regex_option(getattr(options, "fabric_interfaces", None), "--fabric-interfaces"))

    def facts(self, report: NodeReport) -> NodeFacts:
        """One report's facts (the pipeline's fast path for a changed report)."""
        name = report.node_name
        if self._reports.get(name) is report:
            return self._facts[name]
        facts = self._facts[name] = facts_of(report, self.fabric_interfaces)
        self._reports[name] = report
        return facts

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        pattern, known, known_facts = self.fabric_interfaces, self._reports, self._facts
        reports = {report.node_name: report for report in cluster.reports.values()}
        if known:  # a rebuild: the reports that are the very objects of the last build keep their facts
            facts = {
                name: known_facts[name] if known.get(name) is report else facts_of(report, pattern)
                for name, report in reports.items()
            }
        else:
            facts = {name: facts_of(report, pattern) for name, report in reports.items()}
        self._reports, self._facts = reports, facts  # nodes gone since the last build are forgotten
        graph.set_facts_of_nodes(facts)


# where an informer's slim record (aggregator.live.slim) keeps the report it parsed on arrival, or the
# reason it could not: not a field a NodeTopology can have, so it never clashes with one
PARSED_KEY = "hypertopo.io/parsed-report"


def report_from_object(obj: Mapping[str, Any]) -> NodeReport:
    """A NodeTopology object (as the API returns it, or from a file) -> its NodeReport.

    The object name is the node name; a spec without nodeName takes it from there. Raises
    WireError (a ValueError naming the field) for anything of the wrong shape. A slim record
    (aggregator.live.slim) hands back the report parsed on arrival, or raises its reason again."""
    parsed = obj.get(PARSED_KEY)
    if isinstance(parsed, NodeReport):
        return parsed
    if parsed is not None:
        raise WireError(str(parsed))
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, Mapping):
        raise WireError(f"metadata: expected an object, got {type(metadata).__name__}")
    name = scalar_text(metadata.get("name"))
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise WireError(f"spec: expected an object, got {type(spec).__name__}")
    spec = dict(spec)
    spec.setdefault("nodeName", name or "")
    spec.setdefault("health", {})
    return report_from_spec(spec)
