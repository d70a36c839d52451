"""The netlink adapter on a real kernel: a fresh network namespace with a veth pair.

Needs root (network namespaces); runs as its own group with `-m netns`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from realparts import ip, require_root, veth_netns

from agent.adapters.netlink import LinkWatcher, NetlinkUnavailable, dump_links
from agent.common.report import Health
from agent.probes import net

pytestmark = pytest.mark.netns


@pytest.fixture
def netns(unique: str) -> Iterator[str]:
    """A network namespace holding veth pair vA/vB, both up, with vA's MTU 9000."""
    with veth_netns(f"ht-net-{unique}", "vA", "vB", "mtu", "9000") as name:
        yield name


class Changes:
    """Counts callbacks and remembers when the first arrived after `arm()`."""

    def __init__(self) -> None:
        self.fired = threading.Event()
        self.count = 0
        self.at = 0.0

    def __call__(self) -> None:
        self.count += 1
        if not self.fired.is_set():
            self.at = time.monotonic()
            self.fired.set()

    def arm(self) -> float:
        self.fired.clear()
        return time.monotonic()


def test_dump_links_reports_the_veth_pair_of_the_namespace(netns: str) -> None:
    links = {r.name: r for r in dump_links(netns=netns)}
    assert set(links) == {"lo", "vA", "vB"}
    assert (links["vA"].kind, links["vA"].mtu, links["vA"].link_type) == ("veth", 9000, "ether")
    assert links["vA"].oper_state == "up" and links["vA"].mac and len(links["vA"].mac) == 17
    result = net.probe(list(links.values()), sysfs=Path("/nonexistent"))
    assert result.health.state is Health.OK
    assert [(i.name, i.kind) for i in result.value or ()] == sorted(
        [("vA", "veth"), ("vB", "veth")], key=lambda t: links[t[0]].index
    )


def test_link_down_reaches_the_callback_within_one_second(netns: str) -> None:
    changes = Changes()
    with LinkWatcher(changes, netns=netns):
        start = changes.arm()
        ip("-n", netns, "link", "set", "vB", "down")
        assert changes.fired.wait(1.0), "no callback within 1 s of the link going down"
        latency_ms = (changes.at - start) * 1000
        print(f"link down -> on_change latency: {latency_ms:.1f} ms")
        assert latency_ms < 1000
    states = {r.name: r.oper_state for r in dump_links(netns=netns)}
    assert states["vB"] == "down" and states["vA"] == "lowerlayerdown"  # the peer lost its carrier


def test_deleting_a_link_fires_and_a_failing_callback_does_not_stop_the_watcher(netns: str) -> None:
    changes = Changes()
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("callback bug")
        changes()

    watcher = LinkWatcher(flaky, netns=netns)
    watcher.start()
    try:
        ip(
            "-n", netns, "link", "add", "vC", "type", "veth", "peer", "name", "vD"
        )  # first batch: callback raises
        deadline = time.monotonic() + 2
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        changes.arm()
        ip("-n", netns, "link", "del", "vC")  # RTM_DELLINK
        assert changes.fired.wait(1.0)
        assert watcher.events >= 2
    finally:
        watcher.stop()


def test_stop_returns_at_once_and_twice_is_harmless(netns: str) -> None:
    watcher = LinkWatcher(lambda: None, netns=netns)
    watcher.start()
    began = time.monotonic()
    watcher.stop()
    assert time.monotonic() - began < 0.5
    watcher.stop()


def test_a_missing_namespace_is_a_clear_error() -> None:
    require_root()
    with pytest.raises(NetlinkUnavailable, match="ht-no-such-netns"):
        dump_links(netns="ht-no-such-netns")
