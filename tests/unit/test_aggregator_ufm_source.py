"""UFM's REST listings as a fabric source (aggregator.sources.ufm): the tree UFM's view of a fabric
gives is the tree an ibnetdiscover dump of the same fabric gives (both generated from one cluster
model, with the GUIDs the agents report); HCAs meet nodes by the reported GUID first and by UFM's
system name only without one; a port UFM sees down or slow marks its node as the agent would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aggregator_fabric import ibnetdiscover_dump
from ufm_standin import Fault, ca_guid, listings

from agent.cluster_model import ClusterModel, load_model
from agent.model_probe import report_for
from aggregator import render
from aggregator.graph import FabricGraph
from aggregator.health import MemberState, member_health, with_fabric_faults
from aggregator.sources import ibnetdiscover, nodetopology, ufm, ufm_graph
from aggregator.sources.ibnetdiscover import HostNames
from aggregator.tiers.infer import infer

MODELS = Path(__file__).resolve().parent.parent / "models"
MODEL_FILES = sorted(p.name for p in MODELS.glob("*.yaml"))


def model(name: str) -> ClusterModel:
    return load_model(str(MODELS / name))


def graph_of(m: ClusterModel, *, reports: bool = False) -> FabricGraph:
    graph = FabricGraph()
    for node in m.nodes():
        graph.add_node(node)
        if reports:
            nodetopology.apply(graph, report_for(m, node), None)
    return graph


def tree_from_ufm(m: ClusterModel, data: dict[str, list[dict[str, object]]], *, reports: bool = False) -> list[dict[str, object]]:
    graph = graph_of(m, reports=reports)
    ufm_graph.apply(graph, ufm.from_listings(json.loads(json.dumps(data))))
    return render.render(infer(graph))


def tree_from_dump(m: ClusterModel, *, reports: bool = False) -> list[dict[str, object]]:
    graph = graph_of(m, reports=reports)
    ibnetdiscover.apply(graph, ibnetdiscover.parse(ibnetdiscover_dump(m)))
    return render.render(infer(graph))


def specs(objects: list[dict[str, object]]) -> dict[str, object]:
    return {o["metadata"]["name"]: o["spec"] for o in objects}  # type: ignore[index]


# --- the same tree as a dump ---------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_FILES)
def test_ufm_gives_the_tree_of_an_ibnetdiscover_dump_of_the_same_fabric(name: str) -> None:
    m = model(name)
    want = specs(tree_from_dump(m))
    assert want  # every model has a fabric
    assert specs(tree_from_ufm(m, listings(m))) == want


@pytest.mark.parametrize("name", ["small-tree.yaml", "rail-8.yaml", "fat-tree-3tier.yaml"])
def test_ufm_tree_matches_with_reports_joining_by_guid(name: str) -> None:
    m = model(name)
    assert specs(tree_from_ufm(m, listings(m), reports=True)) == specs(tree_from_dump(m, reports=True))


@pytest.mark.parametrize(
    "variant",
    [
        {"peers": False},  # cabling only from the links listing
        {"with_links": False},  # cabling only from the ports' peer fields
        {"with_systems": False},  # switches told from hosts by the ports' descriptions
    ],
)
def test_each_listing_alone_gives_the_cabling(variant: dict[str, bool]) -> None:
    m = model("fat-tree-3tier.yaml")
    assert specs(tree_from_ufm(m, listings(m, **variant))) == specs(tree_from_dump(m))


def test_unused_switch_ports_change_nothing() -> None:
    """UFM lists every port of a switch; those with nothing plugged in (Down/Polling, no peer, no
    rate) are no cable and no fault."""
    m = model("fat-tree-3tier.yaml")
    data = listings(m, radix=64)
    assert len(data["ports"]) > len(listings(m)["ports"])
    assert specs(tree_from_ufm(m, data)) == specs(tree_from_dump(m))
    assert faults_of(m, data) == {}


def test_volcano_style_ports_naming_only_the_switch_give_the_leaves() -> None:
    """What Volcano's discoverer reads: Computer IB Ports with system_name and peer_node_name."""
    data = [
        {"guid": f"{i:016x}", "number": 1, "system_name": f"node{i}", "node_description": f"node{i} mlx5_0",
         "description": "Computer IB Port", "peer_node_name": "leaf0" if i < 2 else "leaf1"}
        for i in range(4)
    ] + [{"guid": f"{0xa0 + i:016x}", "number": 1, "system_name": f"leaf{i}", "description": "Switch IB Port"}
         for i in range(2)]  # fmt: skip
    graph = FabricGraph()
    for i in range(4):
        graph.add_node(f"node{i}")
    ufm_graph.apply(graph, ufm.parse(data))
    assert {n: graph.attached_switches(n) for n in sorted(graph.nodes)} == {
        "node0": {"leaf0"}, "node1": {"leaf0"}, "node2": {"leaf1"}, "node3": {"leaf1"}}  # fmt: skip


