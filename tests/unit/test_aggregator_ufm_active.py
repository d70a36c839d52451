"""UFM's active-ports listing (`/ufmRest/resources/ports?active=true`), what the UFM poller asks for:
it gives the tree an ibnetdiscover dump of the same fabric gives; a host cable unplugged, whose
ports thereby leave the listing, fails its node exactly as a port listed Down does and keeps the
node in its domain, until the cable is back; a port UFM no longer has at all takes its cable with
it; a UFM without the filter (400/404) is asked for the whole listing, once said in the log; and
`--ufm-all-ports` asks for the whole listing from the start. Pure, then through the stand-in on
loopback, then through the aggregator's pipeline."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from test_aggregator_ufm_source import MODEL_FILES, graph_of, model, specs, tree_from_dump
from ufm_standin import Fault, UfmStandIn, active_ports, ca_guid, listings

from agent.cluster_model import ClusterModel
from agent.model_probe import report_for
from aggregator import render
from aggregator.adapters.ufm import UfmClient, UfmConfig, UfmPoller, UfmSource
from aggregator.graph import FabricGraph
from aggregator.health import member_health, with_fabric_faults
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.registry import add_source_arguments, load_sources
from aggregator.sources import ufm, ufm_graph
from aggregator.tiers.infer import infer

RAIL = model("rail-8.yaml")  # su1-n1..su2-n4, 8 rails
NODE, HCA = "su1-n2", 3
HOST_END, SWITCH_END = "su1-n2 mlx5_3 port 1", "su1-rail4:3 port 1/2/1"
UNPLUGGED = {(NODE, HCA): Fault("down", "both")}
Listings = dict[str, list[dict[str, Any]]]


def active(data: Listings) -> Listings:
    """The listings as UFM answers them when the ports are asked for with the active filter."""
    return {**data, "ports": active_ports(data["ports"])}


def poll(data: Listings, previous: ufm.UfmFabric | None = None, *, active_only: bool = True) -> ufm.UfmFabric:
    """One poll as the poller makes it: the listing it asked for, parsed, the last snapshot remembered."""
    answer = json.loads(json.dumps(active(data) if active_only else data))
    return ufm.remember(previous, ufm.from_listings(answer, active_only=active_only))


def merged(m: ClusterModel, fabric: ufm.UfmFabric) -> FabricGraph:
    graph = graph_of(m, reports=True)
    ufm_graph.apply(graph, fabric)
    return graph


# --- pure ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_FILES)
def test_the_active_listing_gives_the_tree_of_an_ibnetdiscover_dump(name: str) -> None:
    m = model(name)
    data = listings(m, radix=64)  # every switch lists 64 ports, most of them never cabled
    assert len(active(data)["ports"]) < len(data["ports"])
    graph = graph_of(m)
    ufm_graph.apply(graph, poll(data))
    assert specs(render.render(infer(graph))) == specs(tree_from_dump(m))


@pytest.mark.parametrize("side", ["switch", "host", "both"])
def test_a_cable_unplugged_fails_its_node_exactly_as_a_down_port_does(side: str) -> None:
    """Both ends of a dead cable leave the active listing (no light either side): the cable is
    remembered from the last poll, and its ends stand as Down ports."""
    healthy, unplugged = listings(RAIL, radix=64), listings(RAIL, radix=64, faults={(NODE, HCA): Fault("down", side)})
    before = poll(healthy)
    now = poll(unplugged, before)
    cable = next(link for link in before.links if (ca_guid(NODE, HCA), 1) in link)
    assert not any(key in ufm.from_listings(active(unplugged)).ports for key in cable)  # both ends left the listing
    assert cable in now.links and not any(now.ports[key].up for key in cable)
    listed_down = merged(RAIL, poll(unplugged, poll(healthy, active_only=False), active_only=False))
    filtered = merged(RAIL, now)
    assert filtered.fabric_faults.keys() == listed_down.fabric_faults.keys() == {NODE}
    [got], [want] = filtered.fabric_faults[NODE], listed_down.fabric_faults[NODE]
    assert (got.failure, got.cause) == (want.failure, want.cause) == (True, "RDMA")
    assert got.text.split(" (UFM: ")[0] == want.text.split(" (UFM: ")[0] == f"RDMA {HOST_END} down"
    for end in (HOST_END, SWITCH_END):
        assert f"{end}: Down/{ufm.ABSENT_STATE}" in got.text and f"{end}: Down/" in want.text
    agent = member_health(report_for(RAIL, NODE), node_ready=True, agent_alive=True)  # the agent sees nothing
    as_listed, as_filtered = with_fabric_faults(agent, [want]), with_fabric_faults(agent, [got])
    assert (as_filtered.state, as_filtered.causes) == (as_listed.state, as_listed.causes)
    assert filtered.attached_by_guid[ca_guid(NODE, HCA)] == {f"su1-rail{HCA + 1}"}  # UFM keeps it in its domain


def test_one_end_gone_and_the_other_initializing_is_a_down_cable_too() -> None:
    """The filter keeps Initialize ports: one end listed but not up, the other left out."""
    data = listings(RAIL, radix=64, faults=UNPLUGGED)
    for port in data["ports"]:
        if port["node_description"] == f"{NODE} mlx5_{HCA}":
            port["logical_state"], port["physical_state"] = "Initialize", "LinkUp"
    fabric = poll(data, poll(listings(RAIL, radix=64)))
    [fault] = merged(RAIL, fabric).fabric_faults[NODE]
    assert fault.failure and fault.text.startswith(f"RDMA {HOST_END} down (UFM: ")
    assert f"{HOST_END}: Initialize/LinkUp" in fault.text and f"{SWITCH_END}: Down/{ufm.ABSENT_STATE}" in fault.text


def test_a_down_cable_stays_unchanged_poll_after_poll_and_recovers_when_plugged_back() -> None:
    healthy = listings(RAIL, radix=64)
    before = poll(healthy)
    down = poll(listings(RAIL, radix=64, faults=UNPLUGGED), before)
    assert poll(listings(RAIL, radix=64, faults=UNPLUGGED), down) == down  # no change: the poller stays quiet
    back = poll(healthy, down)
    assert back == before
    assert merged(RAIL, back).fabric_faults == {}


def test_a_host_ufm_no_longer_has_takes_its_cables_with_it() -> None:
    """Gone from the systems listing too: removed, not down (the whole listing's rule)."""
    before = poll(listings(RAIL))
    data = listings(RAIL, faults={(NODE, h): Fault("down", "both") for h in range(8)})
    removed = {name: [o for o in items if o.get("system_name") != NODE] for name, items in data.items()}
    after = poll(removed, before)
    assert not any(after.ports.get(key, before.ports[key]).system_name == NODE for link in after.links for key in link)
    assert NODE not in merged(RAIL, after).fabric_faults
    # without a systems listing nothing tells a host removed from one unplugged: its cables stay, down
    blind = poll({k: v for k, v in removed.items() if k != "systems"}, before)
    assert merged(RAIL, blind).fabric_faults.keys() == {NODE}


def test_at_start_up_a_cable_already_down_is_unknown_to_ufm_as_with_the_whole_listing() -> None:
    """No previous snapshot: UFM names no peer for a port without a link, so neither listing tells
    which switch the cable went to; the node's own agent reports its port down."""
    data = listings(RAIL, radix=64, faults=UNPLUGGED)
    for active_only in (True, False):
        graph = merged(RAIL, poll(data, active_only=active_only))
        assert graph.fabric_faults == {}
        assert ca_guid(NODE, HCA) not in graph.attached_by_guid  # that HCA meets no switch
        assert graph.attached_switches(NODE)  # placed anyway: its other HCAs' cables, its agent's report
    small = model("small-tree.yaml")  # one HCA a host: UFM alone puts a host whose only cable is down in no leaf
    single = listings(small, radix=64, faults={("node02", 0): Fault("down", "both")})
    for active_only in (True, False):
        graph = graph_of(small)  # no reports: what UFM alone places
        ufm_graph.apply(graph, poll(single, active_only=active_only))
        assert graph.fabric_faults == {} and not graph.attached_switches("node02") and graph.attached_switches("node03")


# --- the poller, against the stand-in on loopback ------------------------------------------------------


@pytest.fixture
def standin() -> Iterator[UfmStandIn]:
    with UfmStandIn(listings(RAIL, radix=64)) as server:
        yield server


def poller(server: UfmStandIn, tmp_path: Path, **config: Any) -> UfmPoller:
    creds = tmp_path / "secret"
    creds.mkdir(exist_ok=True)
    (creds / "username").write_text("admin")
    (creds / "password").write_text("123456")
    client = UfmClient(UfmConfig(url=server.url, credentials_dir=str(creds), interval=0.05, timeout=10.0, **config))
    return UfmPoller(client, interval=0.05, registry=CollectorRegistry())


def test_the_poller_asks_ufm_for_the_active_ports_only(standin: UfmStandIn, tmp_path: Path) -> None:
    p = poller(standin, tmp_path)
    assert p.poll_once()
    assert standin.targets[0] == "/ufmRest/resources/ports?active=true"
    assert p.facts is not None and p.facts.active_only
    assert len(p.facts.ports) == len(active_ports(standin.data["ports"])) < len(standin.data["ports"])


def test_ufm_all_ports_asks_for_the_whole_listing(standin: UfmStandIn, tmp_path: Path) -> None:
    source = pipeline_source(standin, tmp_path, "--ufm-all-ports")
    assert source.poller is not None and source.poller.client.config.all_ports
    p = poller(standin, tmp_path, all_ports=True)
    assert p.poll_once()
    assert standin.targets[0] == "/ufmRest/resources/ports"
    assert p.facts is not None and not p.facts.active_only and len(p.facts.ports) == len(standin.data["ports"])


@pytest.mark.parametrize("status", [400, 404])
def test_a_ufm_refusing_the_filter_is_asked_for_the_whole_listing_said_once(
    standin: UfmStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    standin.behaviour.filter_refused = status
    p = poller(standin, tmp_path)
    with caplog.at_level(logging.INFO, logger="aggregator.adapters.ufm"):
        assert p.poll_once() and p.poll_once()
    ports = [t for t in standin.targets if "/resources/ports" in t]
    assert ports == ["/ufmRest/resources/ports?active=true", "/ufmRest/resources/ports", "/ufmRest/resources/ports"]
    said = [r.getMessage() for r in caplog.records if "active-ports filter" in r.getMessage()]
    assert len(said) == 1 and f"HTTP {status}" in said[0] and "whole port listing" in said[0]
    assert p.facts is not None and not p.facts.active_only and len(p.facts.ports) == len(standin.data["ports"])


def test_a_ufm_answering_404_for_the_whole_listing_too_keeps_the_filter(standin: UfmStandIn, tmp_path: Path) -> None:
    """A UFM still starting up, not one without the filter: the poll fails, the next asks for the
    active ports again."""
    standin.behaviour.missing = {"ports"}
    p = poller(standin, tmp_path)
    assert not p.poll_once()
    standin.behaviour.missing = set()
    assert p.poll_once()
    ports = [t for t in standin.targets if "/resources/ports" in t]
    assert ports == ["/ufmRest/resources/ports?active=true", "/ufmRest/resources/ports", "/ufmRest/resources/ports?active=true"]
    assert p.facts is not None and p.facts.active_only


def test_a_cable_unplugged_at_the_stand_in_fails_the_node_and_recovers(standin: UfmStandIn, tmp_path: Path) -> None:
    p = poller(standin, tmp_path)
    assert p.poll_once()
    healthy, generation = p.facts, p.generation
    standin.set(listings(RAIL, radix=64, faults=UNPLUGGED))
    assert p.poll_once() and p.poll_once()
    assert p.generation == generation + 1  # once for the change, not again for the same fabric
    assert p.facts is not None and healthy is not None and p.facts.links == healthy.links
    [fault] = merged(RAIL, p.facts).fabric_faults[NODE]
    assert fault.failure and f"{SWITCH_END}: Down/{ufm.ABSENT_STATE}" in fault.text
    standin.set(listings(RAIL, radix=64))
    assert p.poll_once()
    assert p.facts == healthy and merged(RAIL, p.facts).fabric_faults == {}


# --- through the pipeline --------------------------------------------------------------------------------


def pipeline_source(server: UfmStandIn, tmp_path: Path, *flags: str) -> UfmSource:
    creds = tmp_path / "secret"
    creds.mkdir(exist_ok=True)
    (creds / "username").write_text("admin")
    (creds / "password").write_text("123456")
    parser = argparse.ArgumentParser()
    add_source_arguments(parser, live=True)
    options = parser.parse_args(["--ufm-url", server.url, "--ufm-credentials", str(creds), *flags])
    [source] = [s for s in load_sources(options, live=True) if isinstance(s, UfmSource)]
    source.workers(registry=CollectorRegistry())
    return source


def hypernodes(source: UfmSource, now: float) -> dict[str, dict[str, Any]]:
    assert source.poller is not None and source.poller.poll_once()
    source.refresh(now)
    names = RAIL.nodes()
    cluster = ClusterInputs(reports={n: report_for(RAIL, n) for n in names}, node_ready=dict.fromkeys(names, True),
                            sources=(source,))  # fmt: skip
    return {o["metadata"]["name"]: o for o in Pipeline().compute(cluster, now).hypernodes}


def readiness(objects: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """HyperNode -> (Ready's status, its reason)."""
    return {name: next((c["status"], c["reason"]) for c in o["status"]["conditions"] if c["type"] == "Ready")
            for name, o in objects.items()}  # fmt: skip


def test_through_the_pipeline_an_unplugged_cable_turns_ready_as_a_down_port_does(standin: UfmStandIn, tmp_path: Path) -> None:
    filtered, whole = pipeline_source(standin, tmp_path), pipeline_source(standin, tmp_path, "--ufm-all-ports")
    healthy = hypernodes(filtered, 1.0)
    assert readiness(healthy) == readiness(hypernodes(whole, 1.0)) and {s for s, _ in readiness(healthy).values()} == {"True"}
    standin.set(listings(RAIL, radix=64, faults=UNPLUGGED))
    after, listed_down = hypernodes(filtered, 2.0), hypernodes(whole, 2.0)
    assert after.keys() == healthy.keys()  # the tree stands: the node stays in its domain
    assert readiness(after) == readiness(listed_down)
    failed = {name for name, (status, _) in readiness(after).items() if status == "False"}
    assert failed and {readiness(after)[n][1] for n in failed} == {"RDMAFailed"}
    assert all(NODE in after[n]["status"]["conditions"][0]["message"] for n in failed)
    standin.set(listings(RAIL, radix=64))
    assert {s for s, _ in readiness(hypernodes(filtered, 3.0)).values()} == {"True"}
