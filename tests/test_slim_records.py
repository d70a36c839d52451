"""Slim records (aggregator.slim) carry everything their readers read: a kubelet-sized Node, a
NodeTopology, agent and workload Pods cut down on arrival give the aggregator's tree, its node
marks and the scheduler's state exactly what the whole objects give, without images,
managedFields of others or the raw report."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

from aggregator_controller_kit import nodetopology, wait_for

from agent.adapters.informer import Informer
from agent.adapters.kube import NODES, WatchEvent
from agent.report import WireError
from aggregator import node_marks, slim
from aggregator.controller import ClusterView, agent_readiness, build_parser, pipeline_compute
from aggregator.feed import node_label_map, node_readiness
from aggregator.placement.decide import why_not
from aggregator.placement.state import ClusterState, _node_view
from aggregator.reconcile import ApiError
from aggregator.sources.nodetopology import PARSED_KEY, report_from_object


def kubelet_node(name: str, *, ready: str = "True", labelled: bool = False) -> dict[str, Any]:
    """A Node as a kubelet and node-feature-discovery leave it: 60 images, 30 labels, managedFields."""
    labels = {f"feature.node.kubernetes.io/f{i}": "true" for i in range(28)}
    labels |= {"kubernetes.io/hostname": name, "leaf": "leaf-1"}
    managed = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {"f:images": {}}}}]
    if labelled:
        labels["hypertopo.io/leaf"] = "leaf-1"
        managed.append({"manager": node_marks.LABEL_MANAGER, "operation": "Apply",
                        "fieldsV1": {"f:metadata": {"f:labels": {"f:hypertopo.io/leaf": {}}}}})
        managed.append({"manager": node_marks.DEGRADED_MANAGER, "operation": "Apply",
                        "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{node_marks.DEGRADED_ANNOTATION}": {}}}}})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7", "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                     **({node_marks.DEGRADED_ANNOTATION: "2026-01-01T00:00:00Z"} if labelled else {})},
                     "managedFields": managed},
        "spec": {"podCIDR": "10.0.0.0/24", "taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8", "pods": "110"},
            "capacity": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [{"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "t"},
                           {"type": "Ready", "status": ready, "lastHeartbeatTime": "t", "reason": "KubeletReady"}],
            "images": [{"names": [f"registry/img{i}@sha256:{i:064d}"], "sizeBytes": i} for i in range(60)],
            "nodeInfo": {"kubeletVersion": "v1.31.0"},
        },
    }


def workload_pod(name: str, node: str | None, group: str = "g1") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "3",
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"scheduling.x-k8s.io/pod-group": group},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 2000 + "}"},
                     "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {}}]},
        "spec": {"schedulerName": "hypertopo-scheduler", "nodeName": node, "nodeSelector": {"leaf": "leaf-1"},
                 "tolerations": [{"key": "gpu", "operator": "Exists"}],
                 "containers": [{"name": "c", "image": "img", "env": [{"name": "A", "value": "1"}] * 20,
                                 "resources": {"requests": {"nvidia.com/gpu": "4", "cpu": "8"}}}],
                 "volumes": [{"name": "v", "emptyDir": {}}] * 10},
        "status": {"phase": "Running" if node else "Pending", "containerStatuses": [{"name": "c"}]},
    }


def test_a_kubelet_node_keeps_only_what_is_read() -> None:
    node = kubelet_node("n1", labelled=True)
    record = slim.slim_node(node)
    assert "images" not in record["status"] and "nodeInfo" not in record["status"]
    assert [m["manager"] for m in record["metadata"]["managedFields"]] == [node_marks.LABEL_MANAGER,
                                                                          node_marks.DEGRADED_MANAGER]
    assert record["metadata"]["annotations"] == {node_marks.DEGRADED_ANNOTATION: "2026-01-01T00:00:00Z"}
    assert record["metadata"]["labels"] == node["metadata"]["labels"]
    assert record["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert slim.slim_node(record) == record  # a re-list may pass a record through again
    assert len(repr(record)) < len(repr(node)) / 3


def test_node_marks_and_readiness_read_the_same_from_a_slim_node() -> None:
    full = {n: kubelet_node(n, labelled=n == "a", ready="False" if n == "b" else "True") for n in ("a", "b")}
    slimmed = {n: slim.slim_node(o) for n, o in full.items()}
    desired = {"a": {"hypertopo.io/spine": "s1"}, "b": {"hypertopo.io/leaf": "leaf-2"}}
    assert node_marks.label_changes(desired, slimmed) == node_marks.label_changes(desired, full)
    assert node_marks.label_changes(desired, full)["a"] == {"hypertopo.io/spine": "s1"}  # our stale label seen
    assert node_marks.degraded_changes(frozenset(), slimmed, "now") == node_marks.degraded_changes(frozenset(), full, "now")
    assert node_marks.degraded_changes(frozenset(), full, "now") == {"a": {}}
    for name in full:
        assert node_marks.wanted_taints(slimmed[name], True) == node_marks.wanted_taints(full[name], True)
    assert node_readiness(slimmed) == node_readiness(full) == {"a": True, "b": False}
    assert node_label_map(slimmed) == node_label_map(full)


def test_a_nodetopology_becomes_its_parsed_report_and_a_bad_one_its_reason() -> None:
    obj = nodetopology("n1", leaf="leaf-1")
    record = slim.slim_topology(copy.deepcopy(obj))
    assert "spec" not in record and record["metadata"]["name"] == "n1"
    assert report_from_object(record) == report_from_object(obj)
    bad = {"metadata": {"name": "n2"}, "spec": {"nodeName": "n2", "lldp": "not a list"}}
    try:
        report_from_object(bad)
    except WireError as exc:
        expected = str(exc)
    record = slim.slim_topology(bad)
    assert record[PARSED_KEY] == expected
    try:
        report_from_object(record)
        raise AssertionError("a slim record of an unreadable report must raise")
    except WireError as exc:
        assert str(exc) == expected


def test_equal_report_parts_are_shared_between_nodes_and_reports_stay_equal() -> None:
    one, two = (slim.slim_topology(nodetopology(n, leaf="leaf-1"))[PARSED_KEY] for n in ("n1", "n2"))
    assert one.nvml.gpus[0].nvlinks[0] is two.nvml.gpus[0].nvlinks[0]
    assert one.nvml.gpus[0].health is two.nvml.gpus[0].health
    assert one == report_from_object(nodetopology("n1", leaf="leaf-1"))
    assert one.nvml.gpus[0].uuid != two.nvml.gpus[0].uuid


def _cluster(slimmed: bool) -> ClusterView:
    topologies = {f"n{i}": nodetopology(f"n{i}", leaf=f"leaf-{i // 2}", nvlink_up=i != 3) for i in range(6)}
    nodes = {name: kubelet_node(name, ready="False" if name == "n4" else "True") for name in topologies}
    pods = {f"hypertopo-system/agent-{n}": {"metadata": {"name": f"agent-{n}", "namespace": "hypertopo-system",
                                                         "managedFields": [{"manager": "kubelet"}]},
                                            "spec": {"nodeName": n, "containers": [{"name": "agent", "image": "x"}]},
                                            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            for n in topologies if n != "n5"}
    if slimmed:
        topologies = {n: slim.slim_topology(o) for n, o in topologies.items()}
        nodes = {n: slim.slim_node(o) for n, o in nodes.items()}
        pods = {k: slim.slim_agent_pod(o) for k, o in pods.items()}
    return ClusterView(topologies, nodes, agent_readiness(pods))


def test_the_tree_from_slim_records_is_the_tree_from_whole_objects() -> None:
    results = []
    for slimmed in (False, True):
        compute = pipeline_compute(build_parser().parse_args(["--hold-down", "0"]))
        desired = compute(_cluster(slimmed), 1000.0)
        results.append((desired.hypernodes, dict(desired.node_labels), desired.unhealthy_nodes))
    assert results[0] == results[1]
    assert len(results[0][0]) >= 3 and results[0][2]  # a real tree, with an unhealthy node in it


def _state(slimmed: bool) -> ClusterState:
    state = ClusterState("hypertopo-scheduler")
    nodes = [kubelet_node(f"n{i}", labelled=i == 0) for i in range(3)]
    pods = [workload_pod("p0", "n0"), workload_pod("p1", "n1"), workload_pod("p2", None), workload_pod("p3", None, "g2")]
    convert_node = slim.slim_node if slimmed else (lambda o: o)
    convert_pod = slim.slim_pod if slimmed else (lambda o: o)
    state.resync("Node", [convert_node(n) for n in nodes])
    state.resync("Pod", [convert_pod(p) for p in pods])
    return state


def test_the_scheduler_state_from_slim_records_is_the_state_from_whole_objects() -> None:
    full, slimmed = _state(False), _state(True)
    assert slimmed.free() == full.free() and full.free()["n0"].gpus == 4
    assert slimmed.pending_keys == full.pending_keys == {("ns", "p2"), ("ns", "p3")}
    assert slimmed.gangs == full.gangs and slimmed.members == full.members
    assert slimmed.free_total == full.free_total
    pod = full.pods[("ns", "p2")]
    for name in full.nodes:
        assert why_not(slimmed.pods[("ns", "p2")], slimmed.nodes[name]) == why_not(pod, full.nodes[name])
        assert _node_view(slimmed.nodes[name])[0] == _node_view(full.nodes[name])[0]
    assert slimmed.request_of(slimmed.pods[("ns", "p2")]) == full.request_of(pod)
    record = slimmed.pods[("ns", "p2")]
    assert "managedFields" not in record["metadata"] and "volumes" not in record["spec"]
    assert record["spec"]["containers"] == [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4", "cpu": "8"}}}]
    assert "annotations" not in record["metadata"]  # only kubectl's last-applied copy was there


class OneListKube:
    """Lists the same Node twice (the second time as a re-list after a watch ends), then idles."""

    def __init__(self) -> None:
        self.lists = 0
        self.idle = threading.Event()
        self.relist = threading.Event()  # set: the watch ends in 410 Gone

    def list(self, resource: Any, **_: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return [kubelet_node("n1")], "7"

    def watch(self, resource: Any, **_: Any) -> Iterator[WatchEvent]:
        if self.lists == 1:
            return self._first()
        self.idle.wait(5)
        return iter(())

    def _first(self) -> Iterator[WatchEvent]:
        yield WatchEvent("MODIFIED", kubelet_node("n2"))
        self.relist.wait(5)
        raise ApiError(410, "Expired", "too old resource version")


def test_an_informer_keeps_slim_records_and_an_unchanged_one_across_a_relist() -> None:
    kube = OneListKube()
    informer = Informer(kube, NODES, transform=slim.slim_node)
    informer.start()
    try:
        wait_for(lambda: kube.lists >= 1 and "n2" in informer.snapshot(), timeout=5, what="the first list and event")
        first = informer.snapshot()["n1"]
        assert "images" not in first["status"] and "images" not in informer.snapshot()["n2"]["status"]
        kube.relist.set()
        wait_for(lambda: kube.lists >= 2, timeout=5, what="the re-list")
        wait_for(lambda: "n2" not in informer.snapshot(), timeout=5, what="the re-list applied")
        assert informer.snapshot()["n1"] is first  # same resourceVersion: the very record kept
    finally:
        kube.relist.set()
        kube.idle.set()
        informer.stop()
