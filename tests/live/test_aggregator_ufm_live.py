"""`hypertopo-aggregator run --ufm-url` against a real API server and a UFM stand-in on loopback:
it writes the HyperNodes an ibnetdiscover dump of the same fabric gives; a port down that only UFM
sees (the switch side of a cable) turns the HyperNodes above that node Ready=False; UFM answering
500 keeps the tree, marks the source stale in /metrics and says so in the log; and an aggregator
that never heard from UFM writes nothing (and is not ready) until UFM answers.

The aggregators here act on every Node, NodeTopology and owned HyperNode they see, so the module
has a control plane of its own."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aggregator_controller_kit import (
    AggregatorProcess,
    live,
    private_plane,
    ready_of,
    same_tree,
    wait_for,
)
from aggregator_fabric import ibnetdiscover_dump
from controlplane.harness import ControlPlane
from ufm_standin import Fault, UfmStandIn, listings

from agent.cluster_model import load_model
from agent.common.report import node_topology_object
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import ibnetdiscover

REPO = Path(__file__).resolve().parents[2]
RAIL = load_model(str(REPO / "tests" / "models" / "rail-8.yaml"))  # su1-n1..su2-n4, 8 rails, a spine per rail
STALE = 'hypertopo_source_stale{source="ufm"}'
pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with private_plane() as cp:
        yield cp


@pytest.fixture
def cluster(plane: ControlPlane) -> Iterator[ControlPlane]:
    """RAIL's Nodes (Ready) with their agents' reports; emptied afterwards."""
    names = RAIL.nodes()
    objs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in names]
    objs += [node_topology_object(report_for(RAIL, n)) for n in names]
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    plane.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=doc)
    cond = {"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z", "reason": "Up"}
    for name in names:
        plane.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": {"conditions": [cond]}}))  # fmt: skip
    yield plane
    plane.kubectl("delete", "nodetopologies,nodes,hypernodes", "--all", "--wait=false")


@pytest.fixture
def ufm(tmp_path: Path) -> Iterator[tuple[UfmStandIn, Path]]:
    secret = tmp_path / "ufm-secret"  # as a mounted Secret: one file per key
    secret.mkdir()
    (secret / "username").write_text("hypertopo\n")
    (secret / "password").write_text("fabric-reader\n")
    with UfmStandIn(listings(RAIL), username="hypertopo", password="fabric-reader") as server:
        yield server, secret


class Aggregator(AggregatorProcess):
    """`hypertopo-aggregator run --ufm-url ...` (no lease, agent pods not tracked, no hold-down)."""

    def __init__(self, plane: ControlPlane, ufm: UfmStandIn, secret: Path):
        flags = ["--kubeconfig", str(plane.kubeconfig), "--no-leader-election", "--agent-selector", "",
                 "--hold-down", "0", "--debounce", "0.05", "--resync", "5",
                 "--ufm-url", ufm.url, "--ufm-credentials", str(secret), "--ufm-interval", "0.3",
                 "--ufm-timeout", "10"]  # fmt: skip
        super().__init__(plane, flags, name="ufm")

    def wait(self, condition: Any, what: str) -> None:
        """wait_for, with the aggregator's log in the failure."""
        try:
            wait_for(condition, timeout=30, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- aggregator log ---\n{self.log.read_text()[-4000:]}") from None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def readyz(self) -> tuple[int, str]:
        """/readyz's status and body."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()


@pytest.fixture
def started() -> Iterator[list[Aggregator]]:
    running: list[Aggregator] = []
    yield running
    for agg in running:
        agg.stop()


def expected_from_dump() -> dict[str, dict[str, Any]]:
    names = RAIL.nodes()
    desired = Pipeline().compute(
        ClusterInputs(reports={n: report_for(RAIL, n) for n in names}, node_ready=dict.fromkeys(names, True),
                      node_labels={n: {} for n in names}, fabric=ibnetdiscover.parse(ibnetdiscover_dump(RAIL))),
        time.time(),
    )  # fmt: skip
    return {o["metadata"]["name"]: o for o in desired.hypernodes}


def holding(node: str, tree: dict[str, dict[str, Any]]) -> set[str]:
    """HyperNodes whose node members include `node` directly or below."""
    members = {n: {m["selector"]["exactMatch"]["name"] for m in o["spec"]["members"]} for n, o in tree.items()}
    found = {n for n, ms in members.items() if node in ms}
    while True:
        more = {n for n, ms in members.items() if ms & found} - found
        if not more:
            return found
        found |= more


def test_run_with_ufm_writes_the_dumps_tree_and_a_ufm_only_port_down_turns_ready_false(
    cluster: ControlPlane, ufm: tuple[UfmStandIn, Path], started: list[Aggregator]
) -> None:
    server, secret = ufm
    want = expected_from_dump()
    assert {o["spec"]["tierName"] for o in want.values()} == {"leaf", "spine"}
    agg = Aggregator(cluster, server, secret)
    started.append(agg)
    agg.wait(lambda: same_tree(cluster, want), "the tree of the dump, from UFM")
    assert agg.metrics().get(STALE) == 0 and agg.ready()
    assert all(auth.startswith("Basic ") for _, auth in server.requests)

    # the switch side of su2-n3's rail-6 cable goes down; its agent reports nothing wrong
    server.set(listings(RAIL, faults={("su2-n3", 5): Fault("down", "switch")}))
    hit = holding("su2-n3", want)
    assert hit and hit != set(want)
    agg.wait(lambda: {n for n, o in live(cluster).items() if ready_of(o) == "False"} == hit,
             "Ready=False on the HyperNodes above su2-n3")  # fmt: skip
    message = next(c["message"] for c in live(cluster)[sorted(hit)[0]]["status"]["conditions"] if c["type"] == "Ready")
    assert "su2-n3: RDMA su2-n3 mlx5_5 port 1 down (UFM: " in message

    # UFM fails: the tree (with its fault) stays, the source is stale, the log says why
    server.behaviour.fail = "500"
    agg.wait(lambda: agg.metrics().get(STALE) == 1, "the UFM source marked stale")
    time.sleep(1.0)  # several failed polls and reconciles
    assert live(cluster).keys() == want.keys()
    assert {n for n, o in live(cluster).items() if ready_of(o) == "False"} == hit
    log = agg.log.read_text()
    assert "UFM poll failed (http, 1 in a row): GET http" in log and "HTTP 500" in log
    assert "keeping the last good fabric facts" in log
    status, body = agg.readyz()  # still serving the last good facts, and says they are stale
    assert status == 200 and body.startswith("ok; ufm stale: ") and "HTTP 500" in body, body

    # UFM answers again, the cable is back: all Ready
    server.behaviour.fail = None
    server.set(listings(RAIL))
    agg.wait(lambda: {ready_of(o) for o in live(cluster).values()} == {"True"}, "all Ready again")
    assert agg.metrics().get(STALE) == 0
    assert agg.readyz() == (200, "ok\n")
    assert "UFM answers again after" in agg.log.read_text()
    assert agg.stop() == 0


def test_run_writes_nothing_until_ufm_first_answers(
    cluster: ControlPlane, ufm: tuple[UfmStandIn, Path], started: list[Aggregator]
) -> None:
    """A tree built without UFM would lack every spine UFM's cabling gives: not written."""
    server, secret = ufm
    server.behaviour.fail = "401"
    agg = Aggregator(cluster, server, secret)
    started.append(agg)
    agg.wait(lambda: agg.metrics().get('hypertopo_source_errors_total{kind="auth",source="ufm"}', 0) >= 3,
             "three refused polls")  # fmt: skip
    assert live(cluster) == {} and not agg.ready()
    assert "UFM poll failed (auth, 1 in a row): GET http" in agg.log.read_text()
    assert "401 credentials refused: check the UFM Secret; no fabric facts from UFM yet" in agg.log.read_text()
    server.behaviour.fail = None
    agg.wait(lambda: same_tree(cluster, expected_from_dump()), "the tree once UFM answered")
    assert agg.ready()
    assert agg.stop() == 0
