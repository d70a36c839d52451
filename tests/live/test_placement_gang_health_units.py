"""Gang health and recovery (unit level): the FabricHealthy verdict from where members sit, its
condition and annotation shapes, and the recovery and whole-time accounts on an injected clock."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from volcano_live import volcano_crds

from aggregator.placement.core import gang_health
from aggregator.placement.core.topology import build
from aggregator.placement.kinds.podgroups import GangView
from aggregator.placement.live.state import VOLCANO, XK8S
from aggregator.placement.sim.recovery import GangClock, Look

LEAVES = {"leaf-a": ["a1", "a2"], "leaf-b": ["b1", "b2"]}


def hypernodes(ready: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    ready = ready or {}
    out = {}
    for leaf, nodes in LEAVES.items():
        out[leaf] = {"metadata": {"name": leaf}, "spec": {"tier": 1, "tierName": "leaf", "members": [
            {"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]},
            "status": {"conditions": [{"type": "Ready", "status": ready.get(leaf, "True"), "reason": "AgentStale"}]}}
    out["spine"] = {"metadata": {"name": "spine"}, "spec": {"tier": 2, "tierName": "spine", "members": [
        {"type": "HyperNode", "selector": {"exactMatch": {"name": leaf}}} for leaf in LEAVES]},
        "status": {"conditions": [{"type": "Ready", "status": ready.get("spine", "True")}]}}
    return out


TOPO = build(hypernodes().values())


def gang(placed: Mapping[str, str], *, min_member: int | None = None, flavour: str = XK8S) -> GangView:
    members = tuple({"metadata": {"name": p, "namespace": "ns"}, "spec": {"nodeName": n}, "status": {"phase": "Running"}}
                    for p, n in placed.items())
    return GangView(("ns", "g"), {"metadata": {"name": "g", "namespace": "ns"}}, members, (),
                    {("ns", p): n for p, n in placed.items()}, min_member or len(placed), {}, flavour)


def test_a_gang_on_healthy_nodes_is_fabric_healthy() -> None:
    found = gang_health.verdict(gang({"p0": "a1", "p1": "a2"}), {}, {}, {}, TOPO)
    assert (found.status, found.reason) == ("True", "FabricHealthy")


def test_a_member_on_a_failed_node_makes_it_false_naming_member_node_and_reason() -> None:
    failed = {"a2": "node a2 has taint hypertopo.io/fabric-unhealthy"}
    found = gang_health.verdict(gang({"p0": "a1", "p1": "a2", "p2": "a2"}), failed, {"a1": "slow"}, {}, TOPO)
    assert (found.status, found.reason) == ("False", "FabricFailed")  # failed wins over degraded
    assert found.message == "2 of 3 members on 1 node(s): a2 (node a2 has taint hypertopo.io/fabric-unhealthy): p1, p2"


def test_a_member_on_a_degraded_node_makes_it_false_as_degraded() -> None:
    found = gang_health.verdict(gang({"p0": "a1", "p1": "b1"}), {}, {"b1": "node b1 fabric degraded since T"}, {}, TOPO)
    assert (found.status, found.reason) == ("False", "FabricDegraded")
    assert "b1 (node b1 fabric degraded since T): p1" in found.message


def test_a_gang_waiting_for_replacements_is_recovering_not_healthy() -> None:
    found = gang_health.verdict(gang({"p0": "a1"}, min_member=2), {}, {}, {}, TOPO, waiting=1)
    assert (found.status, found.reason) == ("False", "Recovering")
    assert "waiting for 1 of 2" in found.message


def test_a_member_under_a_stale_hypernode_or_no_hypernode_is_unknown() -> None:
    unknown = gang_health.unknown_nodes(hypernodes({"leaf-b": "Unknown", "spine": "Unknown"}), TOPO)
    assert set(unknown) == {"b1", "b2"}  # the spine's Unknown is carried up from leaf-b: not its own
    found = gang_health.verdict(gang({"p0": "a1", "p1": "b2"}), {}, {}, unknown, TOPO)
    assert (found.status, found.reason) == ("Unknown", "FabricUnknown")
    found = gang_health.verdict(gang({"p0": "a1", "p1": "zz"}), {}, {}, {}, TOPO)
    assert found.status == "Unknown" and "node zz is under no HyperNode" in found.message


def test_the_message_stays_bounded_for_a_huge_gang_on_many_failed_nodes() -> None:
    placed = {f"pod-{i:04d}-with-a-long-name": f"node-{i // 8:03d}" for i in range(4096)}
    failed = {n: f"node {n} has taint hypertopo.io/fabric-unhealthy and a long story" for n in set(placed.values())}
    found = gang_health.verdict(gang(placed), failed, {}, {}, TOPO)
    assert len(found.message) <= gang_health.MESSAGE_LIMIT
    assert found.message.startswith("4096 of 4096 members on 512 node(s)")


def test_the_transition_time_moves_only_when_the_status_changes() -> None:
    before = {"type": "FabricHealthy", "status": "False", "reason": "FabricFailed", "message": "x",
              "lastTransitionTime": "2026-01-01T00:00:00Z"}
    again = gang_health.condition(gang_health.Verdict("False", "FabricDegraded", "y"), before, "2026-02-02T00:00:00Z")
    assert again["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    healed = gang_health.condition(gang_health.Verdict("True", "FabricHealthy", "z"), before, "2026-02-02T00:00:00Z")
    assert healed["lastTransitionTime"] == "2026-02-02T00:00:00Z"


def test_volcano_conditions_keep_the_others_and_replace_only_fabric_healthy() -> None:
    podgroup = {"status": {"conditions": [{"type": "Scheduled", "status": "True"},
                                          {"type": "FabricHealthy", "status": "True"}]}}
    cond = gang_health.condition(gang_health.Verdict("False", "FabricFailed", "m"), None, "2026-01-01T00:00:00Z")
    out = gang_health.volcano_conditions(podgroup, cond)
    assert [c["type"] for c in out] == ["Scheduled", "FabricHealthy"] and out[1]["status"] == "False"
    assert gang_health.current({"status": {"conditions": out}}, volcano=True) == out[1]


def test_the_volcano_condition_fits_volcanos_podgroup_condition_schema() -> None:
    path = next(p for p in volcano_crds() if p.name == "scheduling.volcano.sh_podgroups.yaml")
    doc = yaml.safe_load(path.read_text())
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    item = schema["conditions"]["items"]["properties"]
    cond = gang_health.condition(gang_health.Verdict("Unknown", "FabricUnknown", "m"), None, "2026-01-01T00:00:00Z")
    assert set(cond) <= set(item)
    assert all(item[k]["type"] == "string" for k in cond)


def test_scheduler_plugins_podgroups_carry_it_as_a_json_annotation() -> None:
    cond = gang_health.condition(gang_health.Verdict("False", "FabricFailed", "m"), None, "2026-01-01T00:00:00Z")
    value = gang_health.annotation(cond)
    podgroup = {"metadata": {"annotations": {gang_health.ANNOTATION: value}}}
    assert gang_health.current(podgroup, volcano=False) == {k: cond[k] for k in ("status", "reason", "message",
                                                                                   "lastTransitionTime")}
    assert json.loads(value)["status"] == "False"
    assert gang_health.current({"metadata": {"annotations": {gang_health.ANNOTATION: "{not json"}}}, volcano=False) is None


def test_events_are_normal_when_healthy_and_warnings_otherwise() -> None:
    assert gang_health.event(gang_health.Verdict("True", "FabricHealthy", "")) == ("FabricHealthy", "Normal")
    assert gang_health.event(gang_health.Verdict("False", "FabricFailed", "")) == ("FabricUnhealthy", "Warning")
    assert gang_health.event(gang_health.Verdict("Unknown", "FabricUnknown", "")) == ("FabricHealthUnknown", "Warning")


# -- recovery and whole time ------------------------------------------------------------------------
def look(placed_ok: int, running_ok: int, *, hit: bool = False, healthy: bool = True, want: int = 4,
         tier: int | None = 1) -> Look:
    return Look(placed_ok, running_ok, hit, healthy, want, tier)


def test_recovery_times_fault_seen_to_bound_and_to_running_with_tiers() -> None:
    clock = GangClock()
    assert clock.update(look(4, 4), 0.0) == []
    assert clock.update(look(3, 3, hit=True, tier=1), 100.0) == []  # fault seen at 100
    assert clock.waiting(look(3, 3)) == 1
    assert clock.update(look(3, 3, want=3), 101.0) == []  # evicted: 3 left, want stays 4
    bound = clock.update(look(4, 3, tier=2), 107.5)  # the replacement bound, one tier up
    assert [(o.stage, o.seconds, o.tier_before, o.tier_after) for o in bound] == [("bound", 7.5, 1, 2)]
    running = clock.update(look(4, 4, tier=2), 112.0)
    assert [(o.stage, o.seconds, o.tier_before, o.tier_after) for o in running] == [("running", 12.0, 1, 2)]
    assert clock.recovery is None


def test_a_second_fault_during_a_recovery_belongs_to_it() -> None:
    clock = GangClock()
    clock.update(look(4, 4), 0.0)
    clock.update(look(3, 3, hit=True), 10.0)
    clock.update(look(2, 2, hit=True), 20.0)
    out = clock.update(look(4, 4), 50.0)
    assert [(o.stage, o.seconds) for o in out] == [("bound", 40.0), ("running", 40.0)]


def test_whole_time_ratio_counts_running_and_healthy_time_since_first_running() -> None:
    clock = GangClock()
    assert clock.ratio(0.0) is None
    clock.update(look(4, 0), 0.0)  # bound, not running yet: not counted
    clock.update(look(4, 4), 10.0)  # first running whole
    clock.update(look(4, 4, healthy=False), 40.0)  # degraded: not whole
    clock.update(look(4, 4), 50.0)
    assert clock.ratio(110.0) == pytest.approx(90 / 100)
    clock.update(look(3, 3, hit=True), 110.0)  # fault: not whole until recovered
    clock.update(look(4, 4), 130.0)
    assert clock.ratio(130.0) == pytest.approx(90 / 120)


def test_a_gang_never_whole_has_no_ratio() -> None:
    clock = GangClock()
    clock.update(look(2, 2, want=4), 0.0)
    assert clock.ratio(100.0) is None


def test_volcano_and_scheduler_plugins_views_get_the_same_verdict() -> None:
    failed = {"b1": "down"}
    one = gang_health.verdict(gang({"p0": "b1"}, flavour=VOLCANO), failed, {}, {}, TOPO)
    two = gang_health.verdict(gang({"p0": "b1"}, flavour=XK8S), failed, {}, {}, TOPO)
    assert one == two
