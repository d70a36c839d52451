"""A two-tier Ethernet lab in network namespaces whose switches add latency per tier, for the
measured-fabric tests (tests/live/test_measure_netns.py).

    spine1                 egress delay spine_ms on each port
    /     \\
 leaf1   leaf2             egress delay leaf_ms to hosts, spine_ms up (swp49)
 / | \\   / | \\
h1 h2 h3 h4 h5 h6          fabric NIC fab0, 10.77.0.N/24, IPv6 off (no neighbour-discovery noise)

The switches are user-space delaying hubs (tests/lab/delay_switch.py): this kernel has no netem.
A round trip inside a leaf crosses two leaf egresses (2 x leaf_ms), one across the spine
2 x (2 x spine_ms + leaf_ms). Namespace and link names carry this process's id, so two runs (or
the LLDP fabric lab, prefix "htl") never touch each other's. Needs root and iproute2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from realparts import stop_processes

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# The hubs and probes time milliseconds on a shared two-core machine: ahead of the (niced) builds
# and test suites beside them, or a busy neighbour shows up as fabric latency. They mostly sleep.
PRIORITY = ("nice", "-n", "-10")


def sh(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=20)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class MeasureNet:
    leaves: dict[str, list[str]] = field(
        default_factory=lambda: {"leaf1": ["h1", "h2", "h3"], "leaf2": ["h4", "h5", "h6"]}
    )
    spine: str = "spine1"
    leaf_ms: float = 2.0
    spine_ms: float = 20.0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="htmeasure-")))
    switches: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_ms: dict[str, float] = field(default_factory=dict)  # host -> extra delay on its leaf port
    uplink_mbit: dict[str, float] = field(default_factory=dict)  # leaf -> rate of its uplink (swp49)
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    rdma_hosts: frozenset[str] = frozenset()  # hosts with an RDMA port on fab0 (stand-in: tests/lab/standin_rdma.py)

    def ns(self, name: str) -> str:
        return f"htm{self.tag}-{name}"

    @property
    def hosts(self) -> list[str]:
        return [h for hosts in self.leaves.values() for h in hosts]

    def address(self, host: str) -> str:
        return f"10.77.0.{self.hosts.index(host) + 1}"

    def domains(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = [
            {"name": leaf, "tier": 1, "children": hosts} for leaf, hosts in self.leaves.items()
        ]
        return [*out, {"name": self.spine, "tier": 2, "children": list(self.leaves)}]

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self) -> None:
        for name in [*self.leaves, self.spine, *self.hosts]:
            sh("ip", "netns", "add", self.ns(name))
            sh("ip", "-n", self.ns(name), "link", "set", "lo", "up")
        cable = 0
        for i, (leaf, hosts) in enumerate(self.leaves.items()):
            cable += 1
            self._cable(cable, leaf, "swp49", self.spine, f"swp{i + 1}")
            for j, host in enumerate(hosts):
                cable += 1
                self._cable(cable, host, "fab0", leaf, f"swp{j + 1}")
                sh("ip", "netns", "exec", self.ns(host), "sysctl", "-qw", "net.ipv6.conf.fab0.disable_ipv6=1")
                # veth leaves UDP checksums to "hardware" that is not there: a frame relayed by the
                # user-space hub would arrive with a partial checksum and be dropped
                sh("ip", "netns", "exec", self.ns(host), "ethtool", "-K", "fab0", "tx", "off")
                sh("ip", "-n", self.ns(host), "addr", "add", f"{self.address(host)}/24", "dev", "fab0")
        for switch in [*self.leaves, self.spine]:
            self.start_switch(switch)

    def _cable(self, n: int, a: str, a_port: str, b: str, b_port: str) -> None:
        tmp_a, tmp_b = f"hm{self.tag}x{n}a", f"hm{self.tag}x{n}b"
        sh("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
        for tmp, name, port in ((tmp_a, a, a_port), (tmp_b, b, b_port)):
            sh("ip", "link", "set", tmp, "netns", self.ns(name))
            sh("ip", "-n", self.ns(name), "link", "set", tmp, "name", port)
            sh("ip", "-n", self.ns(name), "link", "set", port, "up")

    def port_delays(self, switch: str) -> dict[str, str]:
        """Port -> `MS` or `MS/MBIT` (delay_switch.py's argument)."""
        if switch == self.spine:
            return {f"swp{i + 1}": f"{self.spine_ms}" for i in range(len(self.leaves))}
        hosts = self.leaves[switch]
        ports = {f"swp{j + 1}": f"{self.leaf_ms + self.extra_ms.get(h, 0.0)}" for j, h in enumerate(hosts)}
        rate = self.uplink_mbit.get(switch)
        return {**ports, "swp49": f"{self.spine_ms}/{rate}" if rate else f"{self.spine_ms}"}

    def start_switch(self, switch: str) -> None:
        old = self.switches.pop(switch, None)
        if old is not None:
            stop_processes([old], timeout=5)
        argv = [
            *PRIORITY,
            "ip",
            "netns",
            "exec",
            self.ns(switch),
            sys.executable,
            str(HERE / "delay_switch.py"),
        ]
        argv += [f"{port}={ms}" for port, ms in self.port_delays(switch).items()]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"delay switch {switch} did not start: {line!r}")
        self.switches[switch] = proc

    def delay_host_link(self, host: str, extra_ms: float) -> None:
        """Adds latency to the leaf port a host is cabled to (a bad optic, a mis-set QoS class)."""
        self.extra_ms[host] = extra_ms
        self.start_switch(next(leaf for leaf, hosts in self.leaves.items() if host in hosts))

    def limit_uplink(self, leaf: str, mbit: float | None) -> None:
        """Rate-limits a leaf's uplink towards the spine (None: no limit): a slow or congested uplink."""
        if mbit is None:
            self.uplink_mbit.pop(leaf, None)
        else:
            self.uplink_mbit[leaf] = mbit
        self.start_switch(leaf)

    def down(self) -> None:
        stop_processes(list(self.switches.values()), timeout=5)
        self.switches.clear()
        for line in sh("ip", "netns", "list").splitlines():
            name = line.split()[0] if line.strip() else ""
            if name.startswith(f"htm{self.tag}-"):
                subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)

    def _rdma_node(self, host: str, env: dict[str, str]) -> Path:
        """A RoCE port on the host's fab0 and the perftest stand-in on its PATH; its sysfs root."""
        from lab.standin_rdma import roce_sysfs, standin_bin

        sysfs = roce_sysfs(self.workdir / f"{host}-sys", netdev="fab0", address=self.address(host))
        env["PATH"] = f"{standin_bin(self.workdir / 'bin')}:{env.get('PATH', '')}"
        env["HYPERTOPO_STANDIN_SYSFS"] = str(sysfs)
        env["HYPERTOPO_STANDIN_LOG"] = str(self.workdir / f"{host}-perftest.txt")
        return sysfs

    # -- a measuring round -------------------------------------------------------------------
    def measure(
        self, count: int, *, settle: float = 4.0, budget: float = 20.0, trains: int = 0
    ) -> dict[str, dict[str, object]]:
        """Every host runs one round of the agent's loop at the same moment; their results."""
        lab = self.workdir / "lab.json"
        lab.write_text(
            json.dumps({"domains": self.domains(), "addresses": {h: self.address(h) for h in self.hosts}})
        )
        start = time.time() + settle
        procs = {}
        for host in self.hosts:
            argv = [
                *PRIORITY,
                "ip",
                "netns",
                "exec",
                self.ns(host),
                sys.executable,
                str(HERE / "measure_node.py"),
            ]
            argv += ["--node", host, "--address", self.address(host), "--lab", str(lab), "--nic", "fab0"]
            argv += ["--out", str(self.workdir / f"{host}.json"), "--count", str(count), "--trains", str(trains)]
            argv += ["--start-at", str(start), "--end-at", str(start + budget)]
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            if host in self.rdma_hosts:
                argv += ["--rdma-sysfs", str(self._rdma_node(host, env))]
            procs[host] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = {}
        for host, proc in procs.items():
            text, _ = proc.communicate(timeout=settle + budget + 30)
            if proc.returncode != 0:
                raise RuntimeError(f"measuring on {host} failed: {text.decode(errors='replace')[-2000:]}")
            out[host] = json.loads((self.workdir / f"{host}.json").read_text())
        return out
