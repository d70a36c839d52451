"""`--measure-fabric ADDRESS|IFACE`: an address is taken as given; an interface name gives its first
IPv4 address (else its first global IPv6 one) and ties the probe sockets to it, so one DaemonSet
argument (`--measure-fabric=ib0`) fits every node; a name that is neither, or an interface without
an address, is one line naming the value."""

from __future__ import annotations

import socket
from typing import NamedTuple

import pytest

from agent.measure_cli import fabric_address


class Addr(NamedTuple):
    family: int
    address: str


TABLE = {
    "ib0": [Addr(socket.AF_INET6, "fe80::1"), Addr(socket.AF_INET6, "fd00::7"), Addr(socket.AF_INET, "10.1.2.3")],
    "ib1": [Addr(socket.AF_INET6, "fe80::2"), Addr(socket.AF_INET6, "fd00::8")],
    "ib2": [Addr(socket.AF_INET6, "fe80::3")],
}


def test_an_address_is_taken_as_given_and_an_interface_gives_its_address_and_name() -> None:
    assert fabric_address("10.9.8.7", TABLE) == ("10.9.8.7", None)
    assert fabric_address("fd00::9", TABLE) == ("fd00::9", None)
    assert fabric_address("ib0", TABLE) == ("10.1.2.3", "ib0")  # IPv4 first
    assert fabric_address("ib1", TABLE) == ("fd00::8", "ib1")  # else a global IPv6, never link-local


def test_this_hosts_loopback_interface_resolves_through_psutil() -> None:
    assert fabric_address("lo") == ("127.0.0.1", "lo")


def test_an_unknown_name_or_an_interface_without_an_address_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"^--measure-fabric 'eth9': neither an IP address nor an interface"):
        fabric_address("eth9", TABLE)
    with pytest.raises(ValueError, match=r"^--measure-fabric 'ib2': the interface has no IPv4 or global IPv6"):
        fabric_address("ib2", TABLE)
