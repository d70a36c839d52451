"""Nesting decides by set containment alone: accepting candidate domains smallest rank first, the
tree settles the same whatever the classes weigh. `tiers._Nesting` tests "partly overlaps an
accepted root" as "that root's classes are not all among mine"; the counting it replaced (node
weights inside the domain against the root's size) must agree with it on any family of
candidates, overlapping or not, with any positive class weights. The counting version is kept here
as the oracle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.tiers.infer import Domain, _Nesting
from aggregator.tiers.nesting import Nesting, nest, renest

CLASSES = [f"c{i}" for i in range(12)]


def counted(domains: list[Domain], weight: Mapping[str, int]) -> tuple[object, ...]:
    """The nesting as it was computed before: weights counted per root, compared with its size."""
    top: dict[str, str] = {}
    size: dict[str, int] = {}
    accepted, parent, children, direct = [], {}, {}, {}
    merged: dict[str, list[str]] = defaultdict(list)
    dropped = []
    for domain in domains:
        inside: dict[str | None, int] = defaultdict(int)
        for c in domain.nodes:
            inside[top.get(c)] += weight[c]
        overlapped = sorted(k for k, n in inside.items() if k is not None and n != size[k])
        if overlapped:
            dropped.append((domain.key, f"partly overlaps {overlapped[0]}; kept {overlapped[0]}"))
            continue
        if len(inside) == 1 and None not in inside:
            merged[next(iter(inside))].append(domain.key)  # type: ignore[index]
            continue
        accepted.append(domain.key)
        size[domain.key] = sum(inside.values())
        children[domain.key] = sorted(k for k in inside if k is not None)
        direct[domain.key] = frozenset(c for c in domain.nodes if c not in top)
        for child in children[domain.key]:
            parent[child] = domain.key
        for c in domain.nodes:
            top[c] = domain.key
    return accepted, parent, children, direct, dict(merged), dropped


def nested(domains: list[Domain]) -> tuple[object, ...]:
    nest = _Nesting()
    for domain in domains:
        nest.offer(domain)
    return list(nest.accepted), nest.parent, nest.children, nest.direct, dict(nest.merged), nest.dropped


families = st.lists(st.frozensets(st.sampled_from(CLASSES), min_size=1), min_size=1, max_size=14)
weights = st.lists(st.integers(min_value=1, max_value=50), min_size=len(CLASSES), max_size=len(CLASSES))


@settings(max_examples=400, deadline=None)
@given(families, weights)
def test_nesting_by_containment_matches_nesting_by_counted_weights(
    sets: list[frozenset[str]], weight: list[int]
) -> None:
    domains = [Domain(f"d{i:02d}", "k", (f"d{i:02d}",), classes) for i, classes in enumerate(sets)]
    assert nested(domains) == counted(domains, dict(zip(CLASSES, weight, strict=True)))


def test_a_domain_across_two_roots_is_dropped_naming_the_first_root_by_name() -> None:
    a = Domain("a", "k", ("a",), frozenset({"c1", "c2"}))
    b = Domain("b", "k", ("b",), frozenset({"c3", "c4"}))
    across = Domain("x", "k", ("x",), frozenset({"c2", "c3"}))
    assert nested([a, b, across])[5] == [("x", "partly overlaps a; kept a")]


def _outcome(nesting: Nesting) -> tuple[object, ...]:
    return (
        list(nesting.accepted.items()),
        nesting.parent,
        nesting.children,
        nesting.direct,
        dict(nesting.merged),
        nesting.dropped,
        nesting.owner,
    )


def _family(sets: list[frozenset[str]], present: list[bool]) -> list[Domain]:
    return [
        Domain(f"d{i:02d}", "k", (f"d{i:02d}",), classes)
        for i, (classes, here) in enumerate(zip(sets, present, strict=True))
        if here
    ]


changes = st.lists(
    st.tuples(st.integers(min_value=0, max_value=13), st.frozensets(st.sampled_from(CLASSES), min_size=1)),
    max_size=4,
)


@settings(max_examples=600, deadline=None)
@given(
    families,
    st.lists(st.booleans(), min_size=14, max_size=14),
    st.lists(st.booleans(), min_size=14, max_size=14),
    changes,
)
def test_renesting_after_a_change_equals_nesting_from_scratch(
    sets: list[frozenset[str]],
    present: list[bool],
    present_after: list[bool],
    changed: list[tuple[int, frozenset[str]]],
) -> None:
    """Domains change classes, appear and vanish; replaying only the tainted ones from the old
    nesting gives the same tree (outcomes, parents, children, direct classes, merges, drops and
    owners, in the same order) as nesting the new family from scratch, also when re-nested twice."""
    sets = (sets * 14)[:14]
    after = list(sets)
    for index, classes in changed:
        after[index] = classes
    before_order, after_order = _family(sets, present), _family(after, present_after)
    old = nest(before_order)
    assert _outcome(renest(after_order, old)) == _outcome(nest(after_order))
    back = renest(before_order, renest(after_order, old))
    assert _outcome(back) == _outcome(old)


def test_a_class_moving_between_leaves_replays_only_the_domains_on_its_chains() -> None:
    """Two leaves under one spine, a second spine apart: a class moving from one leaf to the other
    re-offers the two leaves and the spine above them, and keeps the other spine's outcome."""
    leaf_a = Domain("leaf-a", "k", ("a",), frozenset({"c1", "c2"}))
    leaf_b = Domain("leaf-b", "k", ("b",), frozenset({"c3"}))
    leaf_c = Domain("leaf-c", "k", ("c",), frozenset({"c5", "c6"}))
    spine = Domain("spine-1", "k", ("s1",), frozenset({"c1", "c2", "c3"}))
    other = Domain("spine-2", "k", ("s2",), frozenset({"c5", "c6", "c7"}))
    old = nest([leaf_a, leaf_b, leaf_c, spine, other])
    moved = [
        leaf_a._replace(nodes=frozenset({"c1"})),
        leaf_b._replace(nodes=frozenset({"c2", "c3"})),
        leaf_c,
        spine,
        other,
    ]
    offered: list[str] = []
    original = Nesting.offer

    def spy(self: Nesting, domain: Domain) -> None:
        offered.append(domain.key)
        original(self, domain)

    Nesting.offer = spy  # type: ignore[method-assign]
    try:
        new = renest(moved, old)
    finally:
        Nesting.offer = original  # type: ignore[method-assign]
    assert offered == ["leaf-a", "leaf-b", "spine-1"]
    assert _outcome(new) == _outcome(nest(moved))
    assert new.parent == {"leaf-a": "spine-1", "leaf-b": "spine-1", "leaf-c": "spine-2"}
