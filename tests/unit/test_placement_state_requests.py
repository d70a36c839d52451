"""The scheduler's cluster state parses a pod's resource requests once per change of them, not at
every event that charges the pod (its list, our assumption, its bind event), and a pod whose
requests change (an in-place resize) is charged its new request."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.placement.core.resources import Resources
from aggregator.placement.live import state as state_module
from aggregator.placement.live.state import ClusterState


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}


def pod(cpu: str, *, node_name: str = "", rv: str = "1") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "s",
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"namespace": "ns", "name": "p", "uid": "u", "resourceVersion": rv}, "spec": spec}


def counting_parses(monkeypatch: pytest.MonkeyPatch, *modules: Any) -> list[str]:
    """Patches `pod_request` in these modules to note the resourceVersion of every pod it parses."""
    parsed: list[str] = []
    real = state_module.pod_request

    def counted(p: dict[str, Any]) -> Resources:
        parsed.append(p["metadata"]["resourceVersion"])
        return real(p)

    for module in modules:
        monkeypatch.setattr(module, "pod_request", counted)
    return parsed


def test_a_pod_charged_three_times_has_its_requests_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = counting_parses(monkeypatch, state_module)
    cluster = ClusterState("s")
    cluster.apply("Node", "ADDED", node("n-0"))
    cluster.apply("Pod", "ADDED", pod("500m", rv="1"))  # pending: nothing charged
    cluster.assume(("ns", "p"), "n-0")
    cluster.apply("Pod", "MODIFIED", pod("500m", node_name="n-0", rv="2"))  # the bind event
    assert parsed == ["1"]
    assert cluster.free(["n-0"])["n-0"] == Resources(0, 7500, 31 * 1024**3, 109)


def test_a_pod_resized_in_place_is_charged_its_new_request() -> None:
    cluster = ClusterState("s")
    cluster.apply("Node", "ADDED", node("n-0"))
    cluster.apply("Pod", "ADDED", pod("500m", node_name="n-0", rv="1"))
    assert cluster.free(["n-0"])["n-0"].cpu_milli == 7500
    cluster.apply("Pod", "MODIFIED", pod("2", node_name="n-0", rv="2"))
    assert cluster.free(["n-0"])["n-0"].cpu_milli == 6000
    cluster.apply("Pod", "DELETED", pod("2", node_name="n-0", rv="3"))
    assert cluster.free(["n-0"])["n-0"].cpu_milli == 8000
    cluster.apply("Pod", "ADDED", pod("1", node_name="n-0", rv="4"))  # recreated under the same name
    assert cluster.free(["n-0"])["n-0"].cpu_milli == 7000


def test_the_decision_reads_the_same_parsed_request_that_then_charges_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    from aggregator.placement.core import decide as decide_module
    from aggregator.placement.core import topology
    from aggregator.placement.kinds import podgroups

    parsed = counting_parses(monkeypatch, state_module, decide_module)
    cluster = ClusterState("s")
    cluster.apply("Node", "ADDED", node("n-0"))
    cluster.apply("Pod", "ADDED", pod("500m", rv="1"))
    view, = podgroups.collect(cluster)
    tree = topology.build([], topology.node_labels_of(cluster.nodes.values()))
    decision = decide_module.decide(cluster, tree, view)
    assert decision.assignments == {("ns", "p"): "n-0"}
    cluster.assume(("ns", "p"), "n-0")
    assert parsed == ["1"]  # parsed for the decision, then the charge found it cached
    assert cluster.free(["n-0"])["n-0"] == Resources(0, 7500, 31 * 1024**3, 109)
