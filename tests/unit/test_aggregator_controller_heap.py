"""The controller takes its start-up heap out of the garbage collector's sight once the informers
have listed everything and the first cycle has computed from it: at 100,000 nodes those are ~9
million objects that every full collection would walk again for nothing (aggregator.live.controller
`freeze_start_up_heap`)."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from agent.cluster_model import DOMAIN_ANNOTATION, parse_model
from agent.model_probe import report_for
from aggregator.live.controller import ClusterView, Controller, Options, freeze_start_up_heap
from aggregator.live.metrics import AggregatorMetrics
from aggregator.pipeline import ClusterInputs, Pipeline


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the frozen objects go back to the oldest generation for the tests after this


class _Desired:
    warnings: tuple[str, ...] = ()
    next_deadline = None


def test_the_first_cycle_after_the_initial_lists_freezes_the_heap_and_later_cycles_do_not_again(
    unfrozen: None,
) -> None:
    stop = threading.Event()
    seen: list[int] = []

    def compute(view: ClusterView, now: float) -> Any:
        seen.append(gc.get_freeze_count())  # what the compute saw when it ran
        if len(seen) == 2:
            stop.set()
        return _Desired()

    controller = Controller(
        object(),  # type: ignore[arg-type]  # never asked: the informers are not started
        compute,
        options=Options(debounce=0.0, period=0.01, agent_selector=""),
        metrics=AggregatorMetrics(),
        may_write=lambda: False,
    )
    controller.synced = lambda: True  # type: ignore[method-assign]  # the initial lists are in
    controller.changed.set()
    assert not controller.heap_frozen
    controller.run(stop)
    assert seen[0] == 0  # the first compute ran on an unfrozen heap
    assert seen[1] > 0  # and froze it once done
    assert controller.heap_frozen


def test_freezing_collects_the_cyclic_garbage_first_instead_of_keeping_it_forever(unfrozen: None) -> None:
    class Node:
        other: Any = None

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    assert freeze_start_up_heap()
    assert gone() is None
    assert gc.get_freeze_count() > 0


def test_a_pipeline_that_freezes_its_builds_leaves_no_reference_cycle_behind_them(unfrozen: None) -> None:
    """The controller's pipeline freezes what a full build leaves alive; a reference cycle in it
    would never be collected once the next build replaces it, so there must be none: after two
    builds and a structural update in between, unfrozen, the collector finds nothing."""
    model = parse_model(
        {
            "switches": {"spine": {"switches": ["leaf1", "leaf2"]}},
            "blocks": [
                {"switch": "leaf1", "nodes": ["n[01-08]"], "annotations": {DOMAIN_ANNOTATION: "rack1"}},
                {"switch": "leaf2", "nodes": ["n[09-16]"], "annotations": {DOMAIN_ANNOTATION: "rack2"}},
            ],
        }
    )
    names = model.nodes()
    reports = {n: report_for(model, n) for n in names}
    inputs = ClusterInputs(reports=reports, node_ready=dict.fromkeys(names, True), model=model)
    gc.collect()
    pipeline = Pipeline(freeze_built_state=True)
    pipeline.compute(inputs, now=1.0)
    assert gc.get_freeze_count() > 0
    moved = dataclasses.replace(
        reports["n01"], lldp=tuple(dataclasses.replace(n, system_name="leaf2") for n in reports["n01"].lldp)
    )
    pipeline.update_report("n01", moved, now=2.0)
    assert pipeline.full_computes == 1  # the update re-inferred in place, no rebuild
    pipeline.compute(inputs, now=3.0)
    gc.unfreeze()
    assert gc.collect() == 0
