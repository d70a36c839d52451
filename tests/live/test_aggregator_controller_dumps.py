"""`hypertopo-aggregator run` takes `render`'s fabric options against a real API server: one
ibnetdiscover dump per rail, `--strip-domain` and `--dump-host-regex` to meet the Node names, and
`--fabric-interfaces` to name the fabric NICs; what cannot be placed (dump hosts matching no Node,
Nodes matching no dump host) is logged once, and again only when it changes.

The aggregators here act on every Node, NodeTopology and owned HyperNode they see, so the module
has a control plane of its own."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aggregator_controller_kit import (
    AggregatorProcess,
    apply_objects,
    live,
    private_plane,
    ready_of,
    same_tree,
    set_ready,
    wait_for,
)
from aggregator_fabric import ibnetdiscover_dump
from controlplane.harness import ControlPlane

from agent.cluster_model import ClusterModel, load_model
from agent.common.report import Interface, LldpNeighbour, NodeReport, node_topology_object
from agent.model_probe import report_for, switch_mac
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import ibnetdiscover
from aggregator.sources.ibnetdiscover import HostNames

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "models"
SMALL = load_model(str(MODELS / "small-tree.yaml"))  # node01..node08 under leaf1, leaf2, spine1
RAIL = load_model(str(MODELS / "rail-8.yaml"))  # su1-n1..su2-n4, one HCA per rail, a spine per rail
DOMAIN = "dc1.example.com"
CLEARED = "the earlier warnings no longer apply"
pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with private_plane() as cp:
        yield cp


RUNNING: list[subprocess.Popen[bytes]] = []


@pytest.fixture
def clean(plane: ControlPlane) -> Iterator[ControlPlane]:
    """The plane, emptied afterwards of Nodes, reports, HyperNodes and aggregators left running."""
    yield plane
    while RUNNING:
        proc = RUNNING.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    plane.kubectl("delete", "nodetopologies,nodes", "--all", "--wait=false")
    plane.kubectl("delete", "hypernodes", "--all", "--wait=false")


def add_nodes(plane: ControlPlane, names: list[str]) -> None:
    """Nodes (Ready, as a kubelet would report them), without labels."""
    items = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in names]
    apply_objects(plane, items)
    for name in names:
        set_ready(plane, "node", name)


class Aggregator(AggregatorProcess):
    """`hypertopo-aggregator run` (no lease, agent pods not tracked, no hold-down, a full rebuild
    every half second), logging to a file of its own."""

    def __init__(self, plane: ControlPlane, *extra: str, name: str):
        flags = ["--kubeconfig", str(plane.kubeconfig), "--no-leader-election", "--agent-selector", "",
                 "--hold-down", "0", "--debounce", "0.05", "--resync", "0.5", *extra]  # fmt: skip
        super().__init__(plane, flags, name=name, running=RUNNING)

    def cycles(self) -> float:
        return self.metrics().get("hypertopo_aggregator_reconcile_duration_seconds_count", 0)

    def wait_cycles(self, count: int) -> None:
        """Waits until `count` more reconciles have run (each a full rebuild, --resync 0.5)."""
        start = self.cycles()
        wait_for(lambda: self.cycles() >= start + count, timeout=30, what=f"{count} reconciles")

    def warnings(self) -> list[str]:
        return [
            line.split("inputs: ", 1)[1] for line in self.log.read_text().splitlines() if "inputs: " in line
        ]


def expected(
    names: list[str],
    *,
    reports: dict[str, NodeReport] | None = None,
    fabric: str | None = None,
    **inputs: Any,
) -> dict[str, dict[str, Any]]:
    """The tree the pipeline derives for these Nodes (Ready, no labels) and inputs."""
    desired = Pipeline().compute(
        ClusterInputs(
            reports=reports or {},
            node_ready=dict.fromkeys(names, True),
            node_labels={n: {} for n in names},
            fabric=ibnetdiscover.parse(fabric) if fabric is not None else None,
            **inputs,
        ),
        time.time(),
    )
    return {o["metadata"]["name"]: o for o in desired.hypernodes}


def summary(tree: dict[str, dict[str, Any]]) -> list[tuple[str, int]]:
    return sorted((o["spec"]["tierName"], o["status"]["nodeCount"]) for o in tree.values())


def node_members(tree: dict[str, dict[str, Any]]) -> set[str]:
    return {
        m["selector"]["exactMatch"]["name"]
        for o in tree.values()
        for m in o["spec"]["members"]
        if m["type"] == "Node"
    }


def fqdn(model: ClusterModel) -> list[str]:
    return [f"{n}.{DOMAIN}" for n in model.nodes()]


def small_dump(
    plane: ControlPlane, path: Path, describe: Callable[[str, int], str], host_names: HostNames
) -> dict[str, dict[str, Any]]:
    """SMALL's Nodes added, its dump written to `path` with each HCA described as describe(node,
    hca); returns the tree the pipeline derives from that dump with these host names."""
    add_nodes(plane, SMALL.nodes())
    path.write_text(ibnetdiscover_dump(SMALL, ca_description=describe))
    return expected(SMALL.nodes(), fabric=path.read_text(), host_names=host_names)


def builds_cleanly(agg: Aggregator, plane: ControlPlane, want: dict[str, dict[str, Any]], what: str, *,
                   cycles: int = 0) -> None:  # fmt: skip
    """The aggregator writes `want`, stays there through `cycles` more full rebuilds, logs no input
    warnings (every host met its Node) and exits 0 on SIGTERM."""
    wait_for(lambda: same_tree(plane, want), timeout=20, what=what)
    if cycles:
        agg.wait_cycles(cycles)
    assert agg.warnings() == []
    assert agg.stop() == 0


# --- dumps ---------------------------------------------------------------------------------------


def test_one_dump_per_rail_with_strip_domain_writes_the_tree_of_one_full_dump(
    clean: ControlPlane, tmp_path: Path
) -> None:
    """Fully qualified Node names, short hosts in the dumps, one dump per rail's subnet."""
    names = fqdn(RAIL)
    add_nodes(clean, names)
    rails = []
    for rail in range(1, 9):
        path = tmp_path / f"rail{rail}.topo"
        path.write_text(
            ibnetdiscover_dump(RAIL, only={f"rail{rail}-spine", f"su1-rail{rail}", f"su2-rail{rail}"})
        )
        rails.append(str(path))
    want = expected(names, fabric=ibnetdiscover_dump(RAIL), host_names=HostNames(domain="."))
    assert summary(want) == [("leaf", 4), ("leaf", 4), ("spine", 8)] and node_members(want) == set(names)
    agg = Aggregator(clean, "--ibnetdiscover", *rails, "--strip-domain", name="rails")
    builds_cleanly(agg, clean, want, "the tree of one full dump", cycles=3)


