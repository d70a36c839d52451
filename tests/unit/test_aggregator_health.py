"""Health: member states, Ready with a threshold, hold-down against flapping, on a fake clock."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.cluster_model import parse_model
from agent.collect import CollectConfig, Prober
from agent.common.report import ComponentHealth, Health, NodeReport, NvLinkDomain, node_topology_object
from agent.model_probe import report_for
from aggregator.health import (
    Condition,
    HoldDown,
    MemberHealth,
    MemberState,
    Threshold,
    evaluate,
    member_health,
)
from aggregator.sources.nodetopology import report_from_object

MODEL = parse_model(
    {
        "blocks": [
            {
                "switch": "leaf1",
                "nodes": ["n[1-4]"],
                "annotations": {"accelerator.topology.test/domain": "r1"},
            },
        ]
    }
)
GOOD = report_for(MODEL, "n1")


def _with(report: NodeReport, component: str, state: Health, reason: str = "") -> NodeReport:
    return dataclasses.replace(report, health={**report.health, component: ComponentHealth(state, reason)})


@pytest.mark.parametrize(
    ("report", "node_ready", "agent_alive", "state", "cause"),
    [
        (GOOD, True, True, MemberState.HEALTHY, None),
        (GOOD, None, None, MemberState.HEALTHY, None),  # readiness not tracked: judged by the report
        (
            _with(GOOD, "nvml", Health.FAILED, "GPU 3 NVLink 5 down"),
            True,
            True,
            MemberState.UNHEALTHY,
            "NVLink",
        ),
        (
            _with(GOOD, "rdma", Health.DEGRADED, "mlx5_2 port 1 DOWN"),
            True,
            True,
            MemberState.UNHEALTHY,
            "RDMA",
        ),
        (_with(GOOD, "net", Health.FAILED), True, True, MemberState.UNHEALTHY, "link"),
        (_with(GOOD, "lldp", Health.FAILED), True, True, MemberState.HEALTHY, None),  # not a fabric fault
        (_with(GOOD, "nvml", Health.ABSENT), True, True, MemberState.HEALTHY, None),  # no GPUs is fine
        (
            _with(GOOD, "rdma", Health.UNUSED, "no RDMA port cabled: mlx5_0 port 1"),  # not a fault
            True,
            True,
            MemberState.HEALTHY,
            None,
        ),
        (GOOD, False, True, MemberState.UNHEALTHY, "NodeNotReady"),
        (GOOD, True, False, MemberState.UNKNOWN, "AgentGone"),
        (None, True, True, MemberState.UNKNOWN, "ReportMissing"),
    ],
)
def test_member_state(
    report: NodeReport | None,
    node_ready: bool | None,
    agent_alive: bool | None,
    state: MemberState,
    cause: str | None,
) -> None:
    health = member_health(report, node_ready=node_ready, agent_alive=agent_alive)
    assert health.state is state
    assert health.causes == (frozenset({cause}) if cause else frozenset())


def test_nvlink_fabric_not_completed_is_unhealthy_and_says_so() -> None:
    assert GOOD.nvml is not None and GOOD.nvml.domain is not None
    nvml = dataclasses.replace(GOOD.nvml, domain=dataclasses.replace(GOOD.nvml.domain, state="in-progress"))
    health = member_health(dataclasses.replace(GOOD, nvml=nvml), node_ready=True, agent_alive=True)
    assert health.state is MemberState.UNHEALTHY
    assert health.problems == ("NVLink fabric in-progress",)
    assert isinstance(GOOD.nvml.domain, NvLinkDomain)


HEALTHY = MemberHealth(MemberState.HEALTHY)
SICK = MemberHealth(MemberState.UNHEALTHY, ("NVLink failed: GPU 1 link 4 down",), frozenset({"NVLink"}))
DOWN = MemberHealth(MemberState.UNHEALTHY, ("Node NotReady",), frozenset({"NodeNotReady"}))
GONE = MemberHealth(MemberState.UNKNOWN, ("agent not running",), frozenset({"AgentGone"}))


@pytest.mark.parametrize(
    ("members", "threshold", "status", "reason"),
    [
        # 10 nodes; the threshold is a fraction below 1 or a count from 1 up
        ({}, 0, "True", "MembersHealthy"),
        ({"n1": SICK}, 0, "False", "NVLinkFailed"),  # 1/10 > 0
        ({"n1": SICK}, 0.1, "True", "WithinThreshold"),  # 1/10 is not > 10 %
        ({"n1": SICK, "n2": SICK}, 0.1, "False", "NVLinkFailed"),  # 2/10 > 10 %
        ({"n1": SICK, "n2": DOWN}, 1, "False", "MembersUnhealthy"),  # 2 > 1, mixed causes
        ({"n1": SICK, "n2": DOWN}, 2, "True", "WithinThreshold"),  # 2 is not > 2
        ({"n1": GONE}, 0, "Unknown", "AgentsGone"),  # could be broken, cannot tell
        ({"n1": SICK, "n2": GONE}, 1, "Unknown", "AgentsGone"),  # 1 bad <= 1, but 1 + 1 unknown > 1
        ({"n1": SICK, "n2": SICK, "n3": GONE}, 1, "False", "NVLinkFailed"),  # known bad already exceed
    ],
)
def test_ready_condition_against_the_threshold(
    members: dict[str, MemberHealth], threshold: float, status: str, reason: str
) -> None:
    health = {f"n{i}": HEALTHY for i in range(1, 11)} | members
    condition = evaluate(health, health, Threshold(threshold))
    assert (condition.status, condition.reason) == (status, reason)


def test_message_names_the_failing_nodes_and_components() -> None:
    health = {f"n{i}": HEALTHY for i in range(1, 11)} | {"n7": SICK, "n3": DOWN}
    condition = evaluate(health, health, Threshold(0))
    assert condition.message.startswith("2 of 10 nodes unhealthy (tolerates 0% of nodes): ")
    assert "n3: Node NotReady; n7: NVLink failed: GPU 1 link 4 down" in condition.message


def test_message_lists_five_nodes_then_counts_the_rest() -> None:
    health = {f"n{i:02d}": SICK for i in range(1, 13)}
    message = evaluate(health, health, Threshold(0)).message
    assert "n05" in message and "n06" not in message and message.endswith("and 7 more")


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_threshold_must_be_a_fraction_or_a_whole_count(bad: float) -> None:
    with pytest.raises(ValueError):
        Threshold(bad)


TRUE = Condition("True", "MembersHealthy", "all healthy")
FALSE = Condition("False", "NVLinkFailed", "n1 failed")

# (time, wanted, published status, lastTransitionTime) with a 10 s hold-down
FLAP_TABLE = [
    (0, TRUE, "True", 0),  # first sight is published at once
    (5, FALSE, "True", 0),  # a new state starts its hold-down
    (9, TRUE, "True", 0),  # ...and the flap back cancels it
    (10, FALSE, "True", 0),  # starts again at 10
    (19, FALSE, "True", 0),  # 9 s held: not yet
    (20, FALSE, "False", 20),  # 10 s held: published, the transition time is now
    (25, FALSE, "False", 20),  # steady: the transition time stays
    (26, TRUE, "False", 20),
    (36, TRUE, "True", 36),
]


def test_hold_down_publishes_a_state_only_after_it_persisted() -> None:
    hold = HoldDown(seconds=10)
    for now, wanted, status, transition in FLAP_TABLE:
        published = hold.observe("leaf:sw1", wanted, now)
        assert (published.status, published.last_transition) == (status, transition), f"at t={now}"


def test_message_changes_without_a_transition_keep_the_transition_time() -> None:
    hold = HoldDown(seconds=10)
    hold.observe("d", FALSE, 0)
    updated = hold.observe("d", Condition("False", "MembersUnhealthy", "n1, n2 failed"), 50)
    assert (updated.message, updated.last_transition) == ("n1, n2 failed", 0)


def test_hold_down_reports_when_the_pending_change_falls_due() -> None:
    hold = HoldDown(seconds=10)
    hold.observe("d", TRUE, 0)
    assert hold.next_deadline() is None
    hold.observe("d", FALSE, 3)
    assert hold.next_deadline() == 13


def test_condition_wire_form_is_a_metav1_condition() -> None:
    wire = Condition("False", "NVLinkFailed", "n1 failed", 1_700_000_000).to_wire(observed_generation=2)
    assert wire == {
        "type": "Ready",
        "status": "False",
        "reason": "NVLinkFailed",
        "message": "n1 failed",
        "lastTransitionTime": "2023-11-14T22:13:20Z",
        "observedGeneration": 2,
    }


def test_a_report_with_a_never_cabled_port_read_from_the_wire_is_a_healthy_member() -> None:
    """What the agent publishes for a dual-port HCA with port 2 never cabled (health `unused`)."""
    tree = Path(__file__).parent.parent / "fixtures" / "sysfs" / "down-port"
    report = Prober(CollectConfig("n1", sysfs=tree, nvml="off"), links=lambda: ()).collect()
    back = report_from_object(node_topology_object(report))
    assert [p.health for p in back.rdma[0].ports] == [Health.OK, Health.UNUSED]
    assert member_health(back, node_ready=True, agent_alive=True).state is MemberState.HEALTHY
