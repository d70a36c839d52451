"""The fabric graph: what every source knows about nodes, switches and NVLink domains, joined.

Sources (NodeTopology reports, ibnetdiscover dumps, switch LLDP tables, node labels, cluster model
files) each see part of the fabric and name things their own way. The graph is where their facts
meet under one vocabulary: nodes by Kubernetes node name, switches by switch ID (LLDP system name,
the host name in an InfiniBand node description, or a GUID when nothing better exists), NVLink
domains by "cluster-uuid/clique-id".

It is built incrementally: facts a node reports are kept per node so one node's new report
replaces only its own facts (the aggregator's fast path), while fabric-wide facts (dumps, switch
tables, the model) are added once. Tier inference (aggregator.tiers.infer) reads it; nothing here
decides tiers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

from agent.common.report import RdmaDevice, RdmaPort


def normalise_guid(text: str) -> str:
    """Any GUID spelling ("0c42:a103:008b:40d0", "0x0c42a103008b40d0", "c42a103008b40d0") -> 16
    lower-case hex digits, so sysfs, ibnetdiscover and UFM spellings compare equal."""
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    return digits.zfill(16)


NULL_GUID = "0" * 16


def _gid_guid(gid: str) -> str | None:
    """The port GUID inside an InfiniBand GID: its low 64 bits under the subnet prefix (IBTA; RFC
    4391), None where the prefix is zero: an IPv4-mapped entry (`::ffff:10.0.0.1`, which a RoCE
    port lists) or an unset one, whose low bits are an address, not a GUID."""
    groups = gid.split(":")
    if len(groups) != 8 or not "".join(groups[:4]).strip("0"):
        return None
    return normalise_guid("".join(groups[4:]))


def port_guids(port: RdmaPort) -> Iterator[str]:
    """The port GUIDs inside the port's GIDs (the null GUID of an unset GID left out). None on an
    Ethernet (RoCE) port: its GIDs are its IP addresses (link-local ones built from the MAC), which
    no fabric dump or UFM listing names, and two hosts may well share an address on separate rails."""
    if port.link_layer == "Ethernet":
        return
    for gid in port.gids:
        guid = _gid_guid(gid)
        if guid and guid != NULL_GUID:
            yield guid


def hca_guids(hcas: Iterable[RdmaDevice]) -> frozenset[str]:
    """The normalised GUIDs of these HCAs: node and system image GUIDs, and the port GUIDs inside
    their InfiniBand ports' GIDs (`port_guids`)."""
    guids: set[str] = set()
    for device in hcas:
        node_guid, image_guid = device.node_guid, device.sys_image_guid
        if node_guid:
            guids.add(normalise_guid(node_guid))
        if image_guid and image_guid != node_guid:
            guids.add(normalise_guid(image_guid))
        for port in device.ports:
            guids.update(port_guids(port))
    return frozenset(guids)


class NodeFacts(NamedTuple):
    """What one node's own report says about where it is cabled (a named tuple: 100,000 of them
    are made per full build, at a tenth of a frozen dataclass's cost).

    The HCAs are kept as reported and their GUIDs worked out when asked (`guids`): only fabric
    dumps and UFM join on GUIDs, and a cluster without either would normalise 400,000 of them per
    full build (a fifth of the facts' cost at 100,000 nodes) for nothing."""

    switches: frozenset[str] = frozenset()  # switch IDs seen by LLDP on the node's ports
    hcas: tuple[RdmaDevice, ...] = ()  # the report's RDMA devices, whose GUIDs dumps and UFM know
    nvlink: str | None = None  # "cluster-uuid/clique-id" of a multi-node NVLink domain

    @property
    def guids(self) -> frozenset[str]:
        """Normalised node, system image and port GUIDs of the node's HCAs."""
        return hca_guids(self.hcas) if self.hcas else frozenset()


@dataclass(frozen=True)
class FabricFault:
    """A fault a fabric manager sees on a node's cable (UFM: a port down or slow), which the node's
    own agent may not see (the switch side of a cable): `failure` counts against Ready, else it is
    a grey failure (FabricDegraded). `cause` is a health component label ("RDMA")."""

    failure: bool
    cause: str
    text: str


class Finding(NamedTuple):
    """A claim of one node's report that was refused because another source, or another report,
    contradicts it (aggregator.crosscheck): `node` is the node the claim was about, `reason` a
    short label (metrics), `text` one line for people. `degrades`: the node itself disagrees with
    the fabric, so its domains show it (FabricDegraded); a claim that anyone could have forged
    against the node (a copied GUID, a forged LLDP frame) is reported without marking it."""

    node: str
    reason: str
    text: str
    degrades: bool = False


@dataclass
class CliqueBook:
    """How the NVLink clique claims were settled (aggregator.crosscheck_cliques), kept so that one
    node's new report re-settles only the cliques it leaves and joins."""

    claimants: dict[str, set[str]] = field(default_factory=dict)  # clique -> nodes in it by report or model
    claim: dict[str, str] = field(default_factory=dict)  # node -> the clique it claims
    before: dict[str, NodeFacts] = field(default_factory=dict)  # node -> its facts before the clique checks
    spread: set[str] = field(default_factory=set)  # cliques whose members span several leaf groups
    spread_sets: dict[frozenset[str], str | None] = field(default_factory=dict)  # their members' switches


