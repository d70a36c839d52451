"""The interface probe: LinkRecords (as netlink or `ip -j link` reports them) joined with sysfs."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from agent.common.report import Health
from agent.probes import net
from agent.probes.net import LinkRecord

TREES = Path(__file__).parent.parent / "fixtures" / "sysfs"
HGX = TREES / "hgx-h100-ib"

HGX_LINKS = [
    LinkRecord(1, "lo", oper_state="UNKNOWN", mtu=65536, link_type="loopback", flags=net.IFF_LOOPBACK),
    LinkRecord(2, "eno1", mac="3c:ec:ef:10:20:30", oper_state="UP", mtu=1500, link_type="ether"),
    *(LinkRecord(3 + i, f"ib{i}", oper_state="UP", mtu=4092, link_type="infiniband") for i in range(8)),
]


def test_hgx_interfaces_carry_speed_pci_parent_and_kind_and_no_loopback() -> None:
    result = net.probe(HGX_LINKS, sysfs=HGX)
    assert result.health.state is Health.OK, result.health.reason
    got = {i.name: i for i in result.value or ()}
    assert list(got) == ["eno1"] + [f"ib{i}" for i in range(8)]
    eno1 = got["eno1"]
    assert (eno1.mac, eno1.oper_state, eno1.mtu, eno1.speed_mbps) == ("3c:ec:ef:10:20:30", "up", 1500, 1000)
    assert (eno1.pci_address, eno1.kind) == ("0000:01:00.0", "physical")
    for i, bus in enumerate(["18", "40", "4f", "5e", "9a", "c0", "ce", "dc"]):
        ib = got[f"ib{i}"]
        assert (ib.speed_mbps, ib.pci_address, ib.kind) == (400000, f"0000:{bus}:00.0", "infiniband")


def test_include_pattern_keeps_only_matching_names() -> None:
    result = net.probe(HGX_LINKS, sysfs=HGX, include=re.compile(r"^ib[0-3]$"))
    assert [i.name for i in result.value or ()] == ["ib0", "ib1", "ib2", "ib3"]
    none = net.probe(HGX_LINKS, sysfs=HGX, include=re.compile(r"^eth"))
    assert none.health.state is Health.ABSENT and "'^eth'" in none.health.reason


def test_only_loopback_is_absent() -> None:
    result = net.probe(HGX_LINKS[:1], sysfs=HGX)
    assert (result.value, result.health.state, result.health.reason) == (
        None,
        Health.ABSENT,
        net.NO_INTERFACES,
    )


def test_unknown_speed_is_none_whether_minus_one_missing_or_refused(tmp_path: Path) -> None:
    down = TREES / "down-port"  # ib1's speed file holds -1 (link down)
    links = [LinkRecord(1, "ib0", link_type="infiniband"), LinkRecord(2, "ib1", link_type="infiniband"),
             LinkRecord(3, "veth9", kind="veth")]  # fmt: skip
    result = net.probe(links, sysfs=down)
    speeds = {i.name: i.speed_mbps for i in result.value or ()}
    assert speeds == {"ib0": 200000, "ib1": None, "veth9": None}  # veth9 has no sysfs dir at all
    assert result.health.state is Health.OK
    (tmp_path / "class" / "net" / "eth0").mkdir(parents=True)
    (tmp_path / "class" / "net" / "eth0" / "speed").write_text("4294967295\n")  # -1 read as unsigned
    assert net.probe([LinkRecord(1, "eth0")], sysfs=tmp_path).value[0].speed_mbps is None  # type: ignore[index]


def test_garbled_speed_degrades_naming_the_file_and_keeps_the_interface(tmp_path: Path) -> None:
    (tmp_path / "class" / "net" / "eth0").mkdir(parents=True)
    (tmp_path / "class" / "net" / "eth0" / "speed").write_bytes(b"\xff\xfe")
    result = net.probe([LinkRecord(1, "eth0", oper_state="up")], sysfs=tmp_path)
    assert result.health.state is Health.DEGRADED and "eth0/speed" in result.health.reason
    assert [(i.name, i.speed_mbps, i.oper_state) for i in result.value or ()] == [("eth0", None, "up")]


def test_bond_members_name_their_bond_but_bridge_ports_do_not(tmp_path: Path) -> None:
    links = [
        LinkRecord(2, "eth0", master="bond0"), LinkRecord(3, "eth1", master="bond0"),
        LinkRecord(4, "bond0", kind="bond"), LinkRecord(5, "veth0", kind="veth", master="br0"),
        LinkRecord(6, "br0", kind="bridge"),
    ]  # fmt: skip
    got = {i.name: (i.bond_master, i.kind) for i in net.probe(links, sysfs=tmp_path).value or ()}
    assert got == {"eth0": ("bond0", None), "eth1": ("bond0", None), "bond0": (None, "bond"),
                   "veth0": (None, "veth"), "br0": (None, "bridge")}  # fmt: skip


def test_duplicate_or_unsafe_names_are_reported_and_the_rest_kept(tmp_path: Path) -> None:
    os.makedirs(tmp_path / "class" / "net")
    links = [LinkRecord(2, "eth0"), LinkRecord(3, "eth0"), LinkRecord(4, "../../etc"), LinkRecord(5, "..")]
    result = net.probe(links, sysfs=tmp_path)
    assert result.health.state is Health.DEGRADED
    assert "eth0: reported twice (indexes 2, 3)" in result.health.reason
    assert "link 4: unusable interface name '../../etc'" in result.health.reason
    assert "link 5: unusable interface name '..'" in result.health.reason
    assert [i.name for i in result.value or ()] == ["eth0"]


@pytest.mark.parametrize(("capture", "count"), [("pass_ib_interfaces", 8), ("fail_ib_interfaces", 7)])
def test_ip_link_captures_give_the_ipoib_interfaces(shared_data: Path, capture: str, count: int) -> None:
    text = (shared_data / "iplink" / f"{capture}.ip-j-link.json").read_text()
    raw = json.loads(text)
    result = net.probe(net.records_from_ip_json(text), sysfs=Path("/nonexistent"))
    interfaces = result.value or ()
    assert len(interfaces) == count
    assert [i.name for i in interfaces] == [e["ifname"] for e in raw]
    assert {(i.kind, i.oper_state, i.mtu) for i in interfaces} == {("infiniband", "up", 2044)}
    assert [i.mac for i in interfaces] == [e["address"] for e in raw]  # 20-byte IPoIB addresses kept


def test_failing_capture_is_missing_exactly_one_port_of_the_passing_one(shared_data: Path) -> None:
    def names(capture: str) -> set[str]:
        text = (shared_data / "iplink" / f"{capture}.ip-j-link.json").read_text()
        return {i.name for i in net.probe(net.records_from_ip_json(text), sysfs=Path("/x")).value or ()}

    assert names("pass_ib_interfaces") - names("fail_ib_interfaces") == {"ibp204s0"}


@pytest.mark.parametrize(
    ("text", "message"),
    [("not json", "not JSON"), ('{"ifname": "a"}', "JSON list"), ('[{"ifindex": 1}]', "link #0: needs")],
)
def test_ip_json_that_is_not_ip_link_output_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        net.records_from_ip_json(text)


def test_ip_json_flags_loopback_and_reads_master_and_kind() -> None:
    text = json.dumps([
        {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP"], "link_type": "loopback"},
        {"ifindex": 2, "ifname": "eth0", "master": "bond0", "operstate": "UP", "mtu": 9000},
        {"ifindex": 3, "ifname": "bond0", "linkinfo": {"info_kind": "bond"}, "mtu": "bad"},
    ])  # fmt: skip
    records = net.records_from_ip_json(text)
    assert records[0].flags & net.IFF_LOOPBACK
    assert (records[1].master, records[1].mtu, records[2].kind, records[2].mtu) == (
        "bond0",
        9000,
        "bond",
        None,
    )
