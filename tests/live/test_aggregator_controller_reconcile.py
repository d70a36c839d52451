"""Reconcile writes only what differs, only on hypertopo's own HyperNodes, and survives conflicts.

The pure diff is checked on hand-made objects; the applier against the real API server, where each
test keeps to HyperNodes named with its own prefix (the server is shared by the whole session)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from aggregator_controller_kit import hypernode, small_tree

from aggregator.adapters.kube import HYPERNODES, HyperNodeClient, KubeClient, connect
from aggregator.live.reconcile import FIELD_MANAGER, OWNER_LABELS, Applier, NotLeader, plan


def by_name(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs}


def as_live(desired: dict[str, Any], *, generation: int = 1, rv: str = "7") -> dict[str, Any]:
    live = copy.deepcopy(desired)
    live["metadata"].update(generation=generation, resourceVersion=rv)
    for cond in live["status"]["conditions"]:
        cond["observedGeneration"] = generation
    return live


# -- the pure diff ---------------------------------------------------------------------------------


def test_plan_creates_every_hypernode_missing_from_the_cluster() -> None:
    tree = small_tree("p1")
    assert plan(tree, {}).create == ("p1-leaf-0", "p1-leaf-1", "p1-spine")


def test_plan_is_empty_when_a_restart_rederives_the_same_status_with_a_new_timestamp() -> None:
    tree = small_tree("p2")
    live = by_name([as_live(o) for o in tree])
    rederived = copy.deepcopy(tree)
    for obj in rederived:
        obj["status"]["conditions"][0]["lastTransitionTime"] = "2030-06-01T12:00:00Z"
    assert plan(rederived, live).empty


def test_plan_updates_status_when_ready_flips_and_keeps_the_new_transition_time() -> None:
    leaf = hypernode("p3-leaf", tier=1, tier_name="leaf", members=[("Node", "a")], node_count=1)
    live = {"p3-leaf": as_live(leaf)}
    failed = hypernode("p3-leaf", tier=1, tier_name="leaf", members=[("Node", "a")], node_count=1,
                       ready="False", since="2030-06-01T12:00:00Z")
    assert plan([failed], live).update_status == ("p3-leaf",)
    assert plan([failed], live).update_spec == ()


def test_plan_updates_spec_when_members_change() -> None:
    leaf = hypernode("p4-leaf", tier=1, tier_name="leaf", members=[("Node", "a")], node_count=1)
    grown = hypernode("p4-leaf", tier=1, tier_name="leaf", members=[("Node", "a"), ("Node", "b")], node_count=2)
    result = plan([grown], {"p4-leaf": as_live(leaf)})
    assert (result.update_spec, result.update_status) == (("p4-leaf",), ("p4-leaf",))


def test_plan_reports_a_clash_with_a_hand_written_hypernode_and_never_deletes_one() -> None:
    mine = hypernode("p5-a", tier=1, tier_name="leaf", members=[("Node", "a")], node_count=1)
    theirs = copy.deepcopy(mine)
    theirs["metadata"]["labels"] = {"team": "ml"}
    other = copy.deepcopy(theirs)
    other["metadata"]["name"] = "p5-handmade"
    result = plan([mine], {"p5-a": theirs, "p5-handmade": other})
    assert result.clashes == ("p5-a",)
    assert result.empty


def test_plan_deletes_only_owned_hypernodes_that_are_no_longer_desired() -> None:
    gone = as_live(hypernode("p6-old", tier=1, tier_name="leaf", members=[("Node", "a")], node_count=1))
    half_owned = copy.deepcopy(gone)
    half_owned["metadata"]["name"] = "p6-half"
    half_owned["metadata"]["labels"] = {"volcano.sh/network-topology-source": "hypertopo"}
    assert plan([], {"p6-old": gone, "p6-half": half_owned}).delete == ("p6-old",)


def test_plan_notices_a_label_that_was_applied_earlier_and_is_no_longer_desired() -> None:
    leaf = hypernode("p7", tier=1, tier_name="leaf", members=[("Node", "a")], node_count=1)
    live = as_live(leaf)
    live["metadata"]["labels"]["hypertopo.io/rack"] = "r1"
    live["metadata"]["managedFields"] = [{
        "manager": FIELD_MANAGER, "operation": "Apply",
        "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in live["metadata"]["labels"]}}},
    }]
    assert plan([leaf], {"p7": live}).update_spec == ("p7",)
    live["metadata"]["managedFields"][0]["manager"] = "someone-else"
    assert plan([leaf], {"p7": live}).empty


# -- the applier on the real API server ----------------------------------------------------------------


@pytest.fixture
def kube(apiserver: Any) -> KubeClient:
    return connect(str(apiserver.kubeconfig))


@pytest.fixture
def prefix(unique: str) -> str:
    """This test's HyperNodes are named <prefix>-...; unique to the test, so tests never see each other's."""
    return f"r-{unique}"


def live_with_prefix(kube: KubeClient, prefix: str) -> dict[str, dict[str, Any]]:
    items, _ = kube.list(HYPERNODES)
    return {o["metadata"]["name"]: o for o in items if o["metadata"]["name"].startswith(prefix)}


def versions(live: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {n: o["metadata"]["resourceVersion"] for n, o in live.items()}


@pytest.mark.apiserver
def test_first_apply_creates_the_tree_and_a_restarted_applier_writes_nothing(
    apiserver: Any, kube: KubeClient, prefix: str
) -> None:
    tree = small_tree(prefix)
    first = Applier(HyperNodeClient(kube)).apply(tree, live_with_prefix(kube, prefix))
    assert dict(first.writes) == {"create": 3, "apply-status": 3}, first.errors
    before = live_with_prefix(kube, prefix)
    assert before[f"{prefix}-spine"]["status"]["nodeCount"] == 4
    table = apiserver.kubectl("get", "hn").stdout
    print(table)
    rows = [line.split() for line in table.splitlines()]
    assert rows[0][:4] == ["NAME", "TIER", "TIERNAME", "NODECOUNT"]
    mine = {row[0]: row[1:4] for row in rows[1:] if row[0].startswith(prefix)}
    assert mine == {f"{prefix}-leaf-0": ["1", "leaf", "2"], f"{prefix}-leaf-1": ["1", "leaf", "2"],
                    f"{prefix}-spine": ["2", "spine", "4"]}

    rederived = copy.deepcopy(tree)  # a new process derives fresh timestamps
    for obj in rederived:
        obj["status"]["conditions"][0]["lastTransitionTime"] = "2031-01-01T00:00:00Z"
    second = Applier(HyperNodeClient(kube)).apply(rederived, before)
    assert second.total_writes == 0
    after = live_with_prefix(kube, prefix)
    assert versions(after) == versions(before)
    assert after[f"{prefix}-leaf-0"]["status"]["conditions"][0]["lastTransitionTime"] == "2024-01-01T00:00:00Z"
    Applier(HyperNodeClient(kube)).apply([], after)
    assert live_with_prefix(kube, prefix) == {}


@pytest.mark.apiserver
def test_a_hand_written_hypernode_is_never_touched_even_when_its_name_collides(
    apiserver: Any, kube: KubeClient, prefix: str
) -> None:
    tree = small_tree(prefix)
    handmade = copy.deepcopy(tree[0])
    handmade["metadata"]["labels"] = {"team": "ml"}
    del handmade["status"]
    elsewhere = copy.deepcopy(handmade)
    elsewhere["metadata"]["name"] = f"{prefix}-manual"
    apiserver.kubectl("create", "-f", "-", input=json.dumps({"kind": "List", "apiVersion": "v1",
                                                            "items": [handmade, elsewhere]}))
    before = versions(live_with_prefix(kube, prefix))

    outcome = Applier(HyperNodeClient(kube)).apply(tree, live_with_prefix(kube, prefix))
    assert outcome.clashes == [f"{prefix}-leaf-0"]
    after = live_with_prefix(kube, prefix)
    for name in (f"{prefix}-leaf-0", f"{prefix}-manual"):
        assert after[name]["metadata"]["resourceVersion"] == before[name]
        assert after[name]["metadata"]["labels"] == {"team": "ml"}
    Applier(HyperNodeClient(kube)).apply([], after)  # removes only our two
    assert sorted(live_with_prefix(kube, prefix)) == [f"{prefix}-leaf-0", f"{prefix}-manual"]
    apiserver.kubectl("delete", "hn", f"{prefix}-leaf-0", f"{prefix}-manual")


@pytest.mark.apiserver
def test_a_create_that_races_a_hand_written_object_does_not_take_it_over(
    apiserver: Any, kube: KubeClient, prefix: str
) -> None:
    leaf = hypernode(f"{prefix}-leaf", tier=1, tier_name="leaf", members=[("Node", "a")], node_count=1)
    handmade = {k: copy.deepcopy(v) for k, v in leaf.items() if k != "status"}
    handmade["metadata"]["labels"] = {}
    apiserver.kubectl("create", "-f", "-", input=json.dumps(handmade))
    outcome = Applier(HyperNodeClient(kube)).apply([leaf], {})  # stale view: believes it is absent
    assert outcome.clashes == [f"{prefix}-leaf"] and outcome.total_writes == 0
    assert kube.get(HYPERNODES, f"{prefix}-leaf")["metadata"].get("labels") is None
    apiserver.kubectl("delete", "hn", f"{prefix}-leaf")


class ConflictOnFirstStatus(HyperNodeClient):
    """Before the first status write, someone else changes the object: the server answers 409."""

    def __init__(self, kube: KubeClient, apiserver: Any):
        super().__init__(kube)
        self.apiserver = apiserver
        self.status_calls = 0

    def apply_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.status_calls += 1
        if self.status_calls == 1:
            self.apiserver.kubectl("annotate", "hn", obj["metadata"]["name"], "touched=by-someone-else")
        return super().apply_status(obj)


@pytest.mark.apiserver
def test_a_409_on_status_is_retried_with_the_fresh_object(apiserver: Any, kube: KubeClient, prefix: str) -> None:
    leaf = hypernode(f"{prefix}-leaf", tier=1, tier_name="leaf", members=[("Node", "a")], node_count=1)
    store = ConflictOnFirstStatus(kube, apiserver)
    outcome = Applier(store).apply([leaf], {})
    assert store.status_calls == 2  # the first got a real 409 from the server
    assert dict(outcome.writes) == {"create": 1, "apply-status": 1} and not outcome.errors
    live = kube.get(HYPERNODES, f"{prefix}-leaf")
    assert live["status"]["nodeCount"] == 1 and live["metadata"]["annotations"] == {"touched": "by-someone-else"}
    kube.delete(HYPERNODES, f"{prefix}-leaf")


@pytest.mark.apiserver
def test_spec_changes_go_by_server_side_apply_and_stale_ones_are_deleted(kube: KubeClient, prefix: str) -> None:
    tree = small_tree(prefix)
    Applier(HyperNodeClient(kube)).apply(tree, {})
    grown = hypernode(f"{prefix}-leaf-0", tier=1, tier_name="leaf", node_count=3,
                      members=[("Node", f"{prefix}-n{i}") for i in (0, 1, 9)])
    outcome = Applier(HyperNodeClient(kube)).apply([grown], live_with_prefix(kube, prefix))
    assert dict(outcome.writes) == {"apply": 1, "apply-status": 1, "delete": 2}
    live = live_with_prefix(kube, prefix)
    assert list(live) == [f"{prefix}-leaf-0"]
    obj = live[f"{prefix}-leaf-0"]
    assert len(obj["spec"]["members"]) == 3 and obj["status"]["nodeCount"] == 3
    assert obj["status"]["conditions"][0]["observedGeneration"] == obj["metadata"]["generation"] == 2
    managers = {(m["manager"], m["operation"], m.get("subresource")) for m in obj["metadata"]["managedFields"]}
    assert (FIELD_MANAGER, "Apply", None) in managers and (FIELD_MANAGER, "Apply", "status") in managers
    assert obj["metadata"]["labels"] == dict(OWNER_LABELS)
    Applier(HyperNodeClient(kube)).apply([], live)


@pytest.mark.apiserver
def test_an_applier_that_loses_the_lease_stops_before_its_next_write(kube: KubeClient, prefix: str) -> None:
    allowed = iter([True])
    applier = Applier(HyperNodeClient(kube), may_write=lambda: next(allowed, False))
    with pytest.raises(NotLeader):
        applier.apply(small_tree(prefix), {})
    live = live_with_prefix(kube, prefix)
    assert list(live) == [f"{prefix}-leaf-0"] and "status" not in live[f"{prefix}-leaf-0"]
    Applier(HyperNodeClient(kube)).apply([], live)
