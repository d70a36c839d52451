"""The ibnetdiscover parser on real dumps (../shared/data/ibnetdiscover) and on malformed input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aggregator.graph import FabricGraph
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import ibnetdiscover
from aggregator.sources.ibnetdiscover import IbnetdiscoverError

TOPOLOGY_DUMPS = [
    "ibtopotool_1.topo",
    "ibtopotool_2.topo",
    "ibtopotool_3.topo",
    "ibtopotool_4.topo",
    "loginoff_stage_cluster_2014.topo",
    "ufm_small_topo_file.txt",
]
PORT_REPORTS = [
    "hwloc_avakas_ib-subnet-fe80-0000.txt",
    "hwloc_plafrim2_ib-subnet-fe80-0000.txt",
    "hwloc_plafrim2_ib-subnet-fe80-0001.txt",
    "hwloc_plafrim_ib-subnet-fe80-0000.txt",
]


def _dumps(shared_data: Path) -> Path:
    return shared_data / "ibnetdiscover"


@pytest.mark.parametrize("name", TOPOLOGY_DUMPS)
def test_topology_dump_holds_every_switch_and_ca_block(shared_data: Path, name: str) -> None:
    text = (_dumps(shared_data) / name).read_text()
    fabric = ibnetdiscover.parse(text)
    switch_guids = {
        g.lower().zfill(16) for g in re.findall(r'^Switch\s+\d+\s+"S-([0-9a-f]+)"', text, re.M | re.I)
    }
    ca_guids = {g.lower().zfill(16) for g in re.findall(r'^Ca\s+\d+\s+"H-([0-9a-f]+)"', text, re.M | re.I)}
    assert {n.guid for n in fabric.switches()} == switch_guids
    assert {n.guid for n in fabric.cas()} == ca_guids
    # every cable is seen from both ends in this format but counted once
    port_lines = len(re.findall(r"^\[\d+\]", text, re.M))
    assert len(fabric.links) <= port_lines < 2 * len(fabric.links) + 1


def test_stderr_noise_inside_a_dump_is_kept_as_a_warning(shared_data: Path) -> None:
    fabric = ibnetdiscover.parse((_dumps(shared_data) / "ibtopotool_3.topo").read_text())
    assert any("bad status 110" in w for w in fabric.warnings)


_REPORT_LINE = re.compile(
    r"^(SW|CA)\s+\S+\s+(\d+)\s+(0x[0-9a-f]+)\s+\S+\s+\S+(?:\s+-\s+(SW|CA)\s+\S+\s+(\d+)\s+(0x[0-9a-f]+))?",
    re.I,
)


def _guid(text: str) -> str:
    return text.lower().removeprefix("0x").zfill(16)


@pytest.mark.parametrize("name", PORT_REPORTS)
def test_port_report_links_connected_ports_and_ignores_unconnected_ones(shared_data: Path, name: str) -> None:
    text = (_dumps(shared_data) / "ports" / name).read_text()
    fabric = ibnetdiscover.parse(text)
    cables: set[frozenset[tuple[str, int]]] = set()
    unconnected = 0
    for line in text.splitlines():
        match = _REPORT_LINE.match(line)
        if not match:
            continue
        _, port, guid, remote_kind, remote_port, remote_guid = match.groups()
        if remote_kind is None:
            unconnected += 1
            assert _guid(guid) in fabric.nodes  # the node is known, its idle port adds no cable
            continue
        cables.add(frozenset({(_guid(guid), int(port)), (_guid(remote_guid), int(remote_port))}))
    assert unconnected > 0
    assert set(fabric.links) == cables
    switch_guids = {_guid(m) for m in re.findall(r"^SW\s+\S+\s+\d+\s+(0x[0-9a-f]+)", text, re.M | re.I)}
    assert {n.guid for n in fabric.switches()} == switch_guids


def test_port_report_hosts_come_from_hca_descriptions(shared_data: Path) -> None:
    fabric = ibnetdiscover.parse((_dumps(shared_data) / "ports" / PORT_REPORTS[0]).read_text())
    graph = FabricGraph()
    ibnetdiscover.apply(graph, fabric)
    assert "node179" in graph.fabric_hosts()  # 'node179 HCA-1'
    # chassis line cards share one description prefix: their IDs fall back to GUIDs, all distinct
    names = ibnetdiscover.switch_names(fabric)
    assert len(set(names.values())) == len(fabric.switches())


def test_gb200_single_ca_dump_yields_no_tree(shared_data: Path) -> None:
    fabric = ibnetdiscover.parse((_dumps(shared_data) / "topograph_example-bad.out").read_text())
    assert not fabric.switches() and not fabric.links
    desired = Pipeline().compute(ClusterInputs(reports={}, fabric=fabric, include_fabric_hosts=True), now=0)
    assert desired.hypernodes == []


def test_real_fat_tree_dump_infers_leaf_and_spine_tiers(shared_data: Path) -> None:
    """loginoff: SX6036 leaves ib1..ib6 with hosts, cabled to two spines."""
    fabric = ibnetdiscover.parse((_dumps(shared_data) / TOPOLOGY_DUMPS[4]).read_text())
    desired = Pipeline().compute(ClusterInputs(reports={}, fabric=fabric, include_fabric_hosts=True), now=0)
    tiers = {o["spec"]["tierName"] for o in desired.hypernodes}
    assert tiers == {"leaf", "spine"}
    top = [o for o in desired.hypernodes if o["spec"]["tierName"] == "spine"]
    assert len(top) == 1 and top[0]["status"]["nodeCount"] == 144


MALFORMED = [
    (
        'Switch  24 "S-005442ba00003080"         # "ISR9024"\n[22]    "H-0008f1040396135"[1](8f10403961355)  # "x" lid 4 4xSDR\n'
        "[x] garbage\n",
        3,
    ),
    ("vendid=0x8f1\ndevid=0x5a06\nswitchguid=0xZZ\n", 3),
    ('[1]\t"S-0002c903007b78b0"[26]\t\t# "sw" lid 19 4xFDR10\n', 1),
    ("#\n\nCA   182  1 0x001175000077d284 4x QDR - SW    18 18 0x00066a00ec002dd9 ( 'node179 HCA-1' - \n", 3),
    ('Switch 36 "S-e41d2d030003e470 # "truncated\n', 1),
]


@pytest.mark.parametrize(("text", "line_no"), MALFORMED)
def test_malformed_line_raises_with_its_line_number(text: str, line_no: int) -> None:
    with pytest.raises(IbnetdiscoverError) as caught:
        ibnetdiscover.parse(text)
    assert caught.value.line_no == line_no
    assert f"line {line_no}" in str(caught.value)
    assert caught.value.text.strip() == text.splitlines()[line_no - 1].strip()
