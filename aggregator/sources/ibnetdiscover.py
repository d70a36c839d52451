"""ibnetdiscover dumps as a fabric source: InfiniBand switches, HCAs and the cables between them.

On an InfiniBand fabric the subnet manager's view (`ibnetdiscover`, run on any host) is the only
place switch-to-switch cabling is visible, so spine and core tiers come from here. Two output
formats are read, line by line, mixed in one file if need be:

* the topology format (`ibnetdiscover`): `Switch`/`Ca`/`Rt` blocks, each headed by
  `switchguid=`/`caguid=`/`rtguid=` and `sysimgguid=` lines, followed by port lines
  `[port](port-guid) "H-<guid>"[remote-port](remote-port-guid)  # "description" lid N 4xNDR`;
* the port report (`ibnetdiscover -s -p`): one line per port,
  `SW  lid port guid width speed - CA lid port guid ( 'local desc' - 'remote desc' )`, with
  unconnected ports written without the `- ...` part (kept as nodes, no link).

Debug and warning lines that ibnetdiscover mixes into its output (`DR path ...`, `ibwarn: ...`,
`src/query_smp.c:195; ...`) are noted as warnings. Anything else raises IbnetdiscoverError with
the line number and the text, so a truncated or garbled dump is never half-read silently.

HCAs become nodes through the GUIDs that NodeTopology reports carry, or through their node
description ("hostname mlx5_0", "hostname HCA-1"), which the kernel sets from the host name.
That name need not be the Kubernetes node name (short host names in the dump, fully qualified
node names, or the other way round), so `HostNames` says how to read and compare them (a
domain to drop, or a regular expression for the description), and `apply` says, with counts,
how many dump hosts match no node and how many nodes match no host, instead of rendering an
empty tree in silence. A fabric with several subnets (one per rail or plane, each with its own
subnet manager) comes as several dumps: `merge` joins them (GUIDs are unique across subnets).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.common.input_limits import clean_name
from aggregator.graph import FabricGraph, NodeFacts, normalise_guid
from aggregator.sources import Cluster, Source, regex_option


class IbnetdiscoverError(ValueError):
    """A line that is neither part of an ibnetdiscover dump nor one of its known diagnostics."""

    def __init__(self, line_no: int, text: str, reason: str) -> None:
        super().__init__(f"line {line_no}: {reason}: {text.strip()[:200]!r}")
        self.line_no = line_no
        self.text = text
        self.reason = reason


@dataclass(frozen=True)
class IbNode:
    kind: str  # "Switch" | "Ca" | "Rt"
    guid: str  # normalised node GUID
    description: str = ""
    ports: int = 0


@dataclass(frozen=True)
class IbLink:
    a: str  # node GUID
    a_port: int
    b: str
    b_port: int
    a_port_guid: str | None = None
    b_port_guid: str | None = None
    speed: str = ""


@dataclass
class Fabric:
    nodes: dict[str, IbNode] = field(default_factory=dict)
    links: dict[frozenset[tuple[str, int]], IbLink] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def switches(self) -> list[IbNode]:
        return [n for n in self.nodes.values() if n.kind == "Switch"]

    def cas(self) -> list[IbNode]:
        return [n for n in self.nodes.values() if n.kind == "Ca"]

    def add_node(self, node: IbNode) -> None:
        known = self.nodes.get(node.guid)
        if known is None or (not known.description and node.description):
            self.nodes[node.guid] = node

    def add_link(self, link: IbLink) -> None:
        key = frozenset({(link.a, link.a_port), (link.b, link.b_port)})
        self.links.setdefault(key, link)


_KIND = {"S": "Switch", "H": "Ca", "R": "Rt", "SW": "Switch", "CA": "Ca", "RT": "Rt"}
# Every pattern is linear in its line (no two unbounded groups that can trade characters: a port
# report's two descriptions are split by hand, `_descriptions`), numbers and GUIDs are ASCII and
# bounded, and a line longer than MAX_LINE is refused before any pattern sees it: a dump's lines
# are under 300 characters, and one 80 KB line took seconds with the earlier patterns.
MAX_LINE = 4096
_GUID = r"[0-9a-fA-F]{1,16}"
_GUID_LINE = re.compile(rf"^(switchguid|caguid|rtguid|sysimgguid)=(0x{_GUID})(\(({_GUID})\))?$", re.A)
_HEADER = re.compile(rf'^(Switch|Ca|Rt)\s+(\d{{1,9}})\s+"([SHR])-({_GUID})"\s*(?:#\s*"([^"]*)"(.*))?$', re.A)
_PORT = re.compile(
    rf'^\[(\d{{1,9}})\](?:\(({_GUID})\))?\s+"([SHR])-({_GUID})"\[(\d{{1,9}})\](?:\(({_GUID})\))?'
    r"\s*(?:#\s*(.*))?$",
    re.A,
)
_SPEED_TAIL = re.compile(r"x[A-Z0-9]+$", re.A)  # the rate's tail ("x" + "NDR"); its digits are found by hand
_PORT_REPORT = re.compile(
    rf"^(SW|CA|RT)\s+(\d{{1,9}}|\?+)\s+(\d{{1,9}})\s+(0x{_GUID})\s+(\S+)\s+(\S+)"
    rf"(?:\s+-\s+(SW|CA|RT)\s+(\d{{1,9}}|\?+)\s+(\d{{1,9}})\s+(0x{_GUID})\s+\(\s*'(.*)'\s*\)"
    r"|\s+'(.*)')\s*$",
    re.A,
)
_BETWEEN = re.compile(r"'\s+-\s+'")  # between a port report's local and remote description
_DIAGNOSTIC = re.compile(r"^(DR path |ibwarn|ibnetdiscover:|ibnetdiscover |src/\S+:\d+;|warning:)", re.I)
_IGNORED = re.compile(r"^(#.*|vendid=\S+|devid=\S+|Non-Chassis Nodes|Chassis \S+.*)?$")


def _speed(comment: str) -> str:
    """The rate at the end of a port line's comment ("... lid 5 4xNDR" -> "4xNDR"), else ""."""
    text = comment.rstrip()
    tail = _SPEED_TAIL.search(text)
    if tail is None:
        return ""
    head = text[: tail.start()]
    digits = len(head) - len(head.rstrip("0123456789"))
    return text[tail.start() - digits :] if digits else ""