# --- joining HCAs to nodes -------------------------------------------------------------------------


def test_a_reported_guid_wins_over_the_system_name() -> None:
    """UFM names node01's HCA "node02" (a stale system name); node01's report carries its GUID."""
    m = model("small-tree.yaml")
    data = listings(m)
    for port in data["ports"]:
        if port["system_name"] == "node01":
            port["system_name"] = "node05"  # under leaf2 by name; by GUID node01 is under leaf1
    graph = graph_of(m, reports=True)
    ufm_graph.apply(graph, ufm.parse(data["ports"], links=data["links"]))
    assert graph.attached_switches("node01") == {"leaf1"}
    assert graph.attached_switches("node05") == {"leaf2"}


def test_without_a_report_the_system_name_places_the_host_after_strip_domain() -> None:
    m = model("small-tree.yaml")
    data = listings(m)
    graph = FabricGraph()
    for node in m.nodes():
        graph.add_node(f"{node}.dc1.example.com")
    warnings = ufm_graph.apply(graph, ufm.from_listings(data), HostNames(domain="."))
    assert warnings == []
    assert graph.attached_switches("node03.dc1.example.com") == {"leaf1"}


def test_hosts_and_nodes_that_meet_nothing_are_counted() -> None:
    m = model("small-tree.yaml")
    graph = FabricGraph()
    for node in [*m.nodes()[:7], "stranger"]:
        graph.add_node(node)
    warnings = ufm_graph.apply(graph, ufm.from_listings(listings(m)))
    assert warnings == [
        "1 hosts in UFM match no node (e.g. node08; nodes are named like node01, node02): see --strip-domain",
        "1 of 8 nodes match no host in UFM (e.g. stranger)",
    ]


# --- port state as health --------------------------------------------------------------------------


def faults_of(m: ClusterModel, data: dict[str, list[dict[str, object]]], previous: ufm.UfmFabric | None = None) -> dict[str, list[tuple[bool, str]]]:
    graph = graph_of(m, reports=True)
    fabric = ufm.remember(previous, ufm.from_listings(data))
    ufm_graph.apply(graph, fabric)
    return {n: [(f.failure, f.text) for f in fs] for n, fs in graph.fabric_faults.items()}


@pytest.mark.parametrize("side", ["switch", "host", "both"])
def test_a_cable_down_on_either_side_is_a_failure_of_its_node(side: str) -> None:
    """UFM drops the peer of a port without a link, so the cable is remembered from the last poll."""
    m = model("rail-8.yaml")
    before = ufm.from_listings(listings(m))
    faults = faults_of(m, listings(m, faults={("su1-n2", 3): Fault("down", side)}), before)
    assert list(faults) == ["su1-n2"]
    [(failure, text)] = faults["su1-n2"]
    assert failure and text.startswith("RDMA su1-n2 mlx5_3 port 1 down (UFM: ")
    switch_end, host_end = "su1-rail4:3 port 1/2/1: Down/", "su1-n2 mlx5_3 port 1: Down/"
    disabled = {"switch": switch_end, "host": host_end}.get(side)
    assert switch_end in text and host_end in text  # a dead cable: no light on either end
    assert disabled is None or disabled + "Disabled" in text


def test_a_slow_cable_is_a_grey_failure_of_its_node() -> None:
    m = model("small-tree.yaml")
    faults = faults_of(m, listings(m, faults={("node06", 0): Fault("slow")}))
    assert faults == {"node06": [(False, "RDMA node06 mlx5_0 port 1 rate: 200 Gb/s below the 400 Gb/s its cable should carry (UFM)")]}


def test_a_slow_cable_without_enabled_rates_is_judged_against_the_fabrics_usual_rate() -> None:
    m = model("small-tree.yaml")
    data = listings(m, faults={("node06", 0): Fault("slow")})
    for port in data["ports"]:
        del port["enabled_speed"], port["enabled_width"]
    faults = faults_of(m, data)
    assert faults == {"node06": [(False, "RDMA node06 mlx5_0 port 1 rate: 200 Gb/s below the 400 Gb/s its cable should carry (UFM)")]}


