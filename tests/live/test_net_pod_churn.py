"""Pod churn makes no NodeTopology write (issue 21.4): the running agent, reading a real network
namespace through rtnetlink, while veth pairs come and go in it the way a CNI plugs pods in.

The namespace's fabric NIC `fab0` is a link netlink reports like any other; the injected sysfs
tree (as every probe test injects one) says it is a PCI function's netdev, which is what makes a
NIC physical. Needs root (network namespaces); runs in the `netns` group.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from realparts import ip, require_binary, require_root, veth_netns, wait_for

from agent.adapters.netlink import dump_links
from agent.cli import EVERY_NAME
from agent.collect import CollectConfig, Prober
from agent.publish import Backoff, Publisher
from agent.runner import Agent, RunConfig

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
PODS = 6  # veth pairs per wave, as a node starting and stopping a handful of pods


class RecordingApi:
    """The API server's side of the agent's writes: every apply is counted."""

    def __init__(self) -> None:
        self.applied: list[Mapping[str, Any]] = []

    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self.applied.append(obj)
        return obj

    def get(self, name: str) -> Mapping[str, Any] | None:
        return None  # no earlier run published anything


def pci_sysfs(root: Path, name: str) -> Path:
    """A sysfs tree in which `name` is the netdev of PCI function 0000:03:00.0."""
    device = root / "devices" / "pci0000:00" / "0000:00:03.0" / "0000:03:00.0"
    (device / "net" / name).mkdir(parents=True)
    (device / "net" / name / "device").symlink_to("../../../0000:03:00.0")
    (root / "class" / "net").mkdir(parents=True)
    (root / "class" / "net" / name).symlink_to(f"../../devices/pci0000:00/0000:00:03.0/0000:03:00.0/net/{name}")
    return root


@contextmanager
def running(prober: Prober, api: RecordingApi) -> Iterator[Agent]:
    agent = Agent(prober, Publisher(api, backoff=Backoff(0.01, 0.05)),
                  RunConfig(interval=0.05, listen=("127.0.0.1", 0), watch=False))  # fmt: skip
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(api.applied) >= 1, what="the first publish")
        yield agent
    finally:
        agent.stop()
        thread.join(10)
        assert not thread.is_alive(), "agent did not stop"


def churn(netns: str, agent: Agent, tag: str) -> None:
    """Plugs PODS veth pairs in (up, like a CNI), lets the agent probe them, then pulls them out."""
    add = [f"link add veth{tag}{n} up type veth peer name eth{tag}{n}" for n in range(PODS)]
    for wave in (add, [f"link del veth{tag}{n}" for n in range(PODS)]):
        batch = "\n".join(wave) + "\n"
        subprocess.run([require_binary("ip"), "-n", netns, "-batch", "-"], input=batch, text=True,
                       check=True, capture_output=True, timeout=30)  # fmt: skip
        seen = agent.cycles
        wait_for(lambda seen=seen: agent.cycles >= seen + 3, what="three probe cycles after the churn")  # type: ignore[misc]


def interface_names(obj: Mapping[str, Any]) -> list[str]:
    return [i["name"] for i in obj["spec"].get("interfaces", [])]


def published_while_churning(netns: str, sysfs: Path, interfaces: re.Pattern[str] | None) -> RecordingApi:
    api = RecordingApi()
    config = CollectConfig("churn-node", sysfs=sysfs, nvml="off", interfaces=interfaces)
    prober = Prober(config, links=lambda: dump_links(netns=netns))
    with running(prober, api) as agent:
        churn(netns, agent, "a")
        churn(netns, agent, "b")
    return api


def test_pods_coming_and_going_make_no_nodetopology_write(tmp_path: Path, unique: str) -> None:
    with veth_netns(f"ht-churn-{unique}", "fab0", "swp1") as netns:
        api = published_while_churning(netns, pci_sysfs(tmp_path, "fab0"), None)
    assert len(api.applied) == 1, f"{len(api.applied)} writes: {[interface_names(o) for o in api.applied]}"
    assert interface_names(api.applied[0]) == ["fab0"]


def test_with_every_interface_asked_for_the_same_churn_is_written(tmp_path: Path, unique: str) -> None:
    """The control: the churn above is real and reaches the report unless the default filters it."""
    with veth_netns(f"ht-churn-{unique}", "fab0", "swp1") as netns:
        api = published_while_churning(netns, pci_sysfs(tmp_path, "fab0"), EVERY_NAME)
    assert len(api.applied) >= 4  # each wave of each round changed the interface list
    assert any(f"vetha{PODS - 1}" in interface_names(o) for o in api.applied)


def test_a_down_bridge_like_kube_ipvs0_does_not_degrade_lldp_on_real_sockets(unique: str) -> None:
    """kube-ipvs0 is a link kube-proxy keeps administratively down: a raw socket on it answers
    ENETDOWN. Asked for by name, it is reported, listened on, and still no LLDP fault."""
    require_root()
    down, fabric, peer = f"htq{unique}", f"htv{unique}a", f"htv{unique}b"
    ip("link", "add", down, "type", "bridge")  # created administratively down, as kube-ipvs0 is
    try:
        ip("link", "add", fabric, "up", "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "up")
        argv = [sys.executable, "-m", "agent", "probe", "--format", "json", "--nvml", "off",
                "--interfaces", f"^({down}|{fabric})$", "--lldp-wait", "0.5"]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    finally:
        subprocess.run([require_binary("ip"), "link", "del", down], capture_output=True, timeout=10, check=False)
        subprocess.run([require_binary("ip"), "link", "del", fabric], capture_output=True, timeout=10, check=False)
    spec = json.loads(proc.stdout)["spec"]
    assert {i["name"]: i["operState"] for i in spec["interfaces"]} == {down: "down", fabric: "up"}
    assert spec["health"]["lldp"] == {"state": "ok", "reason": ""}, spec["health"]["lldp"]
