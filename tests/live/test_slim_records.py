"""Slim records (aggregator.live.slim) carry everything their readers read: a kubelet-sized Node, a
NodeTopology, agent and workload Pods cut down on arrival give the aggregator's tree, its node
marks and the scheduler's state exactly what the whole objects give, without images,
managedFields of others or the raw report."""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aggregator_controller_kit import nodetopology, wait_for
from aggregator_fabric import ibnetdiscover_dump

from agent.cluster_model import DOMAIN_ANNOTATION, parse_model
from agent.common.adapters.informer import Informer
from agent.common.adapters.kube import NODES, WatchEvent
from agent.common.report import (
    ComponentHealth,
    Finding,
    Health,
    Interface,
    LldpNeighbour,
    NodeReport,
    WireError,
    node_topology_object,
)
from agent.model_probe import report_for
from aggregator.graph import hca_guids
from aggregator.live import node_marks, slim
from aggregator.live.controller import ClusterView, agent_readiness, build_parser, pipeline_compute
from aggregator.live.feed import node_label_map, node_readiness
from aggregator.live.reconcile import ApiError
from aggregator.live.slim_report import trim_report
from aggregator.placement.core.decide import why_not
from aggregator.placement.live.state import ClusterState, _node_view
from aggregator.registry import load_sources
from aggregator.sources.nodetopology import (
    PARSED_KEY,
    cabled_switches,
    fabric_interfaces,
    facts_of,
    nvlink_domain_id,
    report_from_object,
)
from aggregator.tree.explain import heard


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


def test_a_nodetopology_becomes_its_trimmed_report_and_a_bad_one_its_reason() -> None:
    obj = nodetopology("n1", leaf="leaf-1")
    record = slim.slim_topology(copy.deepcopy(obj))
    assert "spec" not in record and record["metadata"]["name"] == "n1"
    whole = report_from_object(obj)
    assert report_from_object(record) == trim_report(whole)
    assert slim.slim_topology(record) == record  # a re-list may pass a record through again
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


def _hgx_report(node: str, leaves: tuple[str, ...] = ("leaf-a", "leaf-b")) -> NodeReport:
    """An agent-sized report: GPUs with UUIDs, HCAs with GUIDs, LIDs and GIDs, interfaces with
    MACs, LLDP with TTLs and descriptions, a management NIC hearing its own switch."""
    model = parse_model({"switches": {"spine": {"switches": list(leaves)}},
                         "blocks": [{"switch": leaf, "nodes": [node]} for leaf in leaves]})  # fmt: skip
    report = report_for(model, node)
    ports = lambda d, i: tuple(dataclasses.replace(p, lid=100 + i, sm_lid=1, rate_gbps=400.0, netdev=f"ib{i}",  # noqa: E731
                                                   gids=(f"fe80:0000:0000:0000:{d.node_guid}", "0000:0000:0000:0000:0000:ffff:0a00:0001"))
                               for p in d.ports)  # fmt: skip
    rdma = tuple(dataclasses.replace(d, node_desc=f"{node} {d.name}", firmware="28.39.1002", ports=ports(d, i))
                 for i, d in enumerate(report.rdma))  # fmt: skip
    interfaces = (*(dataclasses.replace(i, mac=f"02:00:00:00:00:{k:02x}", speed_mbps=400000)
                    for k, i in enumerate(report.interfaces)),
                  Interface("eno1", "02:00:00:00:01:00", "up", 1500, 1000, "0000:01:00.0", None, "physical"))  # fmt: skip
    lldp = (*(dataclasses.replace(n, port_description="to host", system_description="switch OS", ttl=120,
                                  management_addresses=("10.0.0.1",)) for n in report.lldp),
            LldpNeighbour("eno1", "aa:bb:cc:00:00:01", "Gi1/0/7", 120, system_name="mgmt-switch"))  # fmt: skip
    return dataclasses.replace(report, rdma=rdma, interfaces=interfaces, lldp=lldp)


