"""Real LLDP captures from switches, phones and NIC firmware decode to what tcpdump reads in them;
fuzzer-found malformed frames are rejected with a reason or parsed, and nothing else escapes.

Expected values come from tcpdump's own decode beside each capture (`*.out`, paired with its
capture by packet timestamps), from the installed tcpdump when there is one, or, for captures
without a decode, from facts read off the frame bytes and noted in SOURCES.md."""

from __future__ import annotations

import datetime
import subprocess
import time
from pathlib import Path

import pcap_files as pcap
import pytest
from lldp_tcpdump_text import DecodedPacket, parse_decode
from realparts import require_binary

from agent.lldp.frame import LldpFrame, MalformedFrame, parse


def _stamp(record: pcap.Record) -> str:
    when = datetime.datetime.fromtimestamp(record.timestamp, tz=datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")


def _captures(shared_data: Path) -> list[Path]:
    found = sorted((shared_data / "lldp").glob("*.pcap"))
    assert found, "no LLDP captures in the shared data"
    return found


def _capture_for(decode: list[DecodedPacket], captures: list[Path]) -> tuple[Path, pcap.Capture]:
    """The capture whose packet timestamps are the ones tcpdump printed (tests run tcpdump in UTC)."""
    wanted = [p.time for p in decode]
    for path in captures:
        capture = pcap.read(path)
        if [_stamp(r) for r in capture.records] == wanted:
            return path, capture
    raise AssertionError(f"no capture has the packet times {wanted[:2]}...")


def _assert_agrees(frame: bytes, expected: DecodedPacket, where: str) -> None:
    if not expected.is_lldp:
        with pytest.raises(MalformedFrame, match="not an LLDP frame"):
            parse(frame)
    elif expected.chassis_id is None:
        # tcpdump found no chassis ID TLV: an LLDPDU without its mandatory TLVs (802.1AB 8.2)
        with pytest.raises(MalformedFrame, match="missing chassis ID TLV"):
            parse(frame)
    else:
        decoded = parse(frame)
        got = (decoded.chassis_id, decoded.port_id, decoded.system_name)
        assert got == (expected.chassis_id, expected.port_id, expected.system_name), where


def test_every_capture_with_a_tcpdump_decode_gives_tcpdumps_chassis_port_and_system_name(
    shared_data: Path,
) -> None:
    decodes = sorted((shared_data / "lldp").glob("*.out"))
    assert decodes, "no tcpdump decodes beside the captures"
    lldp_packets = 0
    for out in decodes:
        expected = parse_decode(out.read_text(errors="replace"))
        path, capture = _capture_for(expected, _captures(shared_data))
        for index, (record, packet) in enumerate(zip(capture.records, expected, strict=True)):
            _assert_agrees(record.data, packet, f"{out.name} packet {index + 1} ({path.name})")
            lldp_packets += packet.is_lldp and packet.chassis_id is not None
    assert lldp_packets >= 10


def test_every_capture_agrees_with_the_installed_tcpdump(shared_data: Path) -> None:
    tcpdump = require_binary("tcpdump")
    for path in _captures(shared_data):
        proc = subprocess.run(
            [tcpdump, "-nn", "-v", "-tttt", "-r", str(path)],
            capture_output=True, text=True, errors="replace", env={"TZ": "UTC"}, timeout=30, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        expected = parse_decode(proc.stdout)
        records = pcap.read(path).records
        assert len(records) == len(expected), path.name
        for index, (record, packet) in enumerate(zip(records, expected, strict=True)):
            assert _stamp(record) == packet.time
            if path.name != "med-loc-malformed.pcap":  # its chassis ID is binary; checked below
                _assert_agrees(record.data, packet, f"{path.name} packet {index + 1}")


def _only_frame(shared_data: Path, name: str) -> LldpFrame:
    capture = pcap.read(shared_data / "lldp" / name)
    assert capture.error is None and len(capture.records) == 1
    return parse(capture.records[0].data)


def test_scalance_switch_reports_its_local_chassis_and_port_names(shared_data: Path) -> None:
    frame = _only_frame(shared_data, "gopacket-scalance.pcap")
    assert (frame.system_name, frame.port_id, frame.port_id_subtype) == ("Switch1", "port-001", "local")
    assert (frame.chassis_id, frame.chassis_id_subtype, frame.ttl) == ("switch1", "local", 20)
    assert [m.address for m in frame.management_addresses] == ["141.81.0.190"]
    assert frame.system_description and "SCALANCE X212-2" in frame.system_description


def test_connectx_firmware_lldp_names_the_nic_port_by_mac(shared_data: Path) -> None:
    capture = pcap.read(shared_data / "lldp" / "connectx.pcap")
    raw = capture.records[0].data
    frame = parse(raw)
    source_mac = ":".join(f"{b:02x}" for b in raw[6:12])
    assert frame.ethernet is not None and frame.ethernet.source == source_mac
    assert (frame.port_id_subtype, frame.port_id) == ("mac", source_mac)
    assert frame.chassis_id_subtype == "mac" and frame.chassis_id != frame.port_id
    assert frame.port_description == "ConnectX-4 Lx, 25G/10G/1G SFP"
    assert frame.system_name is None and frame.ttl == 48


def test_cisco_phone_chassis_id_is_rendered_as_its_ip_address(shared_data: Path) -> None:
    frame = _only_frame(shared_data, "packetnet-lldp.pcap")
    assert (frame.chassis_id_subtype, frame.chassis_id) == ("ip", "172.16.10.109")
    assert (frame.port_id_subtype, frame.port_id) == ("local", "001B54945A8B:P2")
    assert frame.system_name == "SEP001B54945A8B.elmec.ad"


def test_switches_with_med_and_poe_tlvs_decode_with_their_org_tlvs_kept(shared_data: Path) -> None:
    bt = _only_frame(shared_data, "8023bt.pcap")
    assert (bt.system_name, bt.port_id, bt.port_description) == (
        "cisco-bt-switch",
        "Gi1/0/2",
        "GigabitEthernet1/0/2",
    )
    assert {t.oui for t in bt.org_specific} >= {"00:80:c2", "00:12:0f"}
    sg200 = _only_frame(shared_data, "sg200.pcap")
    assert (sg200.chassis_id, sg200.port_id, sg200.port_id_subtype) == ("00:35:35:35:35:35", "g1", "ifname")
    assert any(t.oui == "00:12:bb" for t in sg200.org_specific)  # LLDP-MED (TIA)


# Fuzzer-found frames: what each must give (parsed chassis ID, or the start of the reject reason).
MALFORMED_OUTCOMES = {
    "malformed/lldp-infinite-loop-1.pcap": [("parsed", "08:00:27:42:ba:59")],
    "malformed/lldp-infinite-loop-2.pcap": [("rejected", "End TLV with length")],
    "malformed/lldp_8023_mtu-oobr.pcap": [("rejected", "missing chassis ID TLV")],
    "malformed/lldp_asan.pcap": [("rejected", "missing port ID TLV")],
    "malformed/lldp_mgmt_addr_tlv_asan.pcap": [
        ("rejected", "missing chassis ID TLV"),
        ("rejected", "not an LLDP frame"),
    ],
    # a binary "chassis component" ID: not text, so shown as hex
    "med-loc-malformed.pcap": [("parsed", "0a:c0:de:9d:0a:74")],
}


def _outcome(frame: bytes) -> tuple[str, str]:
    try:
        return "parsed", parse(frame).chassis_id
    except MalformedFrame as exc:
        return "rejected", exc.reason


def test_malformed_captures_are_rejected_with_a_reason_or_parsed_and_nothing_else_raises(
    shared_data: Path,
) -> None:
    on_disk = {f"malformed/{p.name}" for p in (shared_data / "lldp" / "malformed").glob("*.pcap")}
    assert on_disk <= set(MALFORMED_OUTCOMES), f"new malformed captures: {on_disk - set(MALFORMED_OUTCOMES)}"
    for name, expected in MALFORMED_OUTCOMES.items():
        records = pcap.read(shared_data / "lldp" / name).records
        started = time.perf_counter()
        outcomes = [_outcome(r.data) for r in records]
        assert time.perf_counter() - started < 0.5, f"{name}: parsing took too long"
        assert len(outcomes) == len(expected), name
        for (kind, detail), (want_kind, want_detail) in zip(outcomes, expected, strict=True):
            assert kind == want_kind and detail.startswith(want_detail), (name, kind, detail)


@pytest.mark.parametrize("seed", ["fuzz_seed_lldp.0.raw", "fuzz_seed_lldp.1.raw"])
def test_fuzz_seed_frames_parse_and_every_truncation_of_them_is_rejected_cleanly(
    shared_data: Path, seed: str
) -> None:
    raw = (shared_data / "lldp" / seed).read_bytes()
    frame = parse(raw)
    assert frame.ethernet is not None and frame.ethernet.destination == "01:80:c2:00:00:0e"
    assert frame.chassis_id_subtype == "mac" and frame.ttl == 120
    parsed_prefixes = 0
    for cut in range(len(raw)):
        kind, _ = _outcome(raw[:cut])  # raises on anything but MalformedFrame
        parsed_prefixes += kind == "parsed"
    # a prefix that ends exactly between whole TLVs (after the TTL, or later) is still a valid LLDPDU
    assert 0 < parsed_prefixes < len(raw)