def test_strip_domain_takes_a_suffix(clean: ControlPlane, tmp_path: Path) -> None:
    """Short Node names, fully qualified hosts in the dump: only the given domain is dropped."""
    dump = tmp_path / "fabric.topo"
    want = small_dump(clean, dump, lambda n, h: f"{n}.{DOMAIN} mlx5_{h}", HostNames(domain=DOMAIN))
    assert summary(want) == [("leaf", 4), ("leaf", 4), ("spine", 8)] and node_members(want) == set(SMALL.nodes())
    agg = Aggregator(clean, "--ibnetdiscover", str(dump), "--strip-domain", DOMAIN, name="suffix")
    builds_cleanly(agg, clean, want, "the tree with the domain dropped")


def test_dump_host_regex_reads_the_host_out_of_any_description(clean: ControlPlane, tmp_path: Path) -> None:
    dump = tmp_path / "odd.topo"
    regex = r"of hpc-(?P<node>\S+)$"
    want = small_dump(clean, dump, lambda n, h: f"ConnectX-7 port {h} of hpc-{n}", HostNames(pattern=regex))
    assert summary(want) == [("leaf", 4), ("leaf", 4), ("spine", 8)]
    agg = Aggregator(clean, "--ibnetdiscover", str(dump), "--dump-host-regex", regex, name="regex")
    builds_cleanly(agg, clean, want, "the tree of hosts read by the regex")


# --- fabric NICs ---------------------------------------------------------------------------------


def without_rdma_with_management(report: NodeReport) -> NodeReport:
    """A report without RDMA devices (it cannot tell fabric from management NICs) whose management
    NIC eno1 hears its rack's management switch (two racks per scalable unit)."""
    unit, index = report.node_name.split("-n")
    rack = f"mgmt-{unit}-{'a' if int(index) <= 2 else 'b'}"
    nic = Interface(name="eno1", mac="02:00:00:00:01:01", oper_state="up", kind="physical")
    switch = LldpNeighbour(interface="eno1", chassis_id=switch_mac(rack), port_id="ge-0/0/7", ttl=120,
                           system_name=rack, capabilities=("Bridge", "Router"))  # fmt: skip
    return dataclasses.replace(
        report, rdma=(), interfaces=(*report.interfaces, nic), lldp=(*report.lldp, switch)
    )