def _descriptions(both: str) -> tuple[str, str] | None:
    """A port report's "local' - 'remote" (between the outer quotes) split at its last separator,
    as the greedy pattern it replaces split it; None without one."""
    last, start = None, 0
    while (found := _BETWEEN.search(both, start)) is not None:  # overlapping: "a' - ' - 'b" splits at the second
        last, start = found, found.start() + 1
    return (both[: last.start()], both[last.end() :]) if last is not None else None


@dataclass
class _Block:
    kind: str
    guid: str


class _Parser:
    def __init__(self) -> None:
        self.fabric = Fabric()
        self.block: _Block | None = None

    def feed(self, line_no: int, raw: str) -> None:
        if len(raw) > MAX_LINE:
            raise IbnetdiscoverError(line_no, raw, f"a line of {len(raw)} characters (at most {MAX_LINE})")
        line = raw.strip()
        if _IGNORED.match(line):
            if not line:
                self.block = None
            return
        if _DIAGNOSTIC.match(line):
            self.fabric.warnings.append(f"line {line_no}: {line[:200]}")
            return
        for handler in (self._guid_line, self._header, self._port, self._port_report):
            if handler(line_no, line):
                return
        raise IbnetdiscoverError(line_no, raw, "not an ibnetdiscover line")

    def _guid_line(self, line_no: int, line: str) -> bool:
        return _GUID_LINE.match(line) is not None  # the block header repeats the node GUID

    def _header(self, line_no: int, line: str) -> bool:
        match = _HEADER.match(line)
        if not match:
            return False
        kind, ports, _, guid, desc, _rest = match.groups()
        node = IbNode(kind, normalise_guid(guid), desc or "", int(ports))
        self.fabric.add_node(node)
        self.block = _Block(kind, node.guid)
        return True

    def _port(self, line_no: int, line: str) -> bool:
        match = _PORT.match(line)
        if not match:
            return False
        if self.block is None:
            raise IbnetdiscoverError(line_no, line, "port line outside a Switch/Ca/Rt block")
        port, port_guid, rtype, rguid, rport, rport_guid, comment = match.groups()
        remote = normalise_guid(rguid)
        desc = re.search(r'"([^"]*)"', comment or "")
        self.fabric.add_node(IbNode(_KIND[rtype], remote, desc.group(1) if desc else ""))
        speed = _speed(comment or "")
        self.fabric.add_link(
            IbLink(
                a=self.block.guid,
                a_port=int(port),
                b=remote,
                b_port=int(rport),
                a_port_guid=normalise_guid(port_guid) if port_guid else None,
                b_port_guid=normalise_guid(rport_guid) if rport_guid else None,
                speed=speed,
            )
        )
        return True

    def _port_report(self, line_no: int, line: str) -> bool:
        match = _PORT_REPORT.match(line)
        if not match:
            return False
        kind, _lid, port, guid, width, speed, rkind, _rlid, rport, rguid, both, lone = match.groups()
        pair = _descriptions(both) if rkind else None
        if rkind and pair is None:
            return False
        desc, rdesc = pair if pair is not None else (lone, "")
        local = IbNode(_KIND[kind], normalise_guid(guid), desc)
        self.fabric.add_node(local)
        if rkind is None:
            return True  # an unconnected port: the node exists, no cable
        remote = IbNode(_KIND[rkind], normalise_guid(rguid), rdesc)
        self.fabric.add_node(remote)
        self.fabric.add_link(IbLink(local.guid, int(port), remote.guid, int(rport), speed=f"{width}{speed}"))
        return True


