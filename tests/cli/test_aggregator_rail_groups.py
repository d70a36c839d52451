"""Rail-optimised groups hold: one missing or misplaced rail cable is a fault of the node, not a
new domain; a management switch heard on a non-fabric NIC, or a neighbour that is no switch,
is not cabling.

tests/models/rail-8.yaml: two scalable units (su1, su2) of 4 nodes, each node with one HCA per
rail on its unit's leaf of that rail (ib0..ib7 = rail1..rail8), a spine per rail.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from aggregator_fabric import ibnetdiscover_dump

from agent.cluster_model import load_model, parse_model
from agent.common.report import Interface, LldpNeighbour, NodeReport, node_topology_object
from agent.model_probe import report_for, switch_mac
from aggregator.pipeline import ClusterInputs, Desired, Pipeline
from aggregator.sources import ibnetdiscover

MODEL_FILE = Path(__file__).parent.parent / "models" / "rail-8.yaml"
MODEL = load_model(str(MODEL_FILE))
RAW = {k: v for k, v in yaml.safe_load(MODEL_FILE.read_text()).items() if k != "expect"}
REPORTS = {n: report_for(MODEL, n) for n in MODEL.nodes()}
VICTIM = "su1-n2"


def _compute(reports: dict[str, NodeReport], dump: str | None = None, **inputs: Any) -> Desired:
    fabric = ibnetdiscover.parse(dump) if dump is not None else None
    return Pipeline().compute(ClusterInputs(reports=reports, fabric=fabric, **inputs), now=1_700_000_000)


def _members(desired: Desired) -> dict[str, tuple[str, int]]:
    """HyperNode name -> (tierName, nodeCount)."""
    return {
        o["metadata"]["name"]: (o["spec"]["tierName"], o["status"]["nodeCount"]) for o in desired.hypernodes
    }


def _ready(desired: Desired) -> dict[str, tuple[str, str]]:
    return {
        o["metadata"]["name"]: (
            o["status"]["conditions"][0]["status"],
            o["status"]["conditions"][0]["message"],
        )
        for o in desired.hypernodes
    }


def _recabled(leaf_of_rail5: str | None) -> str:
    """The dump with VICTIM's rail-5 cable unplugged (None) or moved to another leaf."""
    blocks = []
    for block in RAW["blocks"]:
        nodes = block["nodes"]
        if block["switch"] == "su1-rail5":
            nodes = ["su1-n1", "su1-n[3-4]"]
        blocks.append({**block, "nodes": nodes})
    if leaf_of_rail5 is not None:
        blocks.append({"switch": leaf_of_rail5, "nodes": [VICTIM]})
    return ibnetdiscover_dump(parse_model({**RAW, "blocks": blocks}))


def _without_rail5(report: NodeReport, moved_to: str | None = None) -> NodeReport:
    lldp = [n for n in report.lldp if n.interface != "ib4"]
    if moved_to is not None:
        lldp.append(
            dataclasses.replace(report.lldp[4], system_name=moved_to, chassis_id=switch_mac(moved_to))
        )
    return dataclasses.replace(report, lldp=tuple(lldp))


INTACT = _compute(REPORTS, ibnetdiscover_dump(MODEL))


def test_a_node_with_one_rail_cable_down_stays_in_its_unit_as_an_unhealthy_member() -> None:
    cut = _compute({**REPORTS, VICTIM: _without_rail5(REPORTS[VICTIM])}, _recabled(None))
    assert _members(cut) == _members(INTACT)  # no 1-node domain, the unit keeps its 4 nodes
    assert cut.node_labels[VICTIM] == INTACT.node_labels[VICTIM]
    assert cut.tree is not None and cut.tree.uncabled == {VICTIM: ("su1-rail5",)}
    unit = cut.node_labels[VICTIM]["hypertopo.io/leaf"]
    status, message = _ready(cut)[unit]
    assert status == "False" and f"{VICTIM}: not cabled to su1-rail5" in message
    assert cut.unhealthy_nodes == {VICTIM}
    assert _ready(cut)[cut.node_labels["su2-n1"]["hypertopo.io/leaf"]][0] == "True"


