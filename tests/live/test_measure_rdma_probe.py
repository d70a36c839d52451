"""The RDMA transport of the measuring probe (agent.measure_transport, agent.adapters.rdma_probe):
which transport a node takes and why, perftest's command line checked against Debian's real
`ib_write_lat`/`ib_write_bw` parser, bounded subprocesses, and measuring rounds between two
agents on this host's loopback (prober 127.0.0.1, peer 127.0.0.2) through the real adapter, the
real responder and gate, and the perftest stand-in (tests/lab/perftest_standin.py: this kernel
has no RDMA, so the tools' RDMA run is the one part that is not real)."""

from __future__ import annotations

import argparse
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.standin_rdma import roce_sysfs, standin_bin
from prometheus_client import CollectorRegistry
from realparts import free_port, require_binary

from agent.adapters.rdma_probe import (
    BANDWIDTH,
    LATENCY,
    RdmaGate,
    RdmaTransport,
    perftest_argv,
    run_tool,
    supports_bind,
)
from agent.adapters.udp_probe import UdpResponder, UdpTransport
from agent.common.measure_rows import PlanRow
from agent.fabric_measure import FabricMeasure, MeasureMetrics
from agent.measure_cli import _transport, interface_of
from agent.measure_transport import RdmaEndpoint, choose, find_endpoint, missing_tools, verbs_device_problem

PROBER, PEER = "127.0.0.1", "127.0.0.2"
ROCE = RdmaEndpoint("rxe0", 1, 3, "Ethernet")


# --- which transport ------------------------------------------------------------------------


def test_a_roce_port_on_the_fabric_interface_gives_its_ipv4_roce_v2_gid_index(tmp_path: Path) -> None:
    sysfs = roce_sysfs(tmp_path, netdev="fab0", address="10.77.0.1")
    assert find_endpoint(sysfs, "fab0", "10.77.0.1") == (ROCE, "")  # index 3: v2 of the address, not 0 (fe80)


def test_no_rdma_on_the_interface_is_a_reason_not_an_endpoint(tmp_path: Path) -> None:
    sysfs = roce_sysfs(tmp_path / "a", netdev="fab0", address="10.77.0.1")
    assert find_endpoint(sysfs, "eth9", "10.77.0.1") == (None, f"no RDMA port on eth9 (sysfs {sysfs}/class/infiniband)")
    assert find_endpoint(sysfs, "fab0", "10.77.0.9") == (None, "RoCE port rxe0/1 has no GID for 10.77.0.9")
    down = roce_sysfs(tmp_path / "b", netdev="fab0", address="10.77.0.1", state="1: DOWN")
    assert find_endpoint(down, "fab0", "10.77.0.1") == (None, "RDMA port rxe0/1 on fab0 is DOWN, not ACTIVE")
    ib = roce_sysfs(tmp_path / "c", netdev="ib0", address="10.77.0.1", device="mlx5_0", link_layer="InfiniBand")
    assert find_endpoint(ib, "ib0", "10.77.0.1") == (RdmaEndpoint("mlx5_0", 1, None, "InfiniBand"), "")
    assert find_endpoint(tmp_path / "none", "fab0", "10.77.0.1")[0] is None


def test_auto_takes_rdma_only_with_a_port_and_both_tools_and_rdma_insists() -> None:
    assert choose("auto", ROCE, "", []) == ("rdma", "rxe0 port 1 (Ethernet) GID index 3")
    assert choose("auto", ROCE, "", ["ib_write_bw"])[0] == "udp"
    assert choose("auto", None, "no RDMA port on eth0", []) == ("udp", "no RDMA port on eth0")
    assert choose("udp", ROCE, "", []) == ("udp", "asked for")
    with pytest.raises(ValueError, match=r"^--measure-transport rdma: perftest not installed \(ib_write_lat, ib_write_bw"):
        choose("rdma", ROCE, "", ["ib_write_lat", "ib_write_bw"])
    with pytest.raises(ValueError, match=r"^--measure-transport rdma: no RDMA port on eth0$"):
        choose("rdma", None, "no RDMA port on eth0", [])


