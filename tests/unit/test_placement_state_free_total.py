"""The schedulable free total that Volcano's queue admission weighs is kept as capacity changes,
and always equals summing every schedulable node's free capacity (each amount floored at 0), the
count the admission made over every node at every cycle before."""

from __future__ import annotations

import random
from typing import Any

from aggregator.placement.core.resources import Resources
from aggregator.placement.live.state import ClusterState


def _node(name: str, gpus: int, cpu: int, unschedulable: bool) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"unschedulable": unschedulable} if unschedulable else {},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": str(cpu), "memory": "64Gi", "pods": "4"}}}


def _pod(name: str, node: str, gpus: int, cpu: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": name},
            "spec": {"schedulerName": "someone-else", "nodeName": node,
                     "containers": [{"name": "c", "resources": {"requests": {
                         "nvidia.com/gpu": str(gpus), "cpu": str(cpu), "memory": "8Gi"}}}]}}


def _summed(state: ClusterState) -> Resources:
    total = Resources()
    for name, free in state.free().items():
        if not (state.nodes[name].get("spec") or {}).get("unschedulable"):
            total += Resources(max(free.gpus, 0), max(free.cpu_milli, 0), max(free.memory, 0), max(free.pods, 0))
    return total


def test_the_kept_total_equals_the_sum_over_nodes_through_random_changes() -> None:
    rng = random.Random(5)
    state = ClusterState("hypertopo")
    names = [f"n{i}" for i in range(6)]
    pods: dict[str, str] = {}
    checked = overcommitted = 0
    for step in range(2000):
        roll = rng.random()
        if roll < 0.3:  # a node comes, changes allocatable, or is cordoned / uncordoned
            state.apply("Node", "MODIFIED", _node(rng.choice(names), rng.choice((0, 4, 8)), rng.choice((2, 16)),
                                                  rng.random() < 0.3))
        elif roll < 0.35 and state.nodes:
            gone = rng.choice(sorted(state.nodes))
            state.apply("Node", "DELETED", {"metadata": {"name": gone}})
        elif roll < 0.75:  # pods bind, over-committing nodes at times (floored in the total)
            name = f"p{step}"
            pods[name] = rng.choice(names)
            state.apply("Pod", "ADDED", _pod(name, pods[name], rng.choice((0, 2, 8)), rng.choice((1, 4))))
        elif pods:
            name = rng.choice(sorted(pods))
            state.apply("Pod", "DELETED", _pod(name, pods.pop(name), 0, 0))
        assert state.free_total == _summed(state), step
        checked += bool(state.nodes)
        overcommitted += any(f.gpus < 0 or f.cpu_milli < 0 for f in state.free().values())
    assert checked > 1500 and overcommitted > 100  # the flooring and cordoning were really exercised
