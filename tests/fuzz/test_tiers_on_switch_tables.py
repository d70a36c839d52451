"""Tiers and names on switch LLDP tables do not depend on which hosts are Nodes (issue 21).

On a RoCE fabric the switches' own lldpd tables (aggregator.sources.switch_lldp) are the fabric
source: every switch lists its switch neighbours and the hosts on its ports, Nodes or not (storage,
login, hosts not yet joined). The same generated fabrics and perturbations as
tests/fuzz/test_tiers_under_damage.py (generated families and real dumps), rendered from such tables and
the Nodes' own reports (their LLDP hears their leaves, so the cross-checks run): with a random subset of the hosts as Nodes, every
HyperNode keeps its name, tier and tierName, its nodes restricted to the Nodes; a management leaf
whose hosts are no Nodes renames nothing. Seeded, so a failure names one reproducible case.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from aggregator_changes import Cluster, without_times
from fabric_perturb import DOMAIN, FAMILIES, NOW, Fabric, Snapshot, changes, from_dump, perturbations
from report_lies import host_tables
from test_tiers_under_damage import DUMPS

from agent.cluster_model import load_model, parse_model
from agent.model_probe import report_for
from aggregator.live.feed import PipelineFeed
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources.nodetopology import NodeReports
from aggregator.sources.switch_lldp import SwitchNeighbour, SwitchTable, SwitchTables, fabric_hosts

# the families whose Node-dependence these tables could show: a subset of Nodes, a management leaf
NODE_FAMILIES = (
    "random subset of hosts as Nodes",
    "management leaf on one switch",
    "hostless leaf on one switch",
)


def tables_of(f: Fabric, *, hosts: Iterable[str] | None = None) -> tuple[SwitchTable, ...]:
    """Every switch's table: its switch neighbours (announcing Bridge and Router) and the hosts on
    its ports as a host's lldpd announces them (Station only). `hosts`: list only those hosts (what
    a source that keeps Nodes only would see), default every host."""
    listed = set(f.hosts if hosts is None else hosts)
    found: dict[str, list[SwitchNeighbour]] = {s: [] for s in f.switches}
    for a, b in sorted(f.switch_cables):
        found[a].append(SwitchNeighbour(f"swp{len(found[a]) + 1}", b, "swp1", True))
        found[b].append(SwitchNeighbour(f"swp{len(found[b]) + 1}", a, "swp1", True))
    for host, hca, leaf in f.host_cables:
        if host in listed:
            found[leaf].append(SwitchNeighbour(f"swp{len(found[leaf]) + 1}", host, f"eth{hca}", False))
    return tuple(SwitchTable(s, tuple(n)) for s, n in sorted(found.items()))


def render_tables(
    f: Fabric, nodes: Iterable[str] | None = None, tables: tuple[SwitchTable, ...] | None = None
) -> list[dict[str, Any]]:
    """The HyperNodes from the switches' tables and the Nodes' reports (each hears its leaves)."""
    wanted = sorted(set(f.hosts if nodes is None else nodes))
    cabled = {h for h, _, _ in f.host_cables}
    blocks = [
        {
            "switch": leaf,
            "nodes": [host],
            **({"annotations": {DOMAIN: f.nvlink[host]}} if host in f.nvlink else {}),
        }
        for host, _, leaf in f.host_cables
    ] + [{"switch": "uncabled", "nodes": [h]} for h in sorted(set(f.hosts) - cabled)]
    model = parse_model({"switches": {}, "blocks": blocks})
    reports = {n: report_for(model, n) for n in wanted}
    reports = {n: r if n in cabled else dataclasses.replace(r, lldp=()) for n, r in reports.items()}
    sources = (NodeReports(), SwitchTables(tables_of(f) if tables is None else tables))
    inputs = ClusterInputs(reports=reports, node_ready=dict.fromkeys(wanted, True), sources=sources)
    return Pipeline().compute(inputs, now=NOW).hypernodes


def _violations(fabric: Fabric, samples: int, **render: Any) -> list[str]:
    base = Snapshot.of(render_tables(fabric))
    assert base.views, fabric.name  # the unperturbed fabric has a tree to keep
    found = []
    for p in perturbations(fabric, seed=21, samples=samples):
        if p.family not in NODE_FAMILIES:
            continue
        tables = tables_of(p.fabric, hosts=p.nodes) if render.get("nodes_only") else None
        after = Snapshot.of(render_tables(p.fabric, p.nodes, tables))
        found += [f"{p.family} [{p.label}]: {change}" for change in changes(base, p, after)]
    return found


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_switch_tables_give_the_same_names_and_tiers_whichever_hosts_are_nodes(family: object) -> None:
    fabric = family()  # type: ignore[operator]
    assert _violations(fabric, samples=8) == []


@pytest.mark.parametrize("name", DUMPS)
def test_real_fabrics_as_switch_tables_give_the_same_names_and_tiers_whichever_hosts_are_nodes(
    shared_data: Path, name: str
) -> None:
    fabric = from_dump(str(shared_data / "ibnetdiscover" / name))
    assert _violations(fabric, samples=6) == []


def test_every_host_on_a_switch_table_makes_its_leaf_though_no_node() -> None:
    """The property can fail: tables listing only the Nodes' ports (the source before issue 21)
    rename or re-rank HyperNodes when only some hosts are Nodes."""
    found = _violations(FAMILIES[1](), samples=8, nodes_only=True)  # three_tier
    assert any(v.startswith("random subset of hosts as Nodes") and v.endswith(" new") for v in found), found


def test_a_host_that_is_no_node_is_placed_nowhere() -> None:
    """Hosts on the tables shape the levels; only Nodes are members of HyperNodes."""
    fabric = FAMILIES[1]()
    nodes = fabric.hosts[::3]
    after = Snapshot.of(render_tables(fabric, nodes))
    placed = set().union(*(v.nodes for v in after.views.values()))
    assert placed == set(nodes)


def test_a_table_neighbour_announcing_a_switch_is_never_a_host() -> None:
    """A name some entry announces with Bridge or Router, or that has a table of its own, stays a
    switch even where another entry announces it as a station."""
    spine = SwitchTable("spine1", (SwitchNeighbour("swp1", "leaf1", "swp9", True),))
    leaf = SwitchTable("leaf1", (SwitchNeighbour("swp9", "spine1", "swp1", False),
                                 SwitchNeighbour("swp10", "storage1", "eth0", False)))  # fmt: skip
    odd = SwitchTable("leaf2", (SwitchNeighbour("swp1", "spine2", "swp1", False),))
    other = SwitchTable("leaf3", (SwitchNeighbour("swp1", "spine2", "swp2", True),))
    assert fabric_hosts([spine, leaf, odd, other]) == {"storage1"}


def _agents(cluster: Cluster) -> dict[str, bool]:
    return {n: r for n, r in cluster.agent_ready.items() if n in cluster.node_ready}


def test_nodes_leaving_and_joining_on_switch_tables_render_as_a_full_recompute() -> None:
    """A Node removed stays on its switch's table as a host that is no Node: the change-driven feed
    must end where a full recompute of the same cluster ends (seeded sequences of removals,
    restorations and readiness changes)."""
    model = load_model(str(Path(__file__).parent.parent / "models" / "mixed-depth.yaml"))
    tables = host_tables(model)
    nodes = sorted(model.nodes())
    for seed in range(6):
        rng = random.Random(seed)
        cluster = Cluster.of(model)
        feed = PipelineFeed(Pipeline(), (NodeReports(), SwitchTables(tables)), resync=1e9)
        desired = feed.compute(cluster.topologies(), cluster.nodes(), _agents(cluster), 0.0, None)
        for step in range(1, 7):
            changed = set()
            for _ in range(rng.randint(1, 4)):
                kind = rng.choice(["remove", "remove", "restore", "ready"])
                changed.add(cluster.apply((kind, rng.choice(nodes), rng.choice([True, False]))))
            desired = feed.compute(
                cluster.topologies(), cluster.nodes(), _agents(cluster), float(step), changed
            )
        inputs = ClusterInputs(
            reports=dict(cluster.reports),
            node_ready=dict(cluster.node_ready),
            node_labels={n: dict(v) for n, v in cluster.labels.items() if n in cluster.node_ready},
            agent_ready=dict(cluster.agent_ready),
            sources=(NodeReports(), SwitchTables(tables)),
        )
        full = Pipeline().compute(inputs, now=0)
        assert list(without_times(desired.hypernodes)) == list(without_times(full.hypernodes)), seed
        assert desired.node_labels == full.node_labels, seed