def test_a_rail_cable_in_the_wrong_unit_keeps_the_node_in_its_own() -> None:
    moved = _compute(
        {**REPORTS, VICTIM: _without_rail5(REPORTS[VICTIM], "su2-rail5")}, _recabled("su2-rail5")
    )
    assert _members(moved) == _members(INTACT)
    assert moved.tree is not None and moved.tree.uncabled == {VICTIM: ("su1-rail5",)}


def test_lldp_alone_gives_the_same_units() -> None:
    cut = _compute({**REPORTS, VICTIM: _without_rail5(REPORTS[VICTIM])})
    assert _members(cut) == _members(_compute(REPORTS))


# --- management LLDP and neighbours that are no switch -------------------------------------------


def _with_management(report: NodeReport, *, rack: str) -> NodeReport:
    """The node's management NIC (no RDMA) hears its rack's management switch, a real switch."""
    nic = Interface(name="eno1", mac="02:00:00:00:01:01", oper_state="up", kind="physical")
    switch = LldpNeighbour(
        interface="eno1",
        chassis_id=switch_mac(rack),
        port_id="ge-0/0/7",
        ttl=120,
        system_name=rack,
        capabilities=("Bridge", "Router"),
    )
    return dataclasses.replace(report, interfaces=(*report.interfaces, nic), lldp=(*report.lldp, switch))


def _rack_of(node: str) -> str:
    unit, index = node.split("-n")
    return f"mgmt-{unit}-{'a' if int(index) <= 2 else 'b'}"  # two racks per unit


MANAGED = {n: _with_management(r, rack=_rack_of(n)) for n, r in REPORTS.items()}


def test_a_management_switch_on_a_non_fabric_nic_does_not_split_units() -> None:
    assert _members(_compute(MANAGED)) == _members(_compute(REPORTS))
    assert _members(_compute(MANAGED, ibnetdiscover_dump(MODEL))) == _members(INTACT)


def test_without_rdma_devices_fabric_interfaces_names_the_fabric_nics() -> None:
    """A report without RDMA devices cannot tell fabric from management NICs: every neighbour
    counts (the management switch joins each unit's leaf set and half of each unit lacks it),
    unless --fabric-interfaces says which interfaces are the fabric."""
    bare = {n: dataclasses.replace(r, rdma=()) for n, r in MANAGED.items()}
    clean = _compute(REPORTS)
    guessed = _compute(bare)
    assert guessed.tree is not None and set(guessed.tree.uncabled.values()) == {
        ("mgmt-su1-a",),
        ("mgmt-su2-a",),
    }
    told = _compute(bare, fabric_interfaces=r"^ib\d+$")
    assert _members(told) == _members(clean) and told.tree is not None and not told.tree.uncabled


def test_a_neighbour_that_is_no_switch_is_no_cabling() -> None:
    """A host's lldpd (Station only) on a fabric NIC, back to back: not a switch. A neighbour
    without capabilities (some switches send none) still counts."""
    station = dataclasses.replace(REPORTS[VICTIM].lldp[0], system_name="su1-n3", capabilities=("Station",))
    host = _compute(
        {**REPORTS, VICTIM: dataclasses.replace(REPORTS[VICTIM], lldp=(station, *REPORTS[VICTIM].lldp[1:]))}
    )
    assert host.tree is not None and host.tree.uncabled == {VICTIM: ("su1-rail1",)}
    switch = dataclasses.replace(REPORTS[VICTIM].lldp[0], capabilities=("Bridge",))
    unknown = dataclasses.replace(REPORTS[VICTIM].lldp[0], capabilities=None)
    for neighbour in (switch, unknown):
        report = dataclasses.replace(REPORTS[VICTIM], lldp=(neighbour, *REPORTS[VICTIM].lldp[1:]))
        desired = _compute({**REPORTS, VICTIM: report})
        assert desired.tree is not None and desired.tree.uncabled == {}


def test_render_takes_fabric_interfaces(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    items = [node_topology_object(dataclasses.replace(r, rdma=())) for r in MANAGED.values()]
    (folder / "all.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "aggregator", "render", "--reports", str(folder), "--format", "json"),
            *("--fabric-interfaces", "^ib"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    leaves = [
        o["status"]["nodeCount"] for o in json.loads(proc.stdout)["items"] if o["spec"]["tierName"] == "leaf"
    ]
    assert leaves == [4, 4]
