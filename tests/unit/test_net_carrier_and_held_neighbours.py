"""A cut cable shows as a degraded fabric link, and the switch it was cabled to stays known."""

from __future__ import annotations

from pathlib import Path

from test_lldp_neighbour_table import frame

from agent.common.report import Health
from agent.probes import net
from agent.probes.lldp import NeighbourTable


def links(oper: str, flags: int, kind: str = "veth") -> list[net.LinkRecord]:
    return [net.LinkRecord(7, "fab0", mac="02:00:00:00:00:07", oper_state=oper, kind=kind, flags=flags)]


def test_an_up_interface_without_carrier_is_a_degraded_link(tmp_path: Path) -> None:
    result = net.probe(links("LOWERLAYERDOWN", net.IFF_UP), sysfs=tmp_path)
    assert result.health.state is Health.DEGRADED
    assert "fab0: link down (administratively up, no carrier)" in result.health.reason
    assert net.links_down(links("LOWERLAYERDOWN", net.IFF_UP), result.value or ()) == {"fab0"}


def test_an_interface_set_down_on_purpose_or_an_empty_bridge_is_not_a_fault(tmp_path: Path) -> None:
    admin_down = net.probe(links("DOWN", 0), sysfs=tmp_path)
    assert admin_down.health.state is Health.OK
    bridge = net.probe(links("DOWN", net.IFF_UP, kind="bridge"), sysfs=tmp_path)
    assert bridge.health.state is Health.OK
    up = net.probe(links("UP", net.IFF_UP), sysfs=tmp_path)
    assert up.health.state is Health.OK and net.links_down(links("UP", net.IFF_UP), up.value or ()) == set()


def test_the_neighbour_of_a_link_that_is_down_outlives_its_ttl_and_expires_after_repair() -> None:
    table = NeighbourTable()
    table.observe("fab0", frame(ttl=3, name="leaf1"), now=100.0)
    table.observe("fab1", frame(chassis="leaf2", ttl=3, name="leaf2"), now=100.0)
    # fab0 lost carrier at 101: its neighbour is held; fab1's expires as usual.
    table.hold(frozenset({"fab0"}), now=101.0)
    for now in (104.0, 150.0, 200.0):
        table.expire(now)  # the listener expires on its own, every poll
        held = table.snapshot(now).value or ()
        assert [(n.interface, n.system_name) for n in held] == [("fab0", "leaf1")]
    # Link back at 200 and no frame heard: a full TTL from then, then gone.
    assert [n.system_name for n in table.snapshot(200.0, links_down=frozenset()).value or ()] == ["leaf1"]
    assert [n.system_name for n in table.snapshot(202.9).value or ()] == ["leaf1"]
    assert table.snapshot(203.1).value == ()
