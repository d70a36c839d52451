"""IEEE 802.1AB LLDPDU parser: bytes from the wire -> `LldpFrame`, or `MalformedFrame(reason)`.

LLDP frames arrive from any device on the cable, so every length field is checked against the
bytes that are really there, and every way a frame can be wrong ends in `MalformedFrame` with a
reason an operator can read; no other exception type leaves `parse`, and every loop advances by
at least the 2-byte TLV header, so no frame can make it spin.

Rendering follows what people read on switch consoles and in `lldpcli`: MAC subtypes as
aa:bb:cc:dd:ee:ff, network-address subtypes as the IP, text subtypes as text, anything else as
colon-separated hex. Subtype names are lldpd's (`mac`, `ifname`, `local`, ...) so neighbours
read from raw frames and from a host lldpd compare equal.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

ETHERTYPE_LLDP = 0x88CC
VLAN_TAG_TYPES = (0x8100, 0x88A8, 0x9100)  # 802.1Q C-tag, 802.1ad S-tag, legacy QinQ
# 802.1AB-2016 clause 7.1: nearest bridge, nearest non-TPMR bridge, nearest customer bridge.
LLDP_MULTICASTS = (
    bytes.fromhex("0180c200000e"),
    bytes.fromhex("0180c2000003"),
    bytes.fromhex("0180c2000000"),
)

# TLV types, 802.1AB-2016 table 8-1.
TLV_END = 0
TLV_CHASSIS_ID = 1
TLV_PORT_ID = 2
TLV_TTL = 3
TLV_PORT_DESCRIPTION = 4
TLV_SYSTEM_NAME = 5
TLV_SYSTEM_DESCRIPTION = 6
TLV_SYSTEM_CAPABILITIES = 7
TLV_MANAGEMENT_ADDRESS = 8
TLV_ORG_SPECIFIC = 127

_MANDATORY = ((TLV_CHASSIS_ID, "chassis ID"), (TLV_PORT_ID, "port ID"), (TLV_TTL, "TTL"))

# Chassis ID subtypes (table 8-2) and port ID subtypes (table 8-3), named as lldpd names them;
# the set after each table says which subtypes carry text.
CHASSIS_SUBTYPES = {1: "chassis", 2: "ifalias", 3: "port", 4: "mac", 5: "ip", 6: "ifname", 7: "local"}
CHASSIS_TEXT = {1, 2, 3, 6, 7}
PORT_SUBTYPES = {1: "ifalias", 2: "port", 3: "mac", 4: "ip", 5: "ifname", 6: "agent-circuit-id", 7: "local"}
PORT_TEXT = {1, 2, 5, 7}
_MAC_SUBTYPE = "mac"
_ADDRESS_SUBTYPE = "ip"

# System capabilities bits (table 8-4), lldpd's names.
CAPABILITY_BITS = (
    "Other", "Repeater", "Bridge", "Wlan", "Router", "Telephone", "Docsis", "Station",
    "CVLAN", "SVLAN", "TPMR",
)  # fmt: skip

# IANA address family numbers used in management and network-address IDs.
AFI_IPV4 = 1
AFI_IPV6 = 2
AFI_802 = 6


class MalformedFrame(ValueError):
    """A frame that is not a valid LLDPDU; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class EthernetHeader:
    destination: str
    source: str
    vlan: int | None = None  # VID of the outermost 802.1Q/802.1ad tag, when tagged


@dataclass(frozen=True)
class ManagementAddress:
    address: str  # the IP as text for IPv4/IPv6, a MAC for 802, else "afi-N:hex"
    family: int  # IANA address family number
    interface_subtype: int
    interface_number: int
    oid: bytes = b""


@dataclass(frozen=True)
class Capabilities:
    system: tuple[str, ...]
    enabled: tuple[str, ...]


@dataclass(frozen=True)
class OrgSpecificTlv:
    oui: str  # "00:80:c2"
    subtype: int
    info: bytes


