"""The pipeline the controller drives: full compute, the one-node fast path, hold-down, labels."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from aggregator_fabric import ibnetdiscover_dump

from agent.cluster_model import load_model
from agent.common.report import ComponentHealth, Health, NodeReport
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Desired, Pipeline
from aggregator.sources import ibnetdiscover

MODEL = load_model(str(Path(__file__).parent.parent / "models" / "mixed-depth.yaml"))
FABRIC = ibnetdiscover.parse(ibnetdiscover_dump(MODEL))
REPORTS = {n: report_for(MODEL, n) for n in MODEL.nodes()}
RACK1 = "gb1-01"


def _inputs(**changes: Any) -> ClusterInputs:
    base = ClusterInputs(
        reports=REPORTS,
        node_ready=dict.fromkeys(REPORTS, True),
        agent_ready=dict.fromkeys(REPORTS, True),
        fabric=FABRIC,
    )
    return dataclasses.replace(base, **changes)


def _failed(report: NodeReport) -> NodeReport:
    return dataclasses.replace(
        report, health={**report.health, "nvml": ComponentHealth(Health.FAILED, "GPU 2: NVLink 7 down")}
    )


def _ready(desired: Desired) -> dict[str, str]:
    return {o["metadata"]["name"]: o["status"]["conditions"][0]["status"] for o in desired.hypernodes}


def _domains_of(desired: Desired, node: str) -> set[str]:
    return set(desired.node_labels[node].values())


def test_one_failing_node_changes_only_its_own_hypernodes() -> None:
    pipeline = Pipeline()
    first = pipeline.compute(_inputs(), now=100)
    assert set(_ready(first).values()) == {"True"}
    update = pipeline.update_report(RACK1, _failed(REPORTS[RACK1]), now=101)
    mine = _domains_of(first, RACK1)
    assert update.changed == mine and len(mine) == 3  # rack (nvlink), spine, core
    assert {n for n, s in _ready(update).items() if s == "False"} == mine
    assert update.unhealthy_nodes == {RACK1}
    rack = next(
        o for o in update.hypernodes if o["spec"]["tierName"] == "nvlink" and o["metadata"]["name"] in mine
    )
    condition = rack["status"]["conditions"][0]
    assert (
        condition["reason"] == "NVLinkFailed"
        and "gb1-01: NVLink failed: GPU 2: NVLink 7 down" in condition["message"]
    )


def test_an_unchanged_report_changes_nothing() -> None:
    pipeline = Pipeline()
    pipeline.compute(_inputs(), now=100)
    assert pipeline.update_report(RACK1, REPORTS[RACK1], now=101).changed == frozenset()


def test_recompute_after_fast_path_gives_the_same_objects() -> None:
    pipeline = Pipeline()
    pipeline.compute(_inputs(), now=100)
    fast = pipeline.update_report(RACK1, _failed(REPORTS[RACK1]), now=101)
    other = Pipeline()
    other.compute(_inputs(), now=100)
    full = other.compute(_inputs(reports={**REPORTS, RACK1: _failed(REPORTS[RACK1])}), now=101)
    assert full.changed == fast.changed
    assert fast.hypernodes == full.hypernodes


def test_hold_down_delays_ready_false_until_the_failure_persists() -> None:
    pipeline = Pipeline(hold_down_seconds=5)
    pipeline.compute(_inputs(), now=100)
    held = pipeline.update_report(RACK1, _failed(REPORTS[RACK1]), now=101)
    assert held.changed == frozenset() and held.next_deadline == 106
    assert pipeline.refresh(now=105).changed == frozenset()
    due = pipeline.refresh(now=106)
    assert len(due.changed) == 3 and "False" in _ready(due).values()
    stamps = {
        o["status"]["conditions"][0]["lastTransitionTime"]
        for o in due.hypernodes
        if o["metadata"]["name"] in due.changed
    }
    assert stamps == {"1970-01-01T00:01:46Z"}


def test_a_stale_agent_makes_its_domains_unknown() -> None:
    pipeline = Pipeline()
    first = pipeline.compute(_inputs(), now=100)
    update = pipeline.update_node("hgx03", 101, agent_ready=False)
    assert {n for n, s in _ready(update).items() if s == "Unknown"} == _domains_of(first, "hgx03")
    assert update.unhealthy_nodes == frozenset()  # unknown is not unhealthy: no taint
    back = pipeline.update_node("hgx03", 102, agent_ready=True)
    assert set(_ready(back).values()) == {"True"} and back.changed == _domains_of(first, "hgx03")


def test_node_not_ready_is_an_unhealthy_member() -> None:
    pipeline = Pipeline(ready_threshold=1)
    pipeline.compute(_inputs(), now=100)
    one = pipeline.update_node("hgx05", 101, node_ready=False)
    assert one.unhealthy_nodes == {"hgx05"} and set(_ready(one).values()) == {"True"}  # 1 tolerated
    two = pipeline.update_node("hgx06", 102, node_ready=False)
    assert _ready(two)["leaf-leaf-hgx2"] == "False"


def test_node_labels_name_every_tier_the_node_is_in() -> None:
    desired = Pipeline().compute(_inputs(), now=100)
    assert desired.tree is not None and desired.tree.tiers == ("nvlink", "leaf", "spine", "core")
    assert set(desired.node_labels["hgx01"]) == {
        "hypertopo.io/leaf",
        "hypertopo.io/spine",
        "hypertopo.io/core",
    }
    assert set(desired.node_labels[RACK1]) == {
        "hypertopo.io/nvlink",
        "hypertopo.io/spine",
        "hypertopo.io/core",
    }
    assert (
        desired.node_labels["hgx01"]["hypertopo.io/core"] == desired.node_labels[RACK1]["hypertopo.io/core"]
    )


def test_a_recabled_node_rebuilds_the_tree() -> None:
    pipeline = Pipeline()
    pipeline.compute(_inputs(fabric=None), now=100)  # cabling from the reports' LLDP only
    neighbour = dataclasses.replace(REPORTS["hgx01"].lldp[0], system_name="leaf-hgx2")
    moved = dataclasses.replace(REPORTS["hgx01"], lldp=(neighbour,))
    update = pipeline.update_report("hgx01", moved, now=101)
    counts = {o["metadata"]["name"]: o["status"]["nodeCount"] for o in update.hypernodes}
    assert (counts["leaf-leaf-hgx1"], counts["leaf-leaf-hgx2"]) == (3, 5)
    assert {"leaf-leaf-hgx1", "leaf-leaf-hgx2"} <= update.changed
    assert update.node_labels["hgx01"]["hypertopo.io/leaf"] == "leaf-leaf-hgx2"


def test_a_deleted_report_leaves_the_node_in_place_but_unknown() -> None:
    pipeline = Pipeline()
    first = pipeline.compute(_inputs(), now=100)
    update = pipeline.update_report("hgx02", None, now=101)
    # the fabric dump still places the node (its HCA description names it); its health is unknown
    assert update.node_labels["hgx02"] == first.node_labels["hgx02"]
    assert {n for n, s in _ready(update).items() if s == "Unknown"} == _domains_of(first, "hgx02")
    leaf = next(o for o in update.hypernodes if o["metadata"]["name"] == "leaf-leaf-hgx1")
    assert leaf["status"]["conditions"][0]["reason"] == "ReportsMissing"


def test_fast_path_needs_a_first_compute() -> None:
    with pytest.raises(RuntimeError):
        Pipeline().update_report("n1", None, now=0)