def test_fabric_interfaces_keeps_a_management_switch_out_of_the_cabling(clean: ControlPlane) -> None:
    """Without the option every neighbour counts: half of each unit lacks the other rack's
    management switch and is an unhealthy member (Ready=False); with it the units are whole."""
    reports = {n: without_rdma_with_management(report_for(RAIL, n)) for n in RAIL.nodes()}
    names = sorted(reports)
    add_nodes(clean, names)
    apply_objects(clean, [node_topology_object(r) for r in reports.values()])
    guessed = expected(names, reports=reports)
    told = expected(names, reports=reports, fabric_interfaces=r"^ib\d+$")
    assert summary(told) == summary(guessed) == [("leaf", 4), ("leaf", 4)]  # LLDP alone: no spine
    assert {ready_of(o) for o in guessed.values()} == {"False"}
    assert {ready_of(o) for o in told.values()} == {"True"}

    agg = Aggregator(clean, name="all-nics")
    wait_for(lambda: same_tree(clean, guessed), timeout=20, what="units with management cabling missing")
    assert agg.stop() == 0
    agg = Aggregator(clean, "--fabric-interfaces", r"^ib\d+$", name="fabric-nics")
    wait_for(lambda: same_tree(clean, told), timeout=20, what="whole units")
    agg.wait_cycles(3)  # and they stay whole through full rebuilds (--resync 0.5)
    assert same_tree(clean, told)
    assert agg.stop() == 0


# --- warnings ------------------------------------------------------------------------------------


def test_warnings_are_logged_once_and_again_when_they_change(clean: ControlPlane, tmp_path: Path) -> None:
    """Fully qualified Node names and short dump hosts, without --strip-domain: nothing is placed,
    and the log says so once (not on each of many reconciles, each a full rebuild), then again
    when a Node joins and the counts change; when the Nodes come back under names the dump knows,
    the tree is written and the log says the warnings no longer apply."""
    names = fqdn(SMALL)
    add_nodes(clean, names)
    dump = tmp_path / "fabric.topo"
    dump.write_text(ibnetdiscover_dump(SMALL))
    agg = Aggregator(clean, "--ibnetdiscover", str(dump), name="warnings")
    first = [
        "ibnetdiscover: 8 of 8 hosts in the fabric dump match no node (e.g. node01, node02, node03; nodes are "
        f"named like node01.{DOMAIN}, node02.{DOMAIN}): see --strip-domain and --dump-host-regex",
        f"ibnetdiscover: 8 of 8 nodes match no host in the fabric dump (e.g. node01.{DOMAIN}, "
        f"node02.{DOMAIN}, node03.{DOMAIN})",
    ]
    wait_for(lambda: agg.warnings() == first, timeout=20, what="the warnings logged")
    agg.wait_cycles(6)
    assert agg.warnings() == first  # still once
    assert live(clean) == {}

    add_nodes(clean, [f"gpu-a.{DOMAIN}"])
    again = [
        "ibnetdiscover: 8 of 8 hosts in the fabric dump match no node (e.g. node01, node02, node03; nodes are "
        f"named like gpu-a.{DOMAIN}, node01.{DOMAIN}): see --strip-domain and --dump-host-regex",
        f"ibnetdiscover: 9 of 9 nodes match no host in the fabric dump (e.g. gpu-a.{DOMAIN}, "
        f"node01.{DOMAIN}, node02.{DOMAIN})",
    ]
    wait_for(lambda: agg.warnings() == first + again, timeout=20, what="the changed warnings logged")
    agg.wait_cycles(6)
    assert agg.warnings() == first + again

    clean.kubectl("delete", "nodes", "--all")  # the Nodes come back under their short names
    add_nodes(clean, SMALL.nodes())
    want = expected(SMALL.nodes(), fabric=dump.read_text())
    wait_for(lambda: same_tree(clean, want), timeout=20, what="the tree once the names match")
    wait_for(lambda: agg.warnings()[-1] == CLEARED, timeout=10, what="the warnings cleared")
    logged = agg.warnings()
    agg.wait_cycles(6)
    assert agg.warnings() == logged
    assert agg.stop() == 0
