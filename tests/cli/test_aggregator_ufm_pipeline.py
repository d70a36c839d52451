"""UFM as a source of the aggregator's pipeline (aggregator.adapters.ufm.UfmSource, one line in
aggregator.registry.SOURCES): the HyperNodes it gives, from a UFM stand-in on loopback, are the
ones an ibnetdiscover dump of the same fabric gives; a port UFM reports down turns its domains'
Ready False and a slow one FabricDegraded True; an outage keeps the tree and says the source is
stale; before UFM ever answered the source is not ready (the controller waits)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aggregator_fabric import ibnetdiscover_dump
from prometheus_client import CollectorRegistry
from ufm_standin import Fault, UfmStandIn, listings

from agent.cluster_model import ClusterModel, load_model
from agent.model_probe import report_for
from aggregator.adapters.ufm import UfmSource
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.registry import SOURCES, add_source_arguments, load_sources
from aggregator.sources import OptionError, ibnetdiscover

MODELS = Path(__file__).resolve().parent.parent / "models"
RAIL = load_model(str(MODELS / "rail-8.yaml"))


def options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_source_arguments(parser, live=True)
    return parser.parse_args(list(argv))


@pytest.fixture
def ufm_server() -> Iterator[UfmStandIn]:
    with UfmStandIn(listings(RAIL)) as server:
        yield server


def source_for(server: UfmStandIn, tmp_path: Path) -> UfmSource:
    creds = tmp_path / "secret"
    creds.mkdir(exist_ok=True)
    (creds / "username").write_text("admin")
    (creds / "password").write_text("123456")
    [source] = [s for s in load_sources(options("--ufm-url", server.url, "--ufm-credentials", str(creds)), live=True)
                if isinstance(s, UfmSource)]  # fmt: skip
    source.workers(registry=CollectorRegistry())
    return source


def by_name(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects}


def ready(obj: dict[str, Any], kind: str = "Ready") -> str:
    return next(c["status"] for c in obj["status"]["conditions"] if c["type"] == kind)


def inputs(m: ClusterModel, **kw: Any) -> ClusterInputs:
    names = m.nodes()
    return ClusterInputs(reports={n: report_for(m, n) for n in names}, node_ready=dict.fromkeys(names, True), **kw)


def test_ufm_is_one_line_in_the_source_list() -> None:
    assert UfmSource in SOURCES
    assert not any(isinstance(s, UfmSource) for s in load_sources(options(), live=True))  # off without --ufm-url
    parser = argparse.ArgumentParser()
    add_source_arguments(parser, live=False)
    assert "--ufm-url" not in parser.format_help()  # render reads files only


def test_the_pipeline_writes_the_dumps_hypernodes_from_ufm(ufm_server: UfmStandIn, tmp_path: Path) -> None:
    source = source_for(ufm_server, tmp_path)
    assert not source.ready()
    assert source.poller.poll_once() and source.refresh(1.0) and source.ready()
    assert not source.refresh(2.0)  # nothing new
    from_ufm = Pipeline().compute(inputs(RAIL, sources=(source,)), 10.0)
    from_dump = Pipeline().compute(inputs(RAIL, fabric=ibnetdiscover.parse(ibnetdiscover_dump(RAIL))), 10.0)
    assert by_name(from_ufm.hypernodes) == by_name(from_dump.hypernodes)
    assert {o["spec"]["tierName"] for o in from_ufm.hypernodes} == {"leaf", "spine"}
    assert from_ufm.warnings == ()


def test_a_port_down_only_ufm_sees_turns_ready_false_and_a_slow_one_fabric_degraded(
    ufm_server: UfmStandIn, tmp_path: Path
) -> None:
    source = source_for(ufm_server, tmp_path)
    pipeline = Pipeline()
    assert source.poller.poll_once() and source.refresh(1.0)
    healthy = by_name(pipeline.compute(inputs(RAIL, sources=(source,)), 10.0).hypernodes)
    assert {ready(o) for o in healthy.values()} == {"True"}
    ufm_server.set(listings(RAIL, faults={("su2-n3", 5): Fault("down", "switch")}))  # the agent sees nothing
    assert source.poller.poll_once() and source.refresh(20.0)
    after = pipeline.compute(inputs(RAIL, sources=(source,)), 20.0)
    assert by_name(after.hypernodes).keys() == healthy.keys()  # the tree stands
    failed = {n: o for n, o in by_name(after.hypernodes).items() if ready(o) == "False"}
    assert failed and all("su2-n3" in o["status"]["conditions"][0]["message"] for o in failed.values())
    assert {c["reason"] for o in failed.values() for c in o["status"]["conditions"] if c["type"] == "Ready"} == {"RDMAFailed"}
    assert "su2-n3" in after.unhealthy_nodes
    ufm_server.set(listings(RAIL, faults={("su2-n3", 5): Fault("slow")}))
    assert source.poller.poll_once() and source.refresh(30.0)
    grey = pipeline.compute(inputs(RAIL, sources=(source,)), 30.0)
    assert {ready(o) for o in grey.hypernodes} == {"True"} and grey.degraded_nodes == {"su2-n3"}
    assert "True" in {ready(o, "FabricDegraded") for o in grey.hypernodes}
    ufm_server.set(listings(RAIL, faults={("su1-n1", 2): Fault("unhealthy", "switch")}))  # UFM's own mark
    assert source.poller.poll_once() and source.refresh(40.0)
    marked = pipeline.compute(inputs(RAIL, sources=(source,)), 40.0)
    assert {ready(o) for o in marked.hypernodes} == {"True"} and marked.degraded_nodes == {"su1-n1"}


def test_an_outage_keeps_the_tree_and_the_source_says_it_is_stale(ufm_server: UfmStandIn, tmp_path: Path) -> None:
    source = source_for(ufm_server, tmp_path)
    pipeline = Pipeline()
    assert source.poller.poll_once() and source.refresh(1.0)
    before = pipeline.compute(inputs(RAIL, sources=(source,)), 10.0)
    ufm_server.behaviour.fail = "500"
    assert not source.poller.poll_once()
    assert not source.refresh(20.0)  # nothing new to build on: the last good facts stay
    after = pipeline.compute(inputs(RAIL, sources=(source,)), 20.0)
    assert by_name(after.hypernodes) == by_name(before.hypernodes)
    reason = source.stale()
    assert reason is not None and reason.startswith("http: GET http://127.0.0.1:")
    assert "HTTP 500" in reason and "(failing since " in reason and ", 1 polls); using the facts of " in reason


def test_an_unreadable_ca_bundle_or_a_bad_interval_is_an_option_error(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"--ufm-ca-bundle .*missing\.pem: \[Errno 2\]"):
        load_sources(options("--ufm-url", "https://ufm.example.com", "--ufm-ca-bundle", str(tmp_path / "missing.pem")),
                     live=True)  # fmt: skip
    with pytest.raises(OptionError, match="--ufm-interval and --ufm-timeout must be positive"):
        load_sources(options("--ufm-url", "https://ufm.example.com", "--ufm-interval", "0"), live=True)


def _render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", "render", "--format", "json", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def untimed(doc: dict[str, Any]) -> dict[str, Any]:
    """The List without the conditions' lastTransitionTime (each render stamps its own clock)."""
    for item in doc["items"]:
        for cond in item["status"]["conditions"]:
            del cond["lastTransitionTime"]
    return doc