def parse(text: str | Iterable[str]) -> Fabric:
    """Parses a whole dump (either format); raises IbnetdiscoverError on a malformed line."""
    parser = _Parser()
    lines = text.splitlines() if isinstance(text, str) else text
    for line_no, line in enumerate(lines, start=1):
        parser.feed(line_no, line.rstrip("\n"))
    return parser.fabric


def parse_file(path: str) -> Fabric:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse(handle)
    except IbnetdiscoverError as exc:
        raise IbnetdiscoverError(exc.line_no, exc.text, f"{path}: {exc.reason}") from exc


# --- naming --------------------------------------------------------------------------------------

_MELLANOX_DESC = re.compile(r"^MF0;([^:]+):")  # "MF0;<hostname>:<model>/U1" (managed switches)
_HCA_NAME = re.compile(
    r"^(HCA-\d+|mlx\d+_\d+|mlx\d+_bond_\d+|qib\d+|hfi\d+_\d+|ibp\S+|bnxt_re\d+|irdma\d+)$", re.I
)
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def switch_names(fabric: Fabric) -> dict[str, str]:
    """GUID -> switch ID: the managed name in the description, a one-word description, else
    "ib-<guid>"; names that two switches would share fall back to the GUID form."""
    wanted: dict[str, str] = {}
    for node in fabric.switches():
        desc = node.description.strip()
        managed = _MELLANOX_DESC.match(desc)
        if managed:
            wanted[node.guid] = clean_name(managed.group(1)) or f"ib-{node.guid}"
        elif _PLAIN.match(desc):
            wanted[node.guid] = desc
        else:
            wanted[node.guid] = f"ib-{node.guid}"
    counts: dict[str, int] = {}
    for name in wanted.values():
        counts[name] = counts.get(name, 0) + 1
    return {guid: (name if counts[name] == 1 else f"ib-{guid}") for guid, name in wanted.items()}


