"""Round trip: a modelled cluster -> each node's agent report (+ the fabric's ibnetdiscover dump)
-> the aggregator -> the HyperNode tree, which must be the tree the model declares."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from aggregator_fabric import expected_tree, ibnetdiscover_dump, nodes_below

from agent.cluster_model import ClusterModel, load_model
from agent.common.report import NodeReport
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import ibnetdiscover, nodetopology

MODELS = Path(__file__).parent.parent / "models"
MODEL_FILES = sorted(MODELS.glob("*.yaml"))


def _tree(objects: list[dict[str, Any]]) -> tuple[set[frozenset[str]], dict[frozenset[str], frozenset[str]]]:
    """(node sets, parent relation) of rendered HyperNodes, resolving members recursively."""
    sets = nodes_below(objects)
    parent = {
        sets[m["selector"]["exactMatch"]["name"]]: sets[o["metadata"]["name"]]
        for o in objects
        for m in o["spec"]["members"]
        if m["type"] == "HyperNode"
    }
    return set(sets.values()), parent


def _render(
    model: ClusterModel, reports: dict[str, NodeReport], *, hosts: bool = True
) -> list[dict[str, Any]]:
    fabric = ibnetdiscover.parse(ibnetdiscover_dump(model, host_descriptions=hosts))
    inputs = ClusterInputs(reports=reports, fabric=fabric)
    return Pipeline().compute(inputs, now=1_700_000_000).hypernodes


@pytest.mark.parametrize("path", MODEL_FILES, ids=[p.stem for p in MODEL_FILES])
def test_model_reports_and_fabric_dump_render_the_declared_tree(path: Path) -> None:
    model = load_model(str(path))
    objects = _render(model, {n: report_for(model, n) for n in model.nodes()})
    assert _tree(objects) == expected_tree(model)
    expect = yaml.safe_load(path.read_text())["expect"]
    tiers = {o["spec"]["tierName"]: o["spec"]["tier"] for o in objects}
    assert tiers == {name: i + 1 for i, name in enumerate(expect["tiers"])}
    for obj in objects:
        assert obj["status"]["nodeCount"] == len(_nodes_of(objects, obj))


def _nodes_of(objects: list[dict[str, Any]], obj: dict[str, Any]) -> set[str]:
    by_name = {o["metadata"]["name"]: o for o in objects}
    out: set[str] = set()
    for m in obj["spec"]["members"]:
        name = m["selector"]["exactMatch"]["name"]
        out |= _nodes_of(objects, by_name[name]) if m["type"] == "HyperNode" else {name}
    return out


@pytest.mark.parametrize("path", MODEL_FILES, ids=[p.stem for p in MODEL_FILES])
def test_fabric_dump_alone_places_nodes_by_their_hca_guids(path: Path) -> None:
    """Reports without LLDP neighbours, a dump whose HCAs name no host: the CA GUIDs the reports
    carry must still place every node."""
    model = load_model(str(path))
    reports = {n: dataclasses.replace(report_for(model, n), lldp=()) for n in model.nodes()}
    for report in reports.values():
        assert not nodetopology.facts_of(report).switches
    assert "mlx5_0" not in ibnetdiscover_dump(model, host_descriptions=False)
    assert _tree(_render(model, reports, hosts=False)) == expected_tree(model)


@pytest.mark.parametrize("path", MODEL_FILES[:3], ids=[p.stem for p in MODEL_FILES[:3]])
def test_fabric_dump_alone_places_nodes_by_their_hca_descriptions(path: Path) -> None:
    """Reports with neither LLDP nor RDMA GUIDs: the HCAs' node descriptions name the hosts."""
    model = load_model(str(path))
    reports = {n: dataclasses.replace(report_for(model, n), lldp=(), rdma=()) for n in model.nodes()}
    assert _tree(_render(model, reports)) == expected_tree(model)
    assert _tree(_render(model, reports, hosts=False)) != expected_tree(model)


def test_parent_relation_is_a_forest_with_one_parent_per_hypernode() -> None:
    model = load_model(str(MODELS / "irregular.yaml"))
    objects = _render(model, {n: report_for(model, n) for n in model.nodes()})
    child_names = Counter(
        m["selector"]["exactMatch"]["name"]
        for o in objects
        for m in o["spec"]["members"]
        if m["type"] == "HyperNode"
    )
    node_names = Counter(
        m["selector"]["exactMatch"]["name"]
        for o in objects
        for m in o["spec"]["members"]
        if m["type"] == "Node"
    )
    assert max(child_names.values()) == 1
    assert max(node_names.values()) == 1
    assert set(node_names) == set(model.nodes())
    tiers = {o["metadata"]["name"]: o["spec"]["tier"] for o in objects}
    for obj in objects:
        for m in obj["spec"]["members"]:
            if m["type"] == "HyperNode":
                assert tiers[m["selector"]["exactMatch"]["name"]] < obj["spec"]["tier"]


def _agent_probe(model_file: Path, node: str) -> NodeReport:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "probe",
            "--model",
            str(model_file),
            "--node",
            node,
            "--format",
            "yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return nodetopology.report_from_object(yaml.safe_load(proc.stdout))


@pytest.mark.parametrize("model_name", ["mixed-depth", "rail-8"])
def test_reports_printed_by_the_agent_cli_equal_the_model_probe_and_render_the_same(model_name: str) -> None:
    path = MODELS / f"{model_name}.yaml"
    model = load_model(str(path))
    nodes = model.nodes()
    chosen = [nodes[0], nodes[len(nodes) // 2], nodes[-1]]
    reports = {n: report_for(model, n) for n in nodes}
    for node in chosen:
        from_cli = _agent_probe(path, node)
        assert from_cli == reports[node]
        reports[node] = from_cli
    assert _tree(_render(model, reports)) == expected_tree(model)
