"""Grey failures seen by the real probes: recorded counter sequences written into a copy of the
HGX H100 fixture tree (and a real H100 node's sysfs capture) drive the agent's probe cycle on a
fake clock; the NodeTopology carries each finding with value, threshold and window, and an
unchanged grey state serialises to the same object (no API write)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from agent_host import HGX_SYSFS, LINKS, NODE
from fake_clock import FakeClock

from agent.collect import PROBES, CollectConfig, Prober
from agent.common.report import ComponentHealth, Finding, Health, report_spec
from agent.probes import rdma
from agent.probes.grey import CounterWindow, GreyConfig, RateLimit, fold, latch, parse_limit
from agent.probes.link_training import ib_findings, max_mode_mbps
from agent.probes.net import LinkRecord
from agent.probes.nvlink_health import decode_health_mask, encode_health_mask
from agent.probes.nvml_fake import FakeNvml

PORT = Path("class/infiniband/mlx5_3/ports/1")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(HGX_SYSFS, root, symlinks=True)
    return root


def prober(sysfs: Path, clock: FakeClock, *, links=LINKS, grey: GreyConfig | None = None, nvml=None):  # type: ignore[no-untyped-def]
    """A prober on the fake HGX node; `links` is the link dump, or a callable giving the current one."""
    config = CollectConfig(NODE, sysfs=sysfs, grey=grey or GreyConfig())
    return Prober(
        config, links=links if callable(links) else lambda: links, nvml_backend=nvml or FakeNvml("hgx-h100"),
        clock=clock, link_modes=lambda name: [],
    )  # fmt: skip


def write(root: Path, rel: Path | str, value: object) -> None:
    (root / rel).write_text(f"{value}\n")


def findings(report, kind: str) -> list[Finding]:  # type: ignore[no-untyped-def]
    return [f for f in report.findings if f.kind == kind]


# --- error rates ---------------------------------------------------------------------------------


def test_symbol_errors_climbing_degrade_then_fail_the_port_with_value_threshold_and_window(
    host: Path,
) -> None:
    clock = FakeClock()
    p = prober(host, clock)
    readings = [0, 0, 1000, 2500, 4000, 40000, 80000]  # every 60 s: 0, 1000, 1500, 1500, 36000, 40000 /min
    states = []
    for reading in readings:
        write(host, PORT / "counters" / "symbol_error", reading)
        report = p.collect()
        states.append(report.health["rdma"].state)
        clock.now += 60
    # 300 s window: 1000 errors over 120 s seen -> 500/min (ok, threshold 600/min); then 2500/180 s
    # -> 833/min degraded; ...; 80000 in the window -> far above 6000/min: failed.
    assert states[:3] == [Health.OK, Health.OK, Health.OK]
    assert states[3] is Health.DEGRADED and states[-1] is Health.FAILED
    (finding,) = findings(report, "error-rate")
    assert finding.subject == "mlx5_3/1" and finding.component == "rdma" and finding.severity is Health.FAILED
    assert finding.threshold == "> 6000/min" and finding.window_s == 300
    assert finding.value.startswith("symbol_error ") and finding.value.endswith("/min")
    assert "mlx5_3/1: symbol_error" in report.health["rdma"].reason


def test_an_unchanged_grey_state_serialises_to_the_same_object_while_the_rate_wanders(host: Path) -> None:
    clock = FakeClock()
    p = prober(host, clock)
    specs, total = [], 0
    for step, increment in enumerate((0, 1000, 1100, 1200, 1000, 1300)):
        total += increment
        write(host, PORT / "counters" / "symbol_error", total)
        report = p.collect()
        if step >= 2:
            specs.append(report_spec(report))
        clock.now += 60
    assert report.health["rdma"].state is Health.DEGRADED
    assert all(spec == specs[0] for spec in specs)  # the rate moved; the object did not


def test_a_counter_reset_counts_from_zero_and_does_not_look_like_a_burst(host: Path) -> None:
    clock = FakeClock()
    p = prober(host, clock)
    for reading in (50000, 50000, 3):  # driver reload between the 2nd and 3rd reading
        write(host, PORT / "counters" / "symbol_error", reading)
        report = p.collect()
        clock.now += 60
    assert report.health["rdma"].state is Health.OK and not report.findings
    window = CounterWindow(300)
    for t, reading in ((0, 65535), (60, 10)):  # a 16-bit counter wrapped: 10 since the wrap
        window.add(t, reading)
    assert window.increments() == 10


def test_one_link_downed_degrades_and_the_finding_clears_when_the_window_passes(host: Path) -> None:
    clock = FakeClock()
    p = prober(host, clock)
    write(host, PORT / "counters" / "link_downed", 0)
    p.collect()
    clock.now += 30
    write(host, PORT / "counters" / "link_downed", 1)
    assert p.collect().health["rdma"].state is Health.DEGRADED
    clock.now += 301
    report = p.collect()
    assert report.health["rdma"].state is Health.OK and report.findings == ()


def test_hw_counters_are_watched_too(host: Path) -> None:
    clock = FakeClock()
    p = prober(host, clock)
    for reading in (0, 0, 5):
        write(host, PORT / "hw_counters" / "rnr_nak_retry_err", reading)
        report = p.collect()
        clock.now += 60
    assert [f.value.split()[0] for f in findings(report, "error-rate")] == ["rnr_nak_retry_err"]


def test_a_hard_failure_stays_failed_with_the_findings_added_to_its_reason() -> None:
    failed = ComponentHealth(Health.FAILED, "mlx5_2/1 DOWN")
    grey = Finding("rdma", "mlx5_3/1", "error-rate", Health.DEGRADED, "x", "y", 300, "mlx5_3/1 errors")
    assert fold(failed, [grey]) == ComponentHealth(Health.FAILED, "mlx5_2/1 DOWN; mlx5_3/1 errors")
    assert fold(ComponentHealth(Health.OK), [grey]) == ComponentHealth(Health.DEGRADED, "mlx5_3/1 errors")


def test_the_latch_keeps_the_first_value_until_the_severity_changes() -> None:
    first = Finding("rdma", "mlx5_3/1", "error-rate", Health.DEGRADED, "700/min", "> 600/min", 300, "a")
    wander = dataclasses.replace(first, value="800/min", reason="b")
    worse = dataclasses.replace(first, severity=Health.FAILED, value="7000/min", reason="c")
    assert latch([first], [wander]) == (first,)
    assert latch([first], [worse]) == (worse,)
    assert latch([first], []) == ()


# --- link training -------------------------------------------------------------------------------


def test_a_port_trained_at_half_rate_is_degraded_with_the_numbers_in_the_reason(host: Path) -> None:
    write(host, PORT / "rate", "200 Gb/sec (2X NDR)")
    report = prober(host, FakeClock()).collect()
    (finding,) = findings(report, "link-training")
    assert (finding.subject, finding.value, finding.threshold) == ("mlx5_3/1", "200 Gb/s", "400 Gb/s")
    assert "200 Gb/sec (2X NDR)" in finding.reason and "7 MT4129 ports" in finding.reason
    assert report.health["rdma"].state is Health.DEGRADED


def test_a_real_h100_node_capture_trains_uniformly_and_its_roce_bond_is_another_model(
    shared_data: Path, tmp_path: Path
) -> None:
    capture = shared_data / "sysfs" / "gpud-h100-infiniband" / "sys-class-infiniband-h100.0"
    devices = rdma.probe_class_dir(capture).value or ()
    assert ib_findings(devices, capture) == []  # 8 ConnectX-7 at 400, the 200G bond is an MT41692
    copy = tmp_path / "infiniband"
    shutil.copytree(capture, copy, symlinks=True)
    (copy / "mlx5_6" / "ports" / "1" / "rate").write_text("200 Gb/sec (2X NDR)\n")
    (found,) = ib_findings(rdma.probe_class_dir(copy).value or (), copy)
    assert found.subject == "mlx5_6/1" and "7 MT4129 ports" in found.reason


def test_an_ethernet_nic_below_its_fastest_link_mode_is_degraded(host: Path) -> None:
    modes = {"eno1": ["25000baseCR/Full", "100000baseCR4/Full", "10000baseT/Full"]}
    write(host, "class/net/eno1/speed", "25000")
    config = CollectConfig(NODE, sysfs=host)
    p = Prober(
        config, links=lambda: LINKS, nvml_backend=FakeNvml("hgx-h100"), link_modes=lambda n: modes.get(n, [])
    )
    report = p.collect()
    (finding,) = findings(report, "link-training")
    assert (finding.component, finding.subject, finding.value, finding.threshold) == (
        "net",
        "eno1",
        "25 Gb/s",
        "100 Gb/s",
    )
    assert report.health["net"].state is Health.DEGRADED
    assert max_mode_mbps(["400000baseCR4/Full", "junk"]) == 400000 and max_mode_mbps([]) is None


# --- flapping ------------------------------------------------------------------------------------


def eno1(changes: int) -> tuple[LinkRecord, ...]:
    return tuple(dataclasses.replace(r, carrier_changes=changes) if r.name == "eno1" else r for r in LINKS)


def net_timeline(host: Path, grey: GreyConfig, steps: list[tuple[int, int]]) -> list[tuple[int, Health]]:
    """One prober's net health at each step (seconds from the start, eno1's carrier_changes then)."""
    clock = FakeClock()
    current = {"links": eno1(steps[0][1])}
    p = prober(host, clock, links=lambda: current["links"], grey=grey)
    timeline = []
    for at, changes in steps:
        clock.now = 1000.0 + at
        current["links"] = eno1(changes)
        timeline.append((at, p.collect().health["net"].state))
    return timeline


def test_a_flapping_carrier_is_degraded_held_down_after_the_last_flap_then_recovers(host: Path) -> None:
    grey = GreyConfig(flap_window_s=600, flap_limit=2, flap_hold_down_s=300)
    timeline = net_timeline(host, grey, [(0, 1), (10, 3), (20, 5), (400, 5), (650, 5), (730, 5)])
    # +2 at 10 s (one down-up): not more than 2; +2 more at 20 s: 4 changes in the window: flapping.
    # 400 s: window still holds them; 650 s: the window dropped them but the hold-down (300 s after
    # the last change at 20 s... ended at 320 s) -> recovered at the first quiet look past both.
    assert timeline[:3] == [(0, Health.OK), (10, Health.OK), (20, Health.DEGRADED)]
    assert timeline[3] == (400, Health.DEGRADED)
    assert timeline[4:] == [(650, Health.OK), (730, Health.OK)]


def test_the_hold_down_keeps_a_link_degraded_after_the_window_forgets_its_flaps(host: Path) -> None:
    grey = GreyConfig(flap_window_s=60, flap_limit=2, flap_hold_down_s=600)
    states = [state for _, state in net_timeline(host, grey, [(0, 0), (10, 6), (100, 6), (500, 6), (611, 6)])]
    assert states == [Health.OK, Health.DEGRADED, Health.DEGRADED, Health.DEGRADED, Health.OK]


def test_an_rdma_port_bouncing_between_active_and_down_is_flapping(host: Path) -> None:
    clock = FakeClock()
    p = prober(host, clock)
    for state in ("4: ACTIVE", "1: DOWN", "4: ACTIVE", "1: DOWN", "4: ACTIVE"):
        write(host, PORT / "state", state)
        report = p.collect()
        clock.now += 20
    assert [f.subject for f in findings(report, "flapping")] == ["mlx5_3/1"]
    assert report.health["rdma"].state is Health.DEGRADED


# --- PCIe ----------------------------------------------------------------------------------------


def test_an_hca_whose_pcie_link_fell_to_gen4_x8_degrades_pcie(host: Path) -> None:
    device = host / "class" / "infiniband" / "mlx5_5" / "device"
    (device / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (device / "current_link_width").write_text("8\n")
    report = prober(host, FakeClock()).collect()
    (finding,) = findings(report, "pcie-link")
    assert finding.component == "pcie" and finding.subject.startswith("mlx5_5 0000:")
    assert (finding.value, finding.threshold) == ("16 GT/s x8", "32 GT/s x16")
    assert report.health["pcie"].state is Health.DEGRADED and report.health["rdma"].state is Health.OK


def test_pcie_is_healthy_on_the_fixture_host_and_absent_without_link_attributes(
    host: Path, tmp_path: Path
) -> None:
    assert prober(host, FakeClock()).collect().health["pcie"].state is Health.OK
    for attr in host.glob("devices/**/current_link_speed"):
        attr.unlink()
    assert prober(host, FakeClock()).collect().health["pcie"].state is Health.ABSENT


# --- NVLink --------------------------------------------------------------------------------------


def test_nvlink_replays_climbing_on_one_link_degrade_that_gpu(host: Path) -> None:
    clock, fake = FakeClock(), FakeNvml("hgx-h100")
    p = prober(host, clock, nvml=fake)
    for replays in (0, 0, 50):
        fake.set_link_errors(4, 11, replay=replays)
        report = p.collect()
        clock.now += 60
    (finding,) = findings(report, "nvlink-errors")
    assert (finding.component, finding.subject, finding.threshold) == ("nvml", "gpu4/nvlink11", "> 10/min")
    assert report.health["nvml"].state is Health.DEGRADED


def test_the_fabric_health_mask_is_decoded_into_reasons(host: Path) -> None:
    fake = FakeNvml("gb200-nvl72")
    fake.set_fabric_health(2, degraded_bw=True)
    fake.set_fabric_health(3, route_unhealthy=True, route_recovery=True)
    report = prober(host, FakeClock(), nvml=fake).collect()
    got = {(f.subject, f.severity, f.reason.split(" (")[0]) for f in findings(report, "fabric-health")}
    assert got == {
        ("gpu2", Health.DEGRADED, "gpu2: NVLink fabric bandwidth degraded"),
        ("gpu3", Health.DEGRADED, "gpu3: NVLink fabric route recovery in progress"),
        ("gpu3", Health.FAILED, "gpu3: NVLink fabric route unhealthy"),
    }
    assert report.health["nvml"].state is Health.FAILED


def test_health_mask_fields_follow_nvml_h() -> None:
    # NVML_GPU_FABRIC_HEALTH_MASK_*: 2-bit fields at shifts 0, 2, 4, 6; TRUE 1, FALSE 2, 0 not supported
    assert decode_health_mask(0b10101010) == [] and decode_health_mask(0) == []
    assert [name for name, _, _ in decode_health_mask(0b01 << 6)] == ["access_timeout_recovery"]
    assert encode_health_mask(0b10101010, degraded_bw=True) == 0b10101001


# --- the probe list ------------------------------------------------------------------------------


def test_a_broken_probe_module_fails_that_probe_only(host: Path) -> None:
    config = CollectConfig(NODE, sysfs=host)
    p = Prober(config, links=lambda: LINKS, nvml_backend=FakeNvml("hgx-h100"), link_modes=lambda n: [],
               probes=(*PROBES, ("agent.probes.no_such_probe", "GhostProbe")))  # fmt: skip
    report = p.collect()
    assert p.latest is not None and p.latest.stats["ghost"].success is False
    assert "no_such_probe" in p.latest.stats["ghost"].error
    assert {h.state for h in report.health.values()} == {Health.OK}


def test_limits_parse_from_the_command_line_form() -> None:
    assert parse_limit("symbol_error=60:600") == ("symbol_error", RateLimit(60, 600))
    assert parse_limit("link_downed=0") == ("link_downed", RateLimit(0, 10))
    for bad in ("symbol_error", "x=a", "x=5:1"):
        with pytest.raises(ValueError, match="COUNTER=DEGRADED"):
            parse_limit(bad)


def test_the_cli_flags_set_windows_and_per_counter_limits() -> None:
    from agent.cli import _collect_config, build_parser

    args = build_parser().parse_args(
        ["probe", "--error-window", "120", "--error-limit", "symbol_error=60:600", "--error-limit", "replay=1",
         "--flap-limit", "4", "--flap-hold-down", "30"]
    )  # fmt: skip
    grey = _collect_config(args, "n1").grey
    assert grey.error_window_s == 120 and grey.flap_limit == 4 and grey.flap_hold_down_s == 30
    assert grey.error_limits["symbol_error"] == RateLimit(60, 600)
    assert grey.nvlink_limits["replay"] == RateLimit(1, 10) and "replay" not in grey.error_limits
    assert grey.error_limits["link_error_recovery"] == RateLimit(5, 50)  # the others keep their defaults


def test_the_real_nvml_capture_script_records_fabric_health_pcie_and_counters(host: Path) -> None:
    """tests/gpu/run_real_nvml.py's grey part, run here over the fake (no GPU in CI): ready for
    a GPU machine."""
    import importlib.util

    script = Path(__file__).parent.parent / "gpu" / "run_real_nvml.py"
    spec = importlib.util.spec_from_file_location("run_real_nvml", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fake = FakeNvml("gb200-nvl72")
    fake.set_fabric_health(1, degraded_bw=True)
    got = module.grey_capture(fake, host, 0.0)
    assert got["gpus"][1]["health_mask_true"] == ["degraded_bw"]
    assert set(got["gpus"][0]["pcie"]) == {"bdf", *module.PCIE_ATTRS}
    assert [f["kind"] for f in got["findings"]] == ["fabric-health"]
    assert got["health"]["nvml"]["state"] == "degraded"


def test_a_completed_registration_in_clique_0_is_not_an_nvlink_domain(host: Path) -> None:
    placed = prober(host, FakeClock(), nvml=FakeNvml("gb200-nvl72")).collect()
    assert placed.nvml is not None and placed.nvml.domain is not None and placed.nvml.domain.clique_id != 0
    unplaced = prober(host, FakeClock(), nvml=FakeNvml("gb200-nvl72", clique_id=0)).collect()
    assert unplaced.nvml is not None and unplaced.nvml.domain is None
    assert unplaced.summary().nvlink_domain == ""


def test_degraded_gauges_carry_the_labels_of_the_health_metrics(host: Path) -> None:
    from prometheus_client import CollectorRegistry

    from agent.metrics import AgentMetrics

    write(host, PORT / "rate", "200 Gb/sec (2X NDR)")
    fake = FakeNvml("gb200-nvl72")
    fake.set_fabric_health(1, degraded_bw=True)
    p = prober(host, FakeClock(), nvml=fake)
    p.collect()
    registry = CollectorRegistry()
    registry.register(AgentMetrics(lambda: p.latest))
    port = {"device": "mlx5_3", "port": "1", "link_layer": "InfiniBand", "netdev": "ib3"}
    assert registry.get_sample_value("hypertopo_rdma_port_degraded", port) == 1
    assert (
        registry.get_sample_value(
            "hypertopo_rdma_port_degraded", port | {"device": "mlx5_2", "netdev": "ib2"}
        )
        == 0
    )
    assert registry.get_sample_value("hypertopo_component_degraded", {"component": "rdma"}) == 1
    assert registry.get_sample_value("hypertopo_component_degraded", {"component": "pcie"}) == 0
    gpu1 = [
        s for m in registry.collect() if m.name == "hypertopo_gpu_degraded" for s in m.samples if s.value == 1
    ]
    assert [s.labels["gpu"] for s in gpu1] == ["1"] and set(gpu1[0].labels) == {
        "gpu",
        "UUID",
        "pci_bus_id",
        "Hostname",
    }
    finding = {"component": "nvml", "subject": "gpu1", "kind": "fabric-health", "severity": "degraded"}
    assert registry.get_sample_value("hypertopo_grey_finding", finding) == 1
