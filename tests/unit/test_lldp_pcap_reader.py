"""The capture reader replays real captures in every layout tools write them (pcap in both byte
orders, nanosecond pcap, pcapng), keeps the whole records of a truncated file and says where it
stopped, and refuses bytes that are no capture at all."""

from __future__ import annotations

import struct
from pathlib import Path

import pcap_files as pcap
import pytest

from agent.lldp.frame import parse


def _real_records(shared_data: Path) -> tuple[pcap.Record, ...]:
    capture = pcap.read(shared_data / "lldp" / "lldp_mudurl.pcap")
    assert capture.error is None and len(capture.records) == 2
    return capture.records


def _pcap_bytes(records: tuple[pcap.Record, ...], *, order: str, nanos: bool) -> bytes:
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 65535, pcap.LINKTYPE_ETHERNET)
    for r in records:
        sec = int(r.timestamp)
        frac = round((r.timestamp - sec) * (1e9 if nanos else 1e6))
        out += struct.pack(order + "IIII", sec, frac, len(r.data), r.original_length) + r.data
    return out


def _block(kind: int, body: bytes) -> bytes:
    body += b"\x00" * (-len(body) % 4)
    return struct.pack("<II", kind, len(body) + 12) + body + struct.pack("<I", len(body) + 12)


def _pcapng_bytes(records: tuple[pcap.Record, ...]) -> bytes:
    shb = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    tsresol = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)  # if_tsresol = 10^-9
    idb = _block(1, struct.pack("<HHI", pcap.LINKTYPE_ETHERNET, 0, 0) + tsresol)
    out = shb + idb
    for r in records:
        ticks = round(r.timestamp * 1e9)
        head = struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(r.data), r.original_length)
        out += _block(6, head + r.data)
    out += _block(3, struct.pack("<I", len(records[0].data)) + records[0].data)  # a simple packet block
    return out


@pytest.mark.parametrize(("order", "nanos"), [("<", False), (">", False), ("<", True), (">", True)])
def test_pcap_in_either_byte_order_and_resolution_gives_the_same_records(
    shared_data: Path, order: str, nanos: bool
) -> None:
    records = _real_records(shared_data)
    again = pcap.parse(_pcap_bytes(records, order=order, nanos=nanos))
    assert again.error is None
    assert [r.data for r in again.records] == [r.data for r in records]
    assert [r.timestamp for r in again.records] == pytest.approx([r.timestamp for r in records], abs=1e-6)


def test_pcapng_enhanced_and_simple_packets_give_the_same_frames(shared_data: Path) -> None:
    records = _real_records(shared_data)
    again = pcap.parse(_pcapng_bytes(records))
    assert again.error is None and len(again.records) == 3
    assert [r.data for r in again.records] == [records[0].data, records[1].data, records[0].data]
    assert again.records[1].timestamp == pytest.approx(records[1].timestamp, abs=1e-6)
    assert parse(again.records[2].data).system_name == "upstairs.ofcourseimright.com"


def test_a_truncated_capture_keeps_its_whole_records_and_says_where_it_stopped(shared_data: Path) -> None:
    data = (shared_data / "lldp" / "lldp_mudurl.pcap").read_bytes()
    cut = pcap.parse(data[:-40])
    assert len(cut.records) == 1 and cut.error is not None and "record 2 claims" in cut.error
    header_cut = pcap.parse(data[: 24 + 16 + len(cut.records[0].data) + 7])
    assert (
        len(header_cut.records) == 1
        and header_cut.error is not None
        and "truncated record header" in header_cut.error
    )
    ng = _pcapng_bytes(_real_records(shared_data))
    ng_cut = pcap.parse(ng[:-30])
    assert len(ng_cut.records) == 2 and ng_cut.error is not None and "bad length" in ng_cut.error


@pytest.mark.parametrize(
    "data", [b"", b"GIF89a", b"\xd4\xc3\xb2\xa1\x02\x00", b"\x0a\x0d\x0d\x0a\x1c\x00\x00\x00zzzz"]
)
def test_bytes_that_are_no_capture_are_refused(data: bytes) -> None:
    with pytest.raises(pcap.PcapError):
        pcap.parse(data)
