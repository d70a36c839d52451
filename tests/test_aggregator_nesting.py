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

from aggregator.tiers import Domain, _Nesting

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
