"""Tiers and names survive the damage every production fabric has (issue 21).

Over generated 2-, 3- and 4-tier Clos fabrics (a core group per spine plane), rail-optimised units,
dual planes, NVL72 racks on leaves and leaves on the cores, and over the real dumps in
../shared/data/ibnetdiscover: remove one switch, one cable, 1-5 % of the cables; hang a hostless or
a management leaf (hosts on the fabric, no Nodes) from one switch; render with a random subset of
the hosts as Nodes. Every HyperNode the perturbation does not touch keeps its tier, tierName, name
and node set, and the tree keeps its one root while the Nodes stay connected. Perturbations are
sampled with a fixed seed (tests/kits/fabric_perturb.py), so a failure names one reproducible case.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fabric_perturb import (
    FAMILIES,
    Fabric,
    Snapshot,
    changes,
    from_dump,
    perturbations,
    render,
    with_stray_leaf,
)

from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import ibnetdiscover

NOW = 1_700_000_000

DUMPS = [
    "ibtopotool_1.topo",
    "ibtopotool_3.topo",
    "loginoff_stage_cluster_2014.topo",
    "ufm_small_topo_file.txt",
    "ports/hwloc_avakas_ib-subnet-fe80-0000.txt",
    "ports/hwloc_plafrim2_ib-subnet-fe80-0000.txt",
    "ports/hwloc_plafrim_ib-subnet-fe80-0000.txt",
]


def _violations(fabric: Fabric, samples: int) -> list[str]:
    base = Snapshot.of(render(fabric))
    assert base.views, fabric.name  # the unperturbed fabric has a tree to keep
    found = []
    for p in perturbations(fabric, seed=21, samples=samples):
        after = Snapshot.of(render(p.fabric, p.nodes))
        found += [f"{p.family} [{p.label}]: {change}" for change in changes(base, p, after)]
    return found


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_hypernodes_a_perturbation_does_not_touch_keep_tier_name_and_nodes(family: object) -> None:
    fabric = family()  # type: ignore[operator]
    assert _violations(fabric, samples=6) == []


@pytest.mark.parametrize("name", DUMPS)
def test_real_dumps_keep_their_tree_under_the_same_perturbations(shared_data: Path, name: str) -> None:
    fabric = from_dump(str(shared_data / "ibnetdiscover" / name))
    assert _violations(fabric, samples=4) == []


def test_a_management_leaf_on_a_spine_renames_nothing_and_keeps_one_root() -> None:
    """The issue's case in full: management leaves on one spine of a 3-tier fat tree, their hosts
    on the fabric but no Nodes, used to rank cores below the spines and split the tree."""
    fabric = FAMILIES[1]()
    base = Snapshot.of(render(fabric))
    spine = fabric.spines[0]
    p = with_stray_leaf(fabric, spine, 2)
    after = Snapshot.of(render(p.fabric, p.nodes))
    assert after == base
    assert {v.tier_name for v in base.views.values()} == {"leaf", "spine", "core"}
    assert len(base.roots) == 1


def test_the_damage_checks_catch_a_renamed_hypernode() -> None:
    """The property is not vacuous: a perturbation that does change an untouched HyperNode (here a
    spine removed but not declared touched) is reported."""
    fabric = FAMILIES[1]()
    base = Snapshot.of(render(fabric))
    p = next(
        q
        for q in perturbations(fabric, seed=21)
        if q.family == "one switch removed" and q.label in fabric.spines
    )
    undeclared = type(p)(p.family, p.label, p.fabric)
    assert changes(base, undeclared, Snapshot.of(render(p.fabric)))


@pytest.mark.parametrize(
    "name",
    [
        "loginoff_stage_cluster_2014.topo",
        "ports/hwloc_avakas_ib-subnet-fe80-0000.txt",
        "ports/hwloc_plafrim_ib-subnet-fe80-0000.txt",
    ],
)
def test_a_dump_rendered_for_some_of_its_hosts_names_and_ranks_as_for_all(
    shared_data: Path, name: str
) -> None:
    """`render --nodes` without agents: the Nodes are some of the dump's hosts (storage, login and
    management hosts are on the fabric, no Nodes), matched by name. Every HyperNode is one of the
    full render's, with its tierName and its nodes less the hosts that are no Nodes."""
    fabric = ibnetdiscover.parse_file(str(shared_data / "ibnetdiscover" / name))

    def objects(nodes: set[str]) -> Snapshot:
        inputs = ClusterInputs(reports={}, node_ready=dict.fromkeys(nodes, True), fabric=fabric)
        return Snapshot.of(Pipeline().compute(inputs, now=NOW).hypernodes)

    hosts = sorted(ibnetdiscover.host_of(n.description) or "" for n in fabric.cas())
    hosts = sorted({h for h in hosts if h})
    full = objects(set(hosts))
    assert len(full.views) > 3
    rng = random.Random(name)
    for share in (0.3, 0.5, 0.8):
        some = set(rng.sample(hosts, int(len(hosts) * share)))
        part = objects(some)
        assert part.views
        for hypernode, view in part.views.items():
            assert hypernode in full.views, hypernode
            assert view.tier_name == full.views[hypernode].tier_name, hypernode
            assert view.nodes == full.views[hypernode].nodes & some, hypernode