@dataclass(frozen=True)
class LldpFrame:
    chassis_id: str
    chassis_id_subtype: str
    port_id: str
    port_id_subtype: str
    ttl: int
    port_description: str | None = None
    system_name: str | None = None
    system_description: str | None = None
    capabilities: Capabilities | None = None
    management_addresses: tuple[ManagementAddress, ...] = ()
    org_specific: tuple[OrgSpecificTlv, ...] = ()
    unknown_tlvs: tuple[tuple[int, bytes], ...] = ()
    ethernet: EthernetHeader | None = None

    @property
    def is_shutdown(self) -> bool:
        """A shutdown LLDPDU (TTL 0, 802.1AB 9.2.7.7): the sender asks us to forget it now."""
        return self.ttl == 0


# --- rendering --------------------------------------------------------------------------------


def hex_colons(data: bytes) -> str:
    return ":".join(f"{b:02x}" for b in data)


def _text(data: bytes) -> str | None:
    """Printable UTF-8 text without trailing NULs, or None when the bytes are not text."""
    try:
        text = data.decode("utf-8").rstrip("\x00")
    except UnicodeDecodeError:
        return None
    return text if text and all(c.isprintable() or c in "\t\r\n" for c in text) else None


def _address(family: int, raw: bytes) -> str:
    if family == AFI_IPV4 and len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    if family == AFI_IPV6 and len(raw) == 16:
        return str(ipaddress.IPv6Address(raw))
    if family == AFI_802 and len(raw) == 6:
        return hex_colons(raw)
    return f"afi-{family}:{hex_colons(raw)}"


def _render_id(subtype_name: str, is_text: bool, raw: bytes) -> str:
    if subtype_name == _MAC_SUBTYPE and len(raw) == 6:
        return hex_colons(raw)
    if subtype_name == _ADDRESS_SUBTYPE and len(raw) >= 2:
        return _address(raw[0], raw[1:])
    text = _text(raw) if is_text else None
    return text if text is not None else hex_colons(raw)


def _identifier(value: bytes, what: str, names: dict[int, str], text: set[int]) -> tuple[str, str]:
    """(rendered ID, subtype name) of a chassis ID or port ID TLV (clauses 8.5.2, 8.5.3)."""
    if len(value) < 2:
        raise MalformedFrame(f"{what} TLV too short ({len(value)} bytes, needs a subtype and an ID)")
    if len(value) > 256:
        raise MalformedFrame(f"{what} TLV too long ({len(value)} bytes, at most 256)")
    subtype, raw = value[0], value[1:]
    name = names.get(subtype, f"reserved-{subtype}")
    return _render_id(name, subtype in text, raw), name


# --- TLV walk -----------------------------------------------------------------------------------


