"""A gang that does not fit is not decided again at every pass (each a count over every node to
explain the failure) until something could let it fit: capacity freed, the tree or the node
filters changed, the gang itself changed, or `resync_seconds` passed. Binds of other gangs only
take capacity away, so they do not count."""

from __future__ import annotations

from typing import Any

from bench_scheduler_events import SilentApi

from aggregator.placement.live.scheduler import Options, Scheduler


def _node(name: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}}}


def _pod(name: str, gpus: int, scheduler: str, node: str = "", version: str = "1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": version},
            "spec": {"schedulerName": scheduler, "nodeName": node,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _decided(sched: Scheduler) -> float:
    return sched.metrics.registry.get_sample_value("hypertopo_scheduler_decisions_total",
                                                   {"result": "unschedulable"}) or 0.0


def test_a_gang_that_did_not_fit_is_tried_again_only_when_something_could_let_it_fit() -> None:
    clock = _Clock()
    sched = Scheduler(SilentApi(), Options(resync_seconds=30.0), clock=clock)
    state, name = sched.state, sched.options.scheduler_name
    state.apply("Node", "ADDED", _node("a", 8))
    state.apply("Pod", "ADDED", _pod("other", 4, "default-scheduler", node="a"))  # 4 of a's 8 GPUs taken
    state.apply("Pod", "ADDED", _pod("big", 6, name))
    sched._cycle()
    assert _decided(sched) == 1
    for i in range(3):  # another scheduler's pods come and bind: passes run, nothing was freed
        state.apply("Pod", "ADDED", _pod(f"tiny{i}", 0, "default-scheduler", node="a"))
        clock.now += 1
        sched._cycle()
    assert _decided(sched) == 1 and sched._scheduled_gen == state.generation  # the passes did run
    state.apply("Pod", "MODIFIED", _pod("big", 6, name, version="2"))  # the gang's pod changed
    sched._cycle()
    assert _decided(sched) == 2
    clock.now += 31  # resync: tried again whatever happened
    state.apply("Pod", "ADDED", _pod("tiny9", 0, "default-scheduler", node="a"))
    sched._cycle()
    assert _decided(sched) == 3
    state.apply("Pod", "DELETED", _pod("other", 4, "default-scheduler", node="a"))  # 8 GPUs free: it fits now
    sched._cycle()
    assert _decided(sched) == 3 and state.assumed == {("ns", "big"): "a"}
    sched.binder.shutdown()
