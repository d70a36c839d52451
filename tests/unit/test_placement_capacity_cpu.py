"""The counting core's per-node count for CPU-only gangs (inlined in `capacity.measure`, the loop
every such decision runs over all nodes) equals `count_fits`, the general rule, on random free maps:
over-committed (negative) nodes, empty ones, excluded ones, and each of CPU, memory or pod slots
binding first."""

from __future__ import annotations

import random

from aggregator.placement.core import capacity, topology
from aggregator.placement.core.gang import Gang, PodSpec
from aggregator.placement.core.resources import Resources


def test_cpu_only_counts_equal_the_general_rule_on_random_nodes() -> None:
    rng = random.Random(11)
    tree = topology.build([])
    checked = 0
    for _ in range(300):
        free = {f"n{i}": Resources(rng.choice([0, 8, -1]), rng.randint(-500, 64_000), rng.randint(-1, 2**38),
                                   rng.randint(-1, 110)) for i in range(rng.randint(1, 40))}
        shape = Resources(0, rng.choice([1, 100, 250, 4000]), rng.choice([1, 2**26, 2**30]), rng.choice([1, 2]))
        gang = Gang("g", tuple(PodSpec(f"p{j}", shape) for j in range(rng.randint(1, 8))))
        excluded = frozenset(n for n in free if rng.random() < 0.2)
        measured = capacity.measure(tree, free, gang, excluded_nodes=excluded)
        expected = {n: c for n, have in free.items() if n not in excluded and (c := capacity.count_fits(have, shape)) > 0}
        assert measured.node_cap == expected
        checked += len(free)
    assert checked > 3000
