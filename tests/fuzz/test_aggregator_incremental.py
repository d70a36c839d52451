"""Incremental tier inference: after any sequence of node changes (health, cabling, NVLink clique,
Node and agent readiness), the pipeline's fast paths render exactly what a full recompute of the
same inputs renders: the same HyperNodes (condition timestamps aside: a fresh pipeline has no
history), node labels, unhealthy and degraded members, and tree warnings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aggregator_changes import Cluster, changes, sources, without_times
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cluster_model import ClusterModel, load_model
from aggregator.pipeline import ClusterInputs, Desired, Pipeline
from aggregator.sources import Source
from aggregator.sources.model import ModelFile
from aggregator.sources.nodetopology import NodeReports

MODELS = Path(__file__).parent.parent / "models"
MIXED = load_model(str(MODELS / "mixed-depth.yaml"))  # NVL72 racks beside HGX leaves, a core
RACKS = load_model(str(MODELS / "nvl72-racks.yaml"))  # two racks per leaf
INCREMENTAL = ("health", "recable", "nvlink", "ready", "agent")  # what the pipeline's fast paths take


def _inputs(cluster: Cluster, found: tuple[Source, ...]) -> ClusterInputs:
    return ClusterInputs(
        reports=dict(cluster.reports),
        node_ready=dict(cluster.node_ready),
        node_labels={n: dict(v) for n, v in cluster.labels.items()},
        agent_ready=dict(cluster.agent_ready),
        sources=found,
    )


def _same_as_full(incremental: Desired, cluster: Cluster, found: tuple[Source, ...]) -> None:
    full = Pipeline().compute(_inputs(cluster, found), now=0)
    assert list(without_times(incremental.hypernodes)) == list(without_times(full.hypernodes))
    assert incremental.node_labels == full.node_labels
    assert incremental.unhealthy_nodes == full.unhealthy_nodes
    assert incremental.degraded_nodes == full.degraded_nodes
    assert incremental.tree is not None and full.tree is not None
    assert dict(incremental.tree.uncabled) == dict(full.tree.uncabled)
    assert incremental.tree.dropped == full.tree.dropped and incremental.tree.tiers == full.tree.tiers


def _apply(pipeline: Pipeline, cluster: Cluster, change: tuple[str, str, Any], now: float) -> Desired:
    node = cluster.apply(change)
    if change[0] in ("ready", "agent"):
        return pipeline.update_node(
            node, now, node_ready=cluster.node_ready[node], agent_ready=cluster.agent_ready[node]
        )
    return pipeline.update_report(node, cluster.reports[node], now)


def _run(model: ClusterModel, found: tuple[Source, ...], sequence: list[tuple[str, str, Any]]) -> None:
    cluster = Cluster.of(model)
    pipeline = Pipeline()
    desired = pipeline.compute(_inputs(cluster, found), now=0)
    for i, change in enumerate(sequence, start=1):
        desired = _apply(pipeline, cluster, change, now=float(i))
    assert pipeline.full_computes == 1  # every change took a fast path
    _same_as_full(desired, cluster, found)


def _incremental(model: ClusterModel) -> st.SearchStrategy[list[tuple[str, str, Any]]]:
    return st.lists(changes(model, INCREMENTAL), min_size=1, max_size=10)


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(sequence=_incremental(MIXED))
def test_discovered_fabric_incremental_equals_full_recompute(sequence: list[tuple[str, str, Any]]) -> None:
    _run(MIXED, sources(MIXED), sequence)


@SETTINGS
@given(sequence=_incremental(RACKS))
def test_modelled_fabric_incremental_equals_full_recompute(sequence: list[tuple[str, str, Any]]) -> None:
    _run(RACKS, (NodeReports(), ModelFile(RACKS)), sequence)


@pytest.mark.parametrize(
    "change",
    [
        ("recable", "hgx01", "leaf-hgx2"),  # to the other HGX leaf: a class that exists already
        ("recable", "gb1-05", "leaf-new"),  # to a leaf nobody else uses: a new leaf domain
        ("nvlink", "gb1-03", 2),  # into another rack's clique: that NVLink domain spans two leaves
        ("nvlink", "gb2-07", None),  # out of its clique
    ],
)
def test_a_structural_change_rewrites_only_the_hypernodes_it_changes(change: tuple[str, str, Any]) -> None:
    cluster = Cluster.of(MIXED)
    found = sources(MIXED)
    pipeline = Pipeline()
    before = {o["metadata"]["name"]: o for o in pipeline.compute(_inputs(cluster, found), now=0).hypernodes}
    desired = _apply(pipeline, cluster, change, now=1)
    after = {o["metadata"]["name"]: o for o in desired.hypernodes}
    differ = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
    assert desired.changed == differ and differ  # named exactly, and something did change
    assert len(differ) < len(after)  # not a rewrite of everything
    assert pipeline.full_computes == 1  # re-inferred over the classes, not rebuilt
    _same_as_full(desired, cluster, found)
