"""The LLDP neighbour table believes a neighbour for its TTL, forgets it on a shutdown LLDPDU
or when the TTL runs out, reports the same snapshot while nothing changes, and keeps what it knew
when a malformed frame arrives. Time is passed in, never slept."""

from __future__ import annotations

import struct
from pathlib import Path

import pcap_files as pcap

from agent.common.report import Health
from agent.probes.lldp import MAX_NEIGHBOURS_PER_INTERFACE, NeighbourTable

LLDP_MAC = bytes.fromhex("0180c200000e")


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", (kind << 9) | len(value)) + value


def frame(
    chassis: str = "leaf-sw1", port: str = "swp1", ttl: int = 120, name: str | None = "leaf-sw1"
) -> bytes:
    body = (
        tlv(1, b"\x07" + chassis.encode()) + tlv(2, b"\x05" + port.encode()) + tlv(3, struct.pack("!H", ttl))
    )
    if name:
        body += tlv(5, name.encode())
    return LLDP_MAC + bytes.fromhex("020000000001") + b"\x88\xcc" + body + tlv(0, b"")


def test_a_neighbour_is_reported_until_its_ttl_runs_out() -> None:
    table = NeighbourTable()
    assert table.observe("eth0", frame(ttl=30), now=100.0) is None
    alive = table.snapshot(now=129.9)
    assert alive.health.state is Health.OK
    assert alive.value is not None
    assert [(n.interface, n.chassis_id, n.port_id, n.ttl, n.system_name) for n in alive.value] == [
        ("eth0", "leaf-sw1", "swp1", 30, "leaf-sw1")
    ]
    assert table.snapshot(now=130.0).value == ()


def test_a_refreshed_neighbour_lives_on_and_does_not_count_as_a_change() -> None:
    table = NeighbourTable()
    table.observe("eth0", frame(ttl=30), now=0.0)
    generation = table.generation
    for second in range(25, 200, 25):
        table.observe("eth0", frame(ttl=30), now=float(second))
    assert table.generation == generation
    assert len(table.snapshot(now=200.0).value or ()) == 1  # last heard at 175 with TTL 30
    table.observe("eth0", frame(ttl=30, name="leaf-sw1-renamed"), now=211.0)
    assert table.generation == generation + 1


def test_a_shutdown_lldpdu_removes_the_neighbour_at_once() -> None:
    table = NeighbourTable()
    table.observe("eth0", frame(port="swp1"), now=0.0)
    table.observe("eth0", frame(port="swp2"), now=0.0)
    generation = table.generation
    assert table.observe("eth0", frame(port="swp1", ttl=0, name=None), now=1.0) is None
    assert [n.port_id for n in table.snapshot(now=1.0).value or ()] == ["swp2"]
    assert table.generation == generation + 1
    table.observe("eth0", frame(port="swp9", ttl=0), now=1.0)  # shutdown of an unknown neighbour
    assert table.generation == generation + 1


def test_a_malformed_frame_is_counted_with_its_reason_and_keeps_what_was_known() -> None:
    table = NeighbourTable()
    table.observe("eth0", frame(), now=0.0)
    broken = frame()[:-5]  # cut inside the system name TLV
    reason = table.observe("eth0", broken, now=1.0)
    assert reason is not None and "claims" in reason
    assert table.rejected["eth0"] == 1 and table.last_reject["eth0"] == reason
    assert table.frames["eth0"] == 1
    assert len(table.snapshot(now=1.0).value or ()) == 1


def test_neighbours_are_sorted_and_kept_apart_per_interface() -> None:
    table = NeighbourTable()
    table.observe("eth1", frame(chassis="spine", port="p2"), now=0.0)
    table.observe("eth0", frame(chassis="leaf", port="p9"), now=0.0)
    table.observe("eth0", frame(chassis="leaf", port="p1"), now=0.0)
    table.observe("eth1", frame(chassis="leaf", port="p1"), now=0.0)
    keys = [(n.interface, n.chassis_id, n.port_id) for n in table.snapshot(now=1.0).value or ()]
    assert keys == [
        ("eth0", "leaf", "p1"),
        ("eth0", "leaf", "p9"),
        ("eth1", "leaf", "p1"),
        ("eth1", "spine", "p2"),
    ]
    assert table.forget("eth0") and not table.forget("eth0")
    assert [n.interface for n in table.snapshot(now=1.0).value or ()] == ["eth1", "eth1"]


def test_a_flood_of_forged_chassis_ids_is_capped_per_interface() -> None:
    table = NeighbourTable()
    reasons = [table.observe("eth0", frame(chassis=f"forged-{i}"), now=0.0) for i in range(100)]
    assert reasons.count(None) == MAX_NEIGHBOURS_PER_INTERFACE
    assert len(table.snapshot(now=0.0).value or ()) == MAX_NEIGHBOURS_PER_INTERFACE
    assert table.observe("eth1", frame(chassis="real-leaf"), now=0.0) is None


def test_an_unchanged_neighbour_gives_an_identical_snapshot_at_every_probe() -> None:
    table = NeighbourTable()
    table.observe("eth0", frame(ttl=120), now=0.0)
    first = table.snapshot(now=1.0)
    table.observe("eth0", frame(ttl=120), now=30.0)
    assert table.snapshot(now=59.0) == first  # the TTL reported is the advertised one, not the rest


def test_a_real_switch_capture_replayed_gives_both_cisco_neighbours_then_none(shared_data: Path) -> None:
    records = pcap.read(shared_data / "lldp" / "LLDP_and_CDP.pcap").records
    table = NeighbourTable()
    reasons = [table.observe("eth0", r.data, now=r.timestamp) for r in records]
    assert sum(r is not None and r.startswith("not an LLDP frame") for r in reasons) == 4  # CDP frames
    last = records[-1].timestamp
    names = sorted(n.system_name or "" for n in table.snapshot(now=last).value or ())
    assert names == ["S1.cisco.com", "S2.cisco.com"]
    assert table.snapshot(now=last + 121).value == ()
