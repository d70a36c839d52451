"""The degraded node mark `hypertopo.io/fabric-degraded`: set with the time since when, kept while
the node stays degraded (no write, the time unchanged), removed when it heals, and nobody else's
annotations touched (pure rules, then a real API server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aggregator_controller_kit import node_object

from aggregator.adapters.kube import NODES, KubeClient, NodeClient, connect
from aggregator.live.node_marks import (
    DEGRADED_ANNOTATION,
    DEGRADED_MANAGER,
    LABEL_MANAGER,
    NodeMarker,
    degraded_changes,
)

SINCE = "2026-11-23T01:00:00Z"
LATER = "2026-11-23T01:05:00Z"


def owned(annotations: dict[str, str]) -> dict[str, Any]:
    """A Node whose degraded annotation our field manager set."""
    fields = {"f:metadata": {"f:annotations": {f"f:{k}": {} for k in annotations}}}
    return {"metadata": {"annotations": annotations,
                         "managedFields": [{"manager": DEGRADED_MANAGER, "operation": "Apply", "fieldsV1": fields}]}}


def test_degraded_changes_set_keep_and_remove_only_ours() -> None:
    plain = {"metadata": {"annotations": {"team": "ml"}}}
    assert degraded_changes(frozenset({"n"}), {"n": plain}, SINCE) == {"n": {DEGRADED_ANNOTATION: SINCE}}
    marked = owned({DEGRADED_ANNOTATION: SINCE})
    assert degraded_changes(frozenset({"n"}), {"n": marked}, LATER) == {}  # still degraded: the time stays
    assert degraded_changes(frozenset(), {"n": marked}, LATER) == {"n": {}}  # healed: drop ours
    theirs = {"metadata": {"annotations": {DEGRADED_ANNOTATION: SINCE}}}  # set by hand, not by us
    assert degraded_changes(frozenset(), {"n": theirs}, LATER) == {}
    assert degraded_changes(frozenset(), {"n": plain}, LATER) == {}


@pytest.fixture
def kube(apiserver: Any) -> KubeClient:
    return connect(str(apiserver.kubeconfig))


@pytest.mark.apiserver
def test_the_degraded_mark_comes_with_its_time_stays_and_goes_leaving_other_annotations(
    apiserver: Any, kube: KubeClient, unique: str
) -> None:
    name = f"grey-{unique}"
    body = node_object(name, labels={"team": "ml"})
    body["metadata"]["annotations"] = {"owner": "infra"}
    apiserver.kubectl("create", "-f", "-", input=json.dumps(body))
    marker = NodeMarker(NodeClient(kube, label_manager=LABEL_MANAGER))

    def node() -> dict[str, Any]:
        return kube.get(NODES, name)

    assert marker.apply_degraded(frozenset({name}), {name: node()}, SINCE).writes["degraded"] == 1
    assert node()["metadata"]["annotations"] == {"owner": "infra", DEGRADED_ANNOTATION: SINCE}
    again = marker.apply_degraded(frozenset({name}), {name: node()}, LATER)
    assert again.writes["degraded"] == 0 and node()["metadata"]["annotations"][DEGRADED_ANNOTATION] == SINCE

    healed = marker.apply_degraded(frozenset(), {name: node()}, LATER)
    assert healed.writes["degraded"] == 1 and not healed.errors
    assert node()["metadata"]["annotations"] == {"owner": "infra"}
    assert node()["metadata"]["labels"] == {"team": "ml"}
    assert marker.apply_degraded(frozenset(), {name: node()}, LATER).writes["degraded"] == 0
    apiserver.kubectl("delete", "node", name)
