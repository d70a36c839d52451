"""The core reading a `FreeIndex` gives exactly the counting core's placement, on random trees,
random free capacity, random gangs (sizes, shapes, limits, minMember, exclusions) and after
random binds and releases applied to the index incrementally.

The reference is `core.place` on a plain dict: the counting path (`capacity.measure`), today's
algorithm, which the index path must reproduce pod for pod."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from aggregator.placement.core import indexed
from aggregator.placement.core.free_index import REQUEST_SHAPES, FreeIndex
from aggregator.placement.core.gang import Gang, Mode, PodSpec
from aggregator.placement.core.place import lowest_feasible_tier, place
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology, build


def _member(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}


def random_tree(rng: random.Random) -> tuple[list[dict[str, Any]], list[str]]:
    """Up to 4 tiers of random fan-out; some nodes hang above tier 1 or in no HyperNode; some
    HyperNodes are not Ready."""
    objs: list[dict[str, Any]] = []
    names: list[str] = []
    count = itertools.count()

    def subtree(tier: int, prefix: str) -> str:
        name = f"{prefix}{rng.randint(0, 99)}-{next(count)}"
        members = []
        if tier == 1:
            for _ in range(rng.randint(1, 4)):
                names.append(node := f"n{next(count):03d}")
                members.append(_member("Node", node))
        else:
            members = [_member("HyperNode", subtree(tier - 1, prefix)) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.2:
                names.append(node := f"n{next(count):03d}")
                members.append(_member("Node", node))
        obj: dict[str, Any] = {"metadata": {"name": name}, "spec": {"tier": tier, "tierName": f"t{tier}", "members": members}}
        if rng.random() < 0.05:
            obj["status"] = {"conditions": [{"type": "Ready", "status": "False"}]}
        objs.append(obj)
        return name

    top = rng.randint(1, 4)
    for _ in range(rng.randint(1, 3)):
        subtree(top, rng.choice("abc"))
    for _ in range(rng.randint(0, 2)):
        names.append(f"loose{next(count)}")
    return objs, names


def tree_of_at_least(rng: random.Random, nodes: int) -> tuple[Topology, list[str]]:
    """The first random tree with at least `nodes` nodes."""
    objs, names = random_tree(rng)
    while len(names) < nodes:
        objs, names = random_tree(rng)
    return build(objs), names


def random_free(rng: random.Random, names: list[str]) -> dict[str, Resources]:
    return {n: Resources(rng.choice((0, 1, 2, 3, 4, 8, 8)), rng.choice((64_000, 64_000, 3000)), 2**40,
                         rng.choice((110, 110, 2))) for n in names}


def random_gang(rng: random.Random, topology: Topology) -> Gang:
    pods = rng.randint(1, 12)
    gpus = rng.choice((0, 1, 2, 4, 8))  # 0: CPU-only pods, answered from their exact request's index
    cpu = rng.choice((1000, 1000, 0))
    shapes = [Resources(gpus, cpu, 2**30, 1)]
    if rng.random() < 0.1:
        shapes.append(Resources(rng.choice((1, 2)), 1000, 2**30, 1))  # mixed: counted classically
    limit = rng.choice((None, None, *topology.tiers))
    return Gang(f"g{rng.randint(0, 999)}", tuple(PodSpec(f"p{i:02d}", rng.choice(shapes)) for i in range(pods)),
                min_member=rng.choice((None, None, max(1, pods // 2))), mode=rng.choice((Mode.HARD, Mode.SOFT)),
                highest_tier=limit)


def exclusions(rng: random.Random, topology: Topology, names: list[str]) -> tuple[frozenset[str], frozenset[str]]:
    nodes = frozenset(rng.sample(names, k=min(len(names), rng.choice((0, 0, 1, 3)))))
    domains = frozenset(rng.sample(sorted(topology.domains), k=min(len(topology.domains), rng.choice((0, 0, 0, 1)))))
    return nodes, domains


def test_index_places_every_gang_exactly_as_the_counting_core_through_binds_and_releases() -> None:
    answered = compared = 0
    for seed in range(300):
        rng = random.Random(seed)
        objs, names = random_tree(rng)
        topology = build(objs)
        free = random_free(rng, names)
        index = FreeIndex(topology, free)
        for _ in range(8):
            gang = random_gang(rng, topology)
            nodes, domains = exclusions(rng, topology, names)
            want = place(topology, dict(index), gang, excluded_nodes=nodes, excluded_domains=domains)
            got = place(topology, index, gang, excluded_nodes=nodes, excluded_domains=domains)
            assert got == want, (seed, gang)
            assert lowest_feasible_tier(topology, index, gang, excluded_nodes=nodes, excluded_domains=domains) == \
                lowest_feasible_tier(topology, dict(index), gang, excluded_nodes=nodes, excluded_domains=domains)
            compared += 1
            tiers = list(range(1, topology.top_tier + 2))
            answered += indexed.place(topology, index, gang, tiers, excluded_nodes=nodes,
                                      excluded_domains=domains) is not None
            for pod, node in want.assignments.items():  # bind: the index follows incrementally
                request = next(p.request for p in gang.pods if p.name == pod)
                index.set(node, index[node] - request)
            for node in rng.sample(names, k=min(3, len(names))):  # pods leave, nodes change
                index.set(node, Resources(rng.choice((0, 2, 8)), 64_000, 2**40, 110))
        assert dict(index) == {**free, **dict(index)} and set(index) == set(free)
    assert compared == 2400
    # the index path really answers most of them, not only the fallback: 1,524 with request-shaped
    # indexes for CPU-only and CPU-bound gangs, 563 with GPU-bound gangs alone
    assert answered > 1200


def test_index_matches_a_fresh_index_after_changes_including_node_removal_and_return() -> None:
    rng = random.Random(7)
    topology, names = tree_of_at_least(rng, 6)
    index = FreeIndex(topology, random_free(rng, names))
    index.shape(2)
    index.shape(8)
    cpu_only = Resources(0, 1000, 2**30, 1)
    index.request_shape(cpu_only)
    for _ in range(200):
        node = rng.choice(names)
        index.set(node, None if rng.random() < 0.2 else Resources(rng.choice((0, 3, 8)), 64_000, 2**40, 110))
    fresh = FreeIndex(topology, dict(index))
    pairs = [(index.shape(gpus), fresh.shape(gpus)) for gpus in (2, 8)]
    for a, b in [*pairs, (index.request_shape(cpu_only), fresh.request_shape(cpu_only))]:
        assert (a.node_cap, a.leaf_cap, a.by_tier) == (b.node_cap, b.leaf_cap, b.by_tier)
        assert {d: c for d, c in a.domain_cap.items() if c} == {d: c for d, c in b.domain_cap.items() if c}
        assert {k: v for k, v in a.leaves_by_cap.items() if v} == {k: v for k, v in b.leaves_by_cap.items() if v}
        assert {d: h for d, h in a.leaf_hist.items() if h} == {d: h for d, h in b.leaf_hist.items() if h}


@pytest.mark.parametrize(("cpu_per_pod", "per_node"), [(60_000, 2), (32_001, 3)])
def test_a_gang_whose_cpu_binds_before_its_gpus_is_answered_from_its_exact_request(cpu_per_pod: int,
                                                                                   per_node: int) -> None:
    leaf = [_member("Node", "a"), _member("Node", "b")]
    topology = build([{"metadata": {"name": "l"}, "spec": {"tier": 1, "members": leaf}}])
    free = {"a": Resources(8, 128_000, 2**40, 110), "b": Resources(8, 128_000, 2**40, 110)}
    index = FreeIndex(topology, free)
    request = Resources(2, cpu_per_pod, 0, 1)
    gang = Gang("g", tuple(PodSpec(f"p{i}", request) for i in range(per_node + 1)))
    assert not index.gpu_bound(request)  # by GPUs alone a node would take 4
    got = indexed.place(topology, index, gang, [1, 2], excluded_nodes=frozenset(), excluded_domains=frozenset())
    assert index.request_shapes() == [request] and index.request_shape(request).node_cap == {"a": per_node,
                                                                                            "b": per_node}
    assert got == place(topology, free, gang).assignments  # the counting core's answer, CPU counted
    assert sorted(got.values()) == ["a"] * per_node + ["b"]


@pytest.mark.parametrize(("cpu_per_gpu", "bound"), [(6250, True), (6251, False)])
def test_gpu_bound_is_exact_on_the_boundary_for_any_gpu_count(cpu_per_gpu: int, bound: bool) -> None:
    # 16 GPUs do not divide the ratio's integer scale (840): that node's ratio is kept as a Fraction
    leaf = [_member("Node", "eight"), _member("Node", "sixteen")]
    topology = build([{"metadata": {"name": "l"}, "spec": {"tier": 1, "members": leaf}}])
    index = FreeIndex(topology, {"eight": Resources(8, 64_000, 2**40, 110), "sixteen": Resources(16, 100_000, 2**40, 110)})
    assert index.gpu_bound(Resources(1, cpu_per_gpu, 0, 1)) is bound  # 100,000 / 16 = 6,250 CPU per GPU
    assert index.gpu_bound(Resources(3, 3 * cpu_per_gpu, 0, 1)) is bound
    index.set("sixteen", Resources(0, 100_000, 2**40, 110))  # no GPU left: only the 8-GPU node counts
    assert index.gpu_bound(Resources(1, cpu_per_gpu, 0, 1))  # 64,000 / 8 = 8,000 per GPU


def test_cpu_only_pods_are_placed_from_an_index_kept_through_binds_and_only_the_recent_requests_kept() -> None:
    rng = random.Random(3)
    topology, names = tree_of_at_least(rng, 8)
    index = FreeIndex(topology, random_free(rng, names))
    requests = [Resources(0, 500 * (i + 1), 2**30, 1) for i in range(REQUEST_SHAPES + 3)]
    for request in requests:
        gang = Gang("g", tuple(PodSpec(f"p{i}", request) for i in range(3)), mode=Mode.SOFT)
        want = place(topology, dict(index), gang)
        assert indexed.place(topology, index, gang, list(range(1, topology.top_tier + 2)),
                             excluded_nodes=frozenset(), excluded_domains=frozenset()) == (want.assignments or None)
        for node in want.assignments.values():
            index.set(node, index[node] - request)
    assert index.request_shapes() == requests[-REQUEST_SHAPES:]  # the oldest were let go
    index.request_shape(requests[-REQUEST_SHAPES])  # used again: now the most recent
    assert index.request_shapes() == [*requests[-REQUEST_SHAPES + 1:], requests[-REQUEST_SHAPES]]
    fresh = FreeIndex(topology, dict(index))
    for request in requests[-REQUEST_SHAPES:]:
        kept, built = index.request_shape(request), fresh.request_shape(request)
        assert (kept.node_cap, kept.leaf_cap, kept.by_tier) == (built.node_cap, built.leaf_cap, built.by_tier)


def test_a_request_index_catches_up_on_use_and_is_let_go_when_further_behind_than_a_rebuild() -> None:
    nodes = [f"n{i:03d}" for i in range(400)]
    leaves = [{"metadata": {"name": f"l{j}"}, "spec": {"tier": 1, "members": [_member("Node", n) for n in nodes[j::4]]}}
              for j in range(4)]
    topology = build(leaves)
    index = FreeIndex(topology, {n: Resources(8, 64_000, 2**40, 110) for n in nodes})
    request = Resources(0, 6000, 2**30, 1)
    index.request_shape(request)
    for node in nodes[:100]:  # behind by 100 nodes: noted, replayed at the next use
        index.set(node, Resources(8, 13_000, 2**40, 110))
    assert index.request_shapes() == [request]
    caught_up = index.request_shape(request)
    assert caught_up.node_cap == FreeIndex(topology, dict(index)).request_shape(request).node_cap
    assert caught_up.node_cap["n000"] == 2 and caught_up.node_cap["n399"] == 10
    for node in nodes[:200]:  # 400 // 4 + 64 = 164 nodes behind: a rebuild is cheaper, so it is let go
        index.set(node, Resources(8, 25_000, 2**40, 110))
    assert index.request_shapes() == []
    rebuilt = index.request_shape(request)
    assert rebuilt.node_cap["n000"] == 4 and rebuilt.node_cap == FreeIndex(topology, dict(index)).request_shape(request).node_cap


def _node(name: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64",
                                                                   "memory": "512Gi", "pods": "110"}}}


def _pod(name: str, gpus: int, node: str = "") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name},
            "spec": {"schedulerName": "hypertopo", "nodeName": node,
                     "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}}]}}


def test_scheduler_state_keeps_its_index_in_step_with_binds_assumptions_and_node_changes() -> None:
    from aggregator.placement.live.state import ClusterState

    state = ClusterState("hypertopo")
    objs = [{"metadata": {"name": f"leaf{i}"}, "spec": {"tier": 1, "members": [_member("Node", f"n{2 * i + j}") for j in (0, 1)]}}
            for i in range(3)]
    topology = build(objs)
    for i in range(6):
        state.apply("Node", "ADDED", _node(f"n{i}", 8))
    index = state.free_index(topology)
    index.shape(4)
    state.apply("Pod", "ADDED", _pod("a", 4, "n0"))
    state.apply("Pod", "ADDED", _pod("b", 8))
    state.assume(("ns", "b"), "n3")
    state.apply("Node", "MODIFIED", _node("n5", 4))
    state.apply("Node", "DELETED", _node("n1", 8))
    assert state.free_index(topology) is index  # same topology: updated, not rebuilt
    assert dict(index) == state.free()
    fresh = FreeIndex(topology, state.free())
    assert index.shape(4).node_cap == fresh.shape(4).node_cap == {"n0": 1, "n2": 2, "n4": 2, "n5": 1}
    assert index.shape(4).by_tier == fresh.shape(4).by_tier
    state.forget(("ns", "b"))
    gang = Gang("g", tuple(PodSpec(f"p{i}", Resources(4, 1000, 0, 1)) for i in range(2)))
    assert place(topology, state.free_index(topology), gang) == place(topology, state.free(), gang)
    # best fit: leaf2 (3 left) before leaf1 (4), and n4 (2) covers both pods
    assert place(topology, state.free_index(topology), gang).assignments == {"p0": "n4", "p1": "n4"}