def test_the_tools_are_looked_up_on_path(tmp_path: Path) -> None:
    assert missing_tools(str(standin_bin(tmp_path / "bin"))) == []
    (tmp_path / "empty").mkdir()
    assert missing_tools(str(tmp_path / "empty")) == ["ib_write_lat", "ib_write_bw"]


def test_the_agent_wires_rdma_and_its_gate_where_the_node_has_them_else_udp(tmp_path, monkeypatch) -> None:
    sysfs = roce_sysfs(tmp_path / "sys", netdev="fab0", address="10.77.0.1")
    monkeypatch.setenv("PATH", f"{standin_bin(tmp_path / 'bin')}:{os.environ['PATH']}")
    udp = UdpTransport("10.77.0.1")
    args = argparse.Namespace(measure_transport="auto", sysfs=str(sysfs), measure_port=9731)
    transport, gate = _transport(args, "10.77.0.1", "fab0", udp)
    assert isinstance(transport, RdmaTransport) and transport.endpoint == ROCE and transport.fallback is udp
    assert gate is not None and gate.__self__.ports == [9732, 9733, 9734, 9735]
    assert _transport(argparse.Namespace(**{**vars(args), "measure_transport": "udp"}), "10.77.0.1", "fab0", udp) == (udp, None)
    assert _transport(args, "10.77.0.1", "eth1", udp) == (udp, None)  # auto: no port there
    with pytest.raises(ValueError, match=r"^--measure-transport rdma: no RDMA port on eth1"):
        _transport(argparse.Namespace(**{**vars(args), "measure_transport": "rdma"}), "10.77.0.1", "eth1", udp)


# --- the real perftest's parser ---------------------------------------------------------------


@pytest.mark.parametrize("kind", [LATENCY, BANDWIDTH])
@pytest.mark.parametrize("peer", [None, "10.77.0.2"])
def test_debians_perftest_accepts_the_command_lines_the_adapter_builds(kind: int, peer: str | None) -> None:
    """The real binary parses our argv and only then fails, at finding a device (none here); an
    option it does not know is refused before that, so the check can tell them apart."""
    tool = require_binary("ib_write_lat" if kind == LATENCY else "ib_write_bw")
    argv = [tool, *perftest_argv(kind, ROCE, 21, free_port(), bind=None, peer=peer)[1:]]
    run = run_tool(argv, 10)
    assert "Unable to find the Infiniband/RoCE device" in run.output, run.output
    assert "Invalid Command" not in run.output and "unrecognized" not in run.output
    refused = run_tool([*argv[:-1], "--no-such-flag", argv[-1]], 10)
    assert "Invalid Command or flag" in refused.output and "Unable to find" not in refused.output


def test_bind_source_ip_is_given_only_to_a_perftest_that_knows_it() -> None:
    tool = require_binary("ib_write_lat")
    argv = [tool, *perftest_argv(LATENCY, ROCE, 21, free_port(), bind="10.77.0.1", peer="10.77.0.2")[1:]]
    accepted = "Unable to find the Infiniband/RoCE device" in run_tool(argv, 10).output
    assert supports_bind(tool) == accepted  # Debian bookworm's 4.5-0.17: neither


# --- bounded subprocesses -------------------------------------------------------------------


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_tool_that_hangs_or_floods_is_killed_and_reported_in_one_line(tmp_path: Path) -> None:
    started = time.monotonic()
    hung = run_tool([script(tmp_path / "hang", "exec sleep 30")], 0.5)
    assert hung.error == f"{tmp_path / 'hang'}: no result within 0.5 s" and hung.status is None
    assert time.monotonic() - started < 5
    flood = run_tool([script(tmp_path / "flood", "exec yes")], 20)
    assert flood.error.endswith("output over 262144 bytes") and len(flood.output) <= 262144
    assert time.monotonic() - started < 10  # killed at the cap, not at its 20 s timeout
    missing = run_tool([str(tmp_path / "absent")], 1)
    assert missing.error == f"{tmp_path / 'absent'}: No such file or directory"
    failed = run_tool([script(tmp_path / "fail", "echo ' Unable to find the Infiniband/RoCE device'; exit 1")], 5)
    assert failed.error.endswith("exit status 1: Unable to find the Infiniband/RoCE device")