def test_a_port_never_cabled_is_no_fault() -> None:
    """Port 2 of a dual-port HCA with nothing plugged in: down, no peer, no remembered cable."""
    m = model("small-tree.yaml")
    data = listings(m)
    guid = ca_guid("node01", 0)
    data["ports"].append({**next(p for p in data["ports"] if p["guid"] == guid), "number": 2,
                          "name": f"{guid}_2", "logical_state": "Down", "physical_state": "Polling"})  # fmt: skip
    for key in ("peer", "peer_guid", "peer_node_name", "peer_port_dname"):
        data["ports"][-1].pop(key, None)
    assert faults_of(m, data) == {}


def test_fabric_faults_turn_member_health_as_the_agents_report_would() -> None:
    m = model("small-tree.yaml")
    report = report_for(m, "node02")
    healthy = member_health(report, node_ready=True, agent_alive=True)
    assert healthy.state is MemberState.HEALTHY
    graph = graph_of(m, reports=True)
    ufm_graph.apply(graph, ufm.remember(ufm.from_listings(listings(m)),
                                  ufm.from_listings(listings(m, faults={("node02", 0): Fault("down")}))))  # fmt: skip
    failed = with_fabric_faults(healthy, graph.fabric_faults["node02"])
    assert failed.state is MemberState.UNHEALTHY and failed.causes == {"RDMA"}
    silent = member_health(None, node_ready=True, agent_alive=None)  # no agent: unknown, yet the fault is known
    assert with_fabric_faults(silent, graph.fabric_faults["node02"]).state is MemberState.UNHEALTHY
    slow = ufm.from_listings(listings(m, faults={("node02", 0): Fault("slow")}))
    graph = graph_of(m, reports=True)
    ufm_graph.apply(graph, slow)
    grey = with_fabric_faults(healthy, graph.fabric_faults["node02"])
    assert grey.state is MemberState.HEALTHY and grey.is_degraded and grey.degraded_causes == {"RDMA"}


def test_remember_keeps_no_cable_whose_ports_are_gone_or_both_up() -> None:
    m = model("small-tree.yaml")
    before = ufm.from_listings(listings(m))
    after = ufm.from_listings(listings(m, faults={("node01", 0): Fault("down", "both")}))
    assert len(after.links) == len(before.links) - 1
    assert ufm.remember(before, after).links == before.links
    gone = ufm.from_listings({k: [o for o in v if o.get("system_name") != "node01"] for k, v in
                              listings(m, faults={("node01", 0): Fault("down", "both")}).items()})  # fmt: skip
    assert ufm.remember(before, gone).links == gone.links  # the HCA left UFM: its cable goes too


# --- malformed responses ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listing", "data", "message"),
    [
        ("ports", "Service Unavailable", "ports: expected a JSON array of objects, got str"),
        ("ports", [{"guid": "0x1", "number": 1}, 7], "ports[1]: expected an object, got int: '7'"),
        ("links", [None], "links[0]: expected an object, got NoneType: 'None'"),
        ("systems", 3, "systems: expected a JSON array of objects, got int"),
    ],
)
def test_a_response_not_in_the_documented_shape_raises_naming_the_listing(listing: str, data: object, message: str) -> None:
    listings_ = {"ports": [], listing: data}
    with pytest.raises(ufm.UfmError) as caught:
        ufm.from_listings(listings_)
    assert str(caught.value) == message


def test_ports_without_a_guid_are_skipped_and_counted() -> None:
    fabric = ufm.parse([{"number": 1, "system_name": "x"}, {"guid": "zz", "number": 2},
                        {"name": "0002c903000e0b73_1", "system_name": "y"}])  # fmt: skip
    assert list(fabric.ports) == [("0002c903000e0b73", 1)]
    assert fabric.warnings == ["ports: 2 port(s) without a GUID or number skipped"]


@pytest.mark.parametrize(
    ("speed", "width", "gbps"),
    [("25.0 Gbps", "4x", 100.0), ("NDR", "4x", 400.0), ("HDR", "2x", 100.0), ("100", "1x", 100.0), ("fast", "4x", None)],
)
def test_active_rate_is_lane_speed_times_width(speed: str, width: str, gbps: float | None) -> None:
    [port] = ufm.parse([{"guid": "1", "number": 1, "active_speed": speed, "active_width": width}]).ports.values()
    assert port.gbps == gbps


