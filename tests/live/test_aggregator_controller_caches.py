"""The controller's caches and gauges: an informer re-lists after 410 Gone and keeps its objects
through errors; our own writes overlay the cache until the watch catches up; metrics read back."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from aggregator_controller_kit import hypernode, wait_for
from prometheus_client import CollectorRegistry

from agent.common.adapters.informer import Informer
from agent.common.adapters.kube import HYPERNODES, WatchEvent
from aggregator.live.controller import Overlay, agent_readiness
from aggregator.live.metrics import AggregatorMetrics
from aggregator.live.reconcile import ApiError


def obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class ScriptedKube:
    """list() answers in turn; watch() yields one event, then says 410 Gone, then blocks."""

    def __init__(self) -> None:
        self.lists = [([obj("a", "1")], "1"), ([obj("a", "5"), obj("c", "6")], "6")]
        self.watches = 0
        self.idle = threading.Event()

    def list(self, resource: Any, **_: Any) -> tuple[list[dict[str, Any]], str]:
        return self.lists.pop(0) if self.lists else ([obj("a", "5"), obj("c", "6")], "6")

    def watch(self, resource: Any, **_: Any) -> Iterator[WatchEvent]:
        self.watches += 1
        if self.watches == 1:
            return self._first()
        if self.watches == 2:
            raise ApiError(0, "MaxRetryError", "connection refused")
        self.idle.wait(5)
        return iter(())

    @staticmethod
    def _first() -> Iterator[WatchEvent]:
        yield WatchEvent("ADDED", obj("b", "2"))
        yield WatchEvent("BOOKMARK", obj("", "3"))
        raise ApiError(410, "Expired", "too old resource version")


def test_an_informer_relists_after_gone_and_retries_after_errors() -> None:
    kube = ScriptedKube()
    informer = Informer(kube, HYPERNODES)  # type: ignore[arg-type]
    informer.start()
    try:
        wait_for(lambda: kube.watches >= 3, timeout=5, what="a watch after the error")
        assert informer.relists == 3  # initial, after 410, after the failed watch
        assert informer.snapshot() == {"a": obj("a", "5"), "c": obj("c", "6")}  # b vanished on re-list
        assert informer.synced.is_set()
    finally:
        kube.idle.set()
        informer.stop()


def test_the_overlay_serves_our_writes_until_the_watch_catches_up() -> None:
    overlay = Overlay(written={"a": obj("a", "9")}, deleted={"d": 4})
    view = overlay.view({"a": obj("a", "8"), "d": obj("d", "4")})
    assert view == {"a": obj("a", "9")}  # newer write wins, deleted one hidden
    view = overlay.view({"a": obj("a", "9")})
    assert view == {"a": obj("a", "9")} and overlay.written == {} and overlay.deleted == {}


def test_agent_readiness_needs_a_ready_pod_not_being_deleted() -> None:
    def pod(node: str, ready: str, deleting: bool = False) -> dict[str, Any]:
        meta = {"deletionTimestamp": "2024-01-01T00:00:00Z"} if deleting else {}
        return {"metadata": meta, "spec": {"nodeName": node},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}}

    pods = {"1": pod("n1", "True"), "2": pod("n2", "False"), "3": pod("n3", "True", deleting=True),
            "4": pod("n4", "False"), "5": pod("n4", "True")}
    assert agent_readiness(pods) == {"n1": True, "n2": False, "n3": False, "n4": True}


def test_hypernode_gauges_follow_the_last_snapshot() -> None:
    metrics = AggregatorMetrics(CollectorRegistry())
    leaves = [hypernode(f"l{i}", tier=1, tier_name="leaf", members=[("Node", "n")], node_count=1,
                        ready="False" if i == 0 else "True") for i in range(3)]
    metrics.publish_state(leaves, stale_agents=2, clashes=1)
    get = metrics.registry.get_sample_value
    assert get("hypertopo_aggregator_hypernodes", {"tier": "1", "tier_name": "leaf", "ready": "True"}) == 2
    assert get("hypertopo_aggregator_hypernodes", {"tier": "1", "tier_name": "leaf", "ready": "False"}) == 1
    assert get("hypertopo_aggregator_stale_agents") == 2 and get("hypertopo_aggregator_hypernode_name_clashes") == 1
    metrics.publish_state(leaves[1:])
    assert get("hypertopo_aggregator_hypernodes", {"tier": "1", "tier_name": "leaf", "ready": "False"}) is None
    metrics.count_write("apply", "hypernodes/status")
    assert get("hypertopo_aggregator_api_writes_total", {"verb": "apply", "resource": "hypernodes/status"}) == 1


def test_only_the_leader_exports_cluster_state_gauges() -> None:
    """Two replicas see the same HyperNodes; a standby exporting them too would double every sum."""
    metrics = AggregatorMetrics(CollectorRegistry())
    get = metrics.registry.get_sample_value
    leaf = hypernode("l0", tier=1, tier_name="leaf", members=[("Node", "n")], node_count=1)
    assert get("hypertopo_aggregator_stale_agents") is None  # a fresh replica leads nothing yet
    metrics.set_leader(True)
    metrics.publish_state([leaf], stale_agents=1)
    assert get("hypertopo_aggregator_hypernodes", {"tier": "1", "tier_name": "leaf", "ready": "True"}) == 1
    metrics.set_leader(False)  # lease lost: the successor exports them now
    assert get("hypertopo_aggregator_is_leader") == 0
    for name in ("hypertopo_aggregator_stale_agents", "hypertopo_aggregator_hypernode_name_clashes"):
        assert get(name) is None
    assert get("hypertopo_aggregator_hypernodes", {"tier": "1", "tier_name": "leaf", "ready": "True"}) is None


class SlimmingKube(ScriptedKube):
    """A client that slims each object as it decodes it (KubeClient's `transform`), or one that
    ignores the transform (a double), in which case the informer must slim the objects itself."""

    def __init__(self, applies_transform: bool) -> None:
        super().__init__()
        self.applies_transform = applies_transform

    def list(self, resource: Any, *, transform: Any = None, **_: Any) -> tuple[list[dict[str, Any]], str]:
        items, version = super().list(resource)
        return ([transform(o) for o in items] if transform and self.applies_transform else items), version


def test_each_listed_object_is_slimmed_once_whether_or_not_the_client_slims_it() -> None:
    for applies in (True, False):
        seen: list[str] = []

        def slim(o: dict[str, Any], seen: list[str] = seen) -> dict[str, Any]:
            seen.append(o["metadata"]["name"])
            return {"metadata": dict(o["metadata"]), "slim": True}

        kube = SlimmingKube(applies)
        informer = Informer(kube, HYPERNODES, transform=slim)  # type: ignore[arg-type]
        informer._list()
        assert seen == ["a"], f"client applies the transform: {applies}"
        assert informer.snapshot() == {"a": {"metadata": obj("a", "1")["metadata"], "slim": True}}
