"""A veth whose carrier flaps in a real network namespace: the agent's own probe cycle (rtnetlink's
IFLA_CARRIER_CHANGES through the netlink adapter) shows the link degraded while it flaps, still
degraded through the hold-down after the last flap, and healthy again once that has passed.

Needs root (network namespaces); runs as its own group with `-m netns`. Time is the fake clock of
the prober; the flaps themselves are real `ip link set ... down/up` on the kernel.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_clock import FakeClock
from realparts import ip, veth_netns

from agent.adapters.netlink import dump_links
from agent.collect import CollectConfig, Prober
from agent.common.report import Health
from agent.probes.grey import GreyConfig

pytestmark = pytest.mark.netns


@pytest.fixture
def netns(unique: str) -> Iterator[str]:
    with veth_netns(f"ht-flap-{unique}", "fabA", "fabB") as name:
        yield name


def test_a_flapping_veth_is_degraded_held_down_then_recovered(netns: str, tmp_path: Path) -> None:
    clock = FakeClock(5000.0)
    config = CollectConfig(
        "flap-node", sysfs=tmp_path, nvml="off", interfaces=re.compile(r"^fabA$"),
        grey=GreyConfig(flap_window_s=120, flap_limit=2, flap_hold_down_s=300),
    )  # fmt: skip
    prober = Prober(config, links=lambda: dump_links(netns=netns), clock=clock, link_modes=lambda n: [])
    assert prober.collect().health["net"].state is Health.OK
    before = {r.name: r.carrier_changes for r in dump_links(netns=netns)}["fabA"]
    for _ in range(2):  # two down-up cycles of the peer: fabA loses and regains carrier twice
        ip("-n", netns, "link", "set", "fabB", "down")
        ip("-n", netns, "link", "set", "fabB", "up")
    after = {r.name: r.carrier_changes for r in dump_links(netns=netns)}["fabA"]
    assert after is not None and before is not None and after - before >= 4  # the kernel counted them
    clock.now += 10
    report = prober.collect()
    assert report.health["net"].state is Health.DEGRADED, report.health["net"].reason
    (finding,) = [f for f in report.findings if f.kind == "flapping"]
    assert finding.subject == "fabA" and finding.component == "net" and "flapping" in finding.reason
    clock.now += 200  # the window (120 s) has forgotten the flaps; the hold-down (300 s) has not
    assert prober.collect().health["net"].state is Health.DEGRADED
    clock.now += 101  # 311 s after the last change: recovered
    report = prober.collect()
    assert report.health["net"].state is Health.OK and report.findings == ()
