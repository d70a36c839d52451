"""Lying reports for the cross-check tests (tests import this module).

A modelled cluster's fabric as each source would show it (the model itself, an ibnetdiscover dump,
UFM's listings, switches' LLDP tables), and `lie(report, ...)`: one node's report changed the way a
compromised or broken agent could change it (another node's LLDP neighbours, NVLink clique, HCA
GUIDs or name; made-up ones; none), for the property that a single node's report moves only that
node. `untouched(hypernodes, node)`: what the HyperNodes without the node are (name, tier, nodes).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aggregator_changes import switch_tables
from aggregator_fabric import ibnetdiscover_dump, nodes_below
from ufm_standin import listings

from agent.cluster_model import ClusterModel
from agent.common.report import (
    ComponentHealth,
    Health,
    LldpNeighbour,
    NodeReport,
    NvLinkDomain,
    NvmlReport,
    RdmaDevice,
)
from agent.model_probe import report_for
from aggregator.adapters.ufm import UfmSource
from aggregator.sources import Source, ibnetdiscover, ufm
from aggregator.sources.ibnetdiscover import Dumps, HostNames
from aggregator.sources.model import ModelFile
from aggregator.sources.nodetopology import NodeReports
from aggregator.sources.switch_lldp import SwitchNeighbour, SwitchTable, SwitchTables

Obj = dict[str, Any]


def reports_of(model: ClusterModel) -> dict[str, NodeReport]:
    return {n: report_for(model, n) for n in model.nodes()}


def host_tables(model: ClusterModel) -> tuple[SwitchTable, ...]:
    """Every switch's LLDP table: the switch tree (aggregator_changes.switch_tables) and, on each
    leaf, the hosts cabled to it as their lldpd announces them (system name = host name)."""
    hosts: dict[str, list[SwitchNeighbour]] = {}
    hca: dict[str, int] = {}
    for block in model.blocks:
        for node in block.nodes:
            index = hca[node] = hca.get(node, -1) + 1
            port = f"swp{100 + len(hosts.get(block.switch, []))}"
            hosts.setdefault(block.switch, []).append(SwitchNeighbour(port, node, f"ib{index}", False))
    tables = {t.switch: t for t in switch_tables(model)}
    for leaf, found in hosts.items():
        known = tables.get(leaf, SwitchTable(leaf, ()))
        tables[leaf] = SwitchTable(leaf, (*known.neighbours, *found))
    return tuple(tables[s] for s in sorted(tables))


def fabric_sources(model: ClusterModel) -> dict[str, tuple[Source, ...]]:
    """The ways a cluster's fabric can be known, each as the pipeline's sources."""
    return {
        "reports": (NodeReports(),),
        "model": (NodeReports(), ModelFile(model)),
        "dump": (NodeReports(), Dumps(ibnetdiscover.parse(ibnetdiscover_dump(model)), HostNames())),
        "ufm": (NodeReports(), UfmSource(None, HostNames(), facts=ufm.from_listings(listings(model)))),
        "switch-lldp": (NodeReports(), SwitchTables(host_tables(model))),
    }


def _shapes(hypernodes: Iterable[Mapping[str, Any]]) -> set[tuple[str, int, frozenset[str]]]:
    objects = list(hypernodes)
    below = nodes_below(objects)
    return {(o["metadata"]["name"], o["spec"]["tier"], below[o["metadata"]["name"]]) for o in objects}


def others_moved(
    before: Iterable[Mapping[str, Any]], after: Iterable[Mapping[str, Any]], node: str
) -> tuple[set[tuple[str, int, frozenset[str]]], set[tuple[str, int, frozenset[str]]]]:
    """The HyperNodes without `node` before that are not there after with the same name, tier and
    nodes (`node` aside: it may have moved in), and those without it after that were not there
    before (but for `node`: it may have moved out). Both empty: only `node` moved."""
    old, new = _shapes(before), _shapes(after)
    old_but_node, new_but_node = ({(name, tier, nodes - {node}) for name, tier, nodes in x} for x in (old, new))
    lost = {h for h in old if node not in h[2]} - new_but_node
    gained = {h for h in new if node not in h[2]} - old_but_node
    return lost, gained


# -- lies -----------------------------------------------------------------------------------------


def _own_nics(report: NodeReport, neighbours: Iterable[LldpNeighbour]) -> tuple[LldpNeighbour, ...]:
    """Neighbours moved onto the report's own NICs (else they would not count as fabric cabling)."""
    nics = [p.netdev for d in report.rdma for p in d.ports if p.netdev] or ["ib0"]
    return tuple(dataclasses.replace(n, interface=nics[i % len(nics)]) for i, n in enumerate(neighbours))


