"""The LLDPDU parser keeps 802.1AB's rules: what it renders for each ID subtype, which TLVs it
keeps, and every way a frame can be malformed ends in `MalformedFrame` with a reason, never in
another exception or a hang (checked by example and, with hypothesis, on arbitrary and mutated
bytes)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.lldp.frame import MalformedFrame, parse, parse_lldpdu

LLDP_MAC = bytes.fromhex("0180c200000e")
SOURCE = bytes.fromhex("020000aabbcc")


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", (kind << 9) | len(value)) + value


def mandatory(chassis: bytes = b"\x04" + SOURCE, port: bytes = b"\x05swp1", ttl: int = 120) -> bytes:
    return tlv(1, chassis) + tlv(2, port) + tlv(3, struct.pack("!H", ttl))


END = tlv(0, b"")


def ethernet(payload: bytes, *, tags: tuple[tuple[int, int], ...] = ()) -> bytes:
    head = LLDP_MAC + SOURCE
    for tpid, vid in tags:
        head += struct.pack("!HH", tpid, vid)
    return head + b"\x88\xcc" + payload


# --- what valid frames give -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chassis", "expected"),
    [
        (b"\x04\x00\x1b\x21\x0a\x0b\x0c", ("mac", "00:1b:21:0a:0b:0c")),
        (b"\x05\x01\x0a\x00\x00\x01", ("ip", "10.0.0.1")),
        (b"\x05\x02" + bytes.fromhex("20010db8000000000000000000000001"), ("ip", "2001:db8::1")),
        (b"\x07leaf-01", ("local", "leaf-01")),
        (b"\x06Ethernet1/1", ("ifname", "Ethernet1/1")),
        (b"\x01\xff\xfe", ("chassis", "ff:fe")),  # a text subtype holding binary: hex
        (b"\x09abc", ("reserved-9", "61:62:63")),  # a reserved subtype: hex
    ],
)
def test_chassis_ids_are_rendered_as_people_read_them(chassis: bytes, expected: tuple[str, str]) -> None:
    frame = parse_lldpdu(mandatory(chassis=chassis) + END)
    assert (frame.chassis_id_subtype, frame.chassis_id) == expected


@pytest.mark.parametrize(
    ("port", "expected"),
    [
        (b"\x03\xaa\xbb\xcc\xdd\xee\xff", ("mac", "aa:bb:cc:dd:ee:ff")),
        (b"\x05swp12", ("ifname", "swp12")),
        (b"\x01Uplink to S1", ("ifalias", "Uplink to S1")),
        (b"\x07Fa0/13", ("local", "Fa0/13")),
        (b"\x06\x00\x01\x02", ("agent-circuit-id", "00:01:02")),
    ],
)
def test_port_ids_are_rendered_as_people_read_them(port: bytes, expected: tuple[str, str]) -> None:
    frame = parse_lldpdu(mandatory(port=port) + END)
    assert (frame.port_id_subtype, frame.port_id) == expected


def test_optional_tlvs_are_decoded_and_unknown_and_org_tlvs_tolerated() -> None:
    mgmt_v4 = b"\x05\x01\xc0\x00\x02\x07" + b"\x02\x00\x00\x00\x11" + b"\x00"
    mgmt_v6 = b"\x11\x02" + bytes.fromhex("fe800000000000000000000000000001") + b"\x01\x00\x00\x00\x00\x00"
    body = (
        mandatory()
        + tlv(4, b"Ethernet1/12")
        + tlv(5, b"leaf-sw1")
        + tlv(6, b"SONiC 202305")
        + tlv(7, struct.pack("!HH", 0x0014, 0x0004))  # Bridge+Router, Bridge enabled
        + tlv(8, mgmt_v4)
        + tlv(8, mgmt_v6)
        + tlv(127, b"\x00\x80\xc2\x01\x00\x01")  # 802.1 port VLAN ID
        + tlv(42, b"future")  # a reserved type from a newer standard
        + END
        + b"\x00" * 20  # Ethernet padding after the End TLV
    )
    frame = parse(ethernet(body))
    assert (frame.port_description, frame.system_name, frame.system_description) == (
        "Ethernet1/12", "leaf-sw1", "SONiC 202305"
    )  # fmt: skip
    assert frame.capabilities is not None
    assert (frame.capabilities.system, frame.capabilities.enabled) == (("Bridge", "Router"), ("Bridge",))
    assert [(m.address, m.interface_number) for m in frame.management_addresses] == [
        ("192.0.2.7", 17),
        ("fe80::1", 0),
    ]
    assert [(t.oui, t.subtype, t.info) for t in frame.org_specific] == [("00:80:c2", 1, b"\x00\x01")]
    assert frame.unknown_tlvs == ((42, b"future"),)


def test_frames_parse_with_or_without_ethernet_header_and_through_vlan_tags() -> None:
    body = mandatory() + END
    bare = parse(body)
    plain = parse(ethernet(body))
    tagged = parse(ethernet(body, tags=((0x8100, 0x2064),)))  # PCP 1, VID 100
    qinq = parse(ethernet(body, tags=((0x88A8, 7), (0x8100, 100))))
    assert bare.ethernet is None
    assert plain.ethernet is not None and plain.ethernet.source == "02:00:00:aa:bb:cc"
    assert plain.ethernet.destination == "01:80:c2:00:00:0e" and plain.ethernet.vlan is None
    assert tagged.ethernet is not None and tagged.ethernet.vlan == 100
    assert qinq.ethernet is not None and qinq.ethernet.vlan == 7
    assert bare.chassis_id == plain.chassis_id == tagged.chassis_id == qinq.chassis_id


def test_a_frame_without_end_tlv_is_accepted_and_ttl_zero_marks_a_shutdown() -> None:
    frame = parse(mandatory(ttl=0))
    assert frame.is_shutdown and frame.ttl == 0
    assert not parse(mandatory(ttl=65535)).is_shutdown


# --- what must be rejected, and why -----------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "empty frame"),
        (b"\x02", "truncated TLV header"),
        (mandatory() + b"\x0a", "truncated TLV header"),
        (tlv(1, b"\x04" + SOURCE)[:5], "claims 7 bytes"),
        (mandatory() + struct.pack("!H", (5 << 9) | 40) + b"short", "claims 40 bytes"),
        # on the wire: a bare LLDPDU is recognised by its leading chassis ID TLV
        (
            ethernet(tlv(2, b"\x05swp1") + tlv(1, b"\x04" + SOURCE) + tlv(3, b"\x00\x78")),
            "missing chassis ID TLV",
        ),
        (ethernet(tlv(127, b"\x00\x80\xc2\x07\x03\x00\x00\x00\x64")), "found TLV type 127"),
        (ethernet(END), "found the end of the frame"),
        (tlv(1, b"\x04" + SOURCE) + tlv(3, b"\x00\x78") + tlv(2, b"\x05p"), "missing port ID TLV"),
        (tlv(1, b"\x04" + SOURCE) + tlv(2, b"\x05p") + END, "missing TTL TLV"),
        (tlv(1, b"\x04" + SOURCE) + tlv(2, b"\x05p"), "found the end of the frame"),
        (tlv(1, b"\x04" + SOURCE) + tlv(2, b"\x05p") + tlv(3, b"\x78"), "TTL TLV must be 2 bytes"),
        (tlv(1, b"\x04" + SOURCE) + tlv(2, b"\x05p") + tlv(3, b"\x00\x00\x78"), "TTL TLV must be 2 bytes"),
        (tlv(1, b"") + tlv(2, b"\x05p") + tlv(3, b"\x00\x78"), "chassis ID TLV too short"),
        (tlv(1, b"\x04") + tlv(2, b"\x05p") + tlv(3, b"\x00\x78"), "chassis ID TLV too short"),
        (tlv(1, b"\x04" + SOURCE) + tlv(2, b"\x05") + tlv(3, b"\x00\x78"), "port ID TLV too short"),
        (tlv(1, b"\x07" + b"x" * 256) + tlv(2, b"\x05p") + tlv(3, b"\x00\x78"), "chassis ID TLV too long"),
        (mandatory() + tlv(1, b"\x04" + SOURCE), "duplicate mandatory TLV"),
        (mandatory() + tlv(7, b"\x00\x14"), "system capabilities TLV must be 4 bytes"),
        (mandatory() + tlv(8, b"\x05\x01\x0a\x00"), "management address TLV too short"),
        (mandatory() + tlv(8, b"\x30\x01" + b"\x00" * 10), "out of range"),
        (mandatory() + tlv(8, b"\x1f\x01" + b"\x00" * 10), "overruns"),
        (mandatory() + tlv(8, b"\x05\x01\x0a\x00\x00\x01\x02\x00\x00\x00\x01\x09"), "OID length 9"),
        (mandatory() + tlv(127, b"\x00\x80"), "organisation-specific TLV too short"),
        (mandatory() + struct.pack("!H", 3) + b"\x00\x00\x00", "End TLV with length 3"),
        (ethernet(mandatory())[:13], "shorter than an Ethernet header"),
        (LLDP_MAC + SOURCE + b"\x81\x00\x00", "truncated VLAN tag"),
        (LLDP_MAC + SOURCE + b"\x08\x00" + b"\x45" * 20, "not an LLDP frame (ethertype 0x0800)"),
        (LLDP_MAC + SOURCE + b"\x00\x40" + b"\xaa" * 20, "not an LLDP frame (802.3 length 64)"),
    ],
)
def test_malformed_frames_are_rejected_with_the_reason(frame: bytes, reason: str) -> None:
    with pytest.raises(MalformedFrame) as caught:
        parse(frame)
    assert reason in caught.value.reason


# --- properties -------------------------------------------------------------------------------

VALID = [
    ethernet(
        mandatory() + tlv(5, b"leaf-sw1") + tlv(8, b"\x05\x01\x0a\x00\x00\x01\x02\x00\x00\x00\x01\x00") + END
    ),
    mandatory(chassis=b"\x05\x02" + bytes(16), port=b"\x03" + SOURCE) + tlv(127, b"\x00\x12\x0f\x04\x05\xdc"),
    ethernet(mandatory(chassis=b"\x07sw") + tlv(7, b"\x00\x14\x00\x04") + END, tags=((0x8100, 5),)),
]


def _parse_or_reject(data: bytes) -> None:
    try:
        frame = parse(data)
    except MalformedFrame as exc:
        assert exc.reason
    else:
        assert frame.chassis_id and frame.port_id


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_arbitrary_bytes_never_raise_anything_but_malformed_frame(data: bytes) -> None:
    _parse_or_reject(data)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(VALID),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    st.integers(0, 10_000),
)
def test_mutated_valid_frames_never_raise_anything_but_malformed_frame(
    frame: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(frame)
    for position, value in flips:
        data[position % len(data)] = value
    _parse_or_reject(bytes(data[: max(cut % (len(data) + 1), 0)]))
