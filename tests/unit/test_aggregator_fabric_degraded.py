"""FabricDegraded: grey findings make a member degraded, a HyperNode gets a second, damped
condition naming the nodes and findings, and Ready stays about failures (unit level: health and
the pipeline)."""

from __future__ import annotations

import dataclasses

import pytest

from agent.cluster_model import parse_model
from agent.common.report import ComponentHealth, Finding, Health, NodeReport
from agent.model_probe import report_for
from aggregator.health import (
    FABRIC_DEGRADED,
    HoldDown,
    MemberHealth,
    MemberState,
    Threshold,
    judge_degraded,
    member_health,
)
from aggregator.pipeline import ClusterInputs, Pipeline

MODEL = parse_model(
    {
        "switches": {"spine1": {"switches": ["leaf1", "leaf2"]}},
        "blocks": [
            {"switch": "leaf1", "nodes": ["n[1-4]"]},
            {"switch": "leaf2", "nodes": ["n[5-8]"]},
        ],
    }
)
NODES = [f"n{i}" for i in range(1, 9)]
SYMBOLS = Finding("rdma", "mlx5_0/1", "error-rate", Health.DEGRADED, "12.0/s", "1.0/s", 300,
                  "mlx5_0/1 symbol_error 12.0/s over 300s (degraded above 1.0/s)")
HALF_RATE = Finding("rdma", "mlx5_1/1", "link-training", Health.DEGRADED, "200 Gb/s", "400 Gb/s", 0,
                    "mlx5_1/1 trained at 200 Gb/s (4X HDR), its maximum is 400 Gb/s")
PCIE = Finding("pcie", "gpu3", "pcie-link", Health.DEGRADED, "Gen3 x8", "Gen5 x16", 0,
               "GPU 3 (0000:3a:00.0) PCIe link Gen3 x8, capable of Gen5 x16")


def _grey(report: NodeReport, *findings: Finding, reason: str | None = None) -> NodeReport:
    """The report an agent writes for grey findings: the components marked degraded, findings listed."""
    health = dict(report.health)
    for component in {f.component for f in findings}:
        own = [f.reason for f in findings if f.component == component]
        health[component] = ComponentHealth(Health.DEGRADED, reason if reason is not None else "; ".join(own))
    return dataclasses.replace(report, health=health, findings=tuple(findings))


def _good(node: str) -> NodeReport:
    return report_for(MODEL, node)


def test_grey_findings_make_a_member_degraded_and_keep_it_healthy_for_ready() -> None:
    health = member_health(_grey(_good("n1"), SYMBOLS, PCIE), node_ready=True, agent_alive=True)
    assert health.state is MemberState.HEALTHY and health.problems == ()
    assert health.is_degraded
    assert health.degraded == (
        "PCIe gpu3 pcie-link: GPU 3 (0000:3a:00.0) PCIe link Gen3 x8, capable of Gen5 x16",
        "RDMA mlx5_0/1 error-rate: mlx5_0/1 symbol_error 12.0/s over 300s (degraded above 1.0/s)",
    )
    assert health.degraded_causes == frozenset({"RDMA", "PCIe"})


def test_a_failure_stays_a_failure_next_to_grey_findings() -> None:
    report = _grey(_good("n1"), SYMBOLS)
    report = dataclasses.replace(report, health={**report.health, "nvml": ComponentHealth(Health.FAILED, "GPU 2 XID 79")})
    health = member_health(report, node_ready=True, agent_alive=True)
    assert health.state is MemberState.UNHEALTHY and health.problems == ("NVLink failed: GPU 2 XID 79",)
    assert health.is_degraded  # and it is degraded too: FabricDegraded names it


def test_a_port_down_in_a_component_with_findings_is_still_a_failure() -> None:
    """The agent joins a down port and a grey finding of one component into one reason."""
    report = _grey(_good("n1"), SYMBOLS, reason=f"mlx5_2 port 1 DOWN (phys_state Disabled); {SYMBOLS.reason}")
    health = member_health(report, node_ready=True, agent_alive=True)
    assert health.state is MemberState.UNHEALTHY
    assert health.problems == ("RDMA degraded: mlx5_2 port 1 DOWN (phys_state Disabled)",)
    assert health.is_degraded


def _links(count: int) -> tuple[Finding, ...]:
    return tuple(Finding("nvml", f"gpu0/nvlink{n}", "nvlink-errors", Health.DEGRADED, f"{n + 2}/min", "> 1/min", 60,
                         f"GPU 0 NVLink {n}: CRC errors {n + 2}/min over 60s (degraded above 1/min)")
                 for n in range(count))