def test_a_trimmed_report_keeps_every_field_the_aggregator_reads() -> None:
    whole = _hgx_report("n1")
    trimmed = trim_report(whole)
    assert trimmed.host is None and trimmed.nvml is not None and trimmed.nvml.gpus == ()
    assert whole.nvml is not None and len(whole.nvml.gpus) == 8 and trimmed.nvml.domain == whole.nvml.domain
    assert all(i.mac is None for i in trimmed.interfaces) and any(i.mac for i in whole.interfaces)
    assert all(p.lid is None and p.rate_gbps is None for d in trimmed.rdma for p in d.ports)
    for kept, was in zip(trimmed.rdma, whole.rdma, strict=True):
        assert (kept.name, kept.node_guid, kept.sys_image_guid, kept.pci_address) == (
            was.name, was.node_guid, was.sys_image_guid, was.pci_address)
        assert [(p.port, p.state, p.netdev) for p in kept.ports] == [(p.port, p.state, p.netdev) for p in was.ports]
        assert hca_guids((kept,)) == hca_guids((was,))  # per device: what the duplicate-GUID check compares
        # the GID naming the node GUID adds nothing, the IPv4-mapped one names no GUID: both go
        assert all(p.gids == () for p in kept.ports) and all(len(p.gids) == 2 for p in was.ports)
    assert [(n.interface, n.chassis_id, n.port_id, n.system_name, n.capabilities) for n in trimmed.lldp] == [
        (n.interface, n.chassis_id, n.port_id, n.system_name, n.capabilities) for n in whole.lldp]
    assert [(i.name, i.bond_master, i.pci_address, i.kind) for i in trimmed.interfaces] == [
        (i.name, i.bond_master, i.pci_address, i.kind) for i in whole.interfaces]
    assert (trimmed.node_name, trimmed.health, trimmed.findings, trimmed.measurements, trimmed.probe_address) == (
        whole.node_name, whole.health, whole.findings, whole.measurements, whole.probe_address)
    for pattern in (None, "^ib"):
        assert cabled_switches(trimmed, pattern) == cabled_switches(whole, pattern)
        assert fabric_interfaces(trimmed, pattern) == fabric_interfaces(whole, pattern)
    assert facts_of(trimmed).guids == facts_of(whole).guids and facts_of(whole).guids
    assert nvlink_domain_id(trimmed) == nvlink_domain_id(whole)
    assert heard(trimmed) == heard(whole)


def test_equal_report_parts_are_shared_between_nodes_and_reports_stay_equal() -> None:
    one, two = (slim.slim_topology(node_topology_object(_hgx_report(n)))[PARSED_KEY] for n in ("n1", "n2"))
    assert one.interfaces[0] is two.interfaces[0] and one.health is two.health and one.nvml is two.nvml
    assert one == trim_report(report_from_object(node_topology_object(_hgx_report("n1"))))
    assert one.rdma[0].node_guid != two.rdma[0].node_guid
    assert facts_of(one).switches is facts_of(two).switches  # one set per leaf group, not per node
    ib = {}  # an InfiniBand port whose one GID holds the node GUID: equal, so shared, on every node
    for node in ("n1", "n2"):
        whole = _hgx_report(node)
        ports = lambda d: tuple(dataclasses.replace(p, gids=(f"fe80:0000:0000:0000:{d.node_guid}",)) for p in d.ports)  # noqa: E731
        rdma = tuple(dataclasses.replace(d, ports=ports(d)) for d in whole.rdma)
        ib[node] = slim.slim_topology(node_topology_object(dataclasses.replace(whole, rdma=rdma)))[PARSED_KEY]
    assert ib["n1"].rdma[0].ports[0] is ib["n2"].rdma[0].ports[0] and ib["n1"].rdma[0].ports[0].gids == ()
    assert hca_guids(ib["n2"].rdma) == hca_guids(rdma) != hca_guids(ib["n1"].rdma)  # rdma: n2's, whole
    own = slim.slim_topology(node_topology_object(_hgx_report("n3")))[PARSED_KEY].rdma[0]  # IPv4-mapped GID too
    assert own.ports[0] is ib["n1"].rdma[0].ports[0]