def host_of(description: str) -> str | None:
    """The host name in an HCA's node description ("node17 mlx5_0" -> "node17"), if it has one."""
    words = description.split()
    if len(words) >= 2 and _HCA_NAME.match(words[1]) and _PLAIN.match(words[0]):
        return words[0].lower()
    return None


@dataclass(frozen=True)
class HostNames:
    """How hosts named in a dump are matched to Kubernetes node names.

    `pattern`: a regular expression searched in the HCA node description; its group `node`
    (else its first group, else the whole match) is the host name. None: the first word when the
    second names an HCA (`host_of`). `domain`: compare names without a DNS domain, "." dropping
    everything from the first dot, any other text dropping that suffix ("dc1.example.com"). None:
    names compare whole. Names always compare lower-cased."""

    pattern: str | None = None
    domain: str | None = None

    def host_of(self, description: str) -> str | None:
        if self.pattern is None:
            return host_of(description)
        match = re.search(self.pattern, description)
        if match is None:
            return None
        if "node" in match.re.groupindex:
            host = match.group("node")
        else:
            host = match.group(1) if match.re.groups else match.group(0)
        return (host or "").strip().lower() or None

    def key(self, name: str) -> str:
        name = name.lower()
        if self.domain == ".":
            return name.split(".", 1)[0]
        if self.domain:
            suffix = "." + self.domain.lower().strip(".")
            return name.removesuffix(suffix)
        return name


def merge(fabrics: Iterable[Fabric]) -> Fabric:
    """One fabric from the dumps of several subnets (a rail or a plane each)."""
    merged = Fabric()
    for fabric in fabrics:
        for node in fabric.nodes.values():
            merged.add_node(node)
        for link in fabric.links.values():
            merged.add_link(link)
        merged.warnings.extend(fabric.warnings)
    return merged


def apply(graph: FabricGraph, fabric: Fabric, hosts: HostNames | None = None) -> list[str]:
    """Switch-to-switch links, and HCA-to-switch attachments by GUID and by host name (the node
    of the graph whose name matches, else the name in the dump). Returns warnings about hosts and
    nodes that match nothing (none when the graph has no nodes yet: the dump names them)."""
    hosts = hosts or HostNames()
    nodes = _nodes_by_key(graph, hosts)
    names = switch_names(fabric)
    for link in fabric.links.values():
        a_switch, b_switch = names.get(link.a), names.get(link.b)
        if a_switch and b_switch:
            graph.add_switch_link(a_switch, b_switch)
        elif a_switch or b_switch:
            switch = a_switch or b_switch
            assert switch is not None
            ca, ca_port_guid = (link.b, link.b_port_guid) if a_switch else (link.a, link.a_port_guid)
            _attach(graph, fabric.nodes.get(ca), ca, ca_port_guid, switch, hosts, nodes)
    graph.switches.update(names.values())
    return _unmatched(graph, fabric, hosts, nodes) if graph.nodes else []


def _nodes_by_key(graph: FabricGraph, hosts: HostNames) -> dict[str, str]:
    """Comparison key -> node, for keys only one node has."""
    found: dict[str, list[str]] = {}
    for node in sorted(graph.nodes):
        found.setdefault(hosts.key(node), []).append(node)
    return {key: nodes[0] for key, nodes in found.items() if len(nodes) == 1}


def _attach(
    graph: FabricGraph,
    ca: IbNode | None,
    guid: str,
    port_guid: str | None,
    switch: str,
    hosts: HostNames,
    nodes: Mapping[str, str],
) -> None:
    if ca is not None and ca.kind != "Ca":
        return  # a router: not a compute node
    graph.attach_guid(guid, switch)
    if port_guid:
        graph.attach_guid(port_guid, switch)
    host = hosts.host_of(ca.description) if ca else None
    if host:
        graph.attach_host(nodes.get(hosts.key(host), host), switch)


