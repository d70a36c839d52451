"""Real LLDP on a real cable, as far as a CI machine has one: two network namespaces joined by a
veth pair, Debian's lldpd playing the leaf switch `leaf-sw1` in one, and in the other the agent's
raw-socket listener (and a host lldpd read through its socket with lldpcli). The listener must
report the switch and the switch-side port, ignore what its own host sends, and drop the switch
at once when lldpd says goodbye with a shutdown LLDPDU, long before its TTL runs out."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from realparts import require_binary, require_root, stop_processes

from agent.adapters.lldpd_socket import LldpdReader
from agent.lldp.lldpcli import parse_json

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
SWITCH_NAME = "leaf-sw1"
HOST_NAME = "gpu-node-1"
SWITCH_PORT = "swp1"
HOST_PORT = "eth0"
TX_HOLD = 10  # TTL = tx-interval 1 s x tx-hold 10: goodbye must beat expiry by seconds


@dataclass
class Fabric:
    ip: str
    lldpd: str
    lldpcli: str
    workdir: Path
    switch_ns: str
    host_ns: str
    processes: dict[str, subprocess.Popen[str]] = field(default_factory=dict)

    def sock(self, role: str) -> Path:
        return self.workdir / f"{role}.sock"

    def start_lldpd(self, role: str, namespace: str, interface: str, hostname: str) -> None:
        config = self.workdir / f"{role}.conf"
        config.write_text(
            f"configure system hostname {hostname}\n"
            "configure lldp tx-interval 1\n"
            f"configure lldp tx-hold {TX_HOLD}\n"
        )
        argv = [self.ip, "netns", "exec", namespace, self.lldpd, "-d", "-u", str(self.sock(role))]
        argv += ["-O", str(config), "-L", self.lldpcli, "-I", interface]
        log = (self.workdir / f"{role}.log").open("w")
        self.processes[role] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)

    def stop(self, role: str) -> None:
        proc = self.processes.pop(role, None)
        if proc:
            stop_processes([proc], timeout=5)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.workdir.glob("*.log")))

    def mac(self, namespace: str, interface: str) -> str:
        out = subprocess.run(
            [self.ip, "-n", namespace, "-j", "link", "show", interface],
            capture_output=True, text=True, check=True, timeout=10,
        )  # fmt: skip
        address: str = json.loads(out.stdout)[0]["address"]
        return address


def _ip(ip: str, *args: str) -> None:
    subprocess.run([ip, *args], check=True, capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    require_root()
    ip, lldpd, lldpcli = require_binary("ip"), require_binary("lldpd"), require_binary("lldpcli")
    suffix = uuid.uuid4().hex[:6]
    # a short directory: lldpd's control socket path must fit in sun_path (108 bytes)
    workdir = Path(tempfile.mkdtemp(prefix="htlldp-"))
    workdir.chmod(0o755)  # lldpd's own lldpcli (run as _lldpd at start) must reach the socket
    fab = Fabric(ip, lldpd, lldpcli, workdir, f"htsw-{suffix}", f"hthost-{suffix}")
    created: list[str] = []
    try:
        for ns in (fab.switch_ns, fab.host_ns):
            _ip(ip, "netns", "add", ns)
            created.append(ns)
        _ip(ip, "link", "add", SWITCH_PORT, "netns", fab.switch_ns, "type", "veth",
            "peer", "name", HOST_PORT, "netns", fab.host_ns)  # fmt: skip
        for ns, port in ((fab.switch_ns, SWITCH_PORT), (fab.host_ns, HOST_PORT)):
            _ip(ip, "-n", ns, "link", "set", "lo", "up")
            _ip(ip, "-n", ns, "link", "set", port, "mtu", "9000", "up")  # jumbo, as on GPU fabrics
        yield fab
    finally:
        for role in list(fab.processes):
            fab.stop(role)
        for ns in created:  # deleting a namespace also deletes its end of the veth pair
            subprocess.run([ip, "netns", "del", ns], capture_output=True, timeout=10, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


class Listener:
    """The agent's listener running in the host namespace, read one JSON line per change (a thread
    reads the pipe, so no line waits in a buffer that `select` cannot see)."""

    def __init__(self, fab: Fabric) -> None:
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
        script = str(REPO / "tests" / "kits/lldp_netns_listener.py")
        argv = [fab.ip, "netns", "exec", fab.host_ns, sys.executable, script, HOST_PORT]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.last: dict[str, Any] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def wait_for(self, condition: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not condition(self.last):
            try:
                self.last = self.lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                stderr = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
                raise AssertionError(
                    f"listener never reported it; last report {self.last}; {stderr}"
                ) from None
        return self.last

    def settle(self, quiet_s: float) -> dict[str, Any]:
        """The latest report once no new one came for `quiet_s` seconds."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.last = self.lines.get(timeout=quiet_s)
        return self.last

    def close(self) -> None:
        stop_processes([self.proc], timeout=5)