def test_a_port_guid_other_than_the_node_guid_keeps_its_gid_and_roce_addresses_are_dropped() -> None:
    whole = _hgx_report("n1")
    device = whole.rdma[0]
    port_guid = "0c42:a103:00ff:0001"
    ib = dataclasses.replace(device.ports[0], gids=(f"fe80:0000:0000:0000:{device.node_guid}",
                                                   f"fe80:0000:0000:0000:{port_guid}"))  # fmt: skip
    roce = dataclasses.replace(device.ports[0], link_layer="Ethernet",
                               gids=("fe80:0000:0000:0000:0200:00ff:fe00:0001", "0000:0000:0000:0000:0000:ffff:0a00:0001"))  # fmt: skip
    for port, kept_gids in ((ib, (ib.gids[1],)), (roce, ())):
        devices = (dataclasses.replace(device, ports=(port,)),)
        kept = trim_report(dataclasses.replace(whole, rdma=devices)).rdma
        assert kept[0].ports[0].gids == kept_gids
        assert hca_guids(kept) == hca_guids(devices)
    assert "0c42a10300ff0001" in hca_guids((dataclasses.replace(device, ports=(ib,)),))


def _sick(report: NodeReport, index: int) -> NodeReport:
    """Varied health: a failed RDMA port, a grey finding, an incomplete NVLink fabric, or none."""
    if index == 1:
        return dataclasses.replace(report, health={**report.health, "rdma": ComponentHealth(Health.FAILED, "mlx5_0/1 down")})
    if index == 2:
        finding = Finding("rdma", "mlx5_1/1", "error-rate", Health.DEGRADED, "12/min", "> 10/min", 60, "errors")
        return dataclasses.replace(report, findings=(finding,),
                                   health={**report.health, "rdma": ComponentHealth(Health.DEGRADED, "errors")})  # fmt: skip
    if index == 3 and report.nvml is not None and report.nvml.domain is not None:
        domain = dataclasses.replace(report.nvml.domain, state="in-progress")
        return dataclasses.replace(report, nvml=dataclasses.replace(report.nvml, domain=domain))
    return report


def _fabric_cluster(tmp_path: Path) -> tuple[list[NodeReport], str]:
    """Two racks of four 2-rail nodes, NVLink cliques per rack, and the ibnetdiscover dump of the
    fabric, its HCAs named by GUID only (so a report's GUIDs are what place its node)."""
    text = {"switches": {"spine": {"switches": ["leaf-1", "leaf-2", "leaf-3", "leaf-4"]}},
            "blocks": [{"switch": f"leaf-{2 * r + k}", "nodes": [f"r{r}n[1-4]"],
                        "annotations": {DOMAIN_ANNOTATION: f"rack{r}"}}
                       for r in range(2) for k in (1, 2)]}  # fmt: skip
    model = parse_model(text)
    dump = tmp_path / "fabric.topo"
    dump.write_text(ibnetdiscover_dump(model, host_descriptions=False))
    reports = [_sick(report_for(model, node), i) for i, node in enumerate(sorted(model.nodes()))]
    return reports, str(dump)


@pytest.mark.parametrize("argv, lldp", [([], True), (["--fabric-interfaces", "^ib"], True),
                                        (["--ibnetdiscover", "DUMP"], False), (["--ibnetdiscover", "DUMP"], True)])
def test_trees_health_and_cross_checks_from_trimmed_reports_are_those_of_whole_ones(
        tmp_path: Path, argv: list[str], lldp: bool) -> None:
    reports, dump = _fabric_cluster(tmp_path)
    objects = {r.node_name: node_topology_object(r if lldp else dataclasses.replace(r, lldp=())) for r in reports}
    nodes = {name: kubelet_node(name) for name in objects}
    results = []
    for records in (objects, {n: slim.slim_topology(copy.deepcopy(o)) for n, o in objects.items()}):
        compute = pipeline_compute(build_parser().parse_args(["--hold-down", "0", *(a.replace("DUMP", dump) for a in argv)]))
        first = compute(ClusterView(records, nodes, None), 1000.0)
        lost = {n: o for n, o in records.items() if n != "r0n1"}  # a report gone, then back: fast paths
        second = compute(ClusterView(lost, nodes, None, frozenset({"r0n1"})), 1001.0)
        third = compute(ClusterView(records, nodes, None, frozenset({"r0n1"})), 1002.0)
        results.append([(d.hypernodes, dict(d.node_labels), d.unhealthy_nodes, d.degraded_nodes, d.warnings)
                         for d in (first, second, third)])  # fmt: skip
    assert results[0] == results[1]
    hypernodes, _labels, unhealthy, degraded, _warnings = results[0][0]
    assert len(hypernodes) >= 2  # the racks (both rails and the NVLink clique of each), in every source mix
    assert unhealthy == {"r0n2", "r0n4"} and degraded == {"r0n3"}, (unhealthy, degraded)


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