def _unmatched(graph: FabricGraph, fabric: Fabric, hosts: HostNames, nodes: Mapping[str, str]) -> list[str]:
    """Counts of dump hosts matching no node and nodes matching no dump host (by name or GUID)."""
    guids_of: dict[str, set[str]] = {}  # dump host -> its HCAs' node and port GUIDs
    cabled = {guid for link in fabric.links.values() for guid in (link.a, link.b)}
    for link in fabric.links.values():
        for guid, port_guid in ((link.a, link.a_port_guid), (link.b, link.b_port_guid)):
            ca = fabric.nodes.get(guid)
            host = hosts.host_of(ca.description) if ca is not None and ca.kind == "Ca" else None
            if host:
                guids_of.setdefault(host, set()).update(g for g in (guid, port_guid) if g)
    reported = {g for facts in graph.facts.values() for g in facts.guids}
    in_dump = {g for found in guids_of.values() for g in found} | cabled
    lost_hosts = sorted(h for h, g in guids_of.items() if hosts.key(h) not in nodes and not g & reported)
    keys = {hosts.key(h) for h in guids_of}
    lost_nodes = sorted(
        n
        for n in graph.nodes
        if hosts.key(n) not in keys and not graph.facts.get(n, NodeFacts()).guids & in_dump
    )
    warnings = []
    if lost_hosts:
        warnings.append(
            f"{len(lost_hosts)} of {len(guids_of)} hosts in the fabric dump match no node "
            f"(e.g. {', '.join(lost_hosts[:3])}; nodes are named like {', '.join(sorted(graph.nodes)[:2])}): "
            "see --strip-domain and --dump-host-regex"
        )
    if lost_nodes:
        warnings.append(
            f"{len(lost_nodes)} of {len(graph.nodes)} nodes match no host in the fabric dump "
            f"(e.g. {', '.join(lost_nodes[:3])})"
        )
    return warnings


def host_names_from(options: argparse.Namespace) -> HostNames:
    """`--strip-domain` and `--dump-host-regex` (added by `Dumps`; UFM reads them too)."""
    pattern = regex_option(getattr(options, "dump_host_regex", None), "--dump-host-regex")
    return HostNames(pattern=pattern, domain=getattr(options, "strip_domain", None))


class Dumps(Source):
    """ibnetdiscover dumps (one per rail or plane, merged) as a source."""

    name = "ibnetdiscover"

    def __init__(self, fabric: Fabric, host_names: HostNames | None = None) -> None:
        self.fabric = fabric
        self.host_names = host_names or HostNames()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        add = parser.add_argument
        add(
            "--ibnetdiscover",
            nargs="+",
            metavar="FILE",
            help="`ibnetdiscover` dumps (topology or `-s -p` port format): switch links, HCAs; one per "
            "subnet where each rail or plane is a fabric of its own",
        )
        add(
            "--strip-domain",
            nargs="?",
            const=".",
            metavar="SUFFIX",
            help="match dump hosts and node names without their DNS domain: SUFFIX, or (without one) "
            "everything from the first dot",
        )
        add(
            "--dump-host-regex",
            metavar="REGEX",
            help="read the host name out of an HCA's node description with this regular expression (its "
            "group `node`, else its first group; default: the first word before mlx5_0, HCA-1, ...)",
        )

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> Dumps | None:
        hosts = host_names_from(options)  # checked even without dumps: a bad option is refused early
        paths = getattr(options, "ibnetdiscover", None) or []
        if not paths:
            return None
        return cls(merge(parse_file(path) for path in paths), hosts)

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        warnings = apply(graph, self.fabric, self.host_names)
        graph.warnings.extend(f"{self.name}: {w}" for w in warnings)
        if cluster.include_fabric_hosts:
            for host in graph.fabric_hosts():
                graph.add_node(host)
