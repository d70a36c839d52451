"""Sources into the fabric graph: NodeTopology reports, switch LLDP tables, node-label levels."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agent.cluster_model import parse_model
from agent.common.report import Interface, LldpNeighbour, RdmaDevice, RdmaPort, node_topology_object
from agent.model_probe import report_for
from aggregator.graph import FabricGraph, hca_guids, normalise_guid
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import labels, nodetopology, switch_lldp

MODEL = parse_model(
    {
        "switches": {"spine1": {"switches": ["leaf1", "leaf2"]}},
        "blocks": [
            {
                "switch": "leaf1",
                "nodes": ["n[1-2]"],
                "annotations": {"accelerator.topology.test/domain": "rack9"},
            },
            {"switch": "leaf2", "nodes": ["n[3-4]"]},
        ],
    }
)


def test_report_facts_name_switches_guids_and_the_nvlink_clique() -> None:
    facts = nodetopology.facts_of(report_for(MODEL, "n1"))
    assert facts.switches == {"leaf1"}
    assert facts.nvlink is not None and facts.nvlink.endswith("/" + facts.nvlink.split("/")[1])
    assert len(facts.guids) == 1
    assert nodetopology.facts_of(report_for(MODEL, "n3")).nvlink is None  # HGX: single-node NVLink


def test_lldp_neighbour_without_a_system_name_is_known_by_its_chassis_id() -> None:
    report = report_for(MODEL, "n3")
    nameless = LldpNeighbour(interface="ib0", chassis_id="0C:42:A1:00:00:01", port_id="swp3", ttl=120)
    facts = nodetopology.facts_of(dataclasses.replace(report, lldp=(nameless,)))
    assert facts.switches == {"0c:42:a1:00:00:01"}


def test_port_guids_inside_gids_map_the_node() -> None:
    port = RdmaPort(
        1, "ACTIVE", "LinkUp", 400.0, "InfiniBand", gids=("fe80:0000:0000:0000:0c42:a103:008b:40d1",)
    )
    report = dataclasses.replace(report_for(MODEL, "n3"), rdma=(RdmaDevice("mlx5_0", ports=(port,)),))
    assert nodetopology.facts_of(report).guids == {"0c42a103008b40d1"}
    assert normalise_guid("0x0c42a103008b40d1") == normalise_guid("c42a103008b40d1") == "0c42a103008b40d1"


def test_roce_addresses_and_ipv4_mapped_gids_name_no_guid() -> None:
    """A RoCE port's GIDs are its addresses (link-local ones built from its MAC), and a zero
    subnet prefix (`::ffff:10.0.0.1`) is an address on any port: none is a port GUID a fabric dump
    or UFM could name, and two hosts may share one on separate rails."""
    link_local = "fe80:0000:0000:0000:0c42:a103:008b:40d1"
    mapped = "0000:0000:0000:0000:0000:ffff:0a00:0001"
    roce = RdmaPort(1, "ACTIVE", "LinkUp", 400.0, "Ethernet", gids=(link_local, mapped))
    ib = RdmaPort(1, "ACTIVE", "LinkUp", 400.0, "InfiniBand", gids=(link_local, mapped))
    assert hca_guids((RdmaDevice("mlx5_0", ports=(roce,)),)) == frozenset()
    assert hca_guids((RdmaDevice("mlx5_0", ports=(ib,)),)) == {"0c42a103008b40d1"}


def test_neighbours_on_bond_slaves_and_shared_pci_functions_are_fabric_and_management_is_not() -> None:
    """RoCE on a bond: the RDMA device sits on bond0 and LLDP is heard on its slaves; a second NIC
    shares the HCA's PCI function; the management NIC is neither. Only the first three count, and
    the same whichever neighbour comes first (the RDMA netdevs are checked before anything else)."""
    rdma = (
        RdmaDevice(
            "mlx5_bond_0",
            pci_address="0000:1a:00.0",
            ports=(RdmaPort(1, "ACTIVE", "LinkUp", 200.0, "Ethernet", netdev="bond0"),),
        ),
        RdmaDevice(
            "mlx5_2",
            pci_address="0000:3b:00.0",
            ports=(RdmaPort(1, "ACTIVE", "LinkUp", 400.0, "Ethernet", netdev="eth2"),),
        ),
    )
    interfaces = (
        Interface("bond0", None, "up", kind="bond"),
        Interface("eth0", None, "up", bond_master="bond0"),
        Interface("eth1", None, "up", bond_master="bond0"),
        Interface("eth2", None, "up", pci_address="0000:3b:00.0"),
        Interface("eth3", None, "up", pci_address="0000:3b:00.0"),  # a second port of the same function
        Interface("eno1", None, "up", pci_address="0000:02:00.0"),  # management
    )
    heard = {"eth0": "leaf-a", "eth1": "leaf-b", "eth2": "leaf-c", "eth3": "leaf-d", "eno1": "mgmt-1"}
    neighbours = tuple(
        LldpNeighbour(i, f"02:00:00:00:00:0{n}", "p1", 120, system_name=s)
        for n, (i, s) in enumerate(heard.items())
    )
    base = dataclasses.replace(report_for(MODEL, "n3"), rdma=rdma, interfaces=interfaces)
    for order in (neighbours, neighbours[::-1], neighbours[2:] + neighbours[:2]):
        facts = nodetopology.facts_of(dataclasses.replace(base, lldp=order))
        assert facts.switches == {"leaf-a", "leaf-b", "leaf-c", "leaf-d"}
    assert nodetopology.fabric_interfaces(base) == {"bond0", "eth0", "eth1", "eth2", "eth3"}


def test_facts_keep_the_hcas_and_their_guids_are_the_normalised_node_and_image_guids() -> None:
    rdma = (
        RdmaDevice("mlx5_0", node_guid="0C42:A103:008B:40D0", sys_image_guid="0c42:a103:008b:40d0"),
        RdmaDevice("mlx5_1", node_guid="0x0c42a103008b40d2", sys_image_guid="0c42:a103:008b:4000"),
    )
    report = dataclasses.replace(report_for(MODEL, "n3"), rdma=rdma)
    facts = nodetopology.facts_of(report)
    assert facts.hcas is report.rdma
    assert facts.guids == {"0c42a103008b40d0", "0c42a103008b40d2", "0c42a103008b4000"}
    assert nodetopology.facts_of(dataclasses.replace(report, rdma=())).guids == frozenset()


def test_nodetopology_object_round_trips_to_the_same_report() -> None:
    report = report_for(MODEL, "n1")
    assert nodetopology.report_from_object(json.loads(json.dumps(node_topology_object(report)))) == report


# lldpd's `lldpcli -f json0 show neighbors` on a leaf (every value is a list of objects), with the
# leaf's `show chassis` section merged in
LEAF_JSON0 = {
    "local-chassis": [
        {"chassis": [{"id": [{"type": "mac", "value": "0c:42:a1:11:22:33"}], "name": [{"value": "leaf7"}]}]}
    ],
    "lldp": [
        {
            "interface": [
                {
                    "name": "swp51",
                    "via": "LLDP",
                    "chassis": [
                        {
                            "id": [{"type": "mac", "value": "0c:42:a1:aa:bb:cc"}],
                            "name": [{"value": "spine3"}],
                            "capability": [
                                {"type": "Bridge", "enabled": True},
                                {"type": "Router", "enabled": True},
                            ],
                        }
                    ],
                    "port": [{"id": [{"type": "ifname", "value": "swp7"}], "ttl": [{"value": "120"}]}],
                },
                {
                    "name": "swp1",
                    "via": "LLDP",
                    "chassis": [
                        {
                            "id": [{"type": "mac", "value": "b8:3f:d2:00:00:01"}],
                            "name": [{"value": "n9"}],
                            "capability": [{"type": "Station", "enabled": True}],
                        }
                    ],
                    "port": [{"id": [{"type": "mac", "value": "b8:3f:d2:00:00:01"}]}],
                },
            ]
        }
    ],
}


def test_switch_table_links_switches_and_attaches_known_hosts() -> None:
    table = switch_lldp.parse_table(json.dumps(LEAF_JSON0), default_name="ignored")
    assert table.switch == "leaf7"
    graph = FabricGraph()
    graph.add_node("n9")
    switch_lldp.apply(graph, [table])
    assert graph.switch_links == {("leaf7", "spine3")}
    assert graph.attached_switches("n9") == {"leaf7"}


def test_host_side_lldpctl_json_reads_too_and_the_file_names_the_switch(
    shared_data: Path, tmp_path: Path
) -> None:
    source = shared_data / "lldp" / "lldpctl" / "sichek_bjg45.json"
    copy = tmp_path / "edge-sw1.json"
    copy.write_text(source.read_text())
    (table,) = switch_lldp.load_files([str(copy)])
    assert table.switch == "edge-sw1"
    raw = json.loads(source.read_text())["lldp"]["interface"]
    expected = {next(iter(next(iter(i.values()))["chassis"])) for i in raw}
    assert {n.name for n in table.neighbours} == expected
    assert all(n.is_switch for n in table.neighbours)


def test_switch_table_that_is_not_json_is_refused_with_the_file_name(tmp_path: Path) -> None:
    bad = tmp_path / "leaf1.json"
    bad.write_text("Interface: swp1 ...")
    with pytest.raises(switch_lldp.SwitchLldpError, match=r"leaf1\.json"):
        switch_lldp.load_files([str(bad)])


def test_switch_tables_give_spines_to_nodes_cabled_by_lldp() -> None:
    reports = {n: report_for(MODEL, n) for n in MODEL.nodes()}
    tables = [
        switch_lldp.parse_table(
            json.dumps({"lldp": [{"interface": [_neighbour("swp49", "spine1")]}]}), default_name=leaf
        )
        for leaf in ("leaf1", "leaf2")
    ]
    desired = Pipeline().compute(ClusterInputs(reports=reports, switch_tables=tables), now=0)
    tiers = {o["metadata"]["name"]: o["spec"]["tierName"] for o in desired.hypernodes}
    assert tiers["spine-spine1"] == "spine"
    assert desired.node_labels["n3"] == {
        "hypertopo.io/leaf": "leaf-leaf2",
        "hypertopo.io/spine": "spine-spine1",
    }


def _neighbour(port: str, name: str) -> dict[str, object]:
    return {
        "name": port,
        "chassis": [{"id": [{"type": "mac", "value": "02:00:00:00:00:01"}], "name": [{"value": name}]}],
    }


ZONE, BLOCK = "topology.kubernetes.io/zone", "example.com/block"


def test_label_levels_nest_and_sit_above_the_switch_levels() -> None:
    model = parse_model({"blocks": [{"switch": f"leaf{i}", "nodes": [f"m{i}-[1-2]"]} for i in range(1, 6)]})
    place = {1: ("a", "b1"), 2: ("a", "b1"), 3: ("a", "b2"), 4: ("a", "b2"), 5: ("b", "b1")}
    node_labels = {n: {ZONE: place[i][0], BLOCK: place[i][1]} for i in place for n in (f"m{i}-1", f"m{i}-2")}
    inputs = ClusterInputs(
        reports={n: report_for(model, n) for n in model.nodes()},
        node_labels=node_labels,
        label_levels=labels.parse_levels(f"{ZONE},{BLOCK}"),
    )
    desired = Pipeline().compute(inputs, now=0)
    assert desired.tree is not None and desired.tree.tiers == ("leaf", "spine", "core")
    counts = sorted((o["spec"]["tierName"], o["status"]["nodeCount"]) for o in desired.hypernodes)
    # block b1 of zone b is exactly leaf5, and zone b too: one HyperNode, the leaf
    assert counts == [
        ("core", 8),
        ("leaf", 2),
        ("leaf", 2),
        ("leaf", 2),
        ("leaf", 2),
        ("leaf", 2),
        ("spine", 4),
        ("spine", 4),
    ]
    assert not desired.tree.dropped


def test_labels_that_cut_across_a_leaf_are_dropped_with_the_reason() -> None:
    reports = {n: report_for(MODEL, n) for n in MODEL.nodes()}
    node_labels = {
        "n1": {ZONE: "a"},
        "n2": {ZONE: "a"},
        "n3": {ZONE: "a"},
        "n4": {ZONE: "b"},
    }  # n3, n4 share leaf2
    inputs = ClusterInputs(reports=reports, node_labels=node_labels, label_levels=(ZONE,))
    desired = Pipeline().compute(inputs, now=0)
    assert desired.tree is not None
    dropped = dict(desired.tree.dropped)
    assert "partly overlaps leaf:leaf2" in dropped[f"spine:label:{ZONE}=a"]
    assert {o["status"]["nodeCount"] for o in desired.hypernodes} == {2}


def test_label_levels_repeating_a_key_are_refused() -> None:
    with pytest.raises(labels.LabelLevelsError):
        labels.parse_levels("zone,rack,zone")


def test_a_node_attaches_to_the_switches_its_model_declares_and_those_it_reports() -> None:
    graph = FabricGraph()
    graph.declare_block(["a", "b", "c"], "leaf1")
    graph.declare_block(["a", "b"], "leaf2")
    graph.declare("c", "leaf3")
    graph.set_node_facts("a", nodetopology.NodeFacts(frozenset({"leaf9"})))
    graph.set_node_facts("d", nodetopology.NodeFacts(frozenset({"leaf9"})))
    assert graph.attached_switches("a") == {"leaf1", "leaf2", "leaf9"}
    assert graph.attached_switches("b") == {"leaf1", "leaf2"}
    assert graph.attached_switches("c") == {"leaf1", "leaf3"}
    assert graph.attached_switches("d") == {"leaf9"}
    assert list(graph.nodes_in_order())[:2] == ["a", "d"] and set(graph.nodes_in_order()) == {
        "a",
        "b",
        "c",
        "d",
    }


def test_a_racks_rail_blocks_declare_every_rail_and_the_first_nvlink_domain_named() -> None:
    from agent.cluster_model import DOMAIN_ANNOTATION, fabric_of
    from aggregator.sources import model as model_source

    model = parse_model(
        {
            "switches": {"spine": {"switches": ["leafA", "leafB", "leafC", "leafD"]}},
            "blocks": [
                {"switch": "leafA", "nodes": ["n[1-2]"]},
                {"switch": "leafB", "nodes": ["n[1-2]"], "annotations": {DOMAIN_ANNOTATION: "rackX"}},
                {"switch": "leafC", "nodes": ["n[1-2]"], "annotations": {DOMAIN_ANNOTATION: "rackY"}},
                {"switch": "leafD", "nodes": ["n[2-3]"], "annotations": {DOMAIN_ANNOTATION: "rackZ"}},
            ],
        }
    )
    graph = FabricGraph()
    model_source.apply(graph, model)
    assert graph.declared == {
        "n1": {"leafA", "leafB", "leafC"},
        "n2": {"leafA", "leafB", "leafC", "leafD"},
        "n3": {"leafD"},
    }
    x, z = ("/".join(map(str, fabric_of(rack))) for rack in ("rackX", "rackZ"))
    assert graph.nvlink_declared == {"n1": x, "n2": x, "n3": z}
