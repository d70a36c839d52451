"""The rank -> node map of a bound gang on its PodGroup (`hypertopo.io/rank-map`, issue 24 point 2):
the status writer patches the PodGroup's annotations, and the live scheduler publishes the map in
rank order (natural: job-2 before job-10) once the gang is bound."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest
from placement_live import Cluster, wait_for

from aggregator.placement import ranks
from aggregator.placement.adapters import kube
from aggregator.placement.state import VOLCANO, XK8S
from aggregator.placement.status_writer import StatusWriter


class RecordingApi:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, str, str, dict[str, Any]]] = []
        self.written = threading.Event()

    def patch(self, resource: Any, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append((resource, namespace, name, patch))
        self.written.set()


def test_the_rank_map_lists_placed_pods_in_rank_order_and_leaves_unplaced_ones_out() -> None:
    pods = [{"metadata": {"name": f"w-{i}"}} for i in (10, 2, 0, 1, 3)]
    where = {"w-0": "node-1", "w-1": "node-1", "w-2": "node-2", "w-10": "node-3"}
    value = ranks.rank_map(pods, lambda p: where.get(p["metadata"]["name"]))
    assert value == '[["w-0","node-1"],["w-1","node-1"],["w-2","node-2"],["w-10","node-3"]]'
    assert ranks.rank_map(pods, lambda p: None) == ""


def test_the_status_writer_patches_the_annotations_of_either_kind_of_podgroup() -> None:
    api = RecordingApi()
    writer = StatusWriter(api, lambda target: None, max_delay=0.0, poll=0.005)
    writer.annotate(VOLCANO, ("ns", "vc"), {ranks.RANK_MAP_ANNOTATION: "[]"})
    writer.annotate(XK8S, ("ns", "pg"), {ranks.RANK_MAP_ANNOTATION: "[]"})
    assert wait_for("both writes", lambda: len(api.calls) == 2 or None, timeout=5.0)
    writer.shutdown()
    body = {"metadata": {"annotations": {ranks.RANK_MAP_ANNOTATION: "[]"}}}
    assert sorted(api.calls, key=lambda c: c[2]) == [(kube.PODGROUPS, "ns", "pg", body), (kube.VC_PODGROUPS, "ns", "vc", body)]


@pytest.mark.apiserver
def test_a_bound_gang_gets_its_rank_map_on_its_podgroup_in_fabric_order(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=6, gpus=1)
    with cluster.scheduler():
        cluster.add_gang("job", 12)
        placement = cluster.wait_bound(12)
        annotations = wait_for("the rank map", lambda: cluster.podgroup("job")["metadata"].get("annotations", {})
                               .get(ranks.RANK_MAP_ANNOTATION))
    rows = json.loads(annotations)
    assert rows == [[f"job-{i}", placement[f"job-{i}"]] for i in range(12)]
    leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
    leaves = [leaf_of[node] for _, node in rows]
    assert sum(a != b for a, b in itertools.pairwise(leaves)) == 1  # one leaf crossing in 12 ranks
    assert [node for _, node in rows] == sorted((node for _, node in rows), key=ranks.natural)