# --- rounds between two agents on loopback -----------------------------------------------------


class Pair:
    """Node b's responder (with a gate, or not) on PEER; node a's measuring loop on PROBER."""

    def __init__(self, root: Path, *, gate: bool = True, allowed: frozenset[str] = frozenset({PROBER}),
                 slots: int = 2) -> None:  # fmt: skip
        self.port = free_port()
        self.gate = RdmaGate(ROCE, PEER, base_port=free_port(), slots=slots) if gate else None
        self.responder = UdpResponder(PEER, port=self.port, allowed=lambda: allowed, rate=1000, burst=100,
                                      gate=self.gate.handle if self.gate else None)  # fmt: skip
        self.responder.start()
        self.udp = UdpTransport(PROBER, port=self.port, timeout=0.2)
        self.transport = RdmaTransport(ROCE, PROBER, fallback=self.udp, port=self.port, run_timeout=20, tries=3)
        row = PlanRow("t", (("b", PEER),), frozenset())
        self.measure = FabricMeasure("a", PROBER, self.transport, lambda: row, count=10, burst_every=1, burst_count=8)
        self.log = root / "ran.txt"

    def ran(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    roce_sysfs(tmp_path / "sys", netdev="lo", address=PEER)
    monkeypatch.setenv("PATH", f"{standin_bin(tmp_path / 'bin')}:{os.environ['PATH']}")
    monkeypatch.setenv("HYPERTOPO_STANDIN_SYSFS", str(tmp_path / "sys"))
    monkeypatch.setenv("HYPERTOPO_STANDIN_LOG", str(tmp_path / "ran.txt"))
    yield tmp_path


def wait_for(check, timeout: float = 10.0) -> None:
    until = time.monotonic() + timeout
    while not check() and time.monotonic() < until:
        time.sleep(0.05)


def test_a_round_between_two_rdma_nodes_fills_the_row_from_perftest_runs(standin: Path) -> None:
    pair = Pair(standin)
    try:
        (m,) = pair.measure.round()
        wait_for(lambda: pair.gate is not None and pair.gate.served == 2)
    finally:
        pair.responder.stop()
    assert (m.peer, m.transport, m.sent, m.loss_percent) == ("b", "rdma", 10, 0.0)
    assert 0 < m.p50_us <= m.p99_us and m.bandwidth_mbps is not None and m.bandwidth_mbps >= 1
    assert pair.udp.sent == 0 and pair.transport.failures == 0  # no UDP probe was needed
    ran = pair.ran()
    lat = [r for r in ran if r.startswith("ib_write_lat")]
    bw = [r for r in ran if r.startswith("ib_write_bw")]
    assert len(lat) == 2 and len(bw) == 2, ran  # one server (by the gate) and one client each
    assert any(r.endswith(f" -s 2 -U {PEER}") and " -d rxe0 -i 1 -x 3 -n 11 " in r for r in lat), lat
    assert any(r.endswith(" -s 65536 --report_gbits") and " -n 8 " in r for r in bw), bw  # the gate's server
    assert pair.gate is not None and pair.gate.served == 2 and pair.gate.intruded == 0 and not pair.gate.busy


def test_a_peer_without_a_gate_is_measured_over_udp_and_the_row_says_so(standin: Path) -> None:
    pair = Pair(standin, gate=False)
    try:
        (m,) = pair.measure.round()
    finally:
        pair.responder.stop()
    assert (m.transport, m.loss_percent, m.sent) == ("udp", 0.0, 10) and m.p50_us > 0
    assert pair.ran() == []  # no perftest ran on either side
    assert pair.transport.failures == 0  # a node without RDMA is no fallback to count


def test_a_session_request_from_outside_the_plan_starts_no_server_and_gets_no_answer(standin: Path) -> None:
    pair = Pair(standin, allowed=frozenset({"127.0.0.9"}))
    try:
        (m,) = pair.measure.round()
    finally:
        pair.responder.stop()
    assert pair.ran() == [] and pair.gate is not None and pair.gate.served == pair.gate.refused == 0
    assert (m.transport, m.loss_percent) == ("udp", 100.0)  # its UDP probes are refused too
    assert pair.responder.refused >= 2 + 10


def test_a_gate_without_a_free_slot_answers_busy_and_the_prober_measures_over_udp(standin: Path) -> None:
    pair = Pair(standin, slots=0)
    pair.measure.burst_every = 0
    try:
        (m,) = pair.measure.round()
    finally:
        pair.responder.stop()
    assert (m.transport, m.loss_percent) == ("udp", 0.0) and pair.ran() == []
    assert pair.responder.answered == 3 + 10  # three BUSY answers (tries), then ten UDP echoes
    # a gate that answers but never serves is a fallback counted (a peer with no gate is not)
    assert pair.transport.failures == 1 and "started no server" in pair.transport.last_error


def test_output_the_parser_refuses_is_one_warning_and_a_udp_measurement(standin: Path, caplog) -> None:
    bad = standin / "bin" / "ib_write_lat"
    bad.unlink()
    script(bad, f'exec {standin / "bin" / "ib_write_bw"} "$@" >/dev/null; echo "#, usec"; echo "1, oops"')
    pair = Pair(standin)
    pair.measure.burst_every = 0
    try:
        (m,) = pair.measure.round()
    finally:
        pair.responder.stop()
    assert (m.transport, m.loss_percent) == ("udp", 0.0) and pair.transport.failures == 1
    registry = CollectorRegistry()
    registry.register(MeasureMetrics(pair.measure))
    assert registry.get_sample_value("hypertopo_fabric_rdma_fallbacks_total") == 1.0
    (warning,) = [r.getMessage() for r in caplog.records if "RDMA probe to" in r.getMessage()]
    assert "\n" not in warning and warning.startswith(f"RDMA probe to {PEER} failed, measured over UDP instead: ")


def test_the_gate_refuses_iterations_perftest_would_refuse_or_the_flags_do_not_allow() -> None:
    from agent.adapters.rdma_probe import _REQUEST, REQUEST_MAGIC

    gate = RdmaGate(ROCE, PEER, base_port=free_port())
    replies: list[bytes] = []
    for kind, iterations in ((LATENCY, 4), (LATENCY, 1002), (BANDWIDTH, 1001), (7, 10)):
        gate.handle(_REQUEST.pack(REQUEST_MAGIC, 1, kind, iterations).ljust(64, b"\0"), PROBER, replies.append)
    assert gate.refused == 4 and replies == [] and not gate.busy and threading.active_count() >= 1


def test_the_fabric_interface_of_an_address_is_the_one_that_holds_it() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.77") is None  # TEST-NET-1: on no interface here


def test_a_port_whose_verbs_device_cannot_be_opened_is_measured_over_udp_and_says_why(tmp_path: Path) -> None:
    # sysfs shows the port in any container; perftest also needs /dev/infiniband/uverbsN
    sysfs = roce_sysfs(tmp_path / "sys", netdev="fab0", address="10.77.0.1")
    (sysfs / "class" / "infiniband_verbs" / "uverbs3").mkdir(parents=True)
    (sysfs / "class" / "infiniband_verbs" / "uverbs3" / "ibdev").write_text("rxe0\n")
    dev = tmp_path / "dev"
    why = verbs_device_problem(sysfs, "rxe0", dev)
    assert why.startswith(f"cannot open {dev}/infiniband/uverbs3 for rxe0 (No such file or directory;")
    assert "\n" not in why
    with pytest.raises(ValueError, match=r"^--measure-transport rdma: cannot open "):
        choose("rdma", None, why, [])
    assert choose("auto", None, why, [])[0] == "udp"
    (dev / "infiniband").mkdir(parents=True)
    (dev / "infiniband" / "uverbs3").write_text("")
    assert verbs_device_problem(sysfs, "rxe0", dev) == ""
    assert verbs_device_problem(sysfs, "mlx5_0", dev) == ""  # not this device's: perftest will say
