"""Whole `hypertopo-aggregator run` processes against a real API server: the tree appears, a restart
writes nothing, NVLink failures reach Ready within seconds, only the leader writes and a successor
takes over after kill -9, node labels and the taint come and go, an API outage is survived, a
deleted Node leaves its HyperNode and its report is collected, and a real Prometheus scraping two
replicas counts every HyperNode once.

These run aggregators that act on every NodeTopology and owned HyperNode they see, so they get a
control plane of their own (module scope) instead of the session's shared one."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aggregator_controller_kit import (
    AggregatorProcess,
    Proxy,
    apply_objects,
    live,
    private_plane,
    prometheus_query,
    prometheus_scraping,
    ready_of,
    ready_with_agents,
    same_tree,
    wait_for,
    writes_of,
)
from controlplane.harness import ControlPlane

from agent.cluster_model import load_model
from agent.common.report import ComponentHealth, Health, NodeReport, node_topology_object
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Pipeline

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tests" / "models" / "small-tree.yaml"
RULES = REPO / "daemonset" / "monitoring" / "prometheusrule.yaml"
LEASE = ("--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5")
pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with private_plane() as cp:
        yield cp


def nodes_of_model() -> list[str]:
    model = load_model(str(MODEL))
    return sorted({n for block in model.blocks for n in block.nodes})


def failed(report: NodeReport) -> NodeReport:
    health = {**report.health, "nvml": ComponentHealth(Health.FAILED, "GPU 0 NVLink 3 down")}
    return dataclasses.replace(report, health=health)


@pytest.fixture
def cluster(plane: ControlPlane) -> Iterator[dict[str, NodeReport]]:
    """The small-tree model's 8 nodes: Node (Ready, a foreign label and taint), NodeTopology from the
    model probe, and a Ready agent pod on each. Everything is removed afterwards."""
    model = load_model(str(MODEL))
    reports = {n: report_for(model, n) for n in nodes_of_model()}
    nodes = [{"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": n, "labels": {"team": "ml"}},
              "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}} for n in reports]
    ready_with_agents(plane, nodes, reports)
    yield reports
    plane.kubectl("delete", "nodetopologies,nodes", "--all", "--wait=false")
    plane.kubectl("delete", "pods", "--all", "-n", "hypertopo-system", "--grace-period=0", "--force")
    plane.kubectl("delete", "leases", "--all", "-n", "hypertopo-system")
    plane.kubectl("delete", "hypernodes", "--all", "--wait=false")


def expected(reports: dict[str, NodeReport]) -> dict[str, dict[str, Any]]:
    """The tree the pipeline derives from these reports (all nodes Ready, agents alive)."""
    inputs = ClusterInputs(reports=reports, node_ready={n: True for n in reports},
                           agent_ready={n: True for n in reports}, model=load_model(str(MODEL)))
    desired = Pipeline().compute(inputs, time.time())
    return {o["metadata"]["name"]: o for o in desired.hypernodes}


class Aggregator(AggregatorProcess):
    def __init__(self, plane: ControlPlane, *extra: str, kubeconfig: Path | None = None, name: str = "a"):
        flags = ["--kubeconfig", str(kubeconfig or plane.kubeconfig), "--model", str(MODEL), "--identity", name,
                 "--hold-down", "1", "--debounce", "0.05", *LEASE, *extra]  # fmt: skip
        super().__init__(plane, flags, name=name)

    def leading(self) -> bool:
        return self.metrics().get("hypertopo_aggregator_is_leader") == 1

    def hn_writes(self) -> float:
        m = self.metrics()
        return writes_of(m, "hypernodes") + writes_of(m, "hypernodes/status")


def leaf_of(tree: dict[str, dict[str, Any]], node: str) -> str:
    return next(n for n, o in tree.items()
                if {"type": "Node", "selector": {"exactMatch": {"name": node}}} in o["spec"]["members"])


def test_first_run_creates_the_tree_and_a_restarted_aggregator_writes_nothing(
    plane: ControlPlane, cluster: dict[str, NodeReport]
) -> None:
    want = expected(cluster)
    first = Aggregator(plane, name="first")
    wait_for(lambda: same_tree(plane, want), timeout=20, what="the HyperNode tree")
    table = plane.kubectl("get", "hn").stdout
    print(table)
    assert table.split("\n")[0].split()[:4] == ["NAME", "TIER", "TIERNAME", "NODECOUNT"]
    assert {tuple(r.split()[1:4]) for r in table.strip().split("\n")[1:]} == {("1", "leaf", "4"), ("2", "spine", "8")}
    # a write is counted after its answer arrives, so after the tree can be seen: wait for the count
    wait_for(lambda: first.hn_writes() >= 2 * len(want), timeout=10, what="the tree's writes counted")
    assert first.hn_writes() == 2 * len(want)  # one create + one status each
    versions = {n: o["metadata"]["resourceVersion"] for n, o in live(plane).items()}
    assert first.stop() == 0

    second = Aggregator(plane, name="second")
    wait_for(lambda: second.metrics().get("hypertopo_aggregator_reconcile_duration_seconds_count", 0) >= 3,
             timeout=20, what="three reconciles by the restarted aggregator")
    assert second.hn_writes() == 0
    assert {n: o["metadata"]["resourceVersion"] for n, o in live(plane).items()} == versions
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{second.port}{path}", timeout=5) as resp:
            assert resp.status == 200
    samples = second.metrics()
    assert samples['hypertopo_aggregator_hypernodes{ready="True",tier="1",tier_name="leaf"}'] == 2
    assert samples["hypertopo_aggregator_stale_agents"] == 0

    node = nodes_of_model()[0]
    leaf = leaf_of(want, node)
    broken = node_topology_object(failed(cluster[node]))
    started = time.monotonic()
    apply_objects(plane, [broken])
    wait_for(lambda: ready_of(live(plane)[leaf]) == "False", timeout=5, interval=0.02, what="Ready=False")
    down = time.monotonic() - started
    apply_objects(plane, [node_topology_object(cluster[node])])
    started = time.monotonic()
    wait_for(lambda: ready_of(live(plane)[leaf]) == "True", timeout=5, interval=0.02, what="Ready=True")
    up = time.monotonic() - started
    print(f"NVLink failure -> Ready=False in {down:.2f}s; repair -> Ready=True in {up:.2f}s (hold-down 1s)")
    cond = next(c for c in live(plane)[leaf]["status"]["conditions"] if c["type"] == "Ready")
    assert cond["reason"] and cond["message"]
    assert second.stop() == 0


def lease_holder(plane: ControlPlane) -> str:
    proc = plane.kubectl("get", "lease", "hypertopo-aggregator", "-n", "hypertopo-system",
                         "-o", "jsonpath={.spec.holderIdentity}", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def test_only_the_leader_writes_and_a_successor_takes_over_after_kill_9(
    plane: ControlPlane, cluster: dict[str, NodeReport]
) -> None:
    want = expected(cluster)
    a, b = Aggregator(plane, name="alpha"), Aggregator(plane, name="beta")
    wait_for(lambda: same_tree(plane, want), timeout=20, what="the HyperNode tree")
    leader, standby = (a, b) if wait_for(lambda: lease_holder(plane), timeout=10) == "alpha" else (b, a)
    wait_for(leader.leading, timeout=5, what="the leader's is_leader metric")
    assert not standby.leading()
    wait_for(lambda: leader.hn_writes() >= 2 * len(want), timeout=10, what="the tree's writes counted")
    assert standby.hn_writes() == 0 and leader.hn_writes() == 2 * len(want)

    node = nodes_of_model()[-1]
    broken = dict(cluster, **{node: failed(cluster[node])})
    leader.proc.kill()  # kill -9: no release, the successor must wait the lease out
    killed = time.monotonic()
    apply_objects(plane, [node_topology_object(broken[node])])  # a change while nobody leads
    wait_for(standby.leading, timeout=10, interval=0.05, what="the standby to lead")
    takeover = time.monotonic() - killed
    want_after = expected(broken)
    wait_for(lambda: same_tree(plane, want_after), timeout=10, what="the change written by the successor")
    changed = sum(1 for n in want if ready_of(want[n]) != ready_of(want_after[n]))
    wait_for(lambda: standby.hn_writes() >= changed, timeout=10, what="the successor's writes counted")
    print(f"takeover after kill -9 in {takeover:.2f}s (lease 3s, retry 0.5s); successor wrote "
          f"{standby.hn_writes():.0f} status updates for {changed} changed HyperNodes")
    assert takeover < 3 + 2 * 0.5
    assert standby.hn_writes() == changed == 2  # the leaf and the spine above it, once each
    assert wait_for(lambda: lease_holder(plane), timeout=5) == standby.proc.args[standby.proc.args.index("--identity") + 1]
    assert standby.stop() == 0


def node(plane: ControlPlane, name: str) -> dict[str, Any]:
    return json.loads(plane.kubectl("get", "node", name, "-o", "json").stdout)


def test_node_labels_and_the_taint_come_and_go_without_touching_others(
    plane: ControlPlane, cluster: dict[str, NodeReport]
) -> None:
    want = expected(cluster)
    agg = Aggregator(plane, "--node-labels", "--taint-unhealthy", name="marks")
    first = nodes_of_model()[0]
    leaf = leaf_of(want, first)
    want_labels = {"team": "ml", "hypertopo.io/leaf": leaf, "hypertopo.io/spine": "spine-spine1"}
    wait_for(lambda: node(plane, first)["metadata"]["labels"] == want_labels, timeout=20, what="node labels")
    foreign = node(plane, first)["spec"]["taints"]  # ours, plus what admission added (not-ready)
    assert {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"} in foreign
    assert not any(t["key"].startswith("hypertopo.io/") for t in foreign)

    apply_objects(plane, [node_topology_object(failed(cluster[first]))])
    ours = {"key": "hypertopo.io/fabric-unhealthy", "value": "true", "effect": "NoSchedule"}
    wait_for(lambda: node(plane, first)["spec"]["taints"] == [*foreign, ours], timeout=5, what="the taint")
    assert not any(t["key"].startswith("hypertopo.io/") for n in nodes_of_model()[1:]
                   for t in node(plane, n)["spec"]["taints"])
    apply_objects(plane, [node_topology_object(cluster[first])])
    wait_for(lambda: node(plane, first)["spec"]["taints"] == foreign, timeout=5, what="the taint removed")
    assert node(plane, first)["metadata"]["labels"] == want_labels
    assert agg.stop() == 0


def test_the_aggregator_survives_an_api_outage_and_converges_afterwards(
    plane: ControlPlane, cluster: dict[str, NodeReport]
) -> None:
    host, port = plane.url.removeprefix("https://").split(":")
    proxy = Proxy(host, int(port))
    config = yaml.safe_load(plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    via_proxy = plane.workdir / "kubeconfig-proxy"
    via_proxy.write_text(yaml.safe_dump(config))
    try:
        agg = Aggregator(plane, kubeconfig=via_proxy, name="outage")
        want = expected(cluster)
        wait_for(lambda: same_tree(plane, want), timeout=20, what="the HyperNode tree")
        proxy.cut()
        node = nodes_of_model()[2]
        broken = dict(cluster, **{node: failed(cluster[node])})
        apply_objects(plane, [node_topology_object(broken[node])])  # changed while unreachable
        time.sleep(4)  # longer than the renew deadline: the aggregator must stop leading, not die
        # is_leader is set by the elector's thread at its next failed round, which a loaded machine
        # may run late; leading() fails at once should the process have died
        wait_for(lambda: not agg.leading(), timeout=10, what="is_leader 0 during the outage")
        assert agg.proc.poll() is None and not agg.leading()
        proxy.restore()
        started = time.monotonic()
        wait_for(lambda: same_tree(plane, expected(broken)), timeout=20, what="convergence after the outage")
        print(f"converged {time.monotonic() - started:.2f}s after the API server came back")
        # the writes start as soon as the lease is renewed; is_leader is set just after, on the elector's thread
        wait_for(agg.leading, timeout=10, what="is_leader 1 after the outage")
        assert agg.leading()
        assert agg.stop() == 0
    finally:
        proxy.close()


def reports_left(plane: ControlPlane) -> set[str]:
    items = json.loads(plane.kubectl("get", "nodetopologies", "-o", "json").stdout)["items"]
    return {o["metadata"]["name"] for o in items}


def test_a_deleted_node_leaves_its_hypernode_and_its_report_is_collected(
    plane: ControlPlane, cluster: dict[str, NodeReport]
) -> None:
    """Its agent pod stays Ready here (no pod GC runs), so only the Node list can say it is gone."""
    want = expected(cluster)
    agg = Aggregator(plane, "--report-gc-period", "0.5", name="gc")
    wait_for(lambda: same_tree(plane, want), timeout=20, what="the HyperNode tree")
    gone = nodes_of_model()[0]
    leaf = leaf_of(want, gone)
    plane.kubectl("delete", "node", gone)
    remaining = {n: r for n, r in cluster.items() if n != gone}
    want_after = expected(remaining)
    wait_for(lambda: same_tree(plane, want_after), timeout=10, what="the tree without the deleted node")
    after = live(plane)[leaf]
    members = {m["selector"]["exactMatch"]["name"] for m in after["spec"]["members"]}
    assert gone not in members and after["status"]["nodeCount"] == 3 and ready_of(after) == "True"
    wait_for(lambda: gone not in reports_left(plane), timeout=10, what="the deleted node's report collected")
    assert reports_left(plane) == set(remaining)
    wait_for(lambda: writes_of(agg.metrics(), "nodetopologies") >= 1, timeout=10, what="the delete counted")
    assert writes_of(agg.metrics(), "nodetopologies") == 1
    assert agg.stop() == 0


@pytest.mark.prometheus
def test_a_real_prometheus_scraping_two_replicas_counts_every_hypernode_once(
    plane: ControlPlane, cluster: dict[str, NodeReport]
) -> None:
    """The shipped Deployment runs two replicas; the dashboard's and the alerts' sums over both must
    equal the cluster, not twice it."""
    want = expected(cluster)
    a, b = Aggregator(plane, name="prom-a"), Aggregator(plane, name="prom-b")
    wait_for(lambda: same_tree(plane, want), timeout=20, what="the HyperNode tree")
    sick = nodes_of_model()[0]
    apply_objects(plane, [node_topology_object(failed(cluster[sick]))])
    leaf = leaf_of(want, sick)
    wait_for(lambda: ready_of(live(plane)[leaf]) == "False", timeout=10, what="Ready=False")
    rules = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    not_ready = next(r["expr"] for g in rules for r in g["rules"] if r.get("alert") == "HypertopoHyperNodeNotReady")
    dashboard = "sum by (tier_name, ready) (hypertopo_aggregator_hypernodes)"
    with prometheus_scraping("hypertopo-aggregator", [a.port, b.port], rules) as prom:
        wait_for(lambda: len(prometheus_query(prom, 'up{job="hypertopo-aggregator"} == 1')) == 2,
                 timeout=30, interval=0.5, what="Prometheus scraping both replicas")  # fmt: skip
        time.sleep(3)  # several scrapes of both replicas, each having reconciled many times
        assert prometheus_query(prom, "sum(hypertopo_aggregator_hypernodes)") == {"": len(want)}
        assert prometheus_query(prom, dashboard) == {
            "ready=False,tier_name=leaf": 1, "ready=True,tier_name=leaf": 1, "ready=False,tier_name=spine": 1}  # fmt: skip
        assert prometheus_query(prom, not_ready) == {"tier_name=leaf": 1, "tier_name=spine": 1}
        assert prometheus_query(prom, "count(hypertopo_aggregator_stale_agents)") == {"": 1}
        assert prometheus_query(prom, "sum(hypertopo_aggregator_is_leader)") == {"": 1}
        leader = a if a.leading() else b
        exporting = prometheus_query(prom, "count by (instance) (hypertopo_aggregator_hypernodes)")
        assert list(exporting) == [f"instance=127.0.0.1:{leader.port}"]  # the leader's, only
    assert a.stop() == 0 and b.stop() == 0
