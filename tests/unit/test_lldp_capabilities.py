"""LLDP neighbours keep the capabilities they enable (802.1AB System Capabilities TLV) in the
report, from raw frames and from a host lldpd alike, so the aggregator can tell a switch from a
host's lldpd, a phone or an access point. A neighbour that sends no such TLV is `None`
(unknown), as are neighbours in reports of older agents."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pcap_files as pcap
import pytest

from agent.cluster_model import parse_model
from agent.common.report import node_topology_object
from agent.lldp.frame import MalformedFrame, parse
from agent.lldp.lldpcli import parse_json, parse_keyvalue
from agent.model_probe import report_for
from agent.probes.lldp import neighbour_from_frame
from aggregator.sources import nodetopology


def _neighbours_of(capture: Path) -> dict[str | None, tuple[str, ...] | None]:
    """system name (or chassis ID) -> enabled capabilities, over every LLDP frame of a capture."""
    found: dict[str | None, tuple[str, ...] | None] = {}
    for record in pcap.read(capture).records:
        try:
            frame = parse(record.data)
        except MalformedFrame:
            continue
        neighbour = neighbour_from_frame("eth0", frame)
        found[neighbour.system_name or neighbour.chassis_id] = neighbour.capabilities
    return found


@pytest.mark.parametrize(
    ("capture", "name", "enabled"),
    [
        (
            "LLDP_and_CDP.pcap",
            "S1.cisco.com",
            ("Bridge",),
        ),  # tcpdump: System [Bridge, Router], Enabled [Bridge]
        ("lldp_mudurl.pcap", "upstairs.ofcourseimright.com", ("Wlan",)),  # an access point: Enabled [WLAN AP]
        ("gopacket-scalance.pcap", "Switch1", ("Station",)),
        ("lldp-app-priority.pcap", "leaf0b", None),  # a Big Cloud Fabric leaf sends no capabilities TLV
    ],
)
def test_raw_frames_give_the_enabled_capabilities(
    shared_data: Path, capture: str, name: str, enabled: tuple[str, ...] | None
) -> None:
    assert _neighbours_of(shared_data / "lldp" / capture)[name] == enabled


def test_lldpctl_json_and_keyvalue_give_the_enabled_capabilities(shared_data: Path) -> None:
    lldpctl = shared_data / "lldp" / "lldpctl"
    (huawei,) = parse_json((lldpctl / "sichek_bjg45.json").read_text())
    assert huawei.capabilities == ("Bridge", "Router")
    by_interface = {
        n.interface: n for n in parse_keyvalue((lldpctl / "netbox-agent_dedibox2.txt").read_text())
    }
    assert by_interface["eno1"].capabilities == ("Bridge",)  # Bridge.enabled=on, Router.enabled=off
    (no_tlv,) = parse_keyvalue((lldpctl / "netbox-agent_dedibox1.txt").read_text())
    assert no_tlv.capabilities is None
    chassis = {
        "id": {"type": "mac", "value": "02:00:00:00:00:07"},
        "capability": {"type": "Station", "enabled": True},
    }
    single = {  # lldpcli -f json collapses a single capability into an object
        "lldp": {
            "interface": {
                "eth0": {"chassis": {"host7": chassis}, "port": {"id": {"type": "ifname", "value": "eth1"}}}
            }
        }
    }
    (host,) = parse_json(json.dumps(single))
    assert host.capabilities == ("Station",)


def test_capabilities_survive_the_wire_and_old_reports_read_as_unknown() -> None:
    model = parse_model({"blocks": [{"switch": "leaf1", "nodes": ["n1"]}]})
    report = report_for(model, "n1")
    neighbour = dataclasses.replace(report.lldp[0], capabilities=("Bridge", "Router"))
    obj = node_topology_object(dataclasses.replace(report, lldp=(neighbour,)))
    assert obj["spec"]["lldp"][0]["capabilities"] == ["Bridge", "Router"]
    assert nodetopology.report_from_object(json.loads(json.dumps(obj))).lldp[0] == neighbour
    del obj["spec"]["lldp"][0]["capabilities"]  # written by an agent that did not know the field
    assert nodetopology.report_from_object(obj).lldp[0].capabilities is None
