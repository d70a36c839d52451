"""What a host lldpd prints (`lldpcli -f json`, `-f json0`, `-f keyvalue`) becomes the same
neighbours as raw frames give. Real outputs from GPU-cluster hosts and servers (sichek,
netbox-agent) are checked against their own text; the lldpd reader turns every failure into a
per-probe result."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.adapters.lldpd_socket import CommandOutput, LldpdReader
from agent.common.report import Health
from agent.lldp.lldpcli import LldpcliError, parse_json, parse_keyvalue
from agent.probes.lldp import from_lldpcli_json

# `lldpcli -f json0 show neighbors details` from lldpd 1.0.16 (Debian 12) in a network namespace,
# one neighbour, trimmed of capabilities and auto-negotiation.
JSON0_ONE_NEIGHBOUR = """{"lldp": [{"interface": [{"name": "eth0x", "via": "LLDP", "rid": "1",
  "age": "0 day, 00:00:04",
  "chassis": [{"id": [{"type": "mac", "value": "96:50:83:55:a1:8e"}], "name": [{"value": "leaf-sw1"}],
               "descr": [{"value": "Debian GNU/Linux 12 (bookworm)"}],
               "mgmt-ip": [{"value": "10.0.0.2"}, {"value": "fe80::9450:83ff:fe55:a18e"}],
               "mgmt-iface": [{"value": "6"}]}],
  "port": [{"id": [{"type": "mac", "value": "96:50:83:55:a1:8e"}], "descr": [{"value": "swp1x"}],
            "ttl": [{"value": "4"}]}]}]}]}"""


def _lldpctl(shared_data: Path) -> Path:
    return shared_data / "lldp" / "lldpctl"


def test_sichek_json_outputs_give_each_interface_its_switch_and_port(shared_data: Path) -> None:
    files = sorted(_lldpctl(shared_data).glob("sichek_*.json"))
    assert len(files) >= 3
    total = 0
    for path in files:
        text = path.read_text()
        neighbours = from_lldpcli_json(text)
        assert len(neighbours) == text.count('"via": "LLDP"'), path.name
        blocks = [text.index(f'"{n.interface}": {{') for n in neighbours] + [len(text)]
        for n, start, end in zip(neighbours, blocks, blocks[1:], strict=False):
            block = text[start:end]  # this interface's part of the file, read as text
            assert n.system_name and f'"{n.system_name}": {{' in block, path.name
            assert f'"type": "ifname", "value": "{n.port_id}"' in block and n.port_id_subtype == "ifname"
            assert f'"type": "mac", "value": "{n.chassis_id}"' in block and n.chassis_id_subtype == "mac"
            assert f'"ttl": "{n.ttl}"' in block
            assert all(address in block for address in n.management_addresses)
        total += len(neighbours)
    assert total == 4


def test_a_multi_address_chassis_keeps_every_management_address(shared_data: Path) -> None:
    (neighbour,) = parse_json((_lldpctl(shared_data) / "sichek_dracog24.json").read_text())
    assert neighbour.management_addresses == ("33.239.145.151", "fdbd:dc41:199:4901::21ef:9197")
    assert neighbour.port_description == "TO-SERVER-26.208.100.178"


def test_an_lldpd_without_neighbours_gives_none(shared_data: Path) -> None:
    assert parse_json((_lldpctl(shared_data) / "sichek_empty.json").read_text()) == []
    assert parse_json('{"lldp": [{}]}') == []  # json0 of an lldpd without neighbours


_KV = re.compile(r"^lldp\.(\S+?)\.(chassis\.name|port\.(?:ifname|mac|local))=(.*)$", re.MULTILINE)


def test_netbox_keyvalue_outputs_give_each_interface_its_switch_and_port(shared_data: Path) -> None:
    checked = 0
    for path in sorted(_lldpctl(shared_data).glob("netbox-agent_*.txt")):
        text = path.read_text()
        names: dict[str, str] = {}
        ports: dict[str, str] = {}
        for ifname, key, value in _KV.findall(text):
            (names if key == "chassis.name" else ports)[ifname] = value
        neighbours = parse_keyvalue(text)
        assert {n.interface for n in neighbours} == set(ports), path.name  # VLAN-only entries skipped
        for n in neighbours:
            assert (n.system_name, n.port_id) == (names.get(n.interface), ports[n.interface]), path.name
            assert re.search(rf"^lldp\.{re.escape(n.interface)}\.chassis\.mac={n.chassis_id}$", text, re.M)
        checked += len(neighbours)
    assert checked == 6


def test_keyvalue_multi_line_values_and_dotted_interface_names_survive() -> None:
    text = (
        "lldp.eth0.100.via=LLDP\n"
        "lldp.eth0.100.chassis.mac=38:20:56:67:90:80\n"
        "lldp.eth0.100.chassis.descr=Cisco IOS Software\n"
        "Technical Support: http://www.cisco.com/techsupport\n"
        "lldp.eth0.100.port.ifname=Gi1/0/29\n"
        "lldp.eth0.100.port.ttl=120\n"
        "lldp.eth0.100.via=LLDP\n"
        "lldp.eth0.100.chassis.local=second-switch\n"
        "lldp.eth0.100.port.local=7\n"
    )
    first, second = parse_keyvalue(text)
    assert first.interface == second.interface == "eth0.100"
    assert (
        first.system_description == "Cisco IOS Software\nTechnical Support: http://www.cisco.com/techsupport"
    )
    assert (first.port_id, first.ttl) == ("Gi1/0/29", 120)
    assert (second.chassis_id, second.chassis_id_subtype, second.port_id, second.ttl) == (
        "second-switch",
        "local",
        "7",
        0,
    )


def test_json0_output_gives_the_same_neighbour_shape_as_json() -> None:
    (neighbour,) = parse_json(JSON0_ONE_NEIGHBOUR)
    assert (neighbour.interface, neighbour.system_name, neighbour.port_id) == (
        "eth0x",
        "leaf-sw1",
        "96:50:83:55:a1:8e",
    )
    assert (neighbour.chassis_id_subtype, neighbour.port_id_subtype, neighbour.ttl) == ("mac", "mac", 4)
    assert neighbour.port_description == "swp1x"
    assert neighbour.management_addresses == ("10.0.0.2", "fe80::9450:83ff:fe55:a18e")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not JSON"),
        ('{"other": 1}', 'no top-level "lldp"'),
        ('{"lldp": {"interface": 3}}', "shape"),
    ],
)
def test_output_that_is_not_lldpcli_json_is_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(LldpcliError, match=reason):
        parse_json(text)


class Replay:
    def __init__(self, output: CommandOutput | BaseException) -> None:
        self.output = output
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandOutput:
        self.calls.append(list(argv))
        if isinstance(self.output, BaseException):
            raise self.output
        return self.output


def test_lldpd_reader_asks_lldpcli_on_the_mounted_socket_for_json0(tmp_path: Path) -> None:
    sock = tmp_path / "lldpd.socket"
    sock.touch()
    replay = Replay(CommandOutput(0, JSON0_ONE_NEIGHBOUR, ""))
    result = LldpdReader(sock, run=replay).probe()
    assert replay.calls == [["lldpcli", "-u", str(sock), "-f", "json0", "show", "neighbors", "details"]]
    assert result.health.state is Health.OK
    assert [n.system_name for n in result.value or ()] == ["leaf-sw1"]


@pytest.mark.parametrize(
    ("output", "state", "reason"),
    [
        (
            CommandOutput(1, "", "lldpcli: unable to connect to lldpd daemon"),
            Health.FAILED,
            "unable to connect",
        ),
        (CommandOutput(0, "<html>", ""), Health.FAILED, "cannot read lldpcli output"),
        (subprocess.TimeoutExpired(["lldpcli"], 5.0), Health.FAILED, "did not answer"),
        (FileNotFoundError("lldpcli"), Health.ABSENT, "not installed"),
    ],
)
def test_lldpd_reader_turns_every_failure_into_a_probe_result(
    tmp_path: Path, output: CommandOutput | BaseException, state: Health, reason: str
) -> None:
    sock = tmp_path / "lldpd.socket"
    sock.touch()
    result = LldpdReader(sock, run=Replay(output)).probe()
    assert result.value is None and result.health.state is state and reason in result.health.reason


def test_lldpd_reader_without_a_socket_reports_absent_without_running_anything(tmp_path: Path) -> None:
    replay = Replay(CommandOutput(0, "{}", ""))
    result = LldpdReader(tmp_path / "missing.socket", run=replay).probe()
    assert result.health.state is Health.ABSENT and replay.calls == []
