"""Reasons that add up: an Unschedulable message's numbers agree with each other for every gang
shape (needed, what the roomiest domain holds, the shortfall; per shape for mixed gangs), a limit
below every tier is named for what it is, and a soft limit naming an unknown tier is said as hard
mode says it, while the gang is placed."""

from __future__ import annotations

import random
import re
from typing import Any

from aggregator.placement.core import place as core
from aggregator.placement.core.decide import decide
from aggregator.placement.core.gang import Gang, PodSpec
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology, build
from aggregator.placement.kinds import podgroups
from aggregator.placement.live.state import ClusterState

SCHED = "hypertopo-scheduler"


def hn(name: str, tier: int, nodes: tuple[str, ...] = (), kids: tuple[str, ...] = ()) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": k}}} for k in kids]
    return {"metadata": {"name": name}, "spec": {"tier": tier, "tierName": {1: "leaf", 2: "spine"}[tier], "members": members}}


def res(gpus: int, cpu: int = 1000) -> Resources:
    return Resources(gpus, cpu, 2**30, 1)


def tree(rng: random.Random) -> tuple[Topology, dict[str, Resources]]:
    """2-3 spines of 1-3 leaves of 1-4 nodes, each node with 0-8 GPUs and 1-8 CPUs free."""
    objects, free = [], {}
    spines = []
    for s in range(rng.randint(2, 3)):
        leaves = []
        for leaf_index in range(rng.randint(1, 3)):
            nodes = tuple(f"n{s}{leaf_index}{i}" for i in range(rng.randint(1, 4)))
            objects.append(hn(f"leaf-{s}{leaf_index}", 1, nodes))
            leaves.append(f"leaf-{s}{leaf_index}")
            free.update({n: Resources(rng.choice((0, 2, 4, 8)), 1000 * rng.randint(1, 8), 2**34, 110) for n in nodes})
        objects.append(hn(f"spine-{s}", 2, kids=tuple(leaves)))
        spines.append(f"spine-{s}")
    return build(objects), free


def test_every_refusal_states_numbers_that_add_up_for_every_gang_shape() -> None:
    rng = random.Random(24)
    refused = mixed = 0
    for _ in range(400):
        topology, free = tree(rng)
        shapes = rng.choice(([8], [4], [8, 4], [8, 2, 1], [4, 1]))
        pods = tuple(PodSpec(f"p{i}", res(rng.choice(shapes))) for i in range(rng.randint(2, 24)))
        gang = Gang("ns/g", pods, min_member=rng.choice((None, max(1, len(pods) - 3))),
                    highest_tier=rng.choice((None, 1, 2)))
        placement = core.place(topology, free, gang)
        if placement.ok:
            continue
        refused += 1
        failure = placement.failure
        assert failure is not None
        if failure.best_domain is None:
            assert failure.short_pods == gang.required
            continue
        need, fits = failure.needed_pods, failure.best_fits
        # the shortfall is positive and is the difference of the two numbers said before it
        assert 0 <= fits < need and failure.short_pods == need - fits > 0, failure
        assert f"holds {fits}" in failure.message and f": {need - fits} pods (" in failure.message, failure.message
        assert f"({failure.short_gpus} GPUs) short" in failure.message
        smallest = sorted(p.request.gpus for p in pods)[:need - fits]
        assert failure.short_gpus >= sum(smallest) and failure.short_gpus > 0
        if not gang.homogeneous:
            mixed += 1
            # per shape: the pods of that shape and the room for it alone, short only where room < wanted
            for wanted, shape, room in re.findall(r"(\d+) (\d+)-GPU pod\(s\), room for (\d+) alone", failure.message):
                assert int(wanted) == sum(1 for p in pods if p.request.gpus == int(shape))
                assert (f"room for {room} alone ({int(wanted) - int(room)} short)" in failure.message) == (int(room) < int(wanted))
    assert refused > 50 and mixed > 20, (refused, mixed)


