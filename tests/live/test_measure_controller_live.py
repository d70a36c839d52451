"""A whole `hypertopo-aggregator run --measured-fabric` against a real API server: it publishes
each measuring node's probe-plan row in that node's NodeTopology status (the plan over the live
HyperNodes, which the real CRD schema accepts); the round trips the nodes then report (written
here as their agents would, peers taken from the published rows) become HyperNode annotations
and metrics; a node slow towards its leaf makes its leaf FabricDegraded (LatencyDegraded, the pair
and numbers in the message) with Ready untouched, and healing clears it; and with
--measured-leaves and no cabling source at all, nodes get leaf HyperNodes from latency alone,
which stay once the plan follows them."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aggregator_controller_kit import apply_objects, live, private_plane, ready_with_agents, scrape, wait_for
from controlplane.harness import ControlPlane
from realparts import free_port

from agent.cluster_model import load_model
from agent.common.measure_rows import from_wire, rows
from agent.common.report import ComponentHealth, Health, Measurement, NodeReport, node_topology_object
from agent.measure_plan import domains_from_hypernodes
from agent.model_probe import report_for
from aggregator.sources.measured import INSIDE, SIBLING

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tests" / "models" / "small-tree.yaml"
pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with private_plane() as cp:
        yield cp


def published_rows(plane: ControlPlane) -> dict[str, Any]:
    items = json.loads(plane.kubectl("get", "nodetopologies", "-o", "json").stdout)["items"]
    return {o["metadata"]["name"]: from_wire((o.get("status") or {}).get("probePlan")) for o in items}


def measure(reports: dict[str, NodeReport], table: dict[str, Any], rtt: Callable[[str, str], int],
            rate: Callable[[str, str], int | None] = lambda a, b: None) -> list[Any]:
    """Each node's report with round trips (and train rates) to the peers of its published row, as
    its agent would."""
    def m(a: str, peer: str) -> Measurement:
        us = rtt(a, peer)
        return Measurement(peer, us, us + us // 10, 0.0, 20, "2026-11-25T21:00:00Z", bandwidth_mbps=rate(a, peer))

    return [node_topology_object(dataclasses.replace(r, measurements=tuple(m(n, p) for p, _ in table[n].peers)))
            for n, r in reports.items()]  # fmt: skip


@contextmanager
def aggregator(plane: ControlPlane, *flags: str) -> Iterator[int]:
    port = free_port()
    log = plane.workdir / f"aggregator-measured-{port}.log"
    argv = [sys.executable, "-m", "aggregator", "run", "--kubeconfig", str(plane.kubeconfig), "--no-leader-election",
            "--listen", f"127.0.0.1:{port}", "--hold-down", "1", "--debounce", "0.05", "--measured-fabric",
            "--measured-period", "0.5", *flags]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
        plane.kubectl("delete", "nodetopologies,nodes,hypernodes", "--all", "--wait=false")
        plane.kubectl("delete", "pods", "--all", "-n", "hypertopo-system", "--grace-period=0", "--force")


def start(plane: ControlPlane, names: list[str], report_of: Callable[[str], NodeReport]) -> dict[str, NodeReport]:
    """Ready Nodes, Ready agent pods, and measuring reports (a probe address each)."""
    reports = {n: dataclasses.replace(report_of(n), probe_address=f"127.0.1.{i}") for i, n in enumerate(names, 1)}
    ready_with_agents(plane, [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in names], reports)
    return reports


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def planned_over_live_tree(plane: ControlPlane, reports: dict[str, NodeReport]) -> dict[str, Any] | None:
    """The published rows, once they are the plan over the live HyperNodes (None before)."""
    want = rows(domains_from_hypernodes(live(plane).values()), {n: r.probe_address for n, r in reports.items()})
    have = published_rows(plane)
    return have if have == want and all(have.values()) else None


def test_measurements_annotate_hypernodes_and_a_slow_node_degrades_its_leaf(plane: ControlPlane) -> None:
    model = load_model(str(MODEL))
    names = sorted({n for block in model.blocks for n in block.nodes})
    reports = start(plane, names, lambda n: report_for(model, n))
    leaf_of = {n: "leaf-leaf1" if n <= "node04" else "leaf-leaf2" for n in names}

    def healthy(a: str, b: str) -> int:
        return 10 if leaf_of[a] == leaf_of[b] else 100

    with aggregator(plane, "--model", str(MODEL)) as port:
        table = wait_for(lambda: len(live(plane)) == 3 and planned_over_live_tree(plane, reports), timeout=30,
                         what="every node's probe plan in its NodeTopology status")  # fmt: skip
        assert all(len(row.peers) == 4 and row.probers for row in table.values()), table  # 3 in its leaf, 1 across

        apply_objects(plane, measure(reports, table, healthy))
        annotated = lambda: {k: v for k, v in live(plane)["leaf-leaf1"]["metadata"].get("annotations", {}).items()  # noqa: E731
                             if k in (INSIDE, SIBLING)}  # fmt: skip
        spine = lambda: live(plane)["spine-spine1"]["metadata"].get("annotations", {}).get(INSIDE)  # noqa: E731
        wait_for(lambda: annotated() == {INSIDE: "10", SIBLING: "100"} and spine() == "100", timeout=20,
                 what="the measured annotations")  # one reconcile writes them, one HyperNode after another
        tree = subprocess.run([sys.executable, "-m", "aggregator", "tree", "--kubeconfig", str(plane.kubeconfig),
                               "--color", "never"], capture_output=True, text=True, cwd=REPO, check=True).stdout  # fmt: skip
        assert "leaf leaf-leaf1  4 nodes  Ready  p50 10 us inside, 100 us to siblings" in tree, tree
        samples = scrape(port)
        assert samples['hypertopo_measured_hypernode_p50_seconds{hypernode="leaf-leaf2",scope="inside"}'] == 1e-5
        assert samples['hypertopo_measured_tier_p50_seconds{tier="2"}'] == 1e-4
        assert samples['hypertopo_measured_leaf_disagreements'] == 0
        before = conditions(live(plane)["leaf-leaf1"])
        assert before["FabricDegraded"]["status"] == "False" and before["Ready"]["status"] == "True"

        slow = lambda a, b: healthy(a, b) + (200 if "node02" in (a, b) else 0)  # noqa: E731
        apply_objects(plane, measure(reports, table, slow))
        wait_for(lambda: conditions(live(plane)["leaf-leaf1"])["FabricDegraded"]["status"] == "True", timeout=20,
                 what="FabricDegraded=True from the measurements")  # fmt: skip
        degraded = conditions(live(plane)["leaf-leaf1"])["FabricDegraded"]
        print("FabricDegraded:", json.dumps(degraded))
        assert degraded["reason"] == "LatencyDegraded"
        assert degraded["message"].startswith("1 of 4 nodes degraded (tolerates 0% of nodes): node02: ")
        assert "p50 210 us, like tier 2 (" in degraded["message"] and "rather than the leaf tier (10 us)" in degraded["message"]
        assert conditions(live(plane)["leaf-leaf1"])["Ready"] == before["Ready"]
        assert conditions(live(plane)["leaf-leaf2"])["FabricDegraded"]["status"] == "False"
        assert scrape(port)['hypertopo_measured_findings{kind="slow-in-leaf"}'] >= 1

        apply_objects(plane, measure(reports, table, healthy))
        wait_for(lambda: conditions(live(plane)["leaf-leaf1"])["FabricDegraded"]["status"] == "False", timeout=20,
                 what="FabricDegraded=False once healed")  # fmt: skip

        # bandwidth trains: leaf2's go up at 10 Mbit/s, everything else at 400
        slow_up = lambda a, b: 10 if leaf_of[a] == "leaf-leaf2" and leaf_of[b] == "leaf-leaf1" else 400  # noqa: E731
        apply_objects(plane, measure(reports, table, healthy, slow_up))
        wait_for(lambda: conditions(live(plane)["leaf-leaf2"])["FabricDegraded"]["status"] == "True", timeout=20,
                 what="FabricDegraded=True on leaf2 from its trains")  # fmt: skip
        degraded = conditions(live(plane)["leaf-leaf2"])["FabricDegraded"]
        assert degraded["reason"] == "BandwidthDegraded", degraded
        assert degraded["message"].startswith("4 of 4 nodes degraded (tolerates 0% of nodes): node05: leaf-leaf2: "
                                              "bandwidth trains from it to its siblings at 10 Mbit/s, theirs at 400 Mbit/s")
        assert conditions(live(plane)["leaf-leaf1"])["FabricDegraded"]["status"] == "False"
        assert scrape(port)['hypertopo_measured_findings{kind="slow-uplink"}'] == 4


def test_without_cabling_nodes_get_leaves_from_latency_alone(plane: ControlPlane) -> None:
    names = [f"x{i}" for i in range(1, 7)]
    truth = {n: "a" if n <= "x3" else "b" for n in names}  # two leaves nobody told the aggregator about
    reports = start(plane, names, lambda n: NodeReport(n, {"host": ComponentHealth(Health.OK)}))

    def rtt(a: str, b: str) -> int:
        return 12 if truth[a] == truth[b] else 150

    with aggregator(plane, "--measured-leaves"):
        table = wait_for(lambda: planned_over_live_tree(plane, reports), timeout=30,
                         what="probe plans for uncabled nodes (one pseudo-leaf)")  # fmt: skip
        assert live(plane) == {} and all(len(row.peers) == 3 for row in table.values())
        apply_objects(plane, measure(reports, table, rtt))

        def leaves() -> set[frozenset[str]] | None:
            found = {frozenset(m["selector"]["exactMatch"]["name"] for m in o["spec"]["members"])
                     for o in live(plane).values() if o["spec"]["tier"] == 1}  # fmt: skip
            return found if found else None

        expected = {frozenset(n for n in names if truth[n] == side) for side in "ab"}
        assert wait_for(lambda: leaves() == expected and leaves(), timeout=30, what="measured leaves") == expected
        assert {o["spec"]["tier"] for o in live(plane).values()} == {1, 2}  # and one domain above them
        # the plan follows the new tree (inside each measured leaf, one probe across); the leaves stay
        table = wait_for(lambda: planned_over_live_tree(plane, reports), timeout=30, what="the plan over the leaves")
        apply_objects(plane, measure(reports, table, rtt))
        wait_for(lambda: all(r.tree == next(iter(table.values())).tree for r in published_rows(plane).values()),
                 timeout=10, what="rows settled")  # fmt: skip
        time.sleep(2.0)  # four fold periods on the new measurements
        assert leaves() == expected
