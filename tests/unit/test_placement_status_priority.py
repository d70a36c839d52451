"""PodGroup status writes yield to pending binds (status_writer.StatusWriter), without losing or
changing any: a bound gang's status waits while binds are pending (at most `max_delay`), urgent
writes (Volcano admission, conditions) go first, and shutdown writes what is left."""

from __future__ import annotations

import threading
import time
from typing import Any

from aggregator.placement.kinds import podgroups
from aggregator.placement.live.binder import Binder, BindItem, BindOutcome
from aggregator.placement.live.state import VOLCANO, XK8S, ClusterState
from aggregator.placement.live.status_writer import StatusWriter


class RecordingApi:
    """Records every status write in order; `written` is set after each one."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.written = threading.Event()

    def patch_status(self, resource: Any, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("xk8s", name, patch))
        self.written.set()

    def patch(self, resource: Any, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("volcano", name, patch))
        self.written.set()


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def test_a_bound_gangs_status_waits_while_binds_are_pending_then_goes_with_the_same_content() -> None:
    api, busy = RecordingApi(), threading.Event()
    busy.set()
    writer = StatusWriter(api, lambda target: None, busy=busy.is_set, max_delay=60.0, poll=0.005)
    writer.queue((XK8S, ("ns", "g1")), {"phase": "Scheduled", "scheduled": 4}, defer=True)
    time.sleep(0.1)
    assert api.calls == [] and writer.pending() == 1
    busy.clear()
    assert wait_for(lambda: len(api.calls) == 1)
    assert api.calls == [("xk8s", "g1", {"status": {"phase": "Scheduled", "scheduled": 4}})]
    writer.shutdown()


def test_urgent_writes_go_ahead_of_deferred_ones_queued_before_them() -> None:
    api, busy = RecordingApi(), threading.Event()
    busy.set()
    writer = StatusWriter(api, lambda target: None, busy=busy.is_set, max_delay=60.0, poll=0.005)
    writer.queue((XK8S, ("ns", "bound")), {"phase": "Scheduled"}, defer=True)
    writer.queue((VOLCANO, ("ns", "admitted")), {"phase": "Inqueue"})
    assert wait_for(lambda: len(api.calls) == 1)
    time.sleep(0.05)
    assert api.calls == [("volcano", "admitted", {"status": {"phase": "Inqueue"}})]
    busy.clear()
    assert wait_for(lambda: len(api.calls) == 2)
    assert api.calls[1] == ("xk8s", "bound", {"status": {"phase": "Scheduled"}})
    writer.shutdown()


def test_a_deferred_write_goes_after_max_delay_even_while_binds_keep_coming() -> None:
    api = RecordingApi()
    now = [100.0]
    writer = StatusWriter(api, lambda target: None, busy=lambda: True, max_delay=5.0, poll=0.005, clock=lambda: now[0])
    writer.queue((XK8S, ("ns", "g1")), {"phase": "Scheduled"}, defer=True)
    now[0] = 104.9
    time.sleep(0.1)
    assert api.calls == []
    now[0] = 105.0
    assert wait_for(lambda: len(api.calls) == 1)
    writer.shutdown()


def test_a_later_status_merges_into_the_queued_one_and_an_urgent_one_takes_the_deferred_fields_along() -> None:
    api, busy = RecordingApi(), threading.Event()
    busy.set()
    writer = StatusWriter(api, lambda target: None, busy=busy.is_set, max_delay=60.0, poll=0.005)
    target = (VOLCANO, ("ns", "g1"))
    writer.queue(target, {"phase": "Running", "running": 2}, defer=True)
    writer.queue(target, {"running": 4}, defer=True)
    writer.queue(target, {"conditions": ["c"]})  # urgent: goes now, with the deferred fields
    assert wait_for(lambda: len(api.calls) == 1)
    assert api.calls == [("volcano", "g1", {"status": {"phase": "Running", "running": 4, "conditions": ["c"]}})]
    time.sleep(0.05)
    assert writer.pending() == 0 and len(api.calls) == 1  # nothing left to write twice
    writer.shutdown()


def test_shutdown_writes_every_deferred_status_even_while_binds_are_pending() -> None:
    api = RecordingApi()
    writer = StatusWriter(api, lambda target: None, busy=lambda: True, max_delay=60.0, poll=0.005)
    for i in range(5):
        writer.queue((XK8S, ("ns", f"g{i}")), {"phase": "Scheduled", "scheduled": i}, defer=True)
    writer.shutdown()
    assert [(name, patch["status"]["scheduled"]) for _, name, patch in api.calls] == [(f"g{i}", i) for i in range(5)]


def _gang_state() -> ClusterState:
    state = ClusterState("hypertopo")
    state.apply("PodGroup", "ADDED", {"metadata": {"namespace": "ns", "name": "g", "resourceVersion": "1"},
                                      "spec": {"minMember": 2}})
    for i in range(2):
        state.apply("Pod", "ADDED", {
            "metadata": {"namespace": "ns", "name": f"p{i}", "uid": f"u{i}", "resourceVersion": "1",
                         "labels": {"scheduling.x-k8s.io/pod-group": "g"}},
            "spec": {"schedulerName": "hypertopo", "nodeName": "n1",
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Pending"}})
    return state


def test_write_dirty_defers_the_bound_gangs_status_and_writes_what_coscheduling_reports() -> None:
    state, api, busy = _gang_state(), RecordingApi(), threading.Event()
    busy.set()
    writer = StatusWriter(api, lambda target: None, busy=busy.is_set, max_delay=60.0, poll=0.005)
    state.dirty_gangs.add(("ns", "g"))
    writer.write_dirty(state, set())
    time.sleep(0.05)
    assert api.calls == [] and writer.pending() == 1  # deferred: binds pending
    busy.clear()
    assert wait_for(lambda: len(api.calls) == 1)
    (_, name, patch), = api.calls
    pods = podgroups.members_of(state, ("ns", "g"))
    wanted = podgroups.group_status(state.podgroups[("ns", "g")], pods, 2)
    assert name == "g" and wanted["phase"] == "Scheduled"
    expected = podgroups.status_patch(state.podgroups[("ns", "g")], wanted, patch["status"]["scheduleStartTime"])
    assert patch == expected == {"status": {"phase": "Scheduled", "scheduled": 2,
                                            "scheduleStartTime": patch["status"]["scheduleStartTime"]}}
    writer.shutdown()


class SlowBindApi:
    def __init__(self) -> None:
        self.release = threading.Event()

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.release.wait(5)

    def delete_pod(self, namespace: str, name: str, uid: str, *, grace_seconds: int | None = None) -> None:
        raise AssertionError("no rollback expected")


def test_the_binder_is_busy_from_submission_until_its_last_bind_returns() -> None:
    api, done = SlowBindApi(), threading.Event()
    outcomes: list[BindOutcome] = []
    binder = Binder(api, lambda outcome: (outcomes.append(outcome), done.set()), workers=1)
    assert not binder.busy()
    binder.submit(("ns", "g"), [BindItem(("ns", "a"), "u1", "n1"), BindItem(("ns", "b"), "u2", "n1")])
    assert binder.busy()
    api.release.set()
    assert done.wait(5)
    assert wait_for(lambda: not binder.busy())
    assert outcomes[0].ok and sorted(outcomes[0].bound) == [("ns", "a"), ("ns", "b")]
    binder.shutdown()
