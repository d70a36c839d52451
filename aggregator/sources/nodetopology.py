"""NodeTopology reports as graph facts: where a node is cabled and which NVLink clique it is in.

A node's own report is the most direct truth about its cabling: LLDP on each port names the
switch at the other end (by system name; by chassis ID when the switch announces no name), the
RDMA devices carry the GUIDs under which fabric dumps (ibnetdiscover, UFM) know the node, and the
GPUs' fabric info names the multi-node NVLink clique. A single-node NVLink board (HGX) is not a
multi-node domain, so it yields none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.report import NodeReport, report_from_spec
from aggregator.graph import FabricGraph, NodeFacts, normalise_guid

ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def switch_id(system_name: str | None, chassis_id: str) -> str:
    """The ID a switch goes by: its LLDP system name, else its chassis ID."""
    name = (system_name or "").strip()
    return name or chassis_id.strip().lower()


def _gid_guid(gid: str) -> str | None:
    """The port GUID inside a link-local GID (its low 64 bits, RFC 4391 / IBTA)."""
    groups = gid.split(":")
    if len(groups) != 8:
        return None
    return normalise_guid("".join(groups[4:]))


def nvlink_domain_id(report: NodeReport) -> str | None:
    """ "cluster-uuid/clique-id" of the node's multi-node NVLink clique, or None."""
    domain = report.nvml.domain if report.nvml else None
    if domain is None or not domain.cluster_uuid or domain.cluster_uuid == ZERO_UUID:
        return None
    return f"{domain.cluster_uuid}/{domain.clique_id}"


def facts_of(report: NodeReport) -> NodeFacts:
    guids: set[str] = set()
    for device in report.rdma:
        for guid in (device.node_guid, device.sys_image_guid):
            if guid:
                guids.add(normalise_guid(guid))
        for port in device.ports:
            guids.update(g for g in (_gid_guid(gid) for gid in port.gids) if g and g != "0" * 16)
    return NodeFacts(
        switches=frozenset(switch_id(n.system_name, n.chassis_id) for n in report.lldp),
        guids=frozenset(guids),
        nvlink=nvlink_domain_id(report),
    )


def apply(graph: FabricGraph, report: NodeReport) -> None:
    """Replaces the node's facts in the graph by those of its (new) report."""
    graph.set_node_facts(report.node_name, facts_of(report))


def report_from_object(obj: Mapping[str, Any]) -> NodeReport:
    """A NodeTopology object (as the API returns it, or from a file) -> its NodeReport.

    The object name is the node name; a spec without nodeName takes it from there."""
    name = str(obj.get("metadata", {}).get("name", ""))
    spec = dict(obj.get("spec") or {})
    spec.setdefault("nodeName", name)
    spec.setdefault("health", {})
    return report_from_spec(spec)
