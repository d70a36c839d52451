"""The probe plan (agent.measure_plan): every HyperNode sampled inside and towards its siblings,
per-node plan size O(tiers * k), bounded in-degree, deterministic, re-planned only on change."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from agent.measure_plan import (
    INSIDE,
    SIBLING,
    Domain,
    build_tree,
    in_degree,
    max_in_degree,
    plan,
    tree_digest,
)


def fat_tree(spines: int, leaves_per_spine: int, nodes_per_leaf: int) -> list[Domain]:
    """Three tiers: leaves of nodes, spines of leaves, one root of spines."""
    out: list[Domain] = []
    for s in range(spines):
        leaves = []
        for lf in range(leaves_per_spine):
            name = f"leaf-{s}-{lf}"
            out.append(Domain(name, 1, tuple(f"n-{s}-{lf}-{i}" for i in range(nodes_per_leaf))))
            leaves.append(name)
        out.append(Domain(f"spine-{s}", 2, tuple(leaves)))
    out.append(Domain("root", 3, tuple(f"spine-{s}" for s in range(spines))))
    return out


@st.composite
def trees(draw: st.DrawFn) -> list[Domain]:
    """Lopsided trees: 1-4 tiers, 1-5 children per domain, leaves of 1-9 nodes."""
    tiers = draw(st.integers(1, 4))
    counter = [0]

    def grow(tier: int) -> str:
        counter[0] += 1
        name = f"t{tier}-{counter[0]}"
        if tier == 1:
            size = draw(st.integers(1, 9))
            out.append(Domain(name, 1, tuple(f"{name}-n{i}" for i in range(size))))
        else:
            kids = [grow(tier - 1) for _ in range(draw(st.integers(1, 5)))]
            out.append(Domain(name, tier, tuple(kids)))
        return name

    out: list[Domain] = []
    grow(tiers)
    return out


def samples(domains: list[Domain], plans: dict) -> tuple[dict[str, int], dict[str, int]]:
    """Per HyperNode: probes with both ends inside it, probes from it to a sibling."""
    tree = build_tree(domains)
    inside: dict[str, int] = defaultdict(int)
    towards: dict[str, int] = defaultdict(int)
    member_sets = {name: set(nodes) for name, nodes in tree.nodes.items()}
    for node, probes in plans.items():
        for p in probes:
            for name, members in member_sets.items():
                if node in members and p.peer in members:
                    inside[name] += 1
            if p.scope == SIBLING:
                towards[p.domain] += 1
    return inside, towards


@given(trees(), st.integers(1, 4), st.integers(1, 3))
def test_every_hypernode_gets_inside_and_between_sibling_samples(domains, k_in, k_sib):
    plans = plan(domains, k_inside=k_in, k_sibling=k_sib)
    tree = build_tree(domains)
    inside, towards = samples(domains, dict(plans))
    for name, nodes in tree.nodes.items():
        if len(nodes) >= 2:
            assert inside[name] >= 1, f"{name} ({len(nodes)} nodes) has no inside sample"
    kids = defaultdict(list)
    for child, parent in tree.parent.items():
        kids[parent].append(child)
    for siblings in kids.values():
        if len(siblings) >= 2:
            for child in siblings:
                assert towards[child] >= 1, f"{child} has no sample towards its siblings"


@given(trees(), st.integers(1, 4), st.integers(1, 3))
def test_plan_size_and_in_degree_stay_within_their_bounds(domains, k_in, k_sib):
    plans = plan(domains, k_inside=k_in, k_sibling=k_sib)
    tiers = build_tree(domains).tiers
    bound = k_in + k_sib * max(tiers - 1, 0)
    for node, probes in plans.items():
        assert len(probes) <= bound, (node, len(probes), bound)
        assert len({p.peer for p in probes}) == len(probes), "a peer twice in one plan"
        assert node not in {p.peer for p in probes}, "a node probing itself"
    worst = max(in_degree(plans).values(), default=0)
    assert worst <= max_in_degree(k_in, k_sib, tiers)


def test_a_one_node_leaf_beside_a_big_one_is_not_overloaded():
    # 1 node in leaf-a, 200 in leaf-b: without the intake cap the lone node would answer all 200
    # members' sibling probes; with it, 2 * k_sibling * 1 = 4 sibling probes plus none inside.
    domains = [
        Domain("leaf-a", 1, ("lone",)),
        Domain("leaf-b", 1, tuple(f"b{i}" for i in range(200))),
        Domain("spine", 2, ("leaf-a", "leaf-b")),
    ]
    plans = plan(domains, k_inside=3, k_sibling=2)
    assert in_degree(plans)["lone"] == 4
    assert [p.peer_domain for p in plans["lone"]] == ["leaf-b"]


def test_each_node_probes_inside_its_leaf_and_one_node_in_each_sibling_at_every_tier():
    domains = fat_tree(spines=2, leaves_per_spine=2, nodes_per_leaf=4)
    probes = plan(domains, k_inside=2, k_sibling=2)["n-0-0-0"]
    inside = [p for p in probes if p.scope == INSIDE]
    assert len(inside) == 2 and all(p.peer.startswith("n-0-0-") for p in inside)
    assert {(p.tier, p.peer_domain) for p in probes if p.scope == SIBLING} == {
        (1, "leaf-0-1"),
        (2, "spine-1"),
    }


def test_the_plan_is_the_same_on_every_agent_and_changes_only_with_the_tree():
    domains = fat_tree(spines=3, leaves_per_spine=4, nodes_per_leaf=8)
    shuffled = list(reversed([Domain(d.name, d.tier, tuple(reversed(d.children))) for d in domains]))
    assert plan(domains) == plan(shuffled)
    assert tree_digest(domains) == tree_digest(shuffled)
    grown = [*domains[:-1], Domain("leaf-x", 1, ("nx",)), Domain("root", 3, (*domains[-1].children,))]
    assert tree_digest(grown) != tree_digest(domains)
    assert plan(domains, seed="a") != plan(domains, seed="b")


def test_plan_size_per_node_does_not_grow_with_the_cluster():
    small = plan(fat_tree(spines=2, leaves_per_spine=4, nodes_per_leaf=8))
    large = plan(fat_tree(spines=8, leaves_per_spine=16, nodes_per_leaf=32))
    # k_inside + k_sibling per tier with siblings: 3 + 2 (other leaves) + 2 (other spines); the small
    # tree has only one other spine, so its nodes probe one node at tier 2.
    assert max(map(len, small.values())) == 3 + 2 + 1
    assert max(map(len, large.values())) == 3 + 2 + 2
