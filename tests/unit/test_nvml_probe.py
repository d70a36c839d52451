"""The NVML probe over the deterministic fakes: what each machine reports, and how faults show."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from agent.common.report import (
    GpuFabric,
    Health,
    NodeReport,
    NvLinkDomain,
    NvmlReport,
    ProbeResult,
    report_from_spec,
    report_spec,
)
from agent.probes import nvml
from agent.probes.nvml_fake import DEFAULT_CLUSTER_UUID, FakeNvml

NO_SYSFS = Path("/nonexistent-sysfs")


def run(fake: FakeNvml | None, **kwargs: object) -> ProbeResult[NvmlReport]:
    return nvml.probe(fake, sysfs=NO_SYSFS, **kwargs)  # type: ignore[arg-type]


def test_hgx_h100_reports_eight_gpus_with_eighteen_nvlink4_links_to_four_nvswitches() -> None:
    result = run(FakeNvml("hgx-h100"))
    assert result.health.state == Health.OK and result.value is not None
    report = result.value
    assert report.driver_version == "565.57.01"
    assert [g.name for g in report.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    for gpu in report.gpus:
        assert len(gpu.nvlinks) == 18
        assert {link.state for link in gpu.nvlinks} == {"up"}
        assert {link.version for link in gpu.nvlinks} == {4}
        assert {link.remote_type for link in gpu.nvlinks} == {"nvswitch"}
        switches = collections.Counter(link.remote_pci_bus_id for link in gpu.nvlinks)
        # 18 links spread 5/4/4/5 over the board's four NVSwitches
        assert switches == {f"00000000:0{b}:00.0": n for b, n in ((5, 5), (6, 4), (7, 4), (8, 5))}
        assert gpu.fabric is None  # HGX H100: no multi-node fabric, NOT_SUPPORTED is not an error
    assert [g.numa_node for g in report.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert report.domain is None
    assert len({g.uuid for g in report.gpus}) == 8


def test_gb200_tray_is_one_nvlink_domain_with_the_configured_clique() -> None:
    result = run(FakeNvml("gb200-nvl72", cluster_uuid="11111111-2222-3333-4444-555555555555", clique_id=7))
    assert result.health.state == Health.OK and result.value is not None
    report = result.value
    assert len(report.gpus) == 4
    assert all(len(g.nvlinks) == 18 and {link.version for link in g.nvlinks} == {5} for g in report.gpus)
    # switch trays are not on this tray's PCI bus: the remote bus id is absent, not invented
    assert all(link.remote_pci_bus_id is None for g in report.gpus for link in g.nvlinks)
    assert report.domain == NvLinkDomain("11111111-2222-3333-4444-555555555555", 7, "completed")


def test_gb200_default_clique_is_fixed_so_eighteen_trays_agree() -> None:
    domains = {run(FakeNvml("gb200-nvl72", node=f"tray{i}")).value.domain for i in range(18)}  # type: ignore[union-attr]
    assert len(domains) == 1
    (domain,) = domains
    assert domain is not None and domain.cluster_uuid == DEFAULT_CLUSTER_UUID


def test_gpu_uuids_differ_between_nodes_but_are_stable_for_one_node() -> None:
    def uuids(node: str) -> list[str]:
        return [g.uuid for g in run(FakeNvml("hgx-h100", node=node)).value.gpus]  # type: ignore[union-attr]

    assert uuids("a") == uuids("a")
    assert not set(uuids("a")) & set(uuids("b"))


def test_no_backend_is_absent_nvml_library_not_found() -> None:
    result = run(None)
    assert result.health.state == Health.ABSENT
    assert result.health.reason == "NVML library not found"
    assert result.value is None


def test_a_node_without_gpus_is_absent() -> None:
    class NoGpus(FakeNvml):
        def device_count(self) -> int:
            return 0

    result = run(NoGpus("hgx-h100"))
    assert result.health.state == Health.ABSENT and result.value is None


def test_a_link_down_degrades_the_gpu_with_a_reason_naming_gpu_and_link() -> None:
    fake = FakeNvml("hgx-h100")
    fake.set_link(3, 7, up=False)
    result = run(fake)
    assert result.health.state == Health.DEGRADED and result.value is not None
    gpu3 = result.value.gpus[3]
    assert gpu3.health.state == Health.DEGRADED
    assert gpu3.health.reason == "GPU 3 (00000000:5D:00.0): NVLink 7 down (17/18 up)"
    assert [link.state for link in gpu3.nvlinks].count("down") == 1
    assert all(g.health.state == Health.OK for g in result.value.gpus if g.index != 3)
    assert "GPU 3 (00000000:5D:00.0): NVLink 7 down" in result.health.reason


def test_a_down_link_reports_no_remote_end() -> None:
    fake = FakeNvml("hgx-h100")
    fake.set_link(0, 2, up=False)
    link = run(fake).value.gpus[0].nvlinks[2]  # type: ignore[union-attr]
    assert (link.state, link.remote_type, link.remote_pci_bus_id) == ("down", None, None)


def test_an_nvml_error_on_one_call_degrades_that_gpu_and_keeps_the_rest() -> None:
    fake = FakeNvml("hgx-h100")
    fake.fail("numa_node", "UNKNOWN", gpu=5)
    fake.fail("uuid", "NO_PERMISSION", gpu=2)
    result = run(fake)
    assert result.value is not None and result.health.state == Health.DEGRADED
    gpus = result.value.gpus
    assert gpus[5].health.reason == "GPU 5 (00000000:AB:00.0): nvmlDeviceGetNumaNodeId: UNKNOWN"
    assert gpus[5].numa_node is None and len(gpus[5].nvlinks) == 18
    assert gpus[2].uuid == "" and gpus[2].name == "NVIDIA H100 80GB HBM3"
    assert "nvmlDeviceGetUUID: NO_PERMISSION" in gpus[2].health.reason
    assert [g.health.state for g in gpus].count(Health.OK) == 6


def test_a_call_failing_on_every_link_is_named_once_with_a_count() -> None:
    fake = FakeNvml("hgx-h100")
    fake.fail("link_version", "UNKNOWN", gpu=1)
    gpu = run(fake).value.gpus[1]  # type: ignore[union-attr]
    assert gpu.health.reason == "GPU 1 (00000000:2A:00.0): nvmlDeviceGetNvLinkVersion: UNKNOWN (18 times)"
    assert all(link.version is None and link.state == "up" for link in gpu.nvlinks)


def test_a_lost_gpu_fails_the_probe_but_the_other_gpus_are_reported() -> None:
    fake = FakeNvml("hgx-h100")
    fake.lose_gpu(6)
    result = run(fake)
    assert result.health.state == Health.FAILED and result.value is not None
    assert result.value.gpus[6].health.state == Health.FAILED
    assert "GPU_IS_LOST" in result.value.gpus[6].health.reason
    assert sum(len(g.nvlinks) for g in result.value.gpus) == 7 * 18


def test_device_count_failing_fails_the_probe_with_the_call_and_error() -> None:
    fake = FakeNvml("hgx-h100")
    fake.fail("device_count", "DRIVER_NOT_LOADED")
    result = run(fake)
    assert result.health.state == Health.FAILED
    assert result.health.reason == "nvmlDeviceGetCount: DRIVER_NOT_LOADED"


def test_a_binding_bug_becomes_a_failed_probe_not_an_exception() -> None:
    class Broken(FakeNvml):
        def name(self, handle: object) -> str:
            raise RuntimeError("ctypes went wrong")

    result = run(Broken("hgx-h100"))
    assert result.health.state == Health.FAILED and "ctypes went wrong" in result.health.reason


@pytest.mark.parametrize(
    ("xid", "state", "words"),
    [
        (79, Health.FAILED, "XID 79 (GPU has fallen off the bus)"),
        (48, Health.FAILED, "XID 48 (double-bit ECC error)"),
        (95, Health.FAILED, "XID 95 (uncontained ECC error)"),
        (119, Health.FAILED, "XID 119 (GSP RPC timeout)"),
        (120, Health.FAILED, "XID 120 (GSP error)"),
        (74, Health.DEGRADED, "XID 74 (NVLink error)"),
        (94, Health.DEGRADED, "XID 94 (contained ECC error)"),
        (13, Health.OK, ""),  # graphics engine exception: an application fault, not the machine
        (31, Health.OK, ""),  # MMU fault: likewise
    ],
)
def test_recent_xids_set_gpu_health_by_severity(xid: int, state: Health, words: str) -> None:
    result = run(FakeNvml("hgx-h100"), xids={4: {xid: 2}})
    gpu = result.value.gpus[4]  # type: ignore[union-attr]
    assert gpu.health.state == state
    assert words in gpu.health.reason
    assert gpu.xid_events == {xid: 2}
    assert result.health.state == state


def test_uncorrected_ecc_errors_degrade_the_gpu() -> None:
    fake = FakeNvml("gb200-nvl72")
    fake.set_uncorrected_ecc(1, 3)
    gpu = run(fake).value.gpus[1]  # type: ignore[union-attr]
    assert gpu.health.state == Health.DEGRADED
    assert gpu.health.reason == "GPU 1 (00000009:01:00.0): 3 uncorrected ECC errors"
    assert gpu.uncorrected_ecc == 3


def test_gpus_in_different_cliques_give_no_domain_and_a_degraded_reason() -> None:
    fake = FakeNvml("gb200-nvl72", clique_id=1)
    fake.set_fabric(3, GpuFabric(DEFAULT_CLUSTER_UUID, 2, "completed", "success"))
    result = run(fake)
    assert result.value is not None and result.value.domain is None
    assert result.health.state == Health.DEGRADED
    assert result.health.reason == (
        f"GPUs are in different NVLink cliques: {DEFAULT_CLUSTER_UUID}/1, {DEFAULT_CLUSTER_UUID}/2"
    )


def test_fabric_registration_in_progress_degrades_and_gives_no_domain() -> None:
    fake = FakeNvml("gb200-nvl72")
    fake.set_fabric(0, GpuFabric(DEFAULT_CLUSTER_UUID, 32766, "in-progress", "success"))
    result = run(fake)
    assert result.value is not None and result.value.domain is None
    assert (
        result.value.gpus[0].health.reason
        == "GPU 0 (00000008:01:00.0): NVLink fabric registration in-progress"
    )


def test_fabric_registration_error_status_degrades_the_gpu() -> None:
    fake = FakeNvml("gb200-nvl72")
    fake.set_fabric(2, GpuFabric(DEFAULT_CLUSTER_UUID, 32766, "completed", "NVLINK_FABRIC_RESOURCES_FAILURE"))
    result = run(fake)
    assert result.value is not None and result.value.domain is None
    assert "registration failed: NVLINK_FABRIC_RESOURCES_FAILURE" in result.value.gpus[2].health.reason


def test_single_node_fabric_with_zero_cluster_uuid_is_not_a_multi_node_domain() -> None:
    # What a real HGX H100 on driver 565 answers (nvidia-smi -q Fabric: Completed, clique 0, zero UUID)
    fake = FakeNvml("hgx-h100")
    for i in range(8):
        fake.set_fabric(i, GpuFabric("00000000-0000-0000-0000-000000000000", 0, "completed", "success"))
    result = run(fake)
    assert result.health.state == Health.OK and result.value is not None
    assert result.value.domain is None
    assert result.value.gpus[0].fabric is not None


def test_the_report_survives_the_wire_form_without_counters() -> None:
    fake = FakeNvml("gb200-nvl72")
    fake.set_uncorrected_ecc(0, 1)
    result = run(fake, xids={0: {74: 1}})
    report = NodeReport(node_name="tray1", health={"nvml": result.health}, nvml=result.value)
    spec = report_spec(report)
    assert "errorCounters" not in str(spec) and "uncorrectedEcc" not in str(spec)
    back = report_from_spec(spec)
    assert back.nvml is not None and result.value is not None
    assert back.nvml.domain == result.value.domain
    assert [g.health for g in back.nvml.gpus] == [g.health for g in result.value.gpus]
    assert spec["summary"]["nvlinkDomain"] == f"{DEFAULT_CLUSTER_UUID}/32766"


def test_an_unchanged_machine_gives_an_identical_report() -> None:
    fake = FakeNvml("hgx-h100")
    assert report_spec(NodeReport("n", {}, nvml=run(fake).value)) == report_spec(
        NodeReport("n", {}, nvml=run(fake).value)
    )


def test_link_error_counters_are_read_for_up_links_and_do_not_change_the_report() -> None:
    fake = FakeNvml("hgx-h100")
    before = report_spec(NodeReport("n", {}, nvml=run(fake).value))
    fake.set_link_errors(0, 3, replay=12, crc_flit=5)
    result = run(fake)
    gpu = result.value.gpus[0]  # type: ignore[union-attr]
    assert gpu.nvlinks[3].error_counters == {"replay": 12, "recovery": 0, "crc_flit": 5, "crc_data": 0}
    assert gpu.nvlinks[2].error_counters["replay"] == 0
    assert gpu.health.state == Health.OK
    assert report_spec(NodeReport("n", {}, nvml=result.value)) == before


def test_once_a_gpu_is_lost_it_is_asked_nothing_more() -> None:
    fake = FakeNvml("hgx-h100")
    fake.fail("link_state", "GPU_IS_LOST", gpu=1)
    fake.fail("uncorrected_ecc", "UNKNOWN", gpu=1)  # would show in the reason if it were still asked
    gpu = run(fake).value.gpus[1]  # type: ignore[union-attr]
    assert gpu.health.state == Health.FAILED
    assert gpu.health.reason == "GPU 1 (00000000:2A:00.0): nvmlDeviceGetNvLinkState: GPU_IS_LOST"
    assert gpu.nvlinks == () and gpu.numa_node is None