def test_more_than_three_findings_summarised_by_the_agent_stay_grey() -> None:
    """The agent lists three finding reasons and "and N more" (agent.probes.grey.fold)."""
    links = _links(5)
    summary = "; ".join(f.reason for f in links[:3]) + "; and 2 more"
    health = member_health(_grey(_good("n1"), *links, reason=summary), node_ready=True, agent_alive=True)
    assert health.state is MemberState.HEALTHY and len(health.degraded) == 5
    down = f"GPU 0 (0000:18:00.0): NVLink 17 down (17/18 up); {summary}"
    health = member_health(_grey(_good("n1"), *links, reason=down), node_ready=True, agent_alive=True)
    assert health.problems == ("NVLink degraded: GPU 0 (0000:18:00.0): NVLink 17 down (17/18 up)",)


def test_degraded_without_findings_keeps_its_older_meaning_a_failure() -> None:
    """An agent without grey findings marks a down port in use `degraded`: still a failure."""
    report = dataclasses.replace(_good("n1"), health={**_good("n1").health,
                                                      "rdma": ComponentHealth(Health.DEGRADED, "mlx5_2 port 1 DOWN")})
    health = member_health(report, node_ready=True, agent_alive=True)
    assert health.state is MemberState.UNHEALTHY and not health.is_degraded


def test_a_finding_under_a_component_not_marked_degraded_does_not_count() -> None:
    stale = dataclasses.replace(_good("n1"), findings=(SYMBOLS,))  # rdma still ok
    assert not member_health(stale, node_ready=True, agent_alive=True).is_degraded


GREY = MemberHealth(MemberState.HEALTHY, degraded=("RDMA mlx5_0/1 error-rate: 12/s",),
                    degraded_causes=frozenset({"RDMA"}))
SLOW = MemberHealth(MemberState.HEALTHY, degraded=("PCIe gpu0 pcie-link: Gen4 x8",),
                    degraded_causes=frozenset({"PCIe"}))


@pytest.mark.parametrize(
    ("degraded", "threshold", "status", "reason"),
    [
        ([], 0, "False", "NoDegradedMembers"),
        ([("n1", GREY)], 0, "True", "RDMADegraded"),  # the default: any degraded member
        ([("n1", GREY), ("n2", SLOW)], 0, "True", "MembersDegraded"),
        ([("n1", GREY)], 1, "False", "WithinThreshold"),  # a count: 1 is not > 1
        ([("n1", GREY), ("n2", SLOW)], 1, "True", "MembersDegraded"),
        ([("n1", GREY)], 0.25, "False", "WithinThreshold"),  # a fraction: 1/4 is not > 25 %
    ],
)
def test_fabric_degraded_against_its_threshold(
    degraded: list[tuple[str, MemberHealth]], threshold: float, status: str, reason: str
) -> None:
    condition = judge_degraded(4, degraded, Threshold(threshold))
    assert (condition.type, condition.status, condition.reason) == (FABRIC_DEGRADED, status, reason)


def test_fabric_degraded_message_names_nodes_and_findings_then_summarises() -> None:
    one = judge_degraded(4, [("n3", GREY)], Threshold(0))
    assert one.message == "1 of 4 nodes degraded (tolerates 0% of nodes): n3: RDMA mlx5_0/1 error-rate: 12/s"
    many = judge_degraded(40, [(f"n{i:02d}", GREY) for i in range(12)], Threshold(0))
    assert "n04: RDMA" in many.message and "n05" not in many.message and many.message.endswith("; and 7 more")


def test_a_node_with_many_findings_shows_three_and_counts_the_rest() -> None:
    links = tuple(f"NVLink gpu{g}/nvlink{n} nvlink-errors: CRC {n}/s" for g in range(8) for n in range(18))
    busy = MemberHealth(MemberState.HEALTHY, degraded=links, degraded_causes=frozenset({"NVLink"}))
    condition = judge_degraded(72, [(f"n{i}", busy) for i in range(72)], Threshold(0))
    assert condition.reason == "NVLinkDegraded"
    assert "n0: NVLink gpu0/nvlink0 nvlink-errors: CRC 0/s, NVLink gpu0/nvlink1" in condition.message
    assert "(and 141 more)" in condition.message and condition.message.endswith("; and 67 more")
    assert len(condition.message) < 2000  # the API refuses a condition message over 32 KiB


