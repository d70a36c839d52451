"""The NVML probe's link cache: later cycles skip only the calls whose answers cannot have changed,
and report exactly what a probe without the cache reports."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from agent.common.report import NvmlReport
from agent.probes import nvml
from agent.probes.nvml_fake import FakeNvml

NO_SYSFS = Path("/nonexistent-sysfs")
FACT_CALLS = ("link_version", "link_remote_type", "link_remote_pci_bus_id")


class Counting:
    """Forwards to a fake NVML and counts each backend call by method, and by (method, link)."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake
        self.max_links = fake.max_links
        self.calls: collections.Counter[str] = collections.Counter()
        self.link_calls: collections.Counter[tuple[str, int, int]] = collections.Counter()

    def __getattr__(self, method: str) -> Any:
        target = getattr(self.fake, method)

        def call(*args: Any) -> Any:
            self.calls[method] += 1
            if method.startswith("link_"):
                self.link_calls[(method, args[0].index, args[1])] += 1
            return target(*args)

        return call

    def reset(self) -> None:
        self.calls.clear()
        self.link_calls.clear()


def cycle(backend: Any, cache: nvml.LinkCache | None, now: float) -> NvmlReport:
    result = nvml.probe(backend, sysfs=NO_SYSFS, cache=cache, now=now)
    assert result.value is not None
    return result.value


@pytest.mark.parametrize("profile", ["hgx-h100", "gb200-nvl72"])
def test_cached_cycles_report_what_uncached_ones_do_with_fewer_calls(profile: str) -> None:
    fake = FakeNvml(profile)
    fake.set_link(1, 4, up=False)
    counting, cache = Counting(fake), nvml.LinkCache()
    first = 0
    for step in range(3):
        counting.reset()
        fake.set_link_errors(0, 3, replay=step * 7, crc_flit=step)
        cached = nvml.probe(counting, sysfs=NO_SYSFS, cache=cache, now=10.0 * step)  # type: ignore[arg-type]
        plain = nvml.probe(fake, sysfs=NO_SYSFS)
        assert cached == plain
        assert (
            cached.value is not None and cached.value.gpus[0].nvlinks[3].error_counters["replay"] == step * 7
        )
        if step == 0:
            first = sum(counting.calls.values())
    later = sum(counting.calls.values())  # the third cycle
    assert later < first * 0.7
    assert counting.calls["link_remote_type"] == 0 and counting.calls["link_remote_pci_bus_id"] == 0
    assert counting.calls["link_version"] == 1  # only the down link: a down link's facts are not kept
    assert counting.calls["link_error_counter"] == 4 * (fake.gpus * 18 - 1)  # counters: every cycle
    assert counting.calls["link_state"] == fake.gpus * 18  # no asking for links that do not exist


def test_a_link_that_was_down_is_asked_again_when_it_comes_back() -> None:
    fake = FakeNvml("hgx-h100")
    counting, cache = Counting(fake), nvml.LinkCache()
    cycle(counting, cache, 0.0)
    fake.set_link(2, 5, up=False)
    cycle(counting, cache, 10.0)
    fake.set_link(2, 5, up=True)
    counting.reset()
    report = cycle(counting, cache, 20.0)
    asked = {key for key in counting.link_calls if key[0] in FACT_CALLS}
    assert asked == {(m, 2, 5) for m in FACT_CALLS}
    assert report.gpus[2].nvlinks[5].remote_type == "nvswitch" and report.gpus[2].nvlinks[5].state == "up"


def test_a_failing_fact_call_is_asked_and_reported_every_cycle() -> None:
    fake = FakeNvml("hgx-h100")
    fake.fail("link_remote_type", "UNKNOWN", gpu=1)
    counting, cache = Counting(fake), nvml.LinkCache()
    for now in (0.0, 10.0):
        counting.reset()
        gpu = cycle(counting, cache, now).gpus[1]
        assert gpu.health.reason.endswith("nvmlDeviceGetNvLinkRemoteDeviceType: UNKNOWN (18 times)")
        assert (
            sum(n for (m, g, _), n in counting.link_calls.items() if m == "link_remote_type" and g == 1) == 18
        )
    fake.heal()
    assert cycle(counting, cache, 20.0).gpus[1].nvlinks[0].remote_type == "nvswitch"


def test_everything_is_asked_again_after_the_refresh_period() -> None:
    fake = FakeNvml("hgx-h100")
    counting, cache = Counting(fake), nvml.LinkCache(refresh_s=60.0)
    cycle(counting, cache, 0.0)
    first = counting.calls.copy()
    counting.reset()
    cycle(counting, cache, 59.0)
    assert counting.calls["link_version"] == 0
    counting.reset()
    cycle(counting, cache, 60.0)
    assert counting.calls == first


def test_a_different_gpu_in_the_same_slot_is_asked_afresh() -> None:
    cache = nvml.LinkCache()
    cycle(Counting(FakeNvml("hgx-h100", node="a")), cache, 0.0)
    swapped = Counting(FakeNvml("hgx-h100", node="b"))  # same bus ids, other GPU UUIDs
    cycle(swapped, cache, 10.0)
    assert swapped.calls["link_version"] == 8 * 18
    assert swapped.calls["link_state"] == 8 * 36
