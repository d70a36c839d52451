"""Node labels `hypertopo.io/<tierName>` and the fabric taint: set, changed and removed, while
everyone else's labels and taints stay exactly as they were (real API server, unique node names)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aggregator_controller_kit import node_object

from aggregator.adapters.kube import NODES, KubeClient, NodeClient, connect
from aggregator.live.node_marks import LABEL_MANAGER, TAINT_KEY, NodeMarker, label_changes, wanted_taints

OTHER_TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def test_wanted_taints_adds_and_removes_only_ours() -> None:
    node = {"spec": {"taints": [OTHER_TAINT]}}
    tainted = wanted_taints(node, True)
    assert tainted == [OTHER_TAINT, {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    assert wanted_taints({"spec": {"taints": tainted}}, True) is None
    assert wanted_taints({"spec": {"taints": tainted}}, False) == [OTHER_TAINT]
    assert wanted_taints(node, False) is None


def test_label_changes_ignore_labels_set_by_others() -> None:
    node = {"metadata": {"labels": {"hypertopo.io/leaf": "leaf-a", "team": "ml"}}}
    assert label_changes({"n": {"hypertopo.io/leaf": "leaf-a"}}, {"n": node}) == {}  # same value
    assert label_changes({}, {"n": node}) == {}  # not ours (no managedFields entry): left alone
    assert label_changes({"n": {"hypertopo.io/leaf": "leaf-b"}}, {"n": node}) == {"n": {"hypertopo.io/leaf": "leaf-b"}}


@pytest.fixture
def kube(apiserver: Any) -> KubeClient:
    return connect(str(apiserver.kubeconfig))


def get_node(kube: KubeClient, name: str) -> dict[str, Any]:
    return kube.get(NODES, name)


@pytest.mark.apiserver
def test_labels_are_applied_changed_and_removed_without_touching_others(
    apiserver: Any, kube: KubeClient, unique: str
) -> None:
    name = f"marks-{unique}"
    apiserver.kubectl("create", "-f", "-", input=json.dumps(node_object(name, labels={"team": "ml"})))
    marker = NodeMarker(NodeClient(kube, label_manager=LABEL_MANAGER))
    want = {name: {"hypertopo.io/leaf": "leaf-a", "hypertopo.io/spine": "spine-1"}}
    assert marker.apply_labels(want, {name: get_node(kube, name)}).writes["labels"] == 1
    assert get_node(kube, name)["metadata"]["labels"] == {"team": "ml", **want[name]}
    assert marker.apply_labels(want, {name: get_node(kube, name)}).writes["labels"] == 0  # unchanged: no write

    moved = {name: {"hypertopo.io/leaf": "leaf-b"}}
    marker.apply_labels(moved, {name: get_node(kube, name)})
    assert get_node(kube, name)["metadata"]["labels"] == {"team": "ml", "hypertopo.io/leaf": "leaf-b"}
    marker.apply_labels({}, {name: get_node(kube, name)})
    assert get_node(kube, name)["metadata"]["labels"] == {"team": "ml"}
    apiserver.kubectl("delete", "node", name)


class StaleOnce(NodeClient):
    """The first taint patch carries a resourceVersion someone else has just made stale."""

    def __init__(self, kube: KubeClient, apiserver: Any):
        super().__init__(kube, label_manager=LABEL_MANAGER)
        self.apiserver = apiserver
        self.calls = 0

    def patch_taints(self, name: str, taints: list[dict[str, Any]], *, resource_version: str) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            self.apiserver.kubectl("label", "node", name, "rack=r7")
        return super().patch_taints(name, taints, resource_version=resource_version)


@pytest.mark.apiserver
def test_the_taint_comes_and_goes_keeps_other_taints_and_survives_a_conflict(
    apiserver: Any, kube: KubeClient, unique: str
) -> None:
    name = f"taint-{unique}"
    apiserver.kubectl("create", "-f", "-", input=json.dumps(node_object(name, taints=[OTHER_TAINT])))
    others = get_node(kube, name)["spec"]["taints"]  # plus whatever admission added
    store = StaleOnce(kube, apiserver)
    outcome = NodeMarker(store).apply_taints(frozenset({name}), {name: get_node(kube, name)})
    assert store.calls == 2 and outcome.writes["taint"] == 1 and not outcome.errors
    node = get_node(kube, name)
    assert node["spec"]["taints"] == [*others, {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    assert node["metadata"]["labels"]["rack"] == "r7"
    NodeMarker(NodeClient(kube, label_manager=LABEL_MANAGER)).apply_taints(frozenset(), {name: node})
    assert get_node(kube, name)["spec"]["taints"] == others
    apiserver.kubectl("delete", "node", name)
