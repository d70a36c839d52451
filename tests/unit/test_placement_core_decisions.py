"""Table-driven placement decisions; each case shows the arithmetic behind the expected answer.

Nodes have 8 GPUs unless a case says otherwise; pods ask 8 GPUs unless a case says otherwise."""

from __future__ import annotations

import random
from typing import Any

import pytest

from aggregator.placement.core.gang import ROOT, Gang, Mode, PodSpec
from aggregator.placement.core.place import lowest_feasible_tier, place
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology, build


def hn(name: str, tier: int, nodes: tuple[str, ...] = (), kids: tuple[str, ...] = (), *,
       ready: bool = True, tier_name: str | None = None) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": k}}} for k in kids]
    names = {1: "leaf", 2: "spine", 3: "core"}
    obj: dict[str, Any] = {"metadata": {"name": name},
                           "spec": {"tier": tier, "tierName": tier_name or names[tier], "members": members}}
    if not ready:
        obj["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "FabricDown"}]}
    return obj


def gpus(n: int) -> Resources:
    return Resources(n, 64_000, 512 * 2**30, 110)


def gang(pods: int, per_pod: int = 8, **kw: Any) -> Gang:
    request = Resources(per_pod, 1000, 2**30, 1)
    return Gang("g", tuple(PodSpec(f"p{i}", request) for i in range(pods)), **kw)


# spine: leaf-a (a1 a2 a3), leaf-b (b1 b2)
TWO_LEAVES = [hn("leaf-a", 1, ("a1", "a2", "a3")), hn("leaf-b", 1, ("b1", "b2")),
              hn("spine", 2, kids=("leaf-a", "leaf-b"))]
FULL = {n: gpus(8) for n in ("a1", "a2", "a3", "b1", "b2")}


@pytest.mark.parametrize(("case", "hypernodes", "free", "request_", "expect"), [
    # leaf-a holds 3 pods (3 nodes x 8 GPUs / 8), leaf-b holds 2: a 2-pod gang fits both;
    # best fit leaves 3-2=1 spare in leaf-a and 2-2=0 in leaf-b -> leaf-b.
    ("best fit picks the tighter leaf", TWO_LEAVES, FULL, gang(2),
     {"tier": 1, "domain": "leaf-b", "nodes": {"b1", "b2"}}),
    # 4 pods: no leaf holds 4 (3, 2) -> tier 2 (spine holds 5); fewest leaves = 2:
    # the largest leaf first (leaf-a, 3 pods), then the smallest leaf covering the last pod (leaf-b).
    ("climbs to the lowest tier that holds the gang", TWO_LEAVES, FULL, gang(4),
     {"tier": 2, "domain": "spine", "leaves": 2, "nodes": {"a1", "a2", "a3", "b1"}}),
    # 1-GPU pods x 4: leaf-a has 2+3+8 = 13 free GPUs, leaf-b 4+0 = 4 -> leaf-b fits exactly (spare 0);
    # in leaf-b, b1 (4 free) covers all 4 pods -> one node.
    ("partly used nodes, one-GPU pods", TWO_LEAVES,
     {"a1": gpus(2), "a2": gpus(3), "a3": gpus(8), "b1": gpus(4), "b2": gpus(0)}, gang(4, per_pod=1),
     {"tier": 1, "domain": "leaf-b", "nodes": {"b1"}}),
    # leaf-b is not Ready: only leaf-a (3 pods) may host the 2-pod gang.
    ("an unready leaf is skipped", [TWO_LEAVES[0], hn("leaf-b", 1, ("b1", "b2"), ready=False), TWO_LEAVES[2]],
     FULL, gang(2), {"tier": 1, "domain": "leaf-a"}),
    # 2-GPU pods x 3 in a leaf with nodes of 8, 6 and 2 free GPUs, i.e. 4, 3 and 1 pods:
    # x1 (4 >= 3) and x2 (3 >= 3) both cover the gang -> the smallest that covers, x2, leaving x1 whole.
    ("the smallest node that covers the rest", [hn("leaf-x", 1, ("x1", "x2", "x3"))],
     {"x1": gpus(8), "x2": gpus(6), "x3": gpus(2)}, gang(3, per_pod=2),
     {"tier": 1, "domain": "leaf-x", "nodes": {"x2"}}),
])
def test_decision_table(case: str, hypernodes: list[dict[str, Any]], free: dict[str, Resources],
                        request_: Gang, expect: dict[str, Any]) -> None:
    placement = place(build(hypernodes), free, request_)
    assert placement.ok, case
    assert len(placement.assignments) == len(request_.pods)
    assert placement.tier == expect["tier"]
    assert placement.domain == expect["domain"]
    if "leaves" in expect:
        assert placement.leaves == expect["leaves"]
    if "nodes" in expect:
        assert set(placement.assignments.values()) == expect["nodes"]


SPINE_LEAVES = (("spine-x", (4, 4, 4)), ("spine-y", (6, 6)), ("spine-q", (6, 5)))


def _spines_objects() -> list[dict[str, Any]]:
    """spine-x: leaves of 4, 4, 4 nodes (12 pods); spine-y: 6, 6 (12); spine-q: 6, 5 (11); core above."""
    hns = []
    for spine, sizes in SPINE_LEAVES:
        leaves = [f"{spine}-l{i}" for i in range(len(sizes))]
        hns += [hn(leaf, 1, tuple(f"{leaf}-n{j}" for j in range(size)))
                for leaf, size in zip(leaves, sizes, strict=True)]
        hns.append(hn(spine, 2, kids=tuple(leaves)))
    return [*hns, hn("core", 3, kids=("spine-q", "spine-x", "spine-y"))]


def _spines() -> tuple[Topology, dict[str, Resources]]:
    topology = build(_spines_objects())
    return topology, {n: gpus(8) for leaf in topology.by_tier[1] for n in topology.domains[leaf].nodes}


def test_fewest_leaves_then_best_fit_between_spines() -> None:
    # 10 pods: no leaf holds 10 (max 6) -> tier 2. spine-x needs 3 leaves (4+4+4), spine-y 2 (6+6),
    # spine-q 2 (6+5). Tie on 2 leaves -> best fit: q spare 11-10=1 < y spare 12-10=2 -> spine-q.
    topology, free = _spines()
    placement = place(topology, free, gang(10))
    assert (placement.tier, placement.domain, placement.leaves) == (2, "spine-q", 2)


def test_hard_limit_fails_with_the_shortfall() -> None:
    # 4 pods, limit tier 1: the largest leaf (leaf-a) holds 3 -> 1 pod = 8 GPUs short.
    placement = place(build(TWO_LEAVES), FULL, gang(4, highest_tier=1))
    assert not placement.ok and placement.failure is not None
    assert (placement.failure.best_domain, placement.failure.best_fits) == ("leaf-a", 3)
    assert (placement.failure.short_pods, placement.failure.short_gpus) == (1, 8)
    assert placement.failure.limiting == "nvidia.com/gpu"
    assert "leaf-a" in placement.failure.message and "8 GPUs" in placement.failure.message


def test_soft_limit_climbs_above_it() -> None:
    placement = place(build(TWO_LEAVES), FULL, gang(4, highest_tier=1, mode=Mode.SOFT))
    assert placement.ok and (placement.tier, placement.domain) == (2, "spine")


def test_highest_tier_by_name() -> None:
    topology = build(TWO_LEAVES)
    # "leaf" is tier 1: a 4-pod gang does not fit in one leaf (3, 2) -> hard mode fails ...
    assert not place(topology, FULL, gang(4, highest_tier_name="leaf")).ok
    # ... "spine" is tier 2 and holds 5 >= 4.
    assert place(topology, FULL, gang(4, highest_tier_name="spine")).tier == 2
    unknown = place(topology, FULL, gang(1, highest_tier_name="pod"))
    assert unknown.failure is not None and "leaf" in unknown.failure.message


def test_excluded_nodes_and_domains() -> None:
    topology = build(TWO_LEAVES)
    # b1 has the fabric fault: leaf-b holds 1 < 2 -> leaf-a.
    assert place(topology, FULL, gang(2), excluded_nodes=frozenset({"b1"})).domain == "leaf-a"
    # the spine is excluded: its whole subtree goes, nothing is left.
    assert not place(topology, FULL, gang(1), excluded_domains=frozenset({"spine"})).ok


def test_restart_pods_stay_next_to_the_running_gang() -> None:
    # core: spine-1 (leaf-a: a1..a3, leaf-b: b1 b2), spine-2 (leaf-c: c1..c8).
    # The gang runs on a1, a2; 2 pods to re-place. Alone they would go to leaf-b (holds 2, spare 0),
    # but they must share a domain with a1, a2: leaf-a holds 1 (a3) < 2 -> spine-1: the anchors'
    # leaf first (a3, 1 pod), then the smallest leaf covering 1 pod (leaf-b).
    hns = [hn("leaf-a", 1, ("a1", "a2", "a3")), hn("leaf-b", 1, ("b1", "b2")),
           hn("leaf-c", 1, tuple(f"c{i}" for i in range(1, 9))),
           hn("spine-1", 2, kids=("leaf-a", "leaf-b")), hn("spine-2", 2, kids=("leaf-c",)),
           hn("core", 3, kids=("spine-1", "spine-2"))]
    free = {n: gpus(8) for n in ("a3", "b1", "b2", *(f"c{i}" for i in range(1, 9)))}
    free.update({"a1": gpus(0), "a2": gpus(0)})
    topology = build(hns)
    alone = place(topology, free, gang(2))
    assert alone.domain == "leaf-b"
    again = place(topology, free, gang(2, running={"p8": "a1", "p9": "a2"}))
    assert again.ok and (again.tier, again.domain) == (2, "spine-1")
    assert set(again.assignments.values()) == {"a3", "b1"}


def test_preferred_nodes_break_ties() -> None:
    topology = build([hn("leaf-x", 1, ("x1", "x2", "x3"))])
    free = {n: gpus(8) for n in ("x1", "x2", "x3")}
    assert place(topology, free, gang(1)).assignments == {"p0": "x1"}  # name order
    assert place(topology, free, gang(1, preferred_nodes=frozenset({"x3"}))).assignments == {"p0": "x3"}


def test_nodes_outside_every_hypernode_meet_at_the_cluster_root() -> None:
    topology = build([hn("leaf-x", 1, ("x1",))])
    # leaf-x holds 1 pod; loose1, loose2 belong to no HyperNode: 3 pods need the virtual root.
    free = {"x1": gpus(8), "loose1": gpus(8), "loose2": gpus(8)}
    placement = place(topology, free, gang(3))
    assert placement.ok and placement.domain == ROOT and placement.tier == 2 and placement.leaves == 3
    assert not place(topology, free, gang(3, highest_tier=1)).ok


def test_min_member_places_what_fits() -> None:
    # 5 pods wanted, minMember 3; the cluster holds 5 only across leaves but leaf-a holds 3 -> tier 1,
    # leaf-a, 3 pods placed: the lowest tier wins over placing the optional pods.
    placement = place(build(TWO_LEAVES), FULL, gang(5, min_member=3))
    assert placement.ok and placement.domain == "leaf-a" and len(placement.assignments) == 3


def test_mixed_pod_shapes() -> None:
    # pods of 8 and 1 GPUs: x1 has 8 free, x2 has 1 -> the big pod on x1, the small one on x2.
    topology = build([hn("leaf-x", 1, ("x1", "x2"))])
    pods = (PodSpec("big", Resources(8, 1000, 2**30, 1)), PodSpec("small", Resources(1, 1000, 2**30, 1)))
    placement = place(topology, {"x1": gpus(8), "x2": gpus(1)}, Gang("mixed", pods))
    assert placement.assignments == {"big": "x1", "small": "x2"}


def test_same_input_in_any_order_gives_the_same_placement() -> None:
    topology, free = _spines()
    rng = random.Random(7)
    reference = place(topology, free, gang(9))
    for _ in range(5):
        hns_shuffled = list(_spines_objects())
        rng.shuffle(hns_shuffled)
        items = list(free.items())
        rng.shuffle(items)
        assert place(build(hns_shuffled), dict(items), gang(9)) == reference


def test_lowest_feasible_tier_ignores_limits() -> None:
    topology = build(TWO_LEAVES)
    assert lowest_feasible_tier(topology, FULL, gang(3, highest_tier=1)) == 1  # leaf-a holds 3
    assert lowest_feasible_tier(topology, FULL, gang(5)) == 2  # only the spine holds 5
    assert lowest_feasible_tier(topology, FULL, gang(6)) is None  # 5 nodes in all
