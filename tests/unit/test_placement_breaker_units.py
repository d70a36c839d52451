"""The fault-storm breaker (unit level, injected clock): when it opens, what it takes to close, and
the threshold it derives from the tree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from fake_clock import FakeClock

from aggregator.placement.core.breaker import CLOSED, OPEN, Breaker, BreakerPolicy, threshold
from aggregator.placement.core.rescheduler import Eviction
from aggregator.placement.core.topology import build
from aggregator.placement.live.eviction import EvictionQueue


def hn(name: str, tier: int, *, nodes: Sequence[str] = (), children: Sequence[str] = ()) -> dict[str, Any]:
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    members += [{"type": "HyperNode", "selector": {"exactMatch": {"name": c}}} for c in children]
    return {"metadata": {"name": name}, "spec": {"tier": tier, "tierName": f"t{tier}", "members": members}}


def fabric(spines: int, leaves: int, per_leaf: int) -> list[dict[str, Any]]:
    out, spine_names = [], []
    for s in range(spines):
        names = []
        for leaf in range(leaves):
            name = f"leaf-{s}-{leaf}"
            out.append(hn(name, 1, nodes=[f"n-{s}-{leaf}-{i}" for i in range(per_leaf)]))
            names.append(name)
        out.append(hn(f"spine-{s}", 2, children=names))
        spine_names.append(f"spine-{s}")
    out.append(hn("core", 3, children=spine_names))
    return out


def spine_nodes(s: int, leaves: int, per_leaf: int) -> list[str]:
    return [f"n-{s}-{leaf}-{i}" for leaf in range(leaves) for i in range(per_leaf)]


def test_threshold_is_a_whole_spine_on_a_large_fabric_where_a_tenth_is_more() -> None:
    # 20 spines x 16 leaves x 32 nodes = 10,240 nodes: a spine is 512, a tenth 1,024
    assert threshold(build(fabric(20, 16, 32)), BreakerPolicy()) == 512


def test_threshold_is_a_tenth_of_the_nodes_when_that_is_fewer_than_a_spine() -> None:
    # 2 spines x 40 leaves x 8 nodes = 640 nodes: a spine is 320, a tenth 64
    assert threshold(build(fabric(2, 40, 8)), BreakerPolicy()) == 64


def test_threshold_never_lets_one_whole_leaf_open_it() -> None:
    # 2 spines x 2 leaves x 4 nodes: a tenth is 2, a leaf is 4 -> at least 5
    assert threshold(build(fabric(2, 2, 4)), BreakerPolicy()) == 5


def test_threshold_given_outright_wins_over_the_tree() -> None:
    assert threshold(build(fabric(2, 2, 4)), BreakerPolicy(threshold_nodes=3)) == 3


def test_a_spines_nodes_failing_at_once_open_it_and_a_leaf_does_not() -> None:
    topo = build(fabric(2, 2, 2))  # 8 nodes, spines of 4, leaves of 2: threshold 3
    limit = threshold(topo, BreakerPolicy())
    assert limit == 3
    leaf_only = Breaker(BreakerPolicy())
    assert leaf_only.observe(["n-0-0-0", "n-0-0-1"], limit, 0.0) is None
    assert leaf_only.state == CLOSED
    storm = Breaker(BreakerPolicy())
    change = storm.observe(spine_nodes(0, 2, 2), limit, 0.0)
    assert change is not None and change.state == OPEN and change.reason == "StormDetected"
    assert "4 nodes failed within 300s (threshold 3" in change.message


def test_failures_spread_wider_than_the_window_never_open_it() -> None:
    breaker, clock = Breaker(BreakerPolicy(window_seconds=300)), FakeClock(0.0)
    failed: list[str] = []
    for i in range(6):  # one more node fails every 200 s; earlier ones stay failed
        failed.append(f"n{i}")
        assert breaker.observe(failed, 3, clock()) is None
        clock.now += 200
    assert breaker.state == CLOSED


def test_failures_within_the_window_add_up_to_open_it() -> None:
    breaker = Breaker(BreakerPolicy(window_seconds=300))
    assert breaker.observe(["a"], 3, 0.0) is None
    assert breaker.observe(["a", "b"], 3, 100.0) is None
    change = breaker.observe(["a", "b", "c"], 3, 299.0)
    assert change is not None and change.state == OPEN


def test_a_node_that_flaps_counts_once() -> None:
    breaker = Breaker(BreakerPolicy())
    for t in range(10):
        breaker.observe(["a"] if t % 2 == 0 else [], 2, float(t))
    assert breaker.state == CLOSED and breaker.last[0] == 1


def test_it_closes_only_after_the_storm_stayed_clear_for_the_hold_down() -> None:
    breaker, clock = Breaker(BreakerPolicy(window_seconds=600, hold_seconds=100)), FakeClock(0.0)
    storm = ["a", "b", "c", "d"]
    assert breaker.observe(storm, 3, clock()) is not None
    clock.now = 30.0
    assert breaker.observe(storm[:3], 3, clock()) is None  # one healed: still 3 failed, no hold-down
    assert breaker.next_look(clock()) is None
    clock.now = 50.0
    assert breaker.observe(storm[:2], 3, clock()) is None  # below the threshold: the hold-down starts
    assert breaker.next_look(clock()) == pytest.approx(100.0)
    clock.now = 149.0
    assert breaker.observe([], 3, clock()) is None
    clock.now = 150.0
    change = breaker.observe([], 3, clock())
    assert change is not None and change.state == CLOSED and change.reason == "StormCleared"
    # the storm's failures are forgotten: the same nodes failing again within the window are a new storm
    # only if enough of them fail anew
    assert breaker.observe(["a", "b"], 3, 160.0) is None and breaker.state == CLOSED


def test_a_storm_that_stays_failed_keeps_it_open_until_an_operator_closes_it() -> None:
    breaker = Breaker(BreakerPolicy(window_seconds=60, hold_seconds=100))
    storm = ["a", "b", "c", "d"]
    breaker.observe(storm, 3, 0.0)
    for t in range(1, 20):  # an hour later the same nodes are still failed
        assert breaker.observe(storm, 3, t * 200.0) is None
    assert breaker.state == OPEN
    change = breaker.operator_close(4000.0)
    assert change is not None and change.reason == "OperatorClosed"
    # the nodes failed at the close are not counted again: the breaker stays closed
    assert breaker.observe(storm, 3, 4001.0) is None and breaker.state == CLOSED
    # but a new storm opens it again
    assert breaker.observe([*storm, "e", "f", "g"], 3, 4002.0) is not None


def test_a_failure_during_the_hold_down_starts_it_again() -> None:
    breaker = Breaker(BreakerPolicy(window_seconds=10, hold_seconds=100))
    breaker.observe(["a", "b", "c"], 3, 0.0)
    breaker.observe([], 3, 20.0)  # clear: hold-down from 20
    breaker.observe(["x", "y", "z"], 3, 90.0)  # a new storm within the hold-down
    assert breaker.observe([], 3, 121.0) is None  # 121 > 20 + 100, but the hold restarted later
    assert breaker.state == OPEN


def test_a_disabled_breaker_counts_but_never_opens() -> None:
    breaker = Breaker(BreakerPolicy(enabled=False))
    assert breaker.observe([f"n{i}" for i in range(100)], 3, 0.0) is None
    assert breaker.state == CLOSED and breaker.last == (100, 100, 3)


class _NeverEvicts:
    def evict(self, namespace: str, name: str, uid: str) -> None:
        raise AssertionError("the queue was never started: nothing may be evicted")


def test_withdrawn_evictions_leave_the_queue_and_may_be_offered_again() -> None:
    queue = EvictionQueue(_NeverEvicts(), lambda *_: None)  # not started: everything stays queued
    evs = [Eviction(("ns", f"p{i}"), f"uid-{i}", "n1", ("ns", "g"), "restart-pods", "down") for i in range(3)]
    assert all(queue.offer(ev) for ev in evs)
    assert not queue.offer(evs[0])  # offered once per UID
    assert sorted(ev.uid for ev in queue.withdraw()) == ["uid-0", "uid-1", "uid-2"]
    assert queue.withdraw() == []
    assert queue.offer(evs[0])  # forgotten: a later plan may offer it again


def test_a_failed_node_is_acted_on_only_once_it_settled_so_a_storm_is_counted_first() -> None:
    breaker = Breaker(BreakerPolicy(settle_seconds=3.0))
    breaker.observe(["a"], 3, 0.0)
    assert breaker.ripe({"a": "down"}, 1.0) == {}
    assert breaker.next_look(1.0) == pytest.approx(2.0)  # the scheduler looks again when it settles
    breaker.observe(["a", "b", "c"], 3, 1.5)  # the rest of the storm arrives within the settle time
    assert breaker.state == OPEN and breaker.ripe({"a": "", "b": "", "c": ""}, 10.0) == {}


def test_a_lone_failure_is_acted_on_after_the_settle_time() -> None:
    breaker = Breaker(BreakerPolicy(settle_seconds=3.0))
    breaker.observe(["a"], 3, 0.0)
    assert breaker.ripe({"a": "down"}, 3.0) == {"a": "down"}
    assert breaker.next_look(3.0) is None


def test_without_the_breaker_failed_nodes_are_acted_on_at_once() -> None:
    breaker = Breaker(BreakerPolicy(enabled=False))
    breaker.observe(["a"], 3, 0.0)
    assert breaker.ripe({"a": "down"}, 0.0) == {"a": "down"}


def test_the_run_command_line_sets_the_breaker_and_gang_health_options() -> None:
    from aggregator.placement.live.scheduler import build_parser, options_from

    parser = build_parser()
    defaults = options_from(parser.parse_args([]))
    assert defaults.breaker == BreakerPolicy() and defaults.health_sweep_seconds == 60.0
    args = parser.parse_args(["--breaker-window", "60", "--breaker-threshold", "7", "--breaker-fraction", "0.2",
                              "--breaker-hold", "30", "--breaker-settle", "0", "--no-breaker", "--health-sweep", "5",
                              "--namespace", "ops"])
    options = options_from(args)
    assert options.breaker == BreakerPolicy(enabled=False, window_seconds=60, hold_seconds=30, fraction=0.2,
                                            threshold_nodes=7, settle_seconds=0)
    assert options.health_sweep_seconds == 5 and options.namespace == "ops"
    text = "".join(parser.format_help().split())  # help wraps lines, at hyphens too
    for flag in ("--breaker-window", "--breaker-threshold", "--breaker-hold", "--breaker-settle", "--no-breaker",
                 "--health-sweep", "hypertopo.io/remediation-breaker=close"):
        assert flag in text