def test_a_mixed_shape_gang_no_longer_reports_a_negative_shortfall() -> None:
    # the shape: 5 pods of 8 GPUs and 16 of 4 on 8 nodes of 8 GPUs under one spine
    topology = build([hn("leaf-a", 1, tuple(f"a{i}" for i in range(4))), hn("leaf-b", 1, tuple(f"b{i}" for i in range(4))),
                      hn("spine", 2, kids=("leaf-a", "leaf-b"))])
    free = {n: Resources(8, 8000, 2**34, 110) for n in [*(f"a{i}" for i in range(4)), *(f"b{i}" for i in range(4))]}
    pods = tuple([PodSpec(f"big{i}", res(8)) for i in range(5)] + [PodSpec(f"s{i}", res(4)) for i in range(16)])
    failure = core.place(topology, free, Gang("ns/mixed", pods, highest_tier=2)).failure
    assert failure is not None
    # 5 big pods take 5 nodes, 3 nodes hold 6 small ones: 11 of 21, 10 small pods (40 GPUs) short
    assert (failure.best_fits, failure.short_pods, failure.short_gpus) == (11, 10, 40), failure.message
    assert "needs 21 pods in one domain within tier <= 2 (spine); the roomiest, spine, holds 11" in failure.message
    assert "16 4-GPU pod(s), room for 16 alone" in failure.message and "5 8-GPU pod(s), room for 8 alone" in failure.message


def test_tier_zero_is_named_for_what_it_is() -> None:
    topology = build([hn("leaf-a", 1, ("a0", "a1")), hn("spine", 2, kids=("leaf-a",))])
    failure = core.place(topology, {"a0": res(8), "a1": res(8)}, Gang("ns/g", (PodSpec("p", res(8)),), highest_tier=0)).failure
    assert failure is not None
    assert "tier <= 0 (below every HyperNode tier, the lowest is 1: no domain qualifies)" in failure.message
    assert "(cluster)" not in failure.message
    assert core.tier_words(topology, 3) == "tier <= 3 (above the top tier 2: the whole cluster)"
    assert core.tier_words(topology, 2) == "tier <= 2 (spine)"


def _volcano_state(network_topology: dict[str, Any], policy: dict[str, Any] | None = None) -> ClusterState:
    state = ClusterState(SCHED)
    for n in ("a0", "a1", "b0", "b1"):
        amounts = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
        state.apply("Node", "ADDED", {"metadata": {"name": n, "labels": {}}, "spec": {}, "status": {"allocatable": amounts}})
    spec: dict[str, Any] = {"minMember": 2, "networkTopology": network_topology}
    if policy:
        spec["subGroupPolicy"] = [policy]
    state.apply("VolcanoPodGroup", "ADDED", {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                                             "metadata": {"name": "pg", "namespace": "ns", "uid": "pg"},
                                             "spec": spec, "status": {"phase": "Inqueue"}})
    for i in range(2):
        state.apply("Pod", "ADDED", {
            "metadata": {"name": f"w{i}", "namespace": "ns", "uid": f"w{i}", "labels": {"part": "0"},
                         "annotations": {"scheduling.k8s.io/group-name": "pg"}, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": SCHED, "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
            "status": {"phase": "Pending"}})
    return state


TREE = [hn("leaf-a", 1, ("a0", "a1")), hn("leaf-b", 1, ("b0", "b1")), hn("spine", 2, kids=("leaf-a", "leaf-b"))]


def test_an_unknown_tier_name_in_soft_mode_is_said_as_hard_mode_says_it() -> None:
    hard = _volcano_state({"mode": "hard", "highestTierName": "rack"})
    [view] = podgroups.collect(hard)
    refused = decide(hard, build(TREE), view)
    assert not refused.ok and "highest tier name 'rack' matches no tier (tiers: 1=leaf, 2=spine)" in refused.reason

    soft = _volcano_state({"mode": "soft", "highestTierName": "rack"})
    [view] = podgroups.collect(soft)
    placed = decide(soft, build(TREE), view)
    assert placed.ok
    assert placed.warning == ("highest tier name 'rack' matches no tier (tiers: 1=leaf, 2=spine) "
                              "(soft mode: placed without that limit)")
    # a sub-group's soft limit too, named as its policy
    policy = {"name": "tp", "matchLabelKeys": ["part"], "networkTopology": {"mode": "soft", "highestTierName": "rail"}}
    state = _volcano_state({"mode": "hard", "highestTierAllowed": 2}, policy)
    [view] = podgroups.collect(state)
    placed = decide(state, build(TREE), view)
    assert placed.ok and placed.warning.startswith("subGroupPolicy 'tp': highest tier name 'rail' matches no tier")
    # a known name or hard mode: nothing to warn about on a placed gang
    state = _volcano_state({"mode": "soft", "highestTierName": "leaf"})
    [view] = podgroups.collect(state)
    assert decide(state, build(TREE), view).warning == ""