def test_the_aggregators_node_keeps_its_labels_and_the_label_levels_and_builds_the_same_tree() -> None:
    argv = ["--hold-down", "0", "--label-levels", "topology.kubernetes.io/zone,leaf"]
    keys = slim.labels_read(load_sources(build_parser().parse_args(argv), live=True))
    assert keys == {"topology.kubernetes.io/zone", "leaf"}
    assert slim.labels_read(load_sources(build_parser().parse_args([]), live=True)) == frozenset()
    record = slim.aggregator_node(keys)
    node = kubelet_node("n1", labelled=True)
    node["metadata"]["labels"]["topology.kubernetes.io/zone"] = "z1"
    kept = record(node)
    assert kept["metadata"]["labels"] == {"leaf": "leaf-1", "topology.kubernetes.io/zone": "z1", "hypertopo.io/leaf": "leaf-1"}
    assert "allocatable" not in kept["status"] and record(kept) == kept
    results = []
    for convert in ((lambda o: o), record):
        view = _cluster(False)
        nodes = {n: convert(kubelet_node(n, labelled=n == "n0", ready="False" if n == "n4" else "True"))
                 for n in view.nodes}  # fmt: skip
        compute = pipeline_compute(build_parser().parse_args(argv))
        desired = compute(ClusterView(view.topologies, nodes, view.agent_ready), 1000.0)
        results.append((desired.hypernodes, dict(desired.node_labels), desired.unhealthy_nodes))
        full = {n: kubelet_node(n, labelled=n == "n0") for n in view.nodes}
        assert node_marks.label_changes(desired.node_labels, nodes) == node_marks.label_changes(desired.node_labels, full)
        assert node_readiness(nodes) == node_readiness({n: kubelet_node(n, ready="False" if n == "n4" else "True")
                                                         for n in view.nodes})  # fmt: skip
    assert results[0] == results[1] and len(results[0][0]) >= 3


def test_live_hypernodes_share_the_desired_member_entries_and_plan_no_write() -> None:
    """The cache of written HyperNodes holds the very member entries the desired ones hold (one
    instance per node), stays equal to what the API server sent, and reconcile plans no write."""
    import json

    from aggregator.live.reconcile import plan

    compute = pipeline_compute(build_parser().parse_args(["--hold-down", "0"]))
    desired = compute(_cluster(True), 1000.0).hypernodes
    as_served = json.loads(json.dumps(desired))  # what a watch decodes: equal, none of the instances
    odd = {"type": "Node", "selector": {"regexMatch": {"pattern": "^n"}}}
    as_served[0]["spec"]["members"].append(odd)  # another shape: kept as it came
    cached = [slim.slim_hypernode(obj) for obj in as_served]
    assert cached == as_served
    assert [slim.slim_hypernode(obj) for obj in cached] == cached  # its own output passes through
    want = {id(m) for obj in desired for m in obj["spec"]["members"]}
    have = [m for obj in cached for m in obj["spec"]["members"]]
    assert {id(m) for m in have if m is not odd} == want and any(m is odd for m in have)
    del as_served[0]["spec"]["members"][-1], cached[0]["spec"]["members"][-1]
    live = {obj["metadata"]["name"]: {**obj, "metadata": {**obj["metadata"], "resourceVersion": "7"}}
            for obj in (slim.slim_hypernode(o) for o in as_served)}  # fmt: skip
    assert plan(desired, live).empty
