"""GPU-to-NIC PCIe affinity over the HGX H100 sysfs fixture tree (tests/fixtures/sysfs/nvml-affinity)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.common.report import RdmaDevice
from agent.probes import nvml, rdma
from agent.probes.nvml_fake import FakeNvml
from agent.probes.pci_affinity import bridge_path, closest_nics, sysfs_bdf

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
TREE = FIXTURES / "nvml-affinity"
GPUS = [f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")]


def hcas() -> list[RdmaDevice]:
    """The HCAs as the rdma probe would list them: name and PCI address from class/infiniband."""
    root = TREE / "class" / "infiniband"
    return [
        RdmaDevice(name=name, pci_address=os.path.basename(os.readlink(root / name / "device")))
        for name in sorted(os.listdir(root))
    ]


def test_the_committed_tree_is_what_the_builder_writes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(FIXTURES / "build_nvml_affinity.py"), str(tmp_path / "t")], check=True
    )

    def entry(path: Path) -> str:
        if path.is_symlink():
            return "-> " + os.readlink(path)
        return path.read_text() if path.is_file() else "/"

    def listing(root: Path) -> list[tuple[str, str]]:
        return [(str(path.relative_to(root)), entry(path)) for path in sorted(root.rglob("*"))]

    assert listing(tmp_path / "t") == listing(TREE)


@pytest.mark.parametrize(
    ("bus_id", "bdf"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000008:01:00.0", "0008:01:00.0"),
        ("0000:AB:00.1", "0000:ab:00.1"),
        ("2a:00.0", "0000:2a:00.0"),
        ("not a bus id", None),
        ("0000:18:00.9", None),
    ],
)
def test_bus_ids_of_every_form_map_to_sysfs_names(bus_id: str, bdf: str | None) -> None:
    assert sysfs_bdf(bus_id) == bdf


def test_each_gpu_gets_the_nic_behind_its_own_pcie_switch() -> None:
    affinity = closest_nics(TREE, GPUS, hcas())
    assert [affinity[g] for g in GPUS] == [(f"mlx5_{i}",) for i in range(8)]


def test_without_its_own_nic_a_gpu_falls_back_to_the_nics_of_the_shared_upper_switch() -> None:
    without_mlx5_1 = [d for d in hcas() if d.name != "mlx5_1"]
    affinity = closest_nics(TREE, GPUS, without_mlx5_1)
    assert affinity["00000000:2A:00.0"] == ("mlx5_0",)
    assert affinity["00000000:18:00.0"] == ("mlx5_0",)


def test_a_nic_sharing_only_the_host_bridge_or_nothing_is_never_close() -> None:
    frontend = [d for d in hcas() if d.name == "mlx5_8"]
    assert closest_nics(TREE, GPUS, frontend) == {g: () for g in GPUS}


def test_devices_missing_from_sysfs_get_no_nics_and_raise_nothing(tmp_path: Path) -> None:
    assert closest_nics(tmp_path, GPUS[:1], hcas()) == {GPUS[0]: ()}
    assert bridge_path(TREE, "00000000:77:00.0") is None
    assert closest_nics(TREE, GPUS[:1], [RdmaDevice(name="mlx5_9", pci_address=None)]) == {GPUS[0]: ()}


def test_the_nvml_probe_fills_nics_from_the_real_rdma_probe_on_the_same_tree() -> None:
    devices = rdma.probe(TREE)
    assert devices.value is not None and len(devices.value) == 9
    result = nvml.probe(FakeNvml("hgx-h100"), sysfs=TREE, rdma=devices.value)
    assert result.value is not None
    assert [g.nics for g in result.value.gpus] == [(f"mlx5_{i}",) for i in range(8)]


def test_numa_node_falls_back_to_sysfs_when_nvml_does_not_support_it() -> None:
    fake = FakeNvml("hgx-h100")
    fake.fail("numa_node", "NOT_SUPPORTED")
    result = nvml.probe(fake, sysfs=TREE)
    assert result.value is not None and result.health.reason == ""
    assert [g.numa_node for g in result.value.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
