"""One probe cycle: every probe timed and isolated; a raising probe is that component's failure with
the exception text, never the agent's; the report carries every component's health."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from agent_host import HGX_SYSFS, LINKS, NODE, fixture_prober

from agent.collect import CollectConfig, ConfigError, Prober, check_nvml_mode, failed_components, timed
from agent.common.report import COMPONENTS, Health, ProbeResult
from agent.probes.nvml_fake import FakeNvml


def test_fixture_host_reports_every_component_healthy() -> None:
    report = fixture_prober().collect()
    assert set(report.health) == set(COMPONENTS)
    assert {h.state for h in report.health.values()} == {Health.OK}
    assert report.nvml is not None and len(report.nvml.gpus) == 8
    assert len(report.rdma) == 8 and [i.name for i in report.interfaces][:2] == ["eno1", "ib0"]
    assert [(n.interface, n.system_name) for n in report.lldp] == [("eno1", "leaf-a1")]


def test_an_exception_in_one_probe_fails_only_that_component_with_its_text() -> None:
    def broken_links() -> list[object]:
        raise OSError(105, "No buffer space available")

    prober = Prober(
        CollectConfig(NODE, sysfs=HGX_SYSFS), links=broken_links, nvml_backend=FakeNvml("hgx-h100")
    )
    report = prober.collect()
    assert report.health["net"].state is Health.FAILED
    assert "OSError" in report.health["net"].reason and "No buffer space" in report.health["net"].reason
    assert report.health["nvml"].state is Health.OK and report.health["rdma"].state is Health.OK
    assert failed_components(report) == ["net"]
    assert prober.latest is not None
    assert prober.latest.stats["net"].success is False and prober.latest.stats["rdma"].success is True


def test_a_backend_whose_calls_raise_odd_exceptions_fails_nvml_only() -> None:
    class Exploding:
        def __getattr__(self, name: str) -> object:
            raise RuntimeError(f"binding bug in {name}")

    prober = Prober(CollectConfig(NODE, sysfs=HGX_SYSFS), links=lambda: LINKS, nvml_backend=Exploding())
    report = prober.collect()
    assert report.health["nvml"].state is Health.FAILED
    assert "binding bug" in report.health["nvml"].reason
    assert report.health["rdma"].state is Health.OK and len(report.interfaces) == 9


def test_an_unknown_fake_profile_is_the_nvml_component_failing_not_a_crash() -> None:
    prober = Prober(CollectConfig(NODE, sysfs=HGX_SYSFS, nvml="fake:dgx-z9"), links=lambda: LINKS)
    report = prober.collect()
    assert report.health["nvml"].state is Health.FAILED
    assert "dgx-z9" in report.health["nvml"].reason


def test_nvml_off_is_absent_and_not_a_failure(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()  # a sysfs without RDMA devices
    prober = Prober(CollectConfig(NODE, sysfs=tmp_path, nvml="off"), links=lambda: ())
    report = prober.collect()
    assert report.health["nvml"].state is Health.ABSENT
    assert report.health["rdma"].state is Health.ABSENT
    assert failed_components(report) == []
    assert report.overall_health() is Health.OK


def test_interface_regex_limits_the_interfaces_reported() -> None:
    prober = fixture_prober()
    prober.config = CollectConfig(NODE, sysfs=HGX_SYSFS, interfaces=re.compile(r"^ib[0-3]$"))
    assert [i.name for i in prober.collect().interfaces] == ["ib0", "ib1", "ib2", "ib3"]


def test_a_link_set_down_in_the_fake_changes_the_report() -> None:
    fake = FakeNvml("hgx-h100")
    prober = fixture_prober(fake)
    before = prober.collect()
    fake.set_link(0, 3, up=False)
    after = prober.collect()
    assert before != after
    assert after.nvml is not None and after.nvml.gpus[0].nvlinks[3].state == "down"
    assert after.health["nvml"].state is Health.DEGRADED


def test_timed_measures_duration_and_turns_exceptions_into_failed_results() -> None:
    def boom() -> ProbeResult[int]:
        raise ValueError("garbled\nsecond line")

    result, stat = timed("x", boom)
    assert result.health.state is Health.FAILED and result.health.reason == "probe raised ValueError: garbled"
    assert stat.success is False and stat.duration_seconds >= 0
    ok, ok_stat = timed("y", lambda: ProbeResult.absent("none here"))
    assert ok.health.state is Health.ABSENT and ok_stat.success is True


@pytest.mark.parametrize("mode", ["auto", "off", "fake:hgx-h100", "fake:gb200-nvl72"])
def test_nvml_modes_accepted(mode: str) -> None:
    assert check_nvml_mode(mode) == mode


@pytest.mark.parametrize("mode", ["", "on", "fake:", "fake", "AUTO"])
def test_nvml_modes_rejected(mode: str) -> None:
    with pytest.raises(ConfigError, match="auto, off or fake:PROFILE"):
        CollectConfig(NODE, nvml=mode)


def test_negative_lldp_wait_is_rejected() -> None:
    with pytest.raises(ConfigError, match="lldp-wait"):
        CollectConfig(NODE, lldp_wait=-1)