def _send_captures(fab: Fabric, captures: list[Path]) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = str(REPO / "tests" / "kits/lldp_netns_sender.py")
    argv = [fab.ip, "netns", "exec", fab.switch_ns, sys.executable, script, SWITCH_PORT, *map(str, captures)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


def _names(report: dict[str, Any]) -> list[str | None]:
    return [n["system_name"] for n in report.get("neighbours", [])]


def _wait_until(probe: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def running(fabric: Fabric) -> Fabric:
    """lldpd as the switch on swp1 and as the host's own lldpd on eth0 (which the agent can read)."""
    fabric.start_lldpd("switch", fabric.switch_ns, SWITCH_PORT, SWITCH_NAME)
    fabric.start_lldpd("host", fabric.host_ns, HOST_PORT, HOST_NAME)
    return fabric


def _lldpcli_json0(fab: Fabric, role: str) -> str:
    argv = [fab.lldpcli, "-u", str(fab.sock(role)), "-f", "json0", "show", "neighbors", "details"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout


def _sees(fab: Fabric, role: str, name: str) -> bool:
    try:
        return name in [n.system_name for n in parse_json(_lldpcli_json0(fab, role))]
    except ValueError:
        return False


def test_lldpcli_json0_from_both_ends_parses_into_the_neighbour_each_end_hears(running: Fabric) -> None:
    fab = running
    assert _wait_until(lambda: _sees(fab, "host", SWITCH_NAME) and _sees(fab, "switch", HOST_NAME), 10), (
        fab.logs()
    )
    (at_switch,) = parse_json(_lldpcli_json0(fab, "switch"))
    assert (at_switch.interface, at_switch.system_name) == (SWITCH_PORT, HOST_NAME)
    result = LldpdReader(fab.sock("host"), lldpcli=fab.lldpcli).probe()
    assert result.value is not None, result.health
    (at_host,) = result.value
    assert (at_host.interface, at_host.system_name) == (HOST_PORT, SWITCH_NAME)
    assert at_host.chassis_id == fab.mac(fab.switch_ns, SWITCH_PORT)
    assert at_host.ttl == TX_HOLD


def test_raw_listener_reports_the_switch_and_its_port_and_forgets_it_on_shutdown(running: Fabric) -> None:
    fab = running
    listener = Listener(fab)
    try:
        started = listener.wait_for(lambda r: "listening" in r, timeout=10)
        assert started["listening"] == [HOST_PORT], started
        report = listener.wait_for(lambda r: SWITCH_NAME in _names(r), timeout=10)
        (neighbour,) = report["neighbours"]
        switch_mac = fab.mac(fab.switch_ns, SWITCH_PORT)
        assert neighbour["interface"] == HOST_PORT
        assert (neighbour["chassis_id_subtype"], neighbour["chassis_id"]) == ("mac", switch_mac)
        # lldpd's default port ID for a veth is its MAC, with the interface name as description
        if neighbour["port_id_subtype"] == "ifname":
            assert neighbour["port_id"] == SWITCH_PORT
        else:
            assert (neighbour["port_id_subtype"], neighbour["port_id"]) == ("mac", switch_mac)
            assert neighbour["port_description"] == SWITCH_PORT
        assert neighbour["ttl"] == TX_HOLD

        # the host's own lldpd sends on eth0 too: those outgoing frames are not neighbours
        assert _wait_until(lambda: _sees(fab, "switch", HOST_NAME), 10), fab.logs()
        assert _names(listener.settle(quiet_s=0.5)) == [SWITCH_NAME]

        stopped_at = time.monotonic()
        fab.stop("switch")  # lldpd sends a shutdown LLDPDU (TTL 0) as it exits
        listener.wait_for(lambda r: SWITCH_NAME not in _names(r), timeout=TX_HOLD + 5)
        assert time.monotonic() - stopped_at < TX_HOLD / 2, "neighbour expired instead of being shut down"
    finally:
        listener.close()


def test_real_malformed_frames_on_the_wire_are_rejected_and_the_listener_carries_on(
    fabric: Fabric, shared_data: Path
) -> None:
    lldp = shared_data / "lldp"
    malformed = [*sorted((lldp / "malformed").glob("*.pcap")), lldp / "med-loc-malformed.pcap"]
    listener = Listener(fabric)
    try:
        assert listener.wait_for(lambda r: "listening" in r, timeout=10)["listening"] == [HOST_PORT]
        assert _send_captures(fabric, malformed) >= len(malformed)
        # then a good frame from a real switch: the listener is still there and hears it
        assert _send_captures(fabric, [lldp / "gopacket-scalance.pcap"]) == 1
        report = listener.wait_for(lambda r: "Switch1" in _names(r), timeout=10)
        # lldp_asan, mtu-oobr, infinite-loop-2 and the mgmt-address frame are refused with reasons
        assert report["rejected"].get(HOST_PORT, 0) >= 4, report
        assert listener.proc.poll() is None
    finally:
        listener.close()


def test_agent_probe_reads_the_host_lldpd_through_its_socket(running: Fabric) -> None:
    """`hypertopo-agent probe --lldpd-socket`: the neighbour a host lldpd heard reaches the report."""
    fab = running
    if "switch" not in fab.processes:  # an earlier test shut the switch down to watch it leave
        fab.start_lldpd("switch", fab.switch_ns, SWITCH_PORT, SWITCH_NAME)
    assert _wait_until(lambda: _sees(fab, "host", SWITCH_NAME), 10), fab.logs()
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "probe", "--format=json", "--nvml=off", f"--lldpd-socket={fab.sock('host')}",
         f"--interfaces=^{HOST_PORT}$"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    spec = json.loads(proc.stdout)["spec"]
    # lldpd may also still hold neighbours from frames an earlier test replayed on this link.
    assert (HOST_PORT, SWITCH_NAME) in [(n["interface"], n.get("systemName")) for n in spec["lldp"]]
    assert spec["health"]["lldp"]["state"] == "ok"


def test_agent_probe_says_why_when_the_host_lldpd_socket_is_missing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "probe", "--format=json", "--nvml=off", f"--lldpd-socket={tmp_path / 'none.sock'}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # degraded is not a failed probe
    lldp = json.loads(proc.stdout)["spec"]["health"]["lldp"]
    assert lldp == {"state": "degraded", "reason": f"host lldpd: no lldpd socket at {tmp_path / 'none.sock'}"}