def _heard(report: NodeReport, switch: str) -> tuple[LldpNeighbour, ...]:
    return _own_nics(report, [LldpNeighbour("ib0", f"02:00:00:00:00:{len(switch) % 100:02d}", "swp1", 120,
                                            system_name=switch)])  # fmt: skip


def _clique(report: NodeReport, cluster_uuid: str, clique_id: int) -> NodeReport:
    nvml = report.nvml or NvmlReport("570.00", ())
    return dataclasses.replace(report, nvml=dataclasses.replace(nvml, domain=NvLinkDomain(cluster_uuid, clique_id, "completed")))


def _random_hca(rng: random.Random, index: int) -> RdmaDevice:
    guid = ":".join(f"{rng.randrange(1 << 16):04x}" for _ in range(4))
    return RdmaDevice(f"mlx5_{index}", node_guid=guid, sys_image_guid=guid)


Lie = Callable[[NodeReport, NodeReport, random.Random, list[str]], NodeReport]

LIES: dict[str, Lie] = {
    "another's LLDP": lambda r, o, g, s: dataclasses.replace(r, lldp=_own_nics(r, o.lldp)),
    "another's LLDP too": lambda r, o, g, s: dataclasses.replace(r, lldp=(*r.lldp, *_own_nics(r, o.lldp))),
    "a known switch": lambda r, o, g, s: dataclasses.replace(r, lldp=(*r.lldp, *_heard(r, g.choice(s)))),
    "only a known switch": lambda r, o, g, s: dataclasses.replace(r, lldp=_heard(r, g.choice(s))),
    "a new switch": lambda r, o, g, s: dataclasses.replace(r, lldp=(*r.lldp, *_heard(r, f"made-up-{g.randrange(9)}"))),
    "no LLDP": lambda r, o, g, s: dataclasses.replace(r, lldp=()),
    "another's clique": lambda r, o, g, s: (
        dataclasses.replace(r, nvml=o.nvml) if o.nvml and o.nvml.domain else _clique(r, "6a1f3f5e-1111-4000-8000-000000000001", 3)
    ),
    "a new clique": lambda r, o, g, s: _clique(r, f"6a1f3f5e-{g.randrange(1 << 16):04x}-4000-8000-000000000002", g.randrange(8)),
    "no clique": lambda r, o, g, s: dataclasses.replace(r, nvml=None),
    "another's GUIDs": lambda r, o, g, s: dataclasses.replace(r, rdma=o.rdma),
    "another's GUIDs too": lambda r, o, g, s: dataclasses.replace(r, rdma=(*r.rdma, *o.rdma)),
    "made-up GUIDs": lambda r, o, g, s: dataclasses.replace(r, rdma=tuple(_random_hca(g, i) for i in range(g.randrange(1, 4)))),
    "no HCAs": lambda r, o, g, s: dataclasses.replace(r, rdma=()),
    "another's name": lambda r, o, g, s: dataclasses.replace(r, node_name=o.node_name),
    "a failed component": lambda r, o, g, s: dataclasses.replace(
        r, health={**r.health, g.choice(sorted(r.health)): ComponentHealth(Health.FAILED, "lie")}
    ),
}


def lie(report: NodeReport, others: list[NodeReport], rng: random.Random, switches: list[str]) -> tuple[NodeReport, list[str]]:
    """The report with one to three lies told in it (each with another random node's report to
    copy from, and the fabric's switch names to claim); returns the lies' names too."""
    told = rng.sample(sorted(LIES), rng.randint(1, 3))
    for name in told:
        report = LIES[name](report, rng.choice(others), rng, switches)
    return report, told
