"""The rank -> node map of a bound gang on its PodGroup (`hypertopo.io/rank-map`, issue 24 point 2)
and in its hostfile ConfigMap (`<PodGroup or Volcano Job>-hostfile`, owned by the PodGroup): the
status writer patches the PodGroup's annotations and creates or updates the ConfigMap, and the live
scheduler publishes both in rank order (natural: job-2 before job-10) once the gang is bound."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest
from placement_live import Cluster, wait_for

from aggregator.placement.adapters import kube
from aggregator.placement.core import ranks
from aggregator.placement.live import hostfile
from aggregator.placement.live.state import VOLCANO, XK8S, ClusterState
from aggregator.placement.live.status_writer import StatusWriter


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


def test_the_hostfile_lists_nodes_in_rank_order_with_one_slot_per_consecutive_rank() -> None:
    rows = '[["w-0","a"],["w-1","a"],["w-2","b"],["w-3","a"]]'
    assert hostfile.hostfile_text(rows) == "a slots=2\nb slots=1\na slots=1\n"
    assert hostfile.hostfile_text("") == ""


def test_the_hostfile_configmap_is_named_after_the_volcano_job_else_the_podgroup_and_owned_by_it() -> None:
    group = {"metadata": {"name": "train-5f1c", "namespace": "ns", "uid": "u-1",
                          "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train"}]}}
    body = hostfile.config_map(group, "scheduling.volcano.sh/v1beta1", '[["train-worker-0","n1"]]')
    assert body is not None
    assert body["metadata"]["name"] == "train-hostfile" and body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                                                    "name": "train-5f1c", "uid": "u-1"}]
    assert body["data"] == {"hostfile": "n1 slots=1\n", "rank-map": '[["train-worker-0","n1"]]'}
    plain = {"metadata": {"name": "pg", "namespace": "ns", "uid": "u-2"}}
    assert hostfile.config_map_name(plain) == "pg-hostfile"
    assert hostfile.config_map({"metadata": {"name": "pg", "namespace": "ns"}}, "v", "[]") is None  # no UID to own it by
    assert hostfile.config_map_name({"metadata": {"name": "x" * 250}}) is None  # too long a name


class FlakyApi(RecordingApi):
    """Refuses the first `failures` ConfigMap creations (an API server outage)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def create(self, resource: Any, obj: dict[str, Any], namespace: str | None = None) -> None:
        if self.failures:
            self.failures -= 1
            raise kube.ApiError(503, "ServiceUnavailable")
        self.calls.append((resource, namespace or "", obj["metadata"]["name"], obj))
        self.written.set()


def test_a_hostfile_write_that_failed_is_queued_again_by_a_later_cycle() -> None:
    api, clock = FlakyApi(failures=1), [0.0]
    failed: list[Any] = []
    writer = StatusWriter(api, failed.append, max_delay=0.0, poll=0.005, clock=lambda: clock[0], retry_seconds=10.0)
    body = hostfile.config_map({"metadata": {"name": "pg", "namespace": "ns", "uid": "u"}}, "v", '[["p","n"]]')
    assert body is not None
    writer.hostfile(("ns", "pg"), body)
    wait_for("the failed write", lambda: failed or None, timeout=5.0)
    state = ClusterState("s")
    writer.write_dirty(state, set())  # too soon: not retried yet
    assert writer.pending() == 0 and not api.calls
    clock[0] = 11.0
    writer.write_dirty(state, set())
    wait_for("the retried write", lambda: api.calls or None, timeout=5.0)
    writer.shutdown()
    assert api.calls == [(kube.CONFIGMAPS, "ns", "pg-hostfile", body)]


