"""The raw-socket listener's loop, driven through injected sockets and a fake clock (no root
needed): it tells the agent once per real change, not on every refresh; it notices a TTL running
out without any frame; it keeps retrying an interface it cannot open; it stops promptly."""

from __future__ import annotations

import errno
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from fake_clock import FakeClock

from agent.adapters.raw_socket import LldpListener
from agent.common.report import Health
from agent.probes.lldp import NeighbourTable


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", (kind << 9) | len(value)) + value


def frame(name: str, ttl: int = 10) -> bytes:
    body = (
        tlv(1, b"\x07" + name.encode()) + tlv(2, b"\x05swp1") + tlv(3, struct.pack("!H", ttl)) + tlv(0, b"")
    )
    return bytes.fromhex("0180c200000e020000000001") + b"\x88\xcc" + body


class Wires:
    """Stands in for AF_PACKET: each interface is a datagram socket pair; tests write the far end."""

    def __init__(self) -> None:
        self.far: dict[str, socket.socket] = {}
        self.refuse: set[str] = set()
        self.opened: list[str] = []

    def open(self, interface: str) -> socket.socket:
        self.opened.append(interface)
        if interface in self.refuse:
            raise OSError(errno.ENODEV, "No such device")
        near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        near.setblocking(False)
        self.far[interface] = far
        return near

    def close(self) -> None:
        for sock in self.far.values():
            sock.close()


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


Rig = tuple[LldpListener, Wires, FakeClock, list[int]]  # listener, its wires, its clock, on_change calls


@pytest.fixture
def rig() -> Iterator[Rig]:
    wires, clock, calls = Wires(), FakeClock(), []
    table = NeighbourTable()
    lock = threading.Lock()

    def on_change() -> None:
        with lock:
            calls.append(table.generation)

    listener = LldpListener(
        ["eth0"], table, on_change, clock=clock, poll_s=0.01, retry_s=5.0, opener=wires.open
    )
    listener.start()
    wait_until(lambda: "eth0" in listener.listening)
    yield listener, wires, clock, calls
    listener.stop()
    wires.close()


def test_the_agent_is_told_once_per_change_and_not_on_refreshes(rig: Rig) -> None:
    listener, wires, _, calls = rig
    wires.far["eth0"].send(frame("leaf-sw1"))
    wait_until(lambda: len(calls) == 1)
    for _ in range(3):
        wires.far["eth0"].send(frame("leaf-sw1"))
    wait_until(lambda: listener.table.frames["eth0"] == 4)
    wires.far["eth0"].send(b"\x01\x02garbage")
    wait_until(lambda: listener.table.rejected["eth0"] == 1)
    assert len(calls) == 1
    wires.far["eth0"].send(frame("leaf-sw2"))
    wait_until(lambda: len(calls) == 2)


def test_a_neighbour_whose_ttl_runs_out_is_dropped_without_any_frame(rig: Rig) -> None:
    listener, wires, clock, calls = rig
    wires.far["eth0"].send(frame("leaf-sw1", ttl=10))
    wait_until(lambda: len(calls) == 1)
    clock.now += 10.5
    wait_until(lambda: len(calls) == 2)
    assert listener.table.snapshot(clock.now).value == ()


def test_an_interface_that_cannot_be_opened_is_reported_and_retried(rig: Rig) -> None:
    listener, wires, clock, _ = rig
    wires.refuse.add("eth9")
    listener.set_interfaces(["eth0", "eth9"])
    wait_until(lambda: "eth9" in listener.errors)
    assert "No such device" in listener.errors["eth9"]
    tries = wires.opened.count("eth9")
    wires.refuse.clear()
    time.sleep(0.05)  # several loop rounds inside the retry interval: no new attempt
    assert wires.opened.count("eth9") == tries
    clock.now += 5.0
    wait_until(lambda: "eth9" in listener.listening)
    assert "eth9" not in listener.errors


def test_removing_an_interface_forgets_its_neighbours(rig: Rig) -> None:
    listener, wires, clock, calls = rig
    wires.far["eth0"].send(frame("leaf-sw1"))
    wait_until(lambda: len(calls) == 1)
    listener.set_interfaces([])
    wait_until(lambda: len(calls) == 2)
    assert listener.listening == frozenset() and listener.table.snapshot(clock.now).value == ()


def test_stop_returns_promptly_with_the_default_poll_interval() -> None:
    wires = Wires()
    listener = LldpListener(["eth0"], NeighbourTable(), lambda: None, opener=wires.open)
    listener.start()
    wait_until(lambda: "eth0" in listener.listening)
    started = time.monotonic()
    listener.stop()
    assert time.monotonic() - started < 0.5
    assert listener.listening == frozenset()
    wires.close()


def test_the_probe_result_says_which_interfaces_cannot_be_heard(rig: Rig) -> None:
    listener, wires, _, calls = rig
    wires.far["eth0"].send(frame("leaf-sw1"))
    wait_until(lambda: len(calls) == 1)
    healthy = listener.probe()
    assert healthy.health.state is Health.OK and [n.chassis_id for n in healthy.value or ()] == ["leaf-sw1"]
    wires.refuse.add("eth9")
    listener.set_interfaces(["eth0", "eth9"])
    wait_until(lambda: "eth9" in listener.errors)
    degraded = listener.probe()
    assert degraded.health.state is Health.DEGRADED and "eth9" in degraded.health.reason
    assert degraded.value == healthy.value
    listener.set_interfaces(["eth9"])
    wait_until(lambda: not listener.listening)
    assert listener.probe().health.state is Health.FAILED
    listener.set_interfaces([])
    assert listener.probe().health.state is Health.ABSENT
