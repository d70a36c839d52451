"""The XID watcher: events reach the callback and the probe's health, counts feed metrics."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_clock import FakeClock

from agent.common.report import Health
from agent.probes import nvml
from agent.probes.nvml_backend import NvmlError, XidEvent
from agent.probes.nvml_fake import FakeNvml


class Seen:
    """Collects callback events; `wait_for(n)` blocks until n arrived (no sleeps)."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int]] = []
        self._cond = threading.Condition()

    def __call__(self, gpu: int, xid: int) -> None:
        with self._cond:
            self.events.append((gpu, xid))
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 5.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.events) >= count, timeout), self.events


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml("hgx-h100")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def watcher(fake: FakeNvml, clock: FakeClock) -> Iterator[tuple[nvml.XidWatcher, Seen]]:
    seen = Seen()
    w = nvml.XidWatcher(fake, seen, poll_ms=50, clock=clock)
    assert w.start()
    yield w, seen
    w.stop()


def test_xid_79_reaches_the_callback_and_fails_the_gpu(
    fake: FakeNvml, watcher: tuple[nvml.XidWatcher, Seen]
) -> None:
    w, seen = watcher
    fake.inject_xid(2, 79)
    seen.wait_for(1)
    assert seen.events == [(2, 79)]
    result = nvml.probe(fake, sysfs=Path("/nonexistent"), xids=w.recent())
    assert result.health.state == Health.FAILED and result.value is not None
    assert result.value.gpus[2].health.state == Health.FAILED
    assert "GPU 2 (00000000:3A:00.0): XID 79 (GPU has fallen off the bus)" in result.health.reason


def test_counts_are_cumulative_and_recent_forgets_old_events(
    fake: FakeNvml, clock: FakeClock, watcher: tuple[nvml.XidWatcher, Seen]
) -> None:
    w, seen = watcher
    fake.inject_xid(0, 74)
    fake.inject_xid(0, 74)
    seen.wait_for(2)
    clock.now += 7200  # two hours later
    fake.inject_xid(5, 13)
    seen.wait_for(3)
    assert w.counts() == {0: {74: 2}, 5: {13: 1}}
    assert w.recent(window_s=3600) == {5: {13: 1}}
    healthy = nvml.probe(fake, sysfs=Path("/nonexistent"), xids=w.recent(window_s=3600))
    assert healthy.health.state == Health.OK  # XID 13 is an application fault, NVLink XID is old


def test_a_failing_callback_does_not_stop_the_watcher(fake: FakeNvml) -> None:
    seen = Seen()

    def callback(gpu: int, xid: int) -> None:
        seen(gpu, xid)
        raise RuntimeError("consumer bug")

    w = nvml.XidWatcher(fake, callback, poll_ms=50)
    assert w.start()
    try:
        fake.inject_xid(1, 94)
        fake.inject_xid(1, 95)
        seen.wait_for(2)
        assert w.counts() == {1: {94: 1, 95: 1}}
    finally:
        w.stop()


def test_registration_refused_by_nvml_is_reported_not_raised(fake: FakeNvml) -> None:
    fake.fail("register_xid_events", "NOT_SUPPORTED")
    w = nvml.XidWatcher(fake, Seen())
    assert w.start() is False
    assert w.error == "nvmlDeviceRegisterEvents: NOT_SUPPORTED"
    w.stop()  # stopping a watcher that never ran is harmless


def test_wait_errors_are_counted_and_the_watcher_keeps_going() -> None:
    class Flaky(FakeNvml):
        def __init__(self) -> None:
            super().__init__("hgx-h100")
            self.failures_left = 1

        def wait_xid(self, timeout_ms: int) -> XidEvent | None:
            if self.failures_left:
                self.failures_left -= 1
                raise NvmlError("nvmlEventSetWait", "UNKNOWN")
            return super().wait_xid(timeout_ms)

    flaky = Flaky()
    seen = Seen()
    w = nvml.XidWatcher(flaky, seen, poll_ms=50, backoff_s=0.01)
    assert w.start()
    try:
        flaky.inject_xid(3, 48)
        seen.wait_for(1, timeout=5.0)
        assert w.wait_errors == 1 and w.error == "nvmlEventSetWait: UNKNOWN"
    finally:
        w.stop()


def test_stop_ends_the_thread_promptly(fake: FakeNvml) -> None:
    w = nvml.XidWatcher(fake, Seen(), poll_ms=50)
    assert w.start()
    w.stop(timeout=2.0)
    assert not any(t.name == "xid-watcher" and t.is_alive() for t in threading.enumerate())
