"""The NVML fake checked against real machines' nvidia-smi captures (../shared/data/nvidia-smi)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.common.report import GpuFabric, Health
from agent.probes import nvml
from agent.probes.nvidia_smi_text import outline, parse_query, parse_topo_matrix
from agent.probes.nvml_fake import FakeNvml

BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
FABRIC_STATES = {"Completed": "completed", "In Progress": "in-progress", "Not Started": "not-started"}


def smi(shared_data: Path, name: str) -> str:
    return (shared_data / "nvidia-smi" / name).read_text()


def fake_report(profile: str) -> nvml.NvmlReport:
    result = nvml.probe(FakeNvml(profile), sysfs=Path("/nonexistent"))
    assert result.value is not None
    return result.value


@pytest.mark.parametrize(
    ("capture", "links"), [("topo-m-H100x8_NV18.txt", 18), ("topo-m-A100x8_NV12.txt", 12)]
)
def test_topo_matrices_show_every_gpu_pair_bonded_by_all_links(
    shared_data: Path, capture: str, links: int
) -> None:
    cells = parse_topo_matrix(smi(shared_data, capture))
    gpus = sorted({row for row, _ in cells})
    assert gpus == [f"GPU{i}" for i in range(8)]
    assert {cells[(a, b)] for a in gpus for b in gpus if a != b} == {f"NV{links}"}
    assert {cells[(g, g)] for g in gpus} == {"X"}


def test_hgx_h100_fake_has_the_eighteen_active_links_per_gpu_that_a_real_board_shows(
    shared_data: Path,
) -> None:
    cells = parse_topo_matrix(smi(shared_data, "topo-m-H100x8_NV18.txt"))
    real_links = {int(cell[2:]) for cell in cells.values() if cell.startswith("NV")}
    for gpu in fake_report("hgx-h100").gpus:
        assert {sum(1 for link in gpu.nvlinks if link.state == "up")} == real_links


def test_real_h100_capture_matches_the_fake_in_names_bus_ids_and_formats(shared_data: Path) -> None:
    log = parse_query(smi(shared_data, "thamada-H100SXMx8_nvidia-smi-q.txt"))
    assert (log.driver_version, log.cuda_version, log.attached_gpus) == ("565.57.01", "12.7", 8)
    fake = fake_report("hgx-h100")
    assert [g.product_name for g in log.gpus] == [g.name for g in fake.gpus]
    assert [g.bus_id for g in log.gpus] == [g.pci_bus_id for g in fake.gpus]
    assert all(BUS_ID.match(g.bus_id) for g in log.gpus)
    assert all(BUS_ID.match(g.pci_bus_id) for g in fake.gpus)
    assert all(g.uuid and GPU_UUID.match(g.uuid) for g in log.gpus)
    assert all(GPU_UUID.match(g.uuid) for g in fake.gpus)
    assert [g.minor_number for g in log.gpus] == list(range(8))
    assert fake.driver_version == log.driver_version


def test_real_h100_fabric_section_is_a_completed_single_node_fabric_and_no_domain(shared_data: Path) -> None:
    log = parse_query(smi(shared_data, "thamada-H100SXMx8_nvidia-smi-q.txt"))
    fake = FakeNvml("hgx-h100")
    for index, gpu in enumerate(log.gpus):
        section = gpu.fabric
        assert section is not None and section.state == "Completed" and section.status == "Success"
        assert section.clique_id is not None and section.cluster_uuid is not None
        fake.set_fabric(
            index, GpuFabric(section.cluster_uuid, section.clique_id, FABRIC_STATES[section.state], "success")
        )
    result = nvml.probe(fake, sysfs=Path("/nonexistent"))
    assert result.health.state == Health.OK and result.value is not None
    assert result.value.domain is None  # zero cluster UUID: NVSwitch board without an NVLink network


@pytest.mark.parametrize(
    ("capture", "count", "name", "first_bus_id"),
    [
        ("thamada-A100SXMx4_nvidia-smi-q.txt", 4, "NVIDIA A100-SXM4-80GB", "00000000:68:00.0"),
        ("thamada-A40x10_nvidia-smi-q.txt", 10, "NVIDIA A40", "00000000:4F:00.0"),
        ("thamada-H100NVLx2_nvidia-smi-q.txt", 2, "NVIDIA H100 NVL", "00000000:AD:00.0"),
    ],
)
def test_other_real_captures_parse_to_their_gpus(
    shared_data: Path, capture: str, count: int, name: str, first_bus_id: str
) -> None:
    log = parse_query(smi(shared_data, capture))
    assert log.attached_gpus == count and len(log.gpus) == count
    assert {g.product_name for g in log.gpus} == {name}
    assert log.gpus[0].bus_id == first_bus_id
    assert len({g.uuid for g in log.gpus}) == count
    # these machines have no NVLink fabric: every field of the Fabric section is N/A
    assert all(
        g.fabric is not None and g.fabric.state is None and g.fabric.clique_id is None for g in log.gpus
    )


def test_outline_keeps_sections_nested_and_values_with_colons_whole() -> None:
    text = "GPU 00000000:18:00.0\n    PCI\n        Bus Id                : 00000000:18:00.0\n    Processes : None\n"
    assert outline(text) == {
        "GPU 00000000:18:00.0": {"PCI": {"Bus Id": "00000000:18:00.0"}, "Processes": "None"}
    }


def test_garbage_text_parses_to_nothing_rather_than_raising() -> None:
    log = parse_query("\x00\x01 not nvidia-smi\n  : :\n      deeper\nGPU zz\n")
    assert log.gpus == () and log.driver_version is None
    assert parse_topo_matrix("") == {}
