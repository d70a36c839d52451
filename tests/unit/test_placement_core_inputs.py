"""Placement inputs read from Kubernetes objects: quantities, pod requests, free resources and
HyperNode members given by exact name, regex or labels."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from aggregator.placement.core.gang import Mode, limits_from_annotations
from aggregator.placement.core.resources import (
    QuantityError,
    Resources,
    free_per_node,
    parse_quantity,
    pod_request,
)
from aggregator.placement.core.topology import build


@pytest.mark.parametrize(("text", "value"), [
    ("500m", Decimal("0.5")), ("2", Decimal(2)), ("2Gi", Decimal(2 * 2**30)), ("1e3", Decimal(1000)),
    ("1.5", Decimal("1.5")), ("128974848", Decimal(128974848)), ("129M", Decimal(129_000_000)),
    ("123Mi", Decimal(123 * 2**20)), ("100n", Decimal("1e-7")), (4, Decimal(4)),
])
def test_quantities(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "5X", "--1"])
def test_bad_quantities_are_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def _pod(node: str | None, phase: str = "Running", **requests: str) -> dict[str, Any]:
    return {"spec": {"nodeName": node, "containers": [{"resources": {"requests": requests}}]},
            "status": {"phase": phase}}


def test_pod_request_sums_containers_and_takes_the_largest_init_container() -> None:
    pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": "500m", "nvidia.com/gpu": "4"}}},
                                   {"resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}}],
                    "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
                    "overhead": {"cpu": "100m"}}}
    # containers: 500m + 250m = 750m < init 2000m -> 2000m, + overhead 100m = 2100m
    assert pod_request(pod) == Resources(gpus=4, cpu_milli=2100, memory=2**30, pods=1)


def test_free_resources_subtract_bound_pods_but_not_finished_ones() -> None:
    node = {"metadata": {"name": "n1"},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"}}}
    pods = [_pod("n1", **{"nvidia.com/gpu": "3", "cpu": "4"}), _pod("n1", "Succeeded", **{"nvidia.com/gpu": "5"}),
            _pod(None, **{"nvidia.com/gpu": "1"}), _pod("elsewhere", **{"nvidia.com/gpu": "1"})]
    # 8 - 3 GPUs (the Succeeded pod and the unbound ones do not count); 96000m - 4000m; 110 - 1 pods
    assert free_per_node([node], pods) == {"n1": Resources(5, 92_000, 2**40, 109)}


def test_members_by_regex_and_labels_and_readiness() -> None:
    labels = {"gpu-1": {"rack": "r1"}, "gpu-2": {"rack": "r1"}, "gpu-3": {"rack": "r2"}, "cpu-1": {}}
    objs = [
        {"metadata": {"name": "by-regex"}, "spec": {"tier": 1, "tierName": "leaf", "members": [
            {"type": "Node", "selector": {"regexMatch": {"pattern": "^gpu-[12]$"}}}]}},
        {"metadata": {"name": "by-label"}, "spec": {"tier": 1, "tierName": "leaf", "members": [
            {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "r2"}}}}]},
         "status": {"conditions": [{"type": "Ready", "status": "False"}]}},
        {"metadata": {"name": "top"}, "spec": {"tier": 2, "tierName": "spine", "members": [
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "by-regex"}}},
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "by-label"}}},
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "ghost"}}}]}},
    ]
    topology = build(objs, labels)
    assert topology.domains["by-regex"].nodes == ("gpu-1", "gpu-2")
    assert topology.node_leaf["gpu-3"] == "by-label"
    assert topology.domains["top"].children == ("by-label", "by-regex")
    assert topology.tier_of_name("spine") == 2
    assert topology.node_usable("gpu-1") and not topology.node_usable("gpu-3")
    assert topology.lca(["gpu-1", "gpu-3"]) == "top"
    assert any("ghost" in p for p in topology.problems)


def test_limits_from_annotations() -> None:
    assert limits_from_annotations({"volcano.sh/network-topology-mode": "soft",
                                    "volcano.sh/network-topology-highest-tier": "2"}) == (Mode.SOFT, 2, None)
    assert limits_from_annotations({"hypertopo.io/highest-tier-name": "leaf"}) == (Mode.HARD, None, "leaf")
    assert limits_from_annotations({"volcano.sh/network-topology-highest-tier": "x"}) == (Mode.HARD, None, None)