def tlvs(lldpdu: bytes) -> list[tuple[int, bytes]]:
    """Splits an LLDPDU into (type, value) pairs up to the End TLV or the end of the bytes.

    Each TLV header is 7 bits of type and 9 bits of length (802.1AB 8.4.1); a header or value that
    runs past the data is an error. Bytes after the End TLV are Ethernet padding and ignored."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while offset < len(lldpdu):
        if len(lldpdu) - offset < 2:
            raise MalformedFrame(f"truncated TLV header at offset {offset}")
        header = int.from_bytes(lldpdu[offset : offset + 2], "big")
        kind, length = header >> 9, header & 0x1FF
        offset += 2
        if offset + length > len(lldpdu):
            raise MalformedFrame(
                f"TLV type {kind} at offset {offset - 2} claims {length} bytes, only {len(lldpdu) - offset} left"
            )
        if kind == TLV_END:
            if length:
                raise MalformedFrame(f"End TLV with length {length} (must be 0)")
            break
        out.append((kind, lldpdu[offset : offset + length]))
        offset += length
    return out


def _ttl(value: bytes) -> int:
    if len(value) != 2:
        raise MalformedFrame(f"TTL TLV must be 2 bytes, got {len(value)}")
    return int.from_bytes(value, "big")


def _capabilities(value: bytes) -> Capabilities:
    if len(value) != 4:
        raise MalformedFrame(f"system capabilities TLV must be 4 bytes, got {len(value)}")
    system, enabled = int.from_bytes(value[:2], "big"), int.from_bytes(value[2:], "big")

    def names(bits: int) -> tuple[str, ...]:
        return tuple(name for i, name in enumerate(CAPABILITY_BITS) if bits & (1 << i))

    return Capabilities(system=names(system), enabled=names(enabled))


def _management_address(value: bytes) -> ManagementAddress:
    """Clause 8.5.9: address string length (subtype + address, 2..32), subtype, address,
    interface numbering subtype, interface number (4 bytes), OID length, OID (0..128)."""
    if len(value) < 9:
        raise MalformedFrame(f"management address TLV too short ({len(value)} bytes, at least 9)")
    addr_len = value[0]
    if not 2 <= addr_len <= 32:
        raise MalformedFrame(f"management address length {addr_len} out of range 2..32")
    end = 1 + addr_len
    if end + 6 > len(value):
        raise MalformedFrame(f"management address length {addr_len} overruns the {len(value)}-byte TLV")
    family, raw = value[1], value[2:end]
    oid_len = value[end + 5]
    if end + 6 + oid_len != len(value):
        raise MalformedFrame(f"management address OID length {oid_len} does not match the TLV length")
    return ManagementAddress(
        address=_address(family, raw),
        family=family,
        interface_subtype=value[end],
        interface_number=int.from_bytes(value[end + 1 : end + 5], "big"),
        oid=value[end + 6 :],
    )


def _org_specific(value: bytes) -> OrgSpecificTlv:
    if len(value) < 4:
        raise MalformedFrame(f"organisation-specific TLV too short ({len(value)} bytes, at least 4)")
    return OrgSpecificTlv(oui=hex_colons(value[:3]), subtype=value[3], info=value[4:])


def _optional_text(value: bytes) -> str | None:
    """Port description, system name and description: 0..255 octets of text (8.5.5-8.5.7);
    undecodable bytes are replaced rather than rejected, an empty string is reported as absent."""
    return value.decode("utf-8", errors="replace").rstrip("\x00") or None


_TEXT_TLVS = (TLV_PORT_DESCRIPTION, TLV_SYSTEM_NAME, TLV_SYSTEM_DESCRIPTION)


def _check_mandatory(items: list[tuple[int, bytes]]) -> None:
    for position, (kind, what) in enumerate(_MANDATORY):
        if len(items) <= position or items[position][0] != kind:
            found = f"TLV type {items[position][0]}" if len(items) > position else "the end of the frame"
            raise MalformedFrame(f"missing {what} TLV: expected at position {position + 1}, found {found}")


@dataclass
class _Optional:
    """The optional TLVs of one LLDPDU as they are collected (the first of a single-instance
    TLV wins; 802.1AB allows several management addresses and organisation-specific TLVs)."""

    texts: dict[int, str | None] = field(default_factory=dict)
    capabilities: Capabilities | None = None
    addresses: list[ManagementAddress] = field(default_factory=list)
    org: list[OrgSpecificTlv] = field(default_factory=list)
    unknown: list[tuple[int, bytes]] = field(default_factory=list)

    def add(self, kind: int, value: bytes) -> None:
        if kind in (TLV_CHASSIS_ID, TLV_PORT_ID, TLV_TTL):
            raise MalformedFrame(f"duplicate mandatory TLV type {kind}")
        if kind in _TEXT_TLVS:
            self.texts.setdefault(kind, _optional_text(value))
        elif kind == TLV_SYSTEM_CAPABILITIES:
            self.capabilities = self.capabilities or _capabilities(value)
        elif kind == TLV_MANAGEMENT_ADDRESS:
            self.addresses.append(_management_address(value))
        elif kind == TLV_ORG_SPECIFIC:
            self.org.append(_org_specific(value))
        else:
            self.unknown.append((kind, value))


def parse_lldpdu(lldpdu: bytes, *, ethernet: EthernetHeader | None = None) -> LldpFrame:
    """Parses an LLDPDU (the Ethernet payload). Chassis ID, port ID and TTL must come first,
    in that order (802.1AB 8.2); optional TLVs may follow in any order."""
    items = tlvs(lldpdu)
    _check_mandatory(items)
    chassis_id, chassis_subtype = _identifier(items[0][1], "chassis ID", CHASSIS_SUBTYPES, CHASSIS_TEXT)
    port_id, port_subtype = _identifier(items[1][1], "port ID", PORT_SUBTYPES, PORT_TEXT)
    ttl = _ttl(items[2][1])
    optional = _Optional()
    for kind, value in items[3:]:
        optional.add(kind, value)
    return LldpFrame(
        chassis_id=chassis_id,
        chassis_id_subtype=chassis_subtype,
        port_id=port_id,
        port_id_subtype=port_subtype,
        ttl=ttl,
        port_description=optional.texts.get(TLV_PORT_DESCRIPTION),
        system_name=optional.texts.get(TLV_SYSTEM_NAME),
        system_description=optional.texts.get(TLV_SYSTEM_DESCRIPTION),
        capabilities=optional.capabilities,
        management_addresses=tuple(optional.addresses),
        org_specific=tuple(optional.org),
        unknown_tlvs=tuple(optional.unknown),
        ethernet=ethernet,
    )


# --- Ethernet ----------------------------------------------------------------------------------


def split_ethernet(frame: bytes) -> tuple[EthernetHeader, bytes]:
    """Ethernet II header (with up to two VLAN tags) -> (header, payload); the ethertype must be
    LLDP's 0x88cc."""
    if len(frame) < 14:
        raise MalformedFrame(f"frame of {len(frame)} bytes is shorter than an Ethernet header")
    offset, vlan = 12, None
    ethertype = int.from_bytes(frame[12:14], "big")
    for _ in range(2):
        if ethertype not in VLAN_TAG_TYPES:
            break
        if len(frame) < offset + 6:
            raise MalformedFrame("truncated VLAN tag")
        if vlan is None:
            vlan = int.from_bytes(frame[offset + 2 : offset + 4], "big") & 0x0FFF
        offset += 4
        ethertype = int.from_bytes(frame[offset : offset + 2], "big")
    if ethertype != ETHERTYPE_LLDP:
        what = f"802.3 length {ethertype}" if ethertype <= 1500 else f"ethertype 0x{ethertype:04x}"
        raise MalformedFrame(f"not an LLDP frame ({what})")
    header = EthernetHeader(destination=hex_colons(frame[0:6]), source=hex_colons(frame[6:12]), vlan=vlan)
    return header, frame[offset + 2 :]


def _has_ethernet_header(frame: bytes) -> bool:
    """A bare LLDPDU starts with a chassis ID TLV header (type 1: first byte 0x02 or 0x03);
    an Ethernet frame has an LLDP or VLAN ethertype at offset 12. Where both could hold, an LLDP
    multicast destination decides for Ethernet."""
    bare = bool(frame) and frame[0] >> 1 == TLV_CHASSIS_ID
    ethertype = int.from_bytes(frame[12:14], "big") if len(frame) >= 14 else None
    looks_ethernet = ethertype == ETHERTYPE_LLDP or ethertype in VLAN_TAG_TYPES
    if looks_ethernet and bare:
        return frame[0:6] in LLDP_MULTICASTS
    return looks_ethernet or not bare


def parse(frame: bytes) -> LldpFrame:
    """Parses an LLDP frame, with or without its Ethernet header. Raises only `MalformedFrame`."""
    if not frame:
        raise MalformedFrame("empty frame")
    if _has_ethernet_header(frame):
        header, payload = split_ethernet(frame)
        return parse_lldpdu(payload, ethernet=header)
    return parse_lldpdu(frame)