@pytest.mark.apiserver
def test_a_bound_gang_gets_its_rank_map_on_its_podgroup_in_fabric_order(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=6, gpus=1)
    with cluster.scheduler():
        cluster.add_gang("job", 12)
        placement = cluster.wait_bound(12)
        annotations = wait_for("the rank map", lambda: cluster.podgroup("job")["metadata"].get("annotations", {})
                               .get(ranks.RANK_MAP_ANNOTATION))
        config_map = wait_for("the hostfile ConfigMap", lambda: _config_map(cluster, "job-hostfile"))
    rows = json.loads(annotations)
    assert rows == [[f"job-{i}", placement[f"job-{i}"]] for i in range(12)]
    leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
    leaves = [leaf_of[node] for _, node in rows]
    assert sum(a != b for a, b in itertools.pairwise(leaves)) == 1  # one leaf crossing in 12 ranks
    assert [node for _, node in rows] == sorted((node for _, node in rows), key=ranks.natural)
    # the same map as a hostfile, owned by the PodGroup (the garbage collector deletes it with the gang)
    assert config_map["data"]["rank-map"] == annotations
    assert config_map["data"]["hostfile"] == "".join(f"{node} slots=1\n" for _, node in rows)
    podgroup = cluster.podgroup("job")
    assert [(o["kind"], o["name"], o["uid"]) for o in config_map["metadata"]["ownerReferences"]] == \
        [("PodGroup", "job", podgroup["metadata"]["uid"])]
    assert config_map["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "hypertopo-scheduler"}


def _config_map(cluster: Cluster, name: str) -> dict[str, Any] | None:
    try:
        return cluster.api.get(kube.CONFIGMAPS, name, namespace=cluster.ns)
    except kube.ApiError as exc:
        if exc.status == 404:
            return None
        raise


@pytest.mark.apiserver
def test_the_hostfile_of_a_gang_bound_again_is_updated_and_anyone_elses_configmap_is_left_alone(cluster: Cluster) -> None:
    """A ConfigMap of ours is rewritten in place (JSON patch); one of the same name without our label
    (a user's) is refused by the API server's test operation and stays as it was."""
    cluster.leaf_spine(leaves=1, per_leaf=4, gpus=1)
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mine-hostfile", "namespace": cluster.ns},
              "data": {"hostfile": "user's own\n"}}
    cluster.api.create(kube.CONFIGMAPS, theirs, namespace=cluster.ns)
    ours = hostfile.config_map({"metadata": {"name": "pg", "namespace": cluster.ns, "uid": "0000-1"}},
                               "scheduling.x-k8s.io/v1alpha1", '[["w-0","n-a"]]')
    assert ours is not None
    cluster.api.create(kube.CONFIGMAPS, ours, namespace=cluster.ns)  # as if from an earlier binding
    writer = StatusWriter(cluster.api, lambda target: None, max_delay=0.0, poll=0.005)
    again = hostfile.config_map({"metadata": {"name": "pg", "namespace": cluster.ns, "uid": "0000-2"}},
                                "scheduling.x-k8s.io/v1alpha1", '[["w-0","n-b"],["w-1","n-b"]]')
    foreign = hostfile.config_map({"metadata": {"name": "mine", "namespace": cluster.ns, "uid": "0000-3"}},
                                  "scheduling.x-k8s.io/v1alpha1", '[["w-0","n-c"]]')
    assert again is not None and foreign is not None
    writer.hostfile((cluster.ns, "pg"), again)
    writer.hostfile((cluster.ns, "mine"), foreign)
    writer.shutdown()
    updated = _config_map(cluster, "pg-hostfile")
    assert updated is not None and updated["data"] == {"hostfile": "n-b slots=2\n", "rank-map": '[["w-0","n-b"],["w-1","n-b"]]'}
    assert [o["uid"] for o in updated["metadata"]["ownerReferences"]] == ["0000-2"]
    left = _config_map(cluster, "mine-hostfile")
    assert left is not None and left["data"] == {"hostfile": "user's own\n"} and "ownerReferences" not in left["metadata"]
    assert writer.completed == 2  # both writes ended (the foreign one refused, not retried)
