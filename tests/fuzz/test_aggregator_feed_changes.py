"""The change-driven feed: handed the informers' changed keys, it looks at those nodes only, and
ends where a feed that compares the whole view every cycle ends (same HyperNodes, labels, faults).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aggregator_changes import Cluster, changes, sources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cluster_model import load_model
from aggregator.live.feed import PipelineFeed
from aggregator.pipeline import Desired, Pipeline

MODEL = load_model(str(Path(__file__).parent.parent / "models" / "mixed-depth.yaml"))


def _feed() -> PipelineFeed:
    return PipelineFeed(Pipeline(), sources(MODEL), resync=1e9)


def _same(a: Desired, b: Desired) -> None:
    assert a.hypernodes == b.hypernodes
    assert a.node_labels == b.node_labels
    assert a.unhealthy_nodes == b.unhealthy_nodes and a.degraded_nodes == b.degraded_nodes


def _step(feed: PipelineFeed, cluster: Cluster, now: float, changed: Any) -> Desired:
    agents = {n: r for n, r in cluster.agent_ready.items() if n in cluster.node_ready}
    return feed.compute(cluster.topologies(), cluster.nodes(), agents, now, changed)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.lists(changes(MODEL), min_size=1, max_size=4), min_size=1, max_size=8))
def test_changed_keys_give_what_comparing_the_whole_view_gives(steps: list[list[Any]]) -> None:
    cluster = Cluster.of(MODEL)
    by_keys, by_view = _feed(), _feed()
    _same(_step(by_keys, cluster, 1, None), _step(by_view, cluster, 1, None))
    for i, batch in enumerate(steps, start=2):
        touched = frozenset(cluster.apply(change) for change in batch)
        _same(_step(by_keys, cluster, i, touched), _step(by_view, cluster, i, None))


def test_a_node_left_out_of_the_changed_keys_is_not_looked_at() -> None:
    """Proof that the keys drive the feed: a change the keys do not name is not seen (until a
    whole-view cycle), so the feed cannot be silently diffing the whole view."""
    cluster = Cluster.of(MODEL)
    feed = _feed()
    node = sorted(MODEL.nodes())[0]
    _step(feed, cluster, 1, None)
    cluster.apply(("health", node, "failed"))
    assert node not in _step(feed, cluster, 2, frozenset()).unhealthy_nodes
    assert node in _step(feed, cluster, 3, frozenset({node})).unhealthy_nodes
    cluster.apply(("health", node, "ok"))
    assert node not in _step(feed, cluster, 4, None).unhealthy_nodes