def test_render_takes_saved_ufm_listings_and_prints_the_dumps_tree(tmp_path: Path) -> None:
    """Without a cluster: the hosts UFM names are the nodes, as for a dump."""
    saved = tmp_path / "ufm"
    saved.mkdir()
    for name, items in listings(RAIL).items():
        (saved / f"{name}.json").write_text(json.dumps(items))
    one_file = tmp_path / "ufm.json"
    one_file.write_text(json.dumps(listings(RAIL, with_systems=False)))
    dump = tmp_path / "fabric.topo"
    dump.write_text(ibnetdiscover_dump(RAIL))
    want = _render("--ibnetdiscover", str(dump))
    assert want.returncode == 0, want.stderr
    for path in (saved, one_file):
        got = _render("--ufm-json", str(path))
        assert got.returncode == 0, got.stderr
        assert untimed(json.loads(got.stdout)) == untimed(json.loads(want.stdout))
    assert [o["spec"]["tierName"] for o in json.loads(want.stdout)["items"]] == ["leaf", "leaf", "spine"]


def test_saved_ufm_listings_that_are_not_json_are_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "ufm.json"
    bad.write_text("<html>login</html>")
    proc = _render("--ufm-json", str(bad))
    assert proc.returncode == 1
    assert f"{bad}: cannot read UFM listings: Expecting value" in proc.stderr and "Traceback" not in proc.stderr
