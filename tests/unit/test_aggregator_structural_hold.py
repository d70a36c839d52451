"""The structural hold-down: a report that briefly lost its cabling (LLDP neighbours, RDMA devices,
NVLink domain) keeps its previous structural facts for the hold-down, so no HyperNode is deleted or
re-created for it; a recabling and every health change take effect at once; when the hold-down runs
out the tree follows the report. Time is a fake clock."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from aggregator_changes import Cluster, sources
from fake_clock import FakeClock

from agent.cluster_model import load_model
from agent.common.report import (
    ComponentHealth,
    Health,
    LldpNeighbour,
    NodeReport,
    NvLinkDomain,
    NvmlReport,
    RdmaDevice,
)
from aggregator.live.feed import PipelineFeed
from aggregator.live.structural_hold import StructuralHold
from aggregator.pipeline import Desired, Pipeline

MODEL = load_model(str(Path(__file__).parent.parent / "models" / "mixed-depth.yaml"))
DOMAIN = NvLinkDomain("6a1f3f5e-0000-4000-8000-00000000c0de", 3, "completed")


def neighbour(interface: str, switch: str) -> LldpNeighbour:
    return LldpNeighbour(interface=interface, chassis_id=switch, port_id="swp1", ttl=120, system_name=switch)


def report(*lldp: LldpNeighbour, rdma: bool = True, domain: NvLinkDomain | None = DOMAIN,
           health: Health = Health.OK) -> NodeReport:  # fmt: skip
    return NodeReport(
        node_name="n1",
        health={"lldp": ComponentHealth(health, "" if health is Health.OK else "ib1 link down")},
        nvml=NvmlReport("550", (), domain),
        rdma=(RdmaDevice("mlx5_0", node_guid="0xabc"),) if rdma else (),
        lldp=lldp,
    )


def switches(r: NodeReport | None) -> list[tuple[str, str | None]]:
    assert r is not None
    return [(n.interface, n.system_name) for n in r.lldp]


def test_lost_neighbours_are_kept_for_the_hold_down_then_the_report_is_believed() -> None:
    hold, clock = StructuralHold(120.0), FakeClock(1000.0)
    both = report(neighbour("ib0", "leaf1"), neighbour("ib1", "leaf2"))
    assert hold.admit("n1", both, clock()) is both  # nothing held: the very same report
    assert hold.next_deadline() is None
    restarted = report()  # an agent's first report after a restart, before any frame
    clock.now += 1
    held = hold.admit("n1", restarted, clock())
    assert switches(held) == [("ib0", "leaf1"), ("ib1", "leaf2")]
    assert held is not None and held.health == restarted.health  # health is never held
    assert hold.held() == {"n1": ["lldp:ib0", "lldp:ib1"]} and hold.next_deadline() == 1121.0
    assert hold.holding == 1
    assert hold.admit("n1", restarted, clock() + 60) is held  # unchanged: the same object, no rebuild
    clock.now = 1120.9
    assert hold.due(clock()) == set()
    clock.now = 1121.0
    assert hold.due(clock()) == {"n1"}
    assert switches(hold.admit("n1", restarted, clock())) == []
    assert hold.next_deadline() is None and hold.held() == {} and hold.holding == 0


def test_a_frame_back_on_one_interface_ends_its_hold_and_the_other_stays_held() -> None:
    hold = StructuralHold(120.0)
    hold.admit("n1", report(neighbour("ib0", "leaf1"), neighbour("ib1", "leaf2")), 0.0)
    partial = hold.admit("n1", report(neighbour("ib1", "leaf2")), 5.0)
    assert switches(partial) == [("ib0", "leaf1"), ("ib1", "leaf2")]
    assert hold.held() == {"n1": ["lldp:ib0"]}
    assert hold.admit("n1", report(neighbour("ib0", "leaf1"), neighbour("ib1", "leaf2")), 10.0) is not None
    assert hold.held() == {}
    # lost again later: a fresh hold-down from then
    hold.admit("n1", report(neighbour("ib1", "leaf2")), 200.0)
    assert hold.next_deadline() == 320.0


def test_a_recabled_interface_takes_effect_at_once() -> None:
    hold = StructuralHold(120.0)
    hold.admit("n1", report(neighbour("ib0", "leaf1")), 0.0)
    moved = report(neighbour("ib0", "leaf7"))
    assert hold.admit("n1", moved, 1.0) is moved
    assert hold.held() == {}


def test_rdma_devices_and_the_nvlink_domain_are_held_too() -> None:
    hold = StructuralHold(30.0)
    hold.admit("n1", report(neighbour("ib0", "leaf1")), 0.0)
    bare = report(neighbour("ib0", "leaf1"), rdma=False, domain=None)
    held = hold.admit("n1", bare, 1.0)
    assert held is not None and [d.name for d in held.rdma] == ["mlx5_0"]
    assert held.nvml is not None and held.nvml.domain == DOMAIN
    assert hold.held() == {"n1": ["nvlink", "rdma"]}
    after = hold.admit("n1", bare, 31.0)
    assert after is bare


def test_a_gone_report_is_forgotten_at_once_and_a_zero_hold_down_holds_nothing() -> None:
    hold = StructuralHold(120.0)
    hold.admit("n1", report(neighbour("ib0", "leaf1")), 0.0)
    assert hold.admit("n1", None, 1.0) is None
    empty = report()
    assert hold.admit("n1", empty, 2.0) is empty  # nothing known any more
    off = StructuralHold(0.0)
    off.admit("n1", report(neighbour("ib0", "leaf1")), 0.0)
    assert off.admit("n1", empty, 1.0) is empty


def test_a_health_change_while_held_is_the_new_reports() -> None:
    hold = StructuralHold(120.0)
    hold.admit("n1", report(neighbour("ib0", "leaf1")), 0.0)
    cut = report(health=Health.FAILED)
    held = hold.admit("n1", cut, 1.0)
    assert held is not None and switches(held) == [("ib0", "leaf1")]
    assert held.health["lldp"].state is Health.FAILED


# --- through the feed ---------------------------------------------------------------------------------------


def leaf_of(desired: Desired, node: str) -> str | None:
    """The leaf HyperNode holding the node as a direct member (None: in no leaf)."""
    member = {"type": "Node", "selector": {"exactMatch": {"name": node}}}
    return next((o["metadata"]["name"] for o in desired.hypernodes
                 if o["spec"]["tierName"] == "leaf" and member in o["spec"]["members"]), None)  # fmt: skip


def a_node_in_a_leaf(desired: Desired) -> str:
    """A node whose own HyperNode is a leaf (an HGX node; the racks' nodes sit in NVLink domains)."""
    return next(n for n in sorted(MODEL.nodes()) if leaf_of(desired, n) is not None)


def step(feed: PipelineFeed, cluster: Cluster, now: float, changed: Any) -> Desired:
    return feed.compute(cluster.topologies(), cluster.nodes(), dict(cluster.agent_ready), now, changed)


def test_the_feed_keeps_the_tree_while_every_report_lost_its_cabling_then_follows() -> None:
    """A rollout: every agent's first report has no neighbours. The tree stays as it was for the
    hold-down (changed keys or whole view alike), and the controller is told when to look again."""
    cluster = Cluster.of(MODEL)
    feed = PipelineFeed(Pipeline(), sources(MODEL), resync=1e9, structural_hold=120.0)
    before = step(feed, cluster, 0.0, None)
    node = a_node_in_a_leaf(before)
    leaf = leaf_of(before, node)
    for name in list(cluster.reports):  # every agent restarted at once
        cluster.reports[name] = dataclasses.replace(cluster.reports[name], lldp=())
        cluster.versions[name] += 1
    during = step(feed, cluster, 1.0, frozenset(cluster.reports))
    assert during.hypernodes == before.hypernodes
    assert during.next_deadline == 121.0
    assert step(feed, cluster, 60.0, None).hypernodes == before.hypernodes  # a whole-view cycle too
    after = step(feed, cluster, 121.0, frozenset())  # nothing changed: the hold ran out
    assert leaf_of(after, node) is None and leaf is not None
    assert after.next_deadline is None


def test_the_feed_without_a_hold_down_reshapes_at_once() -> None:
    cluster = Cluster.of(MODEL)
    feed = PipelineFeed(Pipeline(), sources(MODEL), resync=1e9, structural_hold=0.0)
    before = step(feed, cluster, 0.0, None)
    node = a_node_in_a_leaf(before)
    cluster.reports[node] = dataclasses.replace(cluster.reports[node], lldp=())
    cluster.versions[node] += 1
    assert leaf_of(step(feed, cluster, 1.0, frozenset({node})), node) is None


def test_the_controller_exports_how_many_nodes_are_held() -> None:
    from aggregator.live.controller import ClusterView, build_parser, pipeline_compute
    from aggregator.live.metrics import AggregatorMetrics

    cluster = Cluster.of(MODEL)
    metrics = AggregatorMetrics()
    args = build_parser().parse_args(["--no-leader-election", "--structural-hold-down", "30"])
    compute = pipeline_compute(args, sources(MODEL), metrics)

    def held_gauge() -> float | None:
        return metrics.registry.get_sample_value("hypertopo_aggregator_structure_held_nodes")

    def view(changed: frozenset[str] | None) -> ClusterView:
        return ClusterView(cluster.topologies(), cluster.nodes(), dict(cluster.agent_ready), changed)

    compute(view(None), 0.0)
    assert held_gauge() == 0
    lost = sorted(MODEL.nodes())[:3]
    for name in lost:
        cluster.reports[name] = dataclasses.replace(cluster.reports[name], lldp=())
        cluster.versions[name] += 1
    compute(view(frozenset(lost)), 1.0)
    assert held_gauge() == 3
    compute(view(frozenset()), 31.0)
    assert held_gauge() == 0
