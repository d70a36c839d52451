"""Tiers on odd-shaped fabrics, from links that carry no direction (an ibnetdiscover dump).

A leaf cabled straight to a core beside leaf -> spine -> core pods, an NVL72 rack on the core
(Volcano's mixed-depth case), a second core that only some pods reach, leaves without hosts: the
dump must give exactly the HyperNodes the model (whose links are directed) gives for the same
fabric, and names must hold while nodes join and leave.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aggregator_fabric import ibnetdiscover_dump, nodes_below

from agent.cluster_model import ClusterModel, load_model, parse_model
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import ibnetdiscover

MODELS = Path(__file__).parent.parent / "models"
NOW = 1_700_000_000
IDENTITY = "hypertopo.io/domain-identity"


def _objects(inputs: ClusterInputs) -> list[dict[str, Any]]:
    return Pipeline().compute(inputs, now=NOW).hypernodes


def _from_dump(model: ClusterModel, extra_cables: Iterable[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    fabric = ibnetdiscover.parse(ibnetdiscover_dump(model, extra_cables=tuple(extra_cables)))
    return _objects(ClusterInputs(reports={n: report_for(model, n) for n in model.nodes()}, fabric=fabric))


def _from_model(model: ClusterModel) -> list[dict[str, Any]]:
    return _objects(ClusterInputs(reports={n: report_for(model, n) for n in model.nodes()}, model=model))


def _summary(objects: list[dict[str, Any]]) -> dict[str, tuple[str, int, list[str]]]:
    """name -> (tierName, nodeCount, member names)."""
    return {
        o["metadata"]["name"]: (
            o["spec"]["tierName"],
            o["status"]["nodeCount"],
            [m["selector"]["exactMatch"]["name"] for m in o["spec"]["members"]],
        )
        for o in objects
    }


@pytest.mark.parametrize(
    "model_name",
    ["leaf-on-core", "rack-on-core", "mixed-depth", "irregular", "fat-tree-3tier", "rail-8", "nvl72-racks"],
)
def test_a_dump_gives_the_hypernodes_the_model_gives(model_name: str) -> None:
    model = load_model(str(MODELS / f"{model_name}.yaml"))
    assert _from_dump(model) == _from_model(model)


def test_a_leaf_on_the_core_joins_the_core_beside_the_spines() -> None:
    objects = _summary(_from_dump(load_model(str(MODELS / "leaf-on-core.yaml"))))
    assert objects["core-core1"] == ("core", 14, ["leaf-leafx", "spine-spine1", "spine-spine2"])
    assert objects["spine-spine1"] == ("spine", 6, ["leaf-leaf1", "leaf-leaf2"])
    assert objects["leaf-leafx"] == ("leaf", 2, ["x1", "x2"])


def test_an_nvl72_rack_on_the_core_sits_beside_the_hgx_spine() -> None:
    objects = _from_dump(load_model(str(MODELS / "rack-on-core.yaml")))
    tiers = {o["spec"]["tierName"]: o["spec"]["tier"] for o in objects}
    assert tiers == {"nvlink": 1, "leaf": 2, "spine": 3, "core": 4}
    (core,) = (o for o in objects if o["spec"]["tierName"] == "core")
    members = {
        (m["type"], m["selector"]["exactMatch"]["name"].split("-")[0]) for m in core["spec"]["members"]
    }
    assert members == {("HyperNode", "nvlink"), ("HyperNode", "spine")}
    assert core["status"]["nodeCount"] == 26


# Two cores no model can declare (a switch has one parent there): core2 is cabled to both spines
# and to leafy, core1 to both spines and to leafx, and the cores to each other.
TWO_CORES = parse_model(
    {
        "switches": {
            "core1": {"switches": ["spine1", "spine2", "leafx"]},
            "core2": {"switches": ["leafy"]},
            "spine1": {"switches": ["leaf1", "leaf2"]},
            "spine2": {"switches": ["leaf3", "leaf4"]},
        },
        "blocks": [
            {"switch": s, "nodes": [f"{s}-n[1-2]"]}
            for s in ("leaf1", "leaf2", "leaf3", "leaf4", "leafx", "leafy")
        ],
    }
)
TWO_CORES_CABLES = [("spine1", "core2"), ("spine2", "core2"), ("core1", "core2")]


def test_two_cores_with_leaves_of_their_own_are_one_core_above_both_spines() -> None:
    objects = _from_dump(TWO_CORES, TWO_CORES_CABLES)
    by_tier = {o["spec"]["tierName"]: o for o in objects if o["spec"]["tierName"] == "core"}
    assert {o["spec"]["tierName"] for o in objects} == {"leaf", "spine", "core"}
    core = by_tier["core"]
    assert core["metadata"]["annotations"][IDENTITY] == "core1,core2"
    assert core["status"]["nodeCount"] == 12
    assert sorted(m["selector"]["exactMatch"]["name"] for m in core["spec"]["members"]) == [
        "leaf-leafx",
        "leaf-leafy",
        "spine-spine1",
        "spine-spine2",
    ]
    spines = _summary(o for o in objects if o["spec"]["tierName"] == "spine")  # type: ignore[arg-type]
    assert spines == {
        "spine-spine1": ("spine", 4, ["leaf-leaf1", "leaf-leaf2"]),
        "spine-spine2": ("spine", 4, ["leaf-leaf3", "leaf-leaf4"]),
    }


def test_a_leaf_without_hosts_is_no_core_switch() -> None:
    """irregular.yaml: leaf4 hangs from spineB with no host on it; it is below spineB, so it is in
    no domain (it used to rank above the spines and join the core's identity)."""
    objects = _from_dump(load_model(str(MODELS / "irregular.yaml")))
    identities = {o["spec"]["tierName"]: o["metadata"]["annotations"][IDENTITY] for o in objects}
    assert identities["core"] == "core"
    assert not any("leaf4" in o["metadata"]["annotations"][IDENTITY] for o in objects)


# --- names hold while nodes come and go ----------------------------------------------------------


def _raw(model_name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((MODELS / f"{model_name}.yaml").read_text())
    data.pop("expect", None)
    return data


def _named_sets(raw: dict[str, Any]) -> dict[str, frozenset[str]]:
    """HyperNode name -> the nodes below it, for the model's reports and dump."""
    return nodes_below(_from_dump(parse_model(raw)))


def _without(raw: dict[str, Any], node: str) -> dict[str, Any]:
    model = parse_model(raw)
    blocks = [
        {**block, "nodes": [n for n in model.blocks[i].nodes if n != node]}
        for i, block in enumerate(raw["blocks"])
    ]
    return {**raw, "blocks": blocks}


SHAPES = ["irregular", "leaf-on-core", "rack-on-core", "mixed-depth"]


@pytest.mark.parametrize("model_name", SHAPES)
def test_a_node_joining_any_leaf_keeps_every_name(model_name: str) -> None:
    """The joiner is cabled like the block's nodes (and is a tray of their NVLink rack, if any). It
    may make a new domain (a leaf that was empty), but every existing HyperNode keeps its name and
    its nodes (plus the joiner)."""
    raw = _raw(model_name)
    before = _named_sets(raw)
    for block in raw["blocks"]:
        joiner = {**block, "nodes": ["joiner"]}
        grown = {**raw, "blocks": [*raw["blocks"], joiner]}
        after = _named_sets(grown)
        assert set(before) <= set(after), block["switch"]
        assert {name: after[name] - {"joiner"} for name in before} == before, block["switch"]


@pytest.mark.parametrize("model_name", SHAPES)
def test_a_node_leaving_keeps_every_name_of_the_domains_it_leaves_behind(model_name: str) -> None:
    raw = _raw(model_name)
    before = _named_sets(raw)
    for node in parse_model(raw).nodes():
        after = _named_sets(_without(raw, node))
        assert set(after) <= set(before), node
        assert {name: before[name] - {node} for name in after} == after, node
        assert all(before[name] == {node} for name in set(before) - set(after)), node
