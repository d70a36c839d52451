"""An emulated two-tier Ethernet fabric in network namespaces, with real lldpd on every switch.

    spine1                      (lldpd; sees leaf1 and leaf2 on swp1, swp2)
    /     \\
 leaf1   leaf2                  (lldpd; uplink swp49, host ports swp1, swp2)
 /  \\    /  \\
h1  h2  h3  h4                  (hosts: fabric NIC fab0 cabled to a leaf port; mgmt NIC on a bridge)

Hosts also get a management NIC on a bridge in the root namespace (10.250.0.0/24, the root side is
10.250.0.1) so processes inside a host namespace (the agents) can reach an API server started in
the root namespace. Needs root, iproute2 and lldpd.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from realparts import stop_processes

PREFIX = "htl"
BRIDGE = f"{PREFIX}-mgmt"
MGMT_GATEWAY = "10.250.0.1"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc


@dataclass
class FabricNet:
    """Build with `up()`, tear down with `down()` (also removes leftovers of a crashed run)."""

    leaves: dict[str, list[str]] = field(
        default_factory=lambda: {"leaf1": ["h1", "h2"], "leaf2": ["h3", "h4"]}
    )
    spine: str = "spine1"
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="htlab-")))
    lldpd: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.chmod(0o755)  # lldpd and lldpcli drop to the _lldpd user and must reach their socket

    # -- names -------------------------------------------------------------------------------
    def ns(self, name: str) -> str:
        return f"{PREFIX}-{name}"

    @property
    def hosts(self) -> list[str]:
        return [h for hosts in self.leaves.values() for h in hosts]

    @property
    def switches(self) -> list[str]:
        return [*self.leaves, self.spine]

    def mgmt_ip(self, host: str) -> str:
        return f"10.250.0.{10 + self.hosts.index(host)}"

    def leaf_of(self, host: str) -> str:
        return next(leaf for leaf, hosts in self.leaves.items() if host in hosts)

    def socket(self, switch: str) -> Path:
        return self.workdir / f"{switch}.sock"

    def exec_argv(self, name: str, *argv: str) -> list[str]:
        """argv that runs a command inside a lab namespace."""
        return ["ip", "netns", "exec", self.ns(name), *argv]

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self) -> None:
        self.down()
        for name in [*self.switches, *self.hosts]:
            sh("ip", "netns", "add", self.ns(name))
            sh("ip", "-n", self.ns(name), "link", "set", "lo", "up")
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{MGMT_GATEWAY}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i, leaf in enumerate(self.leaves):
            self._cable(leaf, "swp49", self.spine, f"swp{i + 1}")
            for j, host in enumerate(self.leaves[leaf]):
                self._cable(host, "fab0", leaf, f"swp{j + 1}")
                self._mgmt(host)
        for switch in self.switches:
            self._start_lldpd(switch)

    def _cable(self, a: str, a_port: str, b: str, b_port: str) -> None:
        tmp_a, tmp_b = (
            f"{PREFIX}t{os.getpid() % 1000}{a[-2:]}{b[-2:]}a",
            f"{PREFIX}t{os.getpid() % 1000}{a[-2:]}{b[-2:]}b",
        )
        sh("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
        for tmp, name, port in ((tmp_a, a, a_port), (tmp_b, b, b_port)):
            sh("ip", "link", "set", tmp, "netns", self.ns(name))
            sh("ip", "-n", self.ns(name), "link", "set", tmp, "name", port)
            sh("ip", "-n", self.ns(name), "link", "set", port, "up")

    def _mgmt(self, host: str) -> None:
        outside = f"{PREFIX}m-{host}"
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", f"{PREFIX}mi-{host}")
        sh("ip", "link", "set", f"{PREFIX}mi-{host}", "netns", self.ns(host))
        sh("ip", "-n", self.ns(host), "link", "set", f"{PREFIX}mi-{host}", "name", "mgmt0")
        sh("ip", "-n", self.ns(host), "addr", "add", f"{self.mgmt_ip(host)}/24", "dev", "mgmt0")
        sh("ip", "-n", self.ns(host), "link", "set", "mgmt0", "up")
        sh("ip", "link", "set", outside, "master", BRIDGE)
        sh("ip", "link", "set", outside, "up")

    def _start_lldpd(self, switch: str) -> None:
        lldpd = shutil.which("lldpd") or "/usr/sbin/lldpd"
        log = open(self.workdir / f"{switch}.lldpd.log", "wb")  # noqa: SIM115 - lives with the process
        argv = self.exec_argv(
            switch,
            lldpd,
            "-d",
            "-u",
            str(self.socket(switch)),
            "-p",
            str(self.workdir / f"{switch}.pid"),
            "-I",
            "swp*",
        )
        argv += ["-S", f"hypertopo lab switch {switch}", "-L", "/nonexistent"]
        self.lldpd.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 10
        while not self.socket(switch).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"lldpd for {switch} did not start: {(self.workdir / f'{switch}.lldpd.log').read_text()}"
                )
            time.sleep(0.05)
        for command in (
            ["configure", "system", "hostname", switch],
            ["configure", "lldp", "tx-interval", "1"],
            ["configure", "lldp", "tx-hold", "3"],
            ["configure", "lldp", "portidsubtype", "ifname"],
            ["configure", "system", "capabilities", "enabled", "bridge,router"],
            ["resume"],  # started with -L pointing nowhere, lldpd waits until configured
        ):
            self.lldpcli(switch, *command)

    def lldpcli(self, switch: str, *args: str) -> str:
        return sh("lldpcli", "-u", str(self.socket(switch)), *args).stdout

    def switch_neighbours_json(self, switch: str) -> str:
        """`lldpcli -f json0 show neighbors` as collected from the switch (the aggregator's input)."""
        return self.lldpcli(switch, "-f", "json0", "show", "neighbors", "details")

    def wait_switch_neighbours(self, switch: str, count: int, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.switch_neighbours_json(switch)
            seen = len((json.loads(text).get("lldp") or [{}])[0].get("interface", []) or [])
            if seen >= count or time.monotonic() > deadline:
                return text
            time.sleep(0.2)

    def set_host_link(self, host: str, up: bool) -> None:
        """Shuts (or reopens) the leaf port a host is cabled to, as a failed optic or a switch
        port taken down would: the host's fab0 stays administratively up and loses carrier."""
        leaf = self.leaf_of(host)
        port = f"swp{self.leaves[leaf].index(host) + 1}"
        sh("ip", "-n", self.ns(leaf), "link", "set", port, "up" if up else "down")

    def down(self) -> None:
        stop_processes(self.lldpd, timeout=5)
        self.lldpd.clear()
        existing = sh("ip", "netns", "list", check=False).stdout
        for line in existing.splitlines():
            name = line.split()[0] if line.strip() else ""
            if name.startswith(f"{PREFIX}-"):
                sh("ip", "netns", "del", name, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)
        # Management veths whose namespace end is still held by a stray process of a killed run.
        for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
            if name.startswith(f"{PREFIX}m-"):
                sh("ip", "link", "del", name, check=False)
