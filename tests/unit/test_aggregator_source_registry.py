"""The Source protocol and its one list: options, loading, the graph build, live refreshes.

A source written only against aggregator.sources.Source must plug into `render`'s graph build and
the live feed without changes to the pipeline or the feed; these tests prove that with sources
defined here, and that the built-in ones load from the options the list adds.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from aggregator_fabric import ibnetdiscover_dump

from agent.cluster_model import load_model
from agent.common.report import report_spec
from agent.model_probe import report_for
from aggregator.graph import FabricGraph
from aggregator.live.feed import PipelineFeed
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.registry import SOURCES, add_source_arguments, load_sources
from aggregator.sources import Cluster, OptionError, Source, SourceError
from aggregator.sources.ibnetdiscover import Dumps
from aggregator.sources.model import ModelFile
from aggregator.sources.nodetopology import NodeReports

MODELS = Path(__file__).parent.parent / "models"
MODEL = load_model(str(MODELS / "small-tree.yaml"))
NODES = sorted(MODEL.nodes())


class ExtraSpine(Source):
    """A toy source: declares one more switch above every leaf switch the graph already knows."""

    name = "extra-spine"

    def __init__(self, spine: str) -> None:
        self.spine = spine

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        parser.add_argument("--extra-spine")

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> ExtraSpine | None:
        return cls(options.extra_spine) if options.extra_spine else None

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        for node in sorted(cluster.reports):
            for switch in sorted(graph.attached_switches(node)):
                graph.add_uplink(switch, self.spine)


class Polled(Source):
    """A toy live source: its 'poller' is the test, which sets `latest` and `failing` by hand."""

    name = "polled"

    def __init__(self) -> None:
        self.latest: str | None = None  # the poller's last good fact: a spine above the leaves
        self.generation = 0
        self.failing = False
        self._used = -1
        self._using: str | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        pass

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> Polled | None:
        return cls()

    def refresh(self, now: float) -> bool:
        changed = self.generation != self._used
        self._used, self._using = self.generation, self.latest
        return changed

    def stale(self) -> str | None:
        return "server unreachable; using the last good facts" if self.failing else None

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        if self._using:
            ExtraSpine(self._using).apply(graph, cluster)


def _reports() -> dict[str, Any]:
    return {n: report_for(MODEL, n) for n in NODES}


def _kinds(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {o["metadata"]["name"]: o["spec"]["tierName"] for o in objects}


def test_a_source_defined_outside_the_package_contributes_facts_to_the_graph_build() -> None:
    reports = _reports()
    without = Pipeline().compute(ClusterInputs(reports, sources=(NodeReports(),)), now=0)
    with_extra = Pipeline().compute(
        ClusterInputs(reports, sources=(NodeReports(), ExtraSpine("sp-x"))), now=0
    )
    assert "spine-sp-x" not in _kinds(without.hypernodes)
    assert _kinds(with_extra.hypernodes)["spine-sp-x"] == "spine"
    top = next(o for o in with_extra.hypernodes if o["metadata"]["name"] == "spine-sp-x")
    assert top["status"]["nodeCount"] == len(NODES)


def test_node_reports_become_facts_even_when_the_sources_leave_them_out() -> None:
    inputs = ClusterInputs(_reports(), sources=(ExtraSpine("sp-x"),))
    assert isinstance(inputs.all_sources()[0], NodeReports)
    assert "spine-sp-x" in _kinds(Pipeline().compute(inputs, now=0).hypernodes)


def test_sources_and_the_shorthand_fields_do_not_mix() -> None:
    with pytest.raises(ValueError, match="not both"):
        ClusterInputs({}, model=MODEL, sources=(NodeReports(),))


def test_the_shorthand_and_the_loaded_sources_render_the_same_tree(tmp_path: Path) -> None:
    dump = tmp_path / "fabric.topo"
    dump.write_text(ibnetdiscover_dump(MODEL))
    parser = argparse.ArgumentParser()
    add_source_arguments(parser, live=False)
    options = parser.parse_args(["--ibnetdiscover", str(dump), "--model", str(MODELS / "small-tree.yaml")])
    loaded = load_sources(options, live=False)
    assert [type(s) for s in loaded] == [NodeReports, ModelFile, Dumps]
    reports = _reports()
    by_options = Pipeline().compute(ClusterInputs(reports, sources=loaded), now=0)
    shorthand = ClusterInputs(reports, model=MODEL, fabric=loaded[2].fabric)  # type: ignore[attr-defined]
    assert Pipeline().compute(shorthand, now=0).hypernodes == by_options.hypernodes


def test_every_listed_source_adds_options_that_load_back_to_nothing_when_unused() -> None:
    for live in (False, True):
        parser = argparse.ArgumentParser()
        add_source_arguments(parser, live=live)
        loaded = load_sources(parser.parse_args([]), live=live)
        assert [type(s) for s in loaded] == [NodeReports]  # reports always become facts
    assert NodeReports in SOURCES and len(set(SOURCES)) == len(SOURCES)


def test_bad_option_values_and_bad_files_raise_the_errors_the_command_line_maps(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_source_arguments(parser, live=True)
    with pytest.raises(OptionError, match="--fabric-interfaces"):
        load_sources(parser.parse_args(["--fabric-interfaces", "[ib"]), live=True)
    broken = tmp_path / "broken.topo"
    broken.write_text("vendid=0x2c9\nnot a dump line\n")
    with pytest.raises(SourceError, match=r"line 2: .*broken\.topo"):
        load_sources(parser.parse_args(["--ibnetdiscover", str(broken)]), live=True)


def _topologies() -> dict[str, dict[str, Any]]:
    return {
        n: {"metadata": {"name": n, "resourceVersion": "1"}, "spec": report_spec(r)}
        for n, r in _reports().items()
    }


def _nodes() -> dict[str, dict[str, Any]]:
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    return {n: {"metadata": {"name": n}, "status": ready} for n in NODES}


def test_a_live_source_refreshes_the_feed_and_reports_staleness_keeping_its_last_facts() -> None:
    polled = Polled()
    feed = PipelineFeed(Pipeline(), (NodeReports(), polled), resync=10_000)
    topologies, nodes = _topologies(), _nodes()
    first = feed.compute(topologies, nodes, None, now=1)
    assert "spine-sp-new" not in _kinds(first.hypernodes)
    rebuilds = feed.full_rebuilds
    polled.latest, polled.generation = "sp-new", 1  # the poller got new facts
    second = feed.compute(topologies, nodes, None, now=2)
    assert feed.full_rebuilds == rebuilds + 1 and "spine-sp-new" in _kinds(second.hypernodes)
    polled.failing = True  # the server goes away: the poller keeps its last good snapshot
    third = feed.compute(topologies, nodes, None, now=3)
    assert feed.full_rebuilds == rebuilds + 1  # nothing changed: no rebuild
    assert "spine-sp-new" in _kinds(third.hypernodes)
    assert any(w.startswith("source polled: server unreachable") for w in third.warnings)
    polled.failing = False
    assert not any("polled" in w for w in feed.compute(topologies, nodes, None, now=4).warnings)
