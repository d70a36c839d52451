"""Which interfaces the agent reports by default: physical NICs and RDMA netdevs, decided by sysfs
(issue 21.4). A Kubernetes node also carries pod veths, CNI bridges and tunnels, kube-ipvs0 and
docker0; none of them is fabric, and reporting them made every pod start an API write."""

from __future__ import annotations

import errno
import os
import re
import socket
from pathlib import Path

import pytest
import ttar

from agent import cli
from agent.adapters.raw_socket import LldpListener
from agent.collect import CollectConfig, Prober
from agent.common.report import Health, Interface, ProbeResult
from agent.probes import net
from agent.probes.lldp import NeighbourTable
from agent.probes.net import IFF_UP, LinkRecord

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sysfs"
HGX = FIXTURES / "hgx-h100-ib"
ROCE = FIXTURES / "roce"

# What a Kubernetes GPU node's rtnetlink table holds besides its NICs (kinds as `ip -d link` names them)
CLUTTER = [
    LinkRecord(20, "cni0", kind="bridge", oper_state="up", flags=IFF_UP),
    LinkRecord(21, "veth3f2a9c1e", kind="veth", master="cni0", oper_state="up", flags=IFF_UP),
    LinkRecord(22, "cali5d0e11f2a7b", kind="veth", oper_state="up", flags=IFF_UP),
    LinkRecord(23, "flannel.1", kind="vxlan", oper_state="unknown", flags=IFF_UP),
    LinkRecord(24, "tunl0", kind="ipip", oper_state="unknown", flags=IFF_UP),
    LinkRecord(25, "kube-ipvs0", kind="dummy", oper_state="down"),  # administratively down
    LinkRecord(26, "docker0", kind="bridge", oper_state="down", flags=IFF_UP),
    LinkRecord(27, "nodelocaldns", kind="dummy", oper_state="unknown", flags=IFF_UP),
]
HGX_LINKS = [
    LinkRecord(1, "lo", link_type="loopback", flags=net.IFF_LOOPBACK | IFF_UP),
    LinkRecord(2, "eno1", link_type="ether", oper_state="up", flags=IFF_UP),
    *(LinkRecord(3 + i, f"ib{i}", link_type="infiniband", oper_state="up", flags=IFF_UP) for i in range(8)),
]
NICS = ["eno1"] + [f"ib{i}" for i in range(8)]


def names(result: ProbeResult[tuple[Interface, ...]]) -> list[str]:
    return [i.name for i in result.value or ()]


def test_fabric_only_keeps_the_nics_of_a_real_tree_and_drops_every_virtual_link() -> None:
    result = net.probe([*HGX_LINKS, *CLUTTER], sysfs=HGX, fabric_only=True)
    assert names(result) == NICS
    assert result.health.state is Health.OK
    assert names(net.probe([*HGX_LINKS, *CLUTTER], sysfs=HGX)) == NICS + [r.name for r in CLUTTER]


def test_a_real_capture_tells_a_pci_nic_from_bonds_by_where_its_class_entry_links(
    shared_data: Path, tmp_path: Path
) -> None:
    """node_exporter's sysfs capture: eth0 links into a PCI device, the bonds are no device's."""
    sysfs = ttar.extract(shared_data / "sysfs" / "node_exporter_sys.ttar", tmp_path) / "sys"
    links = [LinkRecord(i, name, kind=kind, flags=IFF_UP)
             for i, (name, kind) in enumerate([("eth0", None), ("bond0", "bond"), ("dmz", "bond"), ("int", "bond")])]  # fmt: skip
    assert names(net.probe(links, sysfs=sysfs, fabric_only=True)) == ["eth0"]
    assert net.is_physical(sysfs / "class" / "net" / "eth0")
    assert not any(
        net.is_physical(sysfs / "class" / "net" / name) for name in ("bond0", "dmz", "int", "nope")
    )


def test_a_link_into_devices_virtual_is_not_physical_and_a_device_link_is(tmp_path: Path) -> None:
    classes = tmp_path / "class" / "net"
    classes.mkdir(parents=True)
    for name, target in [
        ("veth0", "devices/virtual/net/veth0"),
        ("enp1s0", "devices/pci0000:00/0000:01:00.0/net/enp1s0"),
    ]:
        (tmp_path / target).mkdir(parents=True)
        (classes / name).symlink_to(Path("../..") / target)
    (
        tmp_path / "devices/virtual/net/veth0/device"
    ).mkdir()  # a virtual link with a parent device: a VF representor
    assert net.is_physical(classes / "enp1s0") and net.is_physical(classes / "veth0")
    (tmp_path / "devices/virtual/net/veth0/device").rmdir()
    assert not net.is_physical(classes / "veth0")


