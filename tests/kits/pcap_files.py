"""Minimal pcap and pcapng reader, so the tests can replay real captures without libpcap (test-only:
it lives under tests/, not in the agent).

Only what replaying LLDP needs: each record's timestamp, link type and captured bytes. Capture
files from fuzzers are themselves malformed, so the reader keeps every whole record it found and
reports where the file stopped making sense (`Capture.error`) instead of raising halfway; only a
file that is not a capture at all raises `PcapError`.

Formats: pcap (tcpdump.org "pcap savefile format", both byte orders, micro- and nanosecond
magics) and pcapng (IETF draft-ietf-opsawg-pcapng: section header, interface description,
enhanced and simple packet blocks; other blocks skipped).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

LINKTYPE_ETHERNET = 1
_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
    b"\xa1\xb2\xc3\xd4": (">", 1e-6),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
    b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}
_PCAPNG_SHB = 0x0A0D0D0A
_PCAPNG_BYTE_ORDER = 0x1A2B3C4D
_PCAPNG_IDB, _PCAPNG_SPB, _PCAPNG_EPB = 1, 3, 6
_MAX_RECORD = 1 << 18  # 256 KiB: larger claims are corruption, not packets


class PcapError(ValueError):
    """The bytes are not a pcap or pcapng capture."""


@dataclass(frozen=True)
class Record:
    timestamp: float  # seconds since the epoch
    data: bytes  # the captured bytes (may be shorter than original_length)
    original_length: int
    linktype: int


@dataclass(frozen=True)
class Capture:
    records: tuple[Record, ...]
    error: str | None = None  # where and why reading stopped early, None for a whole file


def read(path: Path) -> Capture:
    return parse(path.read_bytes())


def parse(data: bytes) -> Capture:
    if data[:4] in _PCAP_MAGICS:
        return _parse_pcap(data)
    if len(data) >= 4 and struct.unpack("<I", data[:4])[0] == _PCAPNG_SHB:
        return _parse_pcapng(data)
    raise PcapError(f"not a pcap or pcapng file (magic {data[:4].hex() or 'missing'})")


def _parse_pcap(data: bytes) -> Capture:
    order, tick = _PCAP_MAGICS[data[:4]]
    if len(data) < 24:
        raise PcapError("truncated pcap file header")
    linktype = struct.unpack(order + "I", data[20:24])[0] & 0x0FFFFFFF
    records: list[Record] = []
    offset = 24
    while offset < len(data):
        if len(data) - offset < 16:
            return Capture(tuple(records), f"truncated record header at byte {offset}")
        sec, frac, caplen, origlen = struct.unpack(order + "IIII", data[offset : offset + 16])
        offset += 16
        if caplen > _MAX_RECORD or offset + caplen > len(data):
            return Capture(
                tuple(records), f"record {len(records) + 1} claims {caplen} bytes at byte {offset}"
            )
        records.append(Record(sec + frac * tick, data[offset : offset + caplen], origlen, linktype))
        offset += caplen
    return Capture(tuple(records))


def _parse_pcapng(data: bytes) -> Capture:
    order = "<"
    linktypes: list[tuple[int, float]] = []  # per interface: link type, seconds per tick
    records: list[Record] = []
    offset = 0
    while offset < len(data):
        if len(data) - offset < 12:
            return Capture(tuple(records), f"truncated block header at byte {offset}")
        kind = struct.unpack("<I", data[offset : offset + 4])[0]
        if kind == _PCAPNG_SHB:
            order, linktypes = _section_order(data, offset), []
        length = struct.unpack(order + "I", data[offset + 4 : offset + 8])[0]
        if length < 12 or length % 4 or offset + length > len(data):
            return Capture(tuple(records), f"block at byte {offset} has bad length {length}")
        body = data[offset + 8 : offset + length - 4]
        problem = _pcapng_block(kind, body, order, linktypes, records)
        if problem:
            return Capture(tuple(records), f"block at byte {offset}: {problem}")
        offset += length
    return Capture(tuple(records))


def _section_order(data: bytes, offset: int) -> str:
    magic = data[offset + 8 : offset + 12]
    if len(magic) < 4:
        raise PcapError("truncated pcapng section header")
    if struct.unpack("<I", magic)[0] == _PCAPNG_BYTE_ORDER:
        return "<"
    if struct.unpack(">I", magic)[0] == _PCAPNG_BYTE_ORDER:
        return ">"
    raise PcapError(f"pcapng section header with unknown byte-order magic {magic.hex()}")


def _pcapng_block(
    kind: int, body: bytes, order: str, linktypes: list[tuple[int, float]], records: list[Record]
) -> str | None:
    """Handles one block; returns a problem description or None."""
    if kind == _PCAPNG_IDB:
        if len(body) < 8:
            return "truncated interface description"
        linktypes.append((struct.unpack(order + "H", body[:2])[0], _ts_resolution(body[8:], order)))
    elif kind == _PCAPNG_EPB:
        if len(body) < 20:
            return "truncated enhanced packet block"
        iface, high, low, caplen, origlen = struct.unpack(order + "IIIII", body[:20])
        if iface >= len(linktypes) or 20 + caplen > len(body):
            return f"packet on unknown interface {iface} or overrunning its block"
        linktype, tick = linktypes[iface]
        records.append(Record(((high << 32) | low) * tick, body[20 : 20 + caplen], origlen, linktype))
    elif kind == _PCAPNG_SPB:
        if len(body) < 4 or not linktypes:
            return "simple packet block without an interface"
        origlen = struct.unpack(order + "I", body[:4])[0]
        records.append(Record(0.0, body[4 : 4 + origlen], origlen, linktypes[0][0]))
    return None


def _ts_resolution(options: bytes, order: str) -> float:
    """The if_tsresol option (code 9): 2^-n when the high bit is set, else 10^-n; default 1 us."""
    offset = 0
    while offset + 4 <= len(options):
        code, length = struct.unpack(order + "HH", options[offset : offset + 4])
        if code == 0:
            break
        if code == 9 and length >= 1 and offset + 5 <= len(options):
            value = options[offset + 4]
            return 2.0 ** -(value & 0x7F) if value & 0x80 else 10.0**-value
        offset += 4 + length + (-length % 4)
    return 1e-6
