"""On small random HyperNode trees the core's answer is as good as the best of all assignments.

The brute force enumerates every pod -> node assignment that respects free GPUs, usable nodes and
the tier limit, and keeps the best by the core's objective: the lowest tier of the lowest common
HyperNode, then the fewest leaves. The core must find a placement exactly when one exists, and
reach the same (tier, leaves)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from aggregator.placement.core.capacity import leaf_key
from aggregator.placement.core.gang import Gang, Mode, PodSpec
from aggregator.placement.core.place import place
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology, build


def _member(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}


def random_cluster(rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, Resources]]:
    """core (tier 3) > 1-3 spines (tier 2) > 1-3 leaves (tier 1) > 1-2 nodes; some nodes hang
    directly under a spine or belong to no HyperNode; some HyperNodes are not Ready."""
    objs: list[dict[str, Any]] = []
    free: dict[str, Resources] = {}
    count = itertools.count()

    def nodes(n: int) -> list[str]:
        names = [f"n{next(count)}" for _ in range(n)]
        free.update({x: Resources(rng.choice((0, 1, 2, 3, 4, 4)), 8000, 2**34, 110) for x in names})
        return names

    def obj(name: str, tier: int, members: list[dict[str, Any]]) -> None:
        o: dict[str, Any] = {"metadata": {"name": name},
                             "spec": {"tier": tier, "tierName": f"t{tier}", "members": members}}
        if rng.random() < 0.1:
            o["status"] = {"conditions": [{"type": "Ready", "status": "False"}]}
        objs.append(o)

    spines = []
    for s in range(rng.randint(1, 3)):
        members = []
        for leaf in range(rng.randint(1, 3)):
            name = f"s{s}-l{leaf}"
            obj(name, 1, [_member("Node", n) for n in nodes(rng.randint(1, 2))])
            members.append(_member("HyperNode", name))
        if rng.random() < 0.3:
            members += [_member("Node", n) for n in nodes(1)]  # joins the next level directly
        obj(f"s{s}", 2, members)
        spines.append(_member("HyperNode", f"s{s}"))
    if rng.random() < 0.7:
        obj("core", 3, spines)
    if rng.random() < 0.2:
        nodes(1)  # a node in no HyperNode
    return objs, free


def brute_force(topology: Topology, free: dict[str, Resources], gang: Gang, limit: int | None,
                mode: Mode) -> tuple[int, int] | None:
    usable = [n for n in sorted(free) if topology.node_usable(n)]
    best_in: tuple[int, int] | None = None
    best_any: tuple[int, int] | None = None
    # the gang's pods are alike, so a multiset of nodes is an assignment
    for combo in itertools.combinations_with_replacement(usable, len(gang.pods)):
        used: dict[str, int] = {}
        for pod, node in zip(gang.pods, combo, strict=True):
            used[node] = used.get(node, 0) + pod.request.gpus
        if any(used[n] > free[n].gpus for n in used):
            continue
        lca = topology.lca(combo)
        tier = topology.domains[lca].tier if lca else topology.top_tier + 1
        score = (tier, len({leaf_key(topology, n) for n in combo}))
        best_any = score if best_any is None else min(best_any, score)
        if limit is None or tier <= limit:
            best_in = score if best_in is None else min(best_in, score)
    return best_in if best_in is not None or mode is Mode.HARD else best_any


@pytest.mark.parametrize("chunk", range(4))
def test_core_matches_the_brute_force_optimum(chunk: int) -> None:
    for seed in range(chunk * 250, (chunk + 1) * 250):
        check_seed(seed)


def check_seed(seed: int) -> None:
    rng = random.Random(seed)
    objs, free = random_cluster(rng)
    topology = build(objs)
    size, per_pod = rng.randint(1, 6), rng.randint(1, 2)
    limit, mode = rng.choice([None, 1, 2]), rng.choice([Mode.HARD, Mode.SOFT])
    request = Resources(per_pod, 1000, 2**30, 1)
    gang = Gang("g", tuple(PodSpec(f"p{i}", request) for i in range(size)), mode=mode, highest_tier=limit)
    expected = brute_force(topology, free, gang, limit, mode)
    placement = place(topology, free, gang)
    if expected is None:
        assert not placement.ok, (seed, placement)
        return
    assert placement.ok, (seed, placement.failure)
    load: dict[str, int] = {}
    for node in placement.assignments.values():
        assert topology.node_usable(node), seed
        load[node] = load.get(node, 0) + per_pod
    assert all(load[n] <= free[n].gpus for n in load), seed
    assert (placement.tier, placement.leaves) == expected, seed
