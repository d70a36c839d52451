"""A loaded NodeReports source re-reads a report only when it is a new object: a rebuild over the
same parsed reports (a node joining, a resync) reuses their facts, while a changed report, however
small the change, gives fresh facts, and a node gone is forgotten."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agent.cluster_model import load_model
from agent.model_probe import report_for
from aggregator.graph import FabricGraph
from aggregator.pipeline import ClusterInputs
from aggregator.sources import nodetopology
from aggregator.sources.nodetopology import NodeReports

MODEL = load_model(str(Path(__file__).parent.parent / "models" / "nvl72-racks.yaml"))


def _graph(source: NodeReports, reports: dict) -> FabricGraph:  # type: ignore[type-arg]
    graph = FabricGraph()
    source.apply(graph, ClusterInputs(reports=reports))
    return graph


def test_a_rebuild_over_the_same_reports_reads_none_of_them_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    reports = {n: report_for(MODEL, n) for n in MODEL.nodes()[:6]}
    source = NodeReports()
    first = _graph(source, reports)
    read: list[str] = []
    real = nodetopology.facts_of
    monkeypatch.setattr(nodetopology, "facts_of", lambda r, p=None: read.append(r.node_name) or real(r, p))
    again = _graph(source, dict(reports))
    assert read == [] and again.facts == first.facts


def test_a_changed_report_gives_fresh_facts_and_a_gone_node_is_forgotten() -> None:
    names = MODEL.nodes()[:6]
    reports = {n: report_for(MODEL, n) for n in names}
    source = NodeReports()
    before = _graph(source, reports)
    moved = names[0]
    reports[moved] = dataclasses.replace(reports[moved], lldp=reports[moved].lldp[:-1])  # one cable lost
    del reports[names[1]]
    after = _graph(source, reports)
    assert after.facts[moved] == nodetopology.facts_of(reports[moved])
    assert after.facts[moved].switches < before.facts[moved].switches
    assert source.facts(reports[moved]) is after.facts[moved]
    assert names[1] not in after.facts and names[1] not in source._facts and names[1] not in source._reports