@dataclass
class FabricGraph:
    nodes: set[str] = field(default_factory=set)
    switches: set[str] = field(default_factory=set)
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    # fabric-wide facts (dumps, switch tables, models)
    switch_links: set[tuple[str, str]] = field(default_factory=set)  # undirected, (low, high)
    uplinks: set[tuple[str, str]] = field(default_factory=set)  # directed (child, parent)
    attached_by_guid: dict[str, set[str]] = field(default_factory=dict)  # HCA GUID -> switches
    attached_by_host: dict[str, set[str]] = field(default_factory=dict)  # host name -> switches
    declared: dict[str, set[str]] = field(default_factory=dict)  # node -> switches (model)
    nvlink_declared: dict[str, str] = field(default_factory=dict)  # node -> domain (model)
    label_paths: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    label_levels: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)  # what the sources could not place, for people
    fabric_faults: dict[str, list[FabricFault]] = field(default_factory=dict)  # node -> faults (UFM)
    findings: list[Finding] = field(default_factory=list)  # refused claims (aggregator.crosscheck)
    cliques: CliqueBook = field(default_factory=CliqueBook)  # aggregator.crosscheck_cliques

    # -- building -------------------------------------------------------------------------------
    def add_node(self, node: str) -> None:
        self.nodes.add(node)

    def set_node_facts(self, node: str, facts: NodeFacts) -> None:
        self.nodes.add(node)
        self.facts[node] = facts
        self.switches.update(facts.switches)

    def set_facts_of_nodes(self, facts: Mapping[str, NodeFacts]) -> None:
        """`set_node_facts` for many nodes at once (a full build's 100,000 reports)."""
        self.nodes.update(facts)
        self.facts.update(facts)
        self.switches.update(*[f.switches for f in facts.values()])

    def remove_node(self, node: str) -> None:
        self.nodes.discard(node)
        self.facts.pop(node, None)

    def add_switch_link(self, a: str, b: str) -> None:
        if a == b:
            return  # a switch cabled to itself (loopback ports) says nothing about tiers
        self.switches.update((a, b))
        self.switch_links.add((a, b) if a < b else (b, a))

    def add_uplink(self, child: str, parent: str) -> None:
        """A link whose direction is known (a declared switch tree)."""
        self.add_switch_link(child, parent)
        self.uplinks.add((child, parent))

    def attach_guid(self, guid: str, switch: str) -> None:
        self.switches.add(switch)
        self.attached_by_guid.setdefault(normalise_guid(guid), set()).add(switch)

    def attach_host(self, host: str, switch: str) -> None:
        self.switches.add(switch)
        self.attached_by_host.setdefault(host, set()).add(switch)

    def add_fabric_faults(self, node: str, faults: Iterable[FabricFault]) -> None:
        self.fabric_faults.setdefault(node, []).extend(faults)

    def declare(self, node: str, switch: str, nvlink: str | None = None) -> None:
        self.nodes.add(node)
        self.switches.add(switch)
        self.declared.setdefault(node, set()).add(switch)
        if nvlink:
            self.nvlink_declared.setdefault(node, nvlink)

    def declare_block(self, nodes: Iterable[str], switch: str | Sequence[str], nvlink: str | None = None) -> None:
        """`declare` for every node of a block cabled to one switch (a model's block), or to each of
        several (the consecutive blocks of one rack, one per rail): one call per block instead of
        per node, which is most of a model's cost at 100,000 nodes."""
        nodes = tuple(nodes)
        switches = (switch,) if isinstance(switch, str) else tuple(switch)
        self.nodes.update(nodes)
        self.switches.update(switches)
        declared = self.declared
        for node in nodes:
            found = declared.get(node)
            if found is None:
                declared[node] = set(switches)
            else:
                found.update(switches)
        if nvlink:
            known = self.nvlink_declared
            for node in nodes:
                known.setdefault(node, nvlink)

    def set_labels(self, levels: Iterable[str], labels: Mapping[str, Mapping[str, str]]) -> None:
        """Node labels for the ordered label levels (broadest first); see sources.labels."""
        self.label_levels = tuple(levels)
        self.label_paths = {}
        for node, node_labels in labels.items():
            path: list[tuple[str, str]] = []
            for key in self.label_levels:
                if key not in node_labels:
                    break  # a level without a value ends the path: finer levels cannot nest
                path.append((key, node_labels[key]))
            if path:
                self.label_paths[node] = tuple(path)

    # -- reading --------------------------------------------------------------------------------
    def nodes_in_order(self) -> Iterator[str]:
        """Every node, those with facts first, in the order their facts were set (their reports'
        order, near the order their objects lie in memory): a walk over 100,000 nodes in the set's
        hash order instead takes twice as long, in cache misses."""
        return chain(self.facts, self.nodes.difference(self.facts))

    def attached_switches(self, node: str) -> frozenset[str]:
        """Every switch the node is cabled to, by any source."""
        facts = self.facts.get(node)
        if not self.attached_by_guid and not self.attached_by_host:  # no dump, no UFM: the usual case
            declared = self.declared.get(node)
            if facts is None:
                return frozenset(declared or ())
            return facts.switches | declared if declared else facts.switches
        found = set(facts.switches) if facts is not None else set()
        for guid in facts.guids if facts is not None else ():
            found.update(self.attached_by_guid.get(guid, ()))
        found.update(self.attached_by_host.get(node, ()))
        found.update(self.declared.get(node, ()))
        return frozenset(found)

    def nvlink_of(self, node: str) -> str | None:
        facts = self.facts.get(node)
        if facts is not None and facts.nvlink:
            return facts.nvlink
        return self.nvlink_declared.get(node)

    def fabric_hosts(self) -> set[str]:
        """Hosts the fabric dumps know by their node description (may include non-Kubernetes hosts)."""
        return set(self.attached_by_host)
