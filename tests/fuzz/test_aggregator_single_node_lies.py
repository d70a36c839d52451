"""One node's report can move only that node (issue 22): the attacks tried against the shipped
models, each defeated through `render` or the pipeline, and a seeded property over every model,
every way of knowing the fabric and random lies of one report, through a full build and through
the live controller's fast path."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from aggregator_fabric import ibnetdiscover_dump, nodes_below
from prometheus_client import CollectorRegistry
from report_lies import LIES, fabric_sources, host_tables, lie, others_moved, reports_of
from ufm_standin import Fault, listings

from agent.cluster_model import ClusterModel, load_model
from agent.common.report import ComponentHealth, Health, NodeReport, node_topology_object
from aggregator.adapters.ufm import UfmSource
from aggregator.cli import main
from aggregator.crosscheck import (
    DUPLICATE_GUID,
    LLDP_DISPUTED,
    NODE_NAME_MISMATCH,
    NVLINK_OUTLIER,
    SWITCH_TABLE_UNCONFIRMED,
)
from aggregator.graph import Finding
from aggregator.live.controller import Controller, Options
from aggregator.live.metrics import AggregatorMetrics
from aggregator.live.refusals import Refusals
from aggregator.pipeline import ClusterInputs, Desired, Pipeline
from aggregator.sources import ufm
from aggregator.sources.ibnetdiscover import HostNames
from aggregator.sources.nodetopology import NodeReports
from aggregator.sources.switch_lldp import SwitchNeighbour, SwitchTable, SwitchTables

MODELS = Path(__file__).parent.parent / "models"
NOW = 1_700_000_000


def _model(name: str) -> ClusterModel:
    return load_model(str(MODELS / f"{name}.yaml"))


def _render(tmp_path: Path, reports: dict[str, NodeReport], *args: str, capsys: Any) -> tuple[list[dict[str, Any]], str]:
    """`render` over the reports (a List of NodeTopology objects, each under its own object name)."""
    items = []
    for name, report in reports.items():
        obj = node_topology_object(report)
        obj["metadata"]["name"] = name
        items.append(obj)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "reports.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    assert main(["render", "--reports", str(path), "--format", "json", *args]) == 0
    out, err = capsys.readouterr()
    return json.loads(out)["items"], err


def _shapes(objects: list[dict[str, Any]]) -> dict[str, tuple[str, int, frozenset[str]]]:
    below = nodes_below(objects)
    return {o["metadata"]["name"]: (o["spec"]["tierName"], o["spec"]["tier"], below[o["metadata"]["name"]]) for o in objects}


def _condition(obj: dict[str, Any], kind: str) -> str:
    return next(c["status"] for c in obj["status"]["conditions"] if c["type"] == kind)


def _lowest(objects: list[dict[str, Any]], node: str) -> dict[str, Any]:
    below = nodes_below(objects)
    return min((o for o in objects if node in below[o["metadata"]["name"]]), key=lambda o: len(below[o["metadata"]["name"]]))


def _findings(desired: Desired, reason: str) -> set[str]:
    return {f.node for f in desired.findings if f.reason == reason}


# -- issue 22.1: a report filed under another node's name -----------------------------------------


def test_a_report_naming_another_node_is_ignored_in_render_and_said(tmp_path: Path, capsys: Any) -> None:
    model = _model("small-tree")
    reports = reports_of(model)
    before, _ = _render(tmp_path / "a", reports, capsys=capsys)
    failed = {**reports["node01"].health, "rdma": ComponentHealth(Health.FAILED, "port down")}
    reports["node05"] = dataclasses.replace(reports["node01"], health=failed)  # node05's object, node01's spec
    after, err = _render(tmp_path / "b", reports, capsys=capsys)
    assert {k: v for k, v in _shapes(after).items()} == {
        name: (tier_name, tier, nodes - {"node05"}) for name, (tier_name, tier, nodes) in _shapes(before).items()
    }  # node01 stays in its leaf, node05 (no report it may be judged by) is placed by nothing
    leaf1 = _lowest(after, "node01")
    assert _condition(leaf1, "Ready") == "True"  # node01 not shown failed by another's report
    assert "NodeTopology node05: spec.nodeName is 'node01'" in err


def test_the_live_pipeline_ignores_a_report_naming_another_node_on_every_path() -> None:
    model = _model("small-tree")
    reports = reports_of(model)
    ready = dict.fromkeys(reports, True)
    pipeline = Pipeline()
    honest = pipeline.compute(ClusterInputs(reports, node_ready=ready), NOW)
    liar = dataclasses.replace(reports["node01"], lldp=reports["node05"].lldp)
    for desired in (
        pipeline.update_report("node05", liar, NOW + 1),  # the watch event: the fast path
        Pipeline().compute(ClusterInputs({**reports, "node05": liar}, node_ready=ready), NOW),  # a resync
    ):
        assert _findings(desired, NODE_NAME_MISMATCH) == {"node05"}
        assert others_moved(honest.hypernodes, desired.hypernodes, "node05") == (set(), set())
        assert all("node05" not in nodes for _, _, nodes in _shapes(desired.hypernodes).values())
    healed = pipeline.update_report("node05", reports["node05"], NOW + 2)
    assert not healed.findings and _shapes(healed.hypernodes) == _shapes(honest.hypernodes)


# -- issue 22.2: the attacks ----------------------------------------------------------------------


@pytest.mark.parametrize("known_by", [(), ("--model",)])
def test_a_node_claiming_another_racks_clique_keeps_the_other_nodes_leaves(
    tmp_path: Path, capsys: Any, known_by: tuple[str, ...]
) -> None:
    model = _model("nvl72-racks")
    reports = reports_of(model)
    extra = [*known_by, str(MODELS / "nvl72-racks.yaml")] if known_by else []
    before, _ = _render(tmp_path / "a", reports, *extra, capsys=capsys)
    reports["gb-c01"] = dataclasses.replace(reports["gb-c01"], nvml=reports["gb-a01"].nvml)  # rack1's clique
    after, err = _render(tmp_path / "b", reports, *extra, capsys=capsys)
    assert others_moved(before, after, "gb-c01") == (set(), set())
    assert {s[0] for s in _shapes(after).values()} == {s[0] for s in _shapes(before).values()}  # no leaf dropped
    assert "partly overlap" not in err and "gb-c01: its report names NVLink clique" in err
    assert _condition(_lowest(after, "gb-c01"), "FabricDegraded") == "True"  # a finding on the liar
    assert _condition(_lowest(after, "gb-a01"), "FabricDegraded") == "False"


@pytest.mark.parametrize("source", ["--ibnetdiscover", "--ufm-json", "--model"])
def test_a_node_claiming_another_leafs_neighbour_is_outvoted_by_the_fabric(
    tmp_path: Path, capsys: Any, source: str
) -> None:
    model = _model("fat-tree-3tier")
    files = {"--ibnetdiscover": ("fabric.topo", ibnetdiscover_dump(model)),
             "--ufm-json": ("ufm.json", json.dumps(listings(model)))}  # fmt: skip
    if source == "--model":
        path = MODELS / "fat-tree-3tier.yaml"
    else:
        name, text = files[source]
        path = tmp_path / name
        path.write_text(text)
    reports = reports_of(model)
    before, _ = _render(tmp_path / "a", reports, source, str(path), capsys=capsys)
    liar = next(n for n in reports if n != "h001" and reports[n].lldp[0].system_name != reports["h001"].lldp[0].system_name)
    reports[liar] = dataclasses.replace(reports[liar], lldp=(*reports[liar].lldp, *reports["h001"].lldp))
    after, err = _render(tmp_path / "b", reports, source, str(path), capsys=capsys)
    assert _shapes(after) == _shapes(before)  # the core and both spines stay, the liar where the fabric says
    assert f"node {liar}: its report hears" in err
    assert _condition(_lowest(after, liar), "FabricDegraded") == "True"
    assert _condition(_lowest(after, "h001"), "FabricDegraded") == "False"


def test_a_node_copying_anothers_guids_takes_over_no_ufm_cable() -> None:
    model = _model("rail-8")
    reports = reports_of(model)
    victim, liar = "su2-n2", "su1-n1"
    ufm_down = listings(model, faults={(victim, 0): Fault("down")})  # the victim's cable, seen by UFM only

    def build(reports: dict[str, NodeReport]) -> Desired:
        source = UfmSource(None, HostNames(), facts=ufm.from_listings(ufm_down))
        return Pipeline().compute(ClusterInputs(reports, node_ready=dict.fromkeys(reports, True),
                                                sources=(NodeReports(), source)), NOW)  # fmt: skip

    honest = build(reports)
    lied = build({**reports, liar: dataclasses.replace(reports[liar], rdma=reports[victim].rdma)})
    assert _shapes(lied.hypernodes) == _shapes(honest.hypernodes)
    assert victim in lied.unhealthy_nodes and liar not in lied.unhealthy_nodes  # the fault stays the victim's
    assert _findings(lied, DUPLICATE_GUID) == {victim, liar}  # refused for both, reported


def test_a_host_announcing_anothers_name_moves_nobody_on_switch_tables() -> None:
    model = _model("fat-tree-3tier")
    reports = reports_of(model)
    tables = list(host_tables(model))
    victim = "h001"
    victim_leaf = reports[victim].lldp[0].system_name
    other = next(i for i, t in enumerate(tables) if t.switch.endswith("leaf2") and t.switch != victim_leaf)
    impostor = SwitchNeighbour("swp99", victim, "ib0", False)  # a host's lldpd announcing h001's name
    forged = [*tables[:other], SwitchTable(tables[other].switch, (*tables[other].neighbours, impostor)), *tables[other + 1:]]

    def build(found: list[SwitchTable]) -> Desired:
        return Pipeline().compute(ClusterInputs(reports, node_ready=dict.fromkeys(reports, True),
                                                sources=(NodeReports(), SwitchTables(found))), NOW)  # fmt: skip

    honest, lied = build(tables), build(forged)
    assert _shapes(lied.hypernodes) == _shapes(honest.hypernodes)  # h001 still in its own leaf
    assert _findings(lied, SWITCH_TABLE_UNCONFIRMED) == {victim}
    assert victim not in lied.degraded_nodes  # a forged frame is no fault of the victim


def test_each_refusal_says_which_node_and_what() -> None:
    model = _model("nvl72-racks")
    reports = reports_of(model)
    reports["gb-c01"] = dataclasses.replace(reports["gb-c01"], nvml=reports["gb-a01"].nvml)
    desired = Pipeline().compute(ClusterInputs(reports, node_ready=dict.fromkeys(reports, True)), NOW)
    assert _findings(desired, NVLINK_OUTLIER) == {"gb-c01"} and not _findings(desired, LLDP_DISPUTED)
    assert desired.degraded_nodes == {"gb-c01"}
    assert any(w.startswith("node gb-c01: its report names NVLink clique") for w in desired.warnings)


# -- the property ---------------------------------------------------------------------------------

LIES_PER_CASE = 10


@pytest.mark.parametrize("model_name", sorted(p.stem for p in MODELS.glob("*.yaml")))
def test_one_lying_report_moves_only_its_own_node(model_name: str) -> None:
    """For every model and source: a random node's report with random lies (seeded), through a full
    build and through the fast path, leaves every HyperNode without that node as it was."""
    model = _model(model_name)
    base = reports_of(model)
    names = sorted(base)
    ready = dict.fromkeys(names, True)
    switches = sorted(set(model.switches) | {b.switch for b in model.blocks})
    told = set()
    for kind, sources in fabric_sources(model).items():
        live = Pipeline()
        before = live.compute(ClusterInputs(base, node_ready=ready, sources=sources), NOW).hypernodes
        rng = random.Random(f"{model_name}/{kind}")
        for i in range(LIES_PER_CASE):
            node = rng.choice(names)
            lied, lies = lie(base[node], [base[n] for n in names if n != node], rng, switches)
            told.update(lies)
            full = Pipeline().compute(ClusterInputs({**base, node: lied}, node_ready=ready, sources=sources), NOW)
            fast = live.update_report(node, lied, NOW + 2 * i + 1)
            for how, after in (("full", full), ("fast", fast)):
                assert others_moved(before, after.hypernodes, node) == (set(), set()), (kind, how, node, lies)
            assert _shapes(fast.hypernodes) == _shapes(full.hypernodes), (kind, node, lies)
            live.update_report(node, base[node], NOW + 2 * i + 2)  # the truth again
    assert len(told) > len(LIES) // 2  # the seeds tell most kinds of lie


def test_refusals_are_counted_once_each_and_standing_ones_exported() -> None:
    model = _model("small-tree")
    reports = reports_of(model)
    lied = {**reports, "node05": reports["node01"]}  # node05's object with node01's spec
    desired = Pipeline().compute(ClusterInputs(lied, node_ready=dict.fromkeys(reports, True)), NOW)
    registry = CollectorRegistry()
    told: list[str] = []
    refusals = Refusals(registry, on_new=lambda f: told.append(f.node))

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"reason": NODE_NAME_MISMATCH})

    assert value("hypertopo_aggregator_reports_refused_total") == 0
    for _ in range(3):  # three reconciles of the same inputs
        refusals.observe(desired.findings)
    assert value("hypertopo_aggregator_reports_refused_total") == 1
    assert value("hypertopo_aggregator_refused_claims") == 1
    assert told == ["node05"]  # one event for the refused report, not one per reconcile
    refusals.observe(())  # the report fixed
    assert value("hypertopo_aggregator_refused_claims") == 0
    assert value("hypertopo_aggregator_reports_refused_total") == 1


def test_the_controller_writes_one_warning_event_on_a_refused_nodetopology() -> None:
    posted: list[dict[str, Any]] = []
    written = threading.Event()

    class Kube:  # the one call the refusal makes of the API
        def create_event(self, namespace: str, body: dict[str, Any]) -> None:
            posted.append(body)
            written.set()

    controller = Controller(Kube(), lambda *_: None, options=Options(), metrics=AggregatorMetrics())  # type: ignore[arg-type]
    refused = Finding("node05", NODE_NAME_MISMATCH, "NodeTopology node05: spec.nodeName is 'node01' ...")
    for _ in range(3):  # three reconciles
        controller.refusals.observe([refused])
    assert written.wait(10)
    controller.stop()  # the event pool drained
    assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"], e["type"]) for e in posted] == [
        ("NodeTopology", "node05", "ReportRefused", "Warning")
    ]