def test_rdma_netdevs_are_fabric_without_a_device_of_their_own(tmp_path: Path) -> None:
    """A RoCE bond (the HCA port's GID table names bond0) has no `device`; it is reported all the same."""
    links = [LinkRecord(5, "bond0", kind="bond", oper_state="up", flags=IFF_UP), *CLUTTER]
    assert names(net.probe(links, sysfs=tmp_path, fabric_only=True, rdma_netdevs={"bond0"})) == ["bond0"]
    none = net.probe(links, sysfs=tmp_path, fabric_only=True)
    assert none.health.state is Health.ABSENT and none.health.reason == net.NO_FABRIC_INTERFACES


def test_the_agent_default_reports_the_rdma_probes_netdev_and_not_the_clutter() -> None:
    """The RoCE fixture tree: mlx5_0's GID table names eth2, which has no class/net entry in the tree."""
    links = [LinkRecord(2, "eth2", link_type="ether", oper_state="up", flags=IFF_UP), *CLUTTER]
    prober = Prober(CollectConfig("n1", sysfs=ROCE, nvml="off"), links=lambda: links, clock=lambda: 1.0)
    assert [i.name for i in prober.collect().interfaces] == ["eth2"]
    every = Prober(
        CollectConfig("n1", sysfs=ROCE, nvml="off", interfaces=cli.EVERY_NAME), links=lambda: links
    )
    assert [i.name for i in every.collect().interfaces] == ["eth2", *(r.name for r in CLUTTER)]


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ([], NICS),
        (["--interfaces", "fabric"], NICS),
        (["--interfaces", "all"], NICS + [r.name for r in CLUTTER]),
        (["--interfaces", "^(ib0|cni0)$"], ["ib0", "cni0"]),
    ],
)
def test_the_interfaces_flag_selects_fabric_all_or_names(flag: list[str], expected: list[str]) -> None:
    args = cli.build_parser().parse_args(["probe", *flag])
    config = CollectConfig("n1", sysfs=HGX, nvml="off", interfaces=args.interfaces)
    prober = Prober(config, links=lambda: [*HGX_LINKS, *CLUTTER], clock=lambda: 1.0)
    assert [i.name for i in prober.collect().interfaces] == expected


def test_a_bad_interfaces_regex_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["probe", "--interfaces", "(unclosed"])
    assert exit_info.value.code == 2


def refusing_listener(interfaces: list[str]) -> LldpListener:
    """The real raw-socket listener after one round in which every interface refused its socket
    the way an administratively down link does (ENETDOWN)."""

    def refuse(name: str) -> socket.socket:
        raise OSError(errno.ENETDOWN, os.strerror(errno.ENETDOWN))

    listener = LldpListener(interfaces, NeighbourTable(), lambda: None, opener=refuse, poll_s=0.001)
    listener.step()
    assert set(listener.errors) == set(interfaces)
    return listener


def test_a_down_non_fabric_interface_never_degrades_lldp_but_a_fabric_nic_that_is_up_does() -> None:
    links = [*HGX_LINKS, *CLUTTER]
    prober = Prober(CollectConfig("n1", sysfs=HGX, nvml="off", interfaces=cli.EVERY_NAME),
                    links=lambda: links, clock=lambda: 1.0)  # fmt: skip
    prober.lldp_listener = refusing_listener(["kube-ipvs0", "docker0"])
    assert prober.collect().health["lldp"].state is Health.OK
    prober.lldp_listener = refusing_listener(["kube-ipvs0", "ib3"])
    lldp = prober.collect().health["lldp"]
    assert lldp.state is Health.FAILED and lldp.reason == "cannot listen on ib3: Network is down"


def test_lldp_quiet_names_admin_down_links_and_idle_virtual_ones_only() -> None:
    links = [*HGX_LINKS, *CLUTTER, LinkRecord(40, "eno2", link_type="ether", oper_state="down")]
    interfaces = net.probe(links, sysfs=HGX).value or ()
    assert net.lldp_quiet(links, interfaces) == {
        "kube-ipvs0",
        "docker0",
        "flannel.1",
        "tunl0",
        "nodelocaldns",
        "eno2",
    }
    assert (
        net.lldp_quiet(links, [i for i in interfaces if re.match("ib|eno1|cni0|veth", i.name)]) == frozenset()
    )