@pytest.mark.parametrize("side", ["host", "switch"])
def test_a_port_ufm_marks_unhealthy_is_a_grey_failure_of_its_node(side: str) -> None:
    m = model("small-tree.yaml")
    faults = faults_of(m, listings(m, faults={("node07", 0): Fault("unhealthy", side)}))
    [(failure, text)] = faults["node07"]
    marked = "node07 mlx5_0 port 1: HIGH_BER" if side == "host" else "leaf2:"
    assert not failure and text.startswith("RDMA node07 mlx5_0 port 1 marked unhealthy (UFM: ") and marked in text
    assert list(faults) == ["node07"]


def test_an_unhealthy_mark_on_a_port_ufm_does_not_list_is_a_warning() -> None:
    m = model("small-tree.yaml")
    data = listings(m)
    data["unhealthy_ports"] = [{"UnhealthyGUID": "00000000000000ff", "UnhealthyPortNumber": 3, "UnhealthyPort": "ghost/3"}]
    fabric = ufm.from_listings(data)
    assert fabric.unhealthy == {} and fabric.warnings == ["unhealthy_ports: port ghost/3 is not in the port listing"]



# --- reading the bytes UFM sends -----------------------------------------------------------------------


def bodies_of(data: dict[str, list[dict[str, object]]]) -> dict[str, bytes]:
    return {name: json.dumps(items).encode() for name, items in data.items()}


FAULTY = {("su1-n2", 3): Fault("down", "both"), ("su1-n1", 0): Fault("slow"), ("su2-n1", 1): Fault("unhealthy")}


@pytest.mark.parametrize("variant", [{}, {"faults": FAULTY}, {"peers": False}, {"with_systems": False}],
                         ids=["usual", "faults", "no-peers", "no-systems"])  # fmt: skip
def test_one_port_in_another_spelling_gives_the_same_ports(variant: dict[str, object]) -> None:
    """UFM's usual spelling is read field by field across all ports (and systems); one port spelled
    otherwise (a number as text, a GUID with 0x and capitals), or a system name with spaces around
    it, sends the whole listing the item-by-item way."""
    data = listings(model("rail-8.yaml"), **variant)  # type: ignore[arg-type]
    usual = ufm.parse(data["ports"], systems=data.get("systems"))
    odd, systems = json.loads(json.dumps(data["ports"])), json.loads(json.dumps(data.get("systems")))
    odd[5]["number"] = str(odd[5]["number"])
    odd[7]["guid"] = "0x" + str(odd[7]["guid"]).upper()
    if systems:
        systems[3]["system_name"] = f" {systems[3]['system_name']} "
    read_odd = ufm.parse(odd, systems=systems)
    assert (read_odd.ports, read_odd.systems) == (usual.ports, usual.systems)
    assert len(usual.ports) == len(data["ports"])
    assert bool(usual.links) == (variant != {"peers": False})  # cables from the ports' peer fields


@pytest.mark.parametrize("variant", [{}, {"faults": FAULTY}, {"peers": False}], ids=["usual", "faults", "no-peers"])
def test_the_bytes_ufm_sends_give_the_fabric_of_the_decoded_listings(variant: dict[str, object]) -> None:
    data = listings(model("rail-8.yaml"), **variant)  # type: ignore[arg-type]
    from_bytes, decoded = ufm.from_bodies(bodies_of(data)), ufm.from_listings(data)
    assert (from_bytes.ports, from_bytes.links, from_bytes.systems, from_bytes.unhealthy) == (
        decoded.ports, decoded.links, decoded.systems, decoded.unhealthy)  # fmt: skip
    assert bool(from_bytes.unhealthy) == ("faults" in variant)  # the unhealthy-ports listing read too


def test_the_links_listing_is_read_only_when_a_port_names_no_peer() -> None:
    """Every active port naming its peer gives every cable: the links listing is not decoded."""
    m = model("small-tree.yaml")
    with_peers = bodies_of(listings(m))
    assert ufm.from_bodies({**with_peers, "links": b"<html>"}).links == ufm.from_bodies(with_peers).links
    without = bodies_of(listings(m, peers=False))
    assert ufm.from_bodies(without).links == ufm.from_bodies(with_peers).links
    with pytest.raises(ufm.UfmDecodeError) as caught:
        ufm.from_bodies({**without, "links": b"<html>"})
    assert caught.value.listing == "links" and "not JSON" in str(caught.value)