def test_fabric_degraded_is_damped_with_a_real_transition_time() -> None:
    hold = HoldDown(seconds=10)
    clear, grey = judge_degraded(4, [], Threshold(0)), judge_degraded(4, [("n1", GREY)], Threshold(0))
    assert hold.observe("leaf1", clear, 100).status == "False"
    assert hold.observe("leaf1", grey, 105).status == "False"  # pending
    assert hold.observe("leaf1", clear, 108).status == "False"  # flapped back: cancelled
    assert hold.observe("leaf1", grey, 110).status == "False"
    published = hold.observe("leaf1", grey, 120)
    assert (published.type, published.status, published.last_transition) == (FABRIC_DEGRADED, "True", 120)
    wire = published.to_wire()
    assert wire["type"] == "FabricDegraded" and wire["lastTransitionTime"] == "1970-01-01T00:02:00Z"


def _conditions(desired: object, name: str) -> dict[str, dict[str, object]]:
    objects = {o["metadata"]["name"]: o for o in desired.hypernodes}  # type: ignore[attr-defined]
    return {c["type"]: c for c in objects[name]["status"]["conditions"]}


def test_pipeline_marks_the_leaf_fabric_degraded_and_leaves_ready_untouched() -> None:
    reports = {n: _good(n) for n in NODES}
    pipeline = Pipeline(hold_down_seconds=0)
    first = pipeline.compute(ClusterInputs(reports=reports, node_ready=dict.fromkeys(NODES, True), model=MODEL), now=1000)
    assert {c["type"]: c["status"] for c in _conditions(first, "leaf-leaf1").values()} == {
        "Ready": "True", "FabricDegraded": "False"}
    after = pipeline.update_report("n2", _grey(_good("n2"), SYMBOLS, HALF_RATE), now=1010)
    leaf = _conditions(after, "leaf-leaf1")
    assert leaf["Ready"] == first.hypernodes[[o["metadata"]["name"] for o in first.hypernodes].index("leaf-leaf1")][
        "status"]["conditions"][0]  # not one field of Ready moved
    assert leaf["FabricDegraded"]["status"] == "True" and leaf["FabricDegraded"]["reason"] == "RDMADegraded"
    assert leaf["FabricDegraded"]["message"] == (
        "1 of 4 nodes degraded (tolerates 0% of nodes): n2: "
        "RDMA mlx5_0/1 error-rate: mlx5_0/1 symbol_error 12.0/s over 300s (degraded above 1.0/s), "
        "RDMA mlx5_1/1 link-training: mlx5_1/1 trained at 200 Gb/s (4X HDR), its maximum is 400 Gb/s"
    )
    assert leaf["FabricDegraded"]["lastTransitionTime"] == "1970-01-01T00:16:50Z"
    assert _conditions(after, "leaf-leaf2")["FabricDegraded"]["status"] == "False"
    assert _conditions(after, "spine-spine1")["FabricDegraded"]["status"] == "True"  # 1 of 8 > 0
    assert after.degraded_nodes == frozenset({"n2"}) and after.unhealthy_nodes == frozenset()
    assert after.changed == frozenset({"leaf-leaf1", "spine-spine1"})
    healed = pipeline.update_report("n2", _good("n2"), now=1020)
    assert _conditions(healed, "leaf-leaf1")["FabricDegraded"]["status"] == "False"
    assert healed.degraded_nodes == frozenset()


def test_pipeline_damps_fabric_degraded_and_says_when_to_look_again() -> None:
    reports = {n: _good(n) for n in NODES}
    pipeline = Pipeline(hold_down_seconds=30)
    pipeline.compute(ClusterInputs(reports=reports, node_ready=dict.fromkeys(NODES, True), model=MODEL), now=0)
    pending = pipeline.update_report("n6", _grey(_good("n6"), PCIE), now=10)
    assert _conditions(pending, "leaf-leaf2")["FabricDegraded"]["status"] == "False"
    assert pending.next_deadline == 40
    due = pipeline.refresh(now=40)
    assert _conditions(due, "leaf-leaf2")["FabricDegraded"]["status"] == "True"
    assert _conditions(due, "leaf-leaf2")["FabricDegraded"]["reason"] == "PCIeDegraded"
    assert _conditions(due, "leaf-leaf2")["Ready"]["status"] == "True"
