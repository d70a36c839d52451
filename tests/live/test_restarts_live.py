"""Restarts lose nothing, end to end: real `hypertopo-agent run` processes in network namespaces
cabled to switches running real lldpd (tests/lab/fabric_net.py), a real API server, real
`hypertopo-aggregator run` processes. A rolling restart of every agent, a kill -9 of an agent, an
aggregator failover and an API server restart each leave every HyperNode in place: no DELETED watch
event, the same UIDs, no node out of its leaf at any event, and no NodeTopology ever published
without its neighbours.

The switches speak LLDP every 5 s, longer than an agent takes to restart, so a restarted agent has
heard no frame when it first reports: what it publishes then is the carried-over report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aggregator_controller_kit import AggregatorProcess, set_ready
from controlplane.harness import ControlPlane, running
from realparts import http_get, require_binary, require_root, stop_processes, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lab"))

from fabric_net import MGMT_GATEWAY, FabricNet

from agent.common.adapters.informer import Informer
from aggregator.adapters.kube import HYPERNODES, NODETOPOLOGIES, KubeClient, connect

pytestmark = [pytest.mark.netns, pytest.mark.apiserver]
REPO = Path(__file__).resolve().parents[2]
NS = "hypertopo-system"
TX_INTERVAL = "5"  # seconds between LLDP frames of the lab's switches (TTL 16 s with tx-hold 3)
LEASE = ("--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5")
Obj = dict[str, Any]


def members(hn: Obj) -> set[str]:
    return {m["selector"]["exactMatch"]["name"] for m in hn["spec"].get("members") or []}


class Lab:
    """The fabric, the API server, one agent per host (restartable), the aggregators."""

    def __init__(self, plane: ControlPlane, net: FabricNet) -> None:
        self.plane, self.net = plane, net
        self.node_of = {host: f"rs-{host}" for host in net.hosts}
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {}
        self.aggregators: dict[str, AggregatorProcess] = {}
        self.tables: list[str] = []

    # -- agents -----------------------------------------------------------------------------------
    def start_agent(self, host: str) -> None:
        kubeconfig = self.plane.kubeconfig_for(
            "hypertopo-test-admin-token", f"agent-{host}", server=f"https://{MGMT_GATEWAY}:{self.plane.port}"
        )
        argv = self.net.exec_argv(
            host, sys.executable, "-m", "agent", "run", f"--node-name={self.node_of[host]}",
            f"--kubeconfig={kubeconfig}", "--interfaces=^fab", "--nvml=off",
            f"--listen={self.net.mgmt_ip(host)}:9730", "--interval=2",
        )  # fmt: skip
        with open(self.agent_log(host), "ab") as log:
            self.agents[host] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                 env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
        self.starts[host] = self.starts.get(host, 0) + 1

    def stop_agent(self, host: str, sig: int = signal.SIGTERM) -> None:
        proc = self.agents[host]
        proc.send_signal(sig)
        proc.wait(timeout=30)

    def agent_log(self, host: str) -> Path:
        return self.net.workdir / f"agent-{host}.log"

    def carried(self, host: str) -> int:
        """How many starts of this agent carried its previous report over (its log says so)."""
        return self.agent_log(host).read_text(errors="replace").count("from the previous run's report")

    def agent_cycles(self, host: str) -> float:
        try:
            url = f"http://{self.net.mgmt_ip(host)}:9730/metrics"
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return 0.0
        line = next((x for x in text.splitlines() if x.startswith("hypertopo_probe_cycles_total ")), "")
        return float(line.split()[1]) if line else 0.0

    def restarted_agent_settled(self, host: str) -> bool:
        """A restarted agent carried its report over and has probed a few times since."""
        return (self.agents[host].poll() is None and self.carried(host) == self.starts[host] - 1
                and self.agent_cycles(host) >= 3)  # fmt: skip

    # -- aggregators ------------------------------------------------------------------------------
    def start_aggregator(self, name: str) -> AggregatorProcess:
        flags = ["--kubeconfig", str(self.plane.kubeconfig), "--namespace", NS, "--identity", name,
                 "--agent-selector=", "--hold-down", "1", "--debounce", "0.05", *LEASE,
                 "--switch-lldp", *self.tables]  # fmt: skip
        self.aggregators[name] = AggregatorProcess(self.plane, flags, name=name)
        return self.aggregators[name]

    def leader(self) -> AggregatorProcess | None:
        return next((a for a in self.aggregators.values()
                     if a.metrics().get("hypertopo_aggregator_is_leader") == 1), None)  # fmt: skip

    # -- the tree ---------------------------------------------------------------------------------------
    def hypernodes(self) -> dict[str, Obj]:
        items = json.loads(self.plane.kubectl("get", "hypernodes", "-o", "json").stdout)["items"]
        return {o["metadata"]["name"]: o for o in items}

    def tree(self) -> dict[str, tuple[str, frozenset[str]]] | None:
        """HyperNode -> (UID, members), once two leaves of two nodes each sit under one spine."""
        hns = self.hypernodes()
        leaves = [o for o in hns.values() if o["spec"].get("tierName") == "leaf"]
        spines = [o for o in hns.values() if o["spec"].get("tierName") == "spine"]
        if len(leaves) != 2 or len(spines) != 1 or any(len(members(o)) != 2 for o in leaves):
            return None
        if members(spines[0]) != {o["metadata"]["name"] for o in leaves}:
            return None
        return {n: (o["metadata"]["uid"], frozenset(members(o))) for n, o in hns.items()}


class Watch:
    """Every HyperNode and NodeTopology event (and every object of a re-list) from informers of
    their own, as a consumer of the API would see them."""

    def __init__(self, kube: KubeClient) -> None:
        self.events: list[tuple[str, str, Obj]] = []
        self._lock = threading.Lock()
        self.informers = [Informer(kube, HYPERNODES, on_event=self._recorder("hn")),
                          Informer(kube, NODETOPOLOGIES, on_event=self._recorder("nt"))]  # fmt: skip

    def _recorder(self, kind: str) -> Any:
        def record(event: str, payload: Any) -> None:
            with self._lock:
                for obj in payload if event in ("SYNC", "ABSENT") else [payload]:
                    self.events.append((kind, event, obj))

        return record

    def __enter__(self) -> Watch:
        for informer in self.informers:
            informer.start()
        wait_for(lambda: all(i.synced.is_set() for i in self.informers), timeout=20, what="the watch")
        return self

    def __exit__(self, *_: object) -> None:
        for informer in self.informers:
            informer.stop()

    def check(self, tree: dict[str, tuple[str, frozenset[str]]]) -> int:
        """Asserts nothing was lost at any event; returns how many HyperNode events were seen."""
        with self._lock:
            events = list(self.events)
        hn = [(event, obj) for kind, event, obj in events if kind == "hn"]
        deleted = [obj["metadata"]["name"] for event, obj in hn if event == "DELETED"]
        assert deleted == [], f"HyperNodes deleted: {deleted}"
        for event, obj in hn:
            name = obj["metadata"]["name"]
            assert name in tree, f"a HyperNode {name} appeared ({event})"
            uid, want = tree[name]
            assert obj["metadata"]["uid"] == uid, f"HyperNode {name} re-created ({event})"
            assert members(obj) == want, f"HyperNode {name} members {sorted(members(obj))} at a {event} event"
        empty = [obj["metadata"]["name"] for kind, _, obj in events
                 if kind == "nt" and not (obj.get("spec") or {}).get("lldp")]  # fmt: skip
        assert empty == [], f"NodeTopology published without neighbours: {empty}"
        return len(hn)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    require_root()
    require_binary("lldpd")
    require_binary("lldpcli")
    net = FabricNet()
    try:
        net.up()
        for switch in net.switches:
            net.lldpcli(switch, "configure", "lldp", "tx-interval", TX_INTERVAL)
        with running(bind_address="0.0.0.0") as plane:
            plane.kubectl("create", "namespace", NS)
            the_lab = Lab(plane, net)
            try:
                _bring_up(the_lab)
                yield the_lab
            finally:
                stop_processes(the_lab.agents.values(), timeout=10)
                for aggregator in the_lab.aggregators.values():
                    aggregator.stop()
    finally:
        net.down()


def _bring_up(lab: Lab) -> None:
    for host, node in lab.node_of.items():
        lab.plane.kubectl("create", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))  # fmt: skip
        set_ready(lab.plane, "node", node)
        lab.start_agent(host)
    for switch, count in [(lab.net.spine, len(lab.net.leaves)), *[(leaf, 1) for leaf in lab.net.leaves]]:
        path = lab.net.workdir / f"{switch}.lldp.json"
        path.write_text(lab.net.wait_switch_neighbours(switch, count))
        lab.tables.append(str(path))
    lab.start_aggregator("agg-a")
    wait_for(lab.tree, timeout=60, interval=0.2, what="two leaves of two nodes under a spine")
    wait_for(lambda: lab.leader() is not None, timeout=20, what="a leading aggregator")


@pytest.fixture
def kube(lab: Lab) -> KubeClient:
    return connect(str(lab.plane.kubeconfig))


def settled(lab: Lab, hosts: list[str], tree: dict[str, tuple[str, frozenset[str]]]) -> None:
    for host in hosts:
        wait_for(lambda h=host: lab.restarted_agent_settled(h), timeout=60, interval=0.2,  # type: ignore[misc]
                 what=f"agent {host} restarted with its report carried over")  # fmt: skip
    leader = wait_for(lab.leader, timeout=30, what="a leading aggregator")
    assert lab.tree() == tree
    # the agents carried their reports over, so the aggregator never had to hold one
    assert leader.metrics()["hypertopo_aggregator_structure_held_nodes"] == 0


def test_a_rolling_restart_of_every_agent_deletes_no_hypernode(lab: Lab, kube: KubeClient) -> None:
    tree = wait_for(lab.tree, timeout=30, what="the tree")
    with Watch(kube) as watch:
        for host in lab.net.hosts:  # a DaemonSet rollout, one node at a time
            lab.stop_agent(host)
            lab.start_agent(host)
            settled(lab, [host], tree)
        settled(lab, lab.net.hosts, tree)
        seen = watch.check(tree)
    print(f"rolling restart of {len(lab.net.hosts)} agents: {seen} HyperNode events, none a deletion")


def test_a_killed_agent_comes_back_with_its_report(lab: Lab, kube: KubeClient) -> None:
    tree = wait_for(lab.tree, timeout=30, what="the tree")
    host = lab.net.hosts[0]
    with Watch(kube) as watch:
        lab.stop_agent(host, signal.SIGKILL)
        lab.start_agent(host)
        settled(lab, [host], tree)
        watch.check(tree)


def test_an_aggregator_failover_deletes_no_hypernode(lab: Lab, kube: KubeClient) -> None:
    """The standby takes over after the leader's kill -9, while an agent restarts meanwhile."""
    tree = wait_for(lab.tree, timeout=30, what="the tree")
    leader = lab.leader()
    assert leader is not None
    standby = lab.start_aggregator("agg-b")
    wait_for(lambda: http_get(f"http://127.0.0.1:{standby.port}/readyz")[0] == 200, timeout=30,
             what="the standby synced")  # fmt: skip
    host = lab.net.hosts[1]
    with Watch(kube) as watch:
        leader.proc.kill()
        leader.proc.wait(10)
        del lab.aggregators[next(n for n, a in lab.aggregators.items() if a is leader)]
        lab.stop_agent(host)
        lab.start_agent(host)
        wait_for(lambda: lab.leader() is standby, timeout=20, interval=0.1, what="the standby to lead")
        settled(lab, [host], tree)
        watch.check(tree)


def restart_api_server(plane: ControlPlane, while_down: Any) -> None:
    """Kills kube-apiserver (etcd keeps running; a graceful stop drains watches for a minute),
    runs `while_down()`, and starts it again as before."""
    index = next(i for i, p in enumerate(plane.processes) if "kube-apiserver" in str(p.args[0]))
    old = plane.processes[index]
    old.kill()
    old.wait(timeout=30)
    while_down()
    with open(plane.workdir / "kube-apiserver.log", "ab") as log:
        plane.processes[index] = subprocess.Popen(old.args, stdout=log, stderr=subprocess.STDOUT)
    plane._wait_ready(timeout=90)


def test_an_api_server_restart_deletes_no_hypernode(lab: Lab, kube: KubeClient) -> None:
    """An agent restarted while the API server is down carries its report over once it is back."""
    tree = wait_for(lab.tree, timeout=30, what="the tree")
    host = lab.net.hosts[2]
    with Watch(kube) as watch:

        def restart_agent() -> None:
            lab.stop_agent(host)
            lab.start_agent(host)

        restart_api_server(lab.plane, restart_agent)
        settled(lab, [host], tree)
        watch.check(tree)
