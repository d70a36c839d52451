"""The scheduler's event recorder: a repeat of the same (object, reason, message) within
`repeat_seconds` is not written again, and what it remembers to tell repeats apart is dropped once
older than that, so a scheduler that binds pods for months does not keep an entry per pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggregator.placement.live.events import EventRecorder


class Posted:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.events.append(dict(event))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(i: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"p{i}", "uid": f"uid-{i}"}}


def test_a_repeat_within_the_interval_is_not_written_and_one_after_it_is() -> None:
    api, clock = Posted(), Clock()
    recorder = EventRecorder(api, "sched", repeat_seconds=300.0, clock=clock)
    assert recorder.record(pod(1), reason="FailedScheduling", message="no room")
    clock.now += 299.0
    assert not recorder.record(pod(1), reason="FailedScheduling", message="no room")
    assert recorder.record(pod(1), reason="FailedScheduling", message="other reason")
    clock.now += 1.0
    assert recorder.record(pod(1), reason="FailedScheduling", message="no room")
    recorder.shutdown()
    assert [e["message"] for e in api.events] == ["no room", "other reason", "no room"]


def test_scheduled_events_of_many_pods_are_forgotten_after_the_interval() -> None:
    api, clock = Posted(), Clock()
    recorder = EventRecorder(api, "sched", repeat_seconds=300.0, clock=clock)
    for i in range(1000):
        recorder.scheduled([(pod(i), "node-a")], [])
        clock.now += 0.1
    assert recorder.remembered() == 1000  # all within the last 300 s: each may still suppress a repeat
    clock.now += 300.0
    recorder.scheduled([(pod(1000), "node-b")], [])
    assert recorder.remembered() == 1  # the 1000 older ones suppress nothing more
    recorder.shutdown()
    assert len(api.events) == 1001
    last = api.events[-1]
    assert (last["reason"], last["type"], last["message"]) == (
        "Scheduled", "Normal", "Successfully assigned ns/p1000 to node-b",
    )
    assert last["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p1000", "namespace": "ns",
                                      "uid": "uid-1000"}  # fmt: skip


def test_a_podgroup_gets_volcanos_scheduled_message_with_its_api_version() -> None:
    api = Posted()
    recorder = EventRecorder(api, "sched", clock=Clock())
    group = {"metadata": {"namespace": "ns", "name": "g", "uid": "g-uid"}}
    recorder.scheduled([], [(group, "scheduling.volcano.sh/v1beta1")])
    recorder.shutdown()
    [event] = api.events
    assert (event["reason"], event["type"], event["message"]) == ("Scheduled", "Normal", "pod group is ready")
    assert event["involvedObject"]["kind"] == "PodGroup"
    assert event["involvedObject"]["apiVersion"] == "scheduling.volcano.sh/v1beta1"
