"""A GPU node whose NVML cannot be loaded (no NVIDIA runtime class, no `utility` capability) or
sees no GPU reports `nvml: failed` with the reason, never `absent` as a GPU-less node does.

The sysfs trees are built as the kernel lays them out (bus/pci/devices/<bdf> a symlink into
devices/pci<domain>:<bus>/, `vendor` and `class` in hex, `driver` a symlink into
bus/pci/drivers/<name>); the HGX fixture tree (tests/fixtures/sysfs/nvml-affinity) adds a
board with NVSwitches, which are NVIDIA PCI functions but not GPUs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest
from agent_host import NODE

from agent.collect import CollectConfig, Prober
from agent.common.report import Health
from agent.probes import nvml
from agent.probes.nvidia_pci import nvidia_gpus
from agent.probes.nvml_fake import FakeNvml

HGX_TREE = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs" / "nvml-affinity"


def pci_tree(root: Path, devices: list[tuple[str, str, str, str | None]]) -> Path:
    """A sysfs with PCI functions (bdf, vendor, class, bound driver or None)."""
    (root / "bus" / "pci" / "devices").mkdir(parents=True)
    for bdf, vendor, pci_class, driver in devices:
        real = root / "devices" / "pci0000:00" / bdf
        real.mkdir(parents=True)
        (real / "vendor").write_text(vendor + "\n")
        (real / "class").write_text(pci_class + "\n")
        if driver is not None:
            (root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            os.symlink(f"../../../../bus/pci/drivers/{driver}", real / "driver")
        os.symlink(f"../../../devices/pci0000:00/{bdf}", root / "bus" / "pci" / "devices" / bdf)
    return root


def h100_node(root: Path, driver: str | None = "nvidia") -> Path:
    """Two H100 (3D controllers), an NVSwitch (bridge class), a ConnectX-7 and the host bridge."""
    return pci_tree(
        root,
        [
            ("0000:00:00.0", "0x8086", "0x060000", None),
            ("0000:18:00.0", "0x10de", "0x030200", driver),
            ("0000:2a:00.0", "0x10de", "0x030200", driver),
            ("0000:05:00.0", "0x10de", "0x068000", "nvidia-nvswitch"),
            ("0000:19:00.0", "0x15b3", "0x020700", "mlx5_core"),
        ],
    )


def test_gpus_on_the_bus_without_libnvidia_ml_fail_with_the_load_error_and_the_runtime_hint(
    tmp_path: Path,
) -> None:
    result = nvml.probe(None, sysfs=h100_node(tmp_path), load_error="NVML Shared Library Not Found")
    assert result.health.state is Health.FAILED and result.value is None
    assert result.health.reason == (
        "NVIDIA GPUs on the PCI bus (2) but libnvidia-ml could not be loaded: NVML Shared Library Not "
        "Found; is the pod's runtimeClassName the NVIDIA runtime and NVIDIA_DRIVER_CAPABILITIES "
        "includes utility?"
    )


def test_the_agent_names_pynvmls_own_load_error_when_the_library_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the agent's real path: `--nvml=auto` loads pynvml, whose nvmlInit fails as it does
    in a container the NVIDIA runtime did not prepare (the C library is not there)."""

    def library_not_found() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", library_not_found)
    report = Prober(CollectConfig(NODE, sysfs=h100_node(tmp_path)), links=lambda: ()).collect()
    health = report.health["nvml"]
    assert health.state is Health.FAILED
    assert health.reason.startswith("NVIDIA GPUs on the PCI bus (2) but libnvidia-ml could not be loaded: ")
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)) in health.reason
    assert "runtimeClassName" in health.reason
    assert report.nvml is None


def test_gpus_with_no_kernel_driver_bound_point_at_the_host_driver(tmp_path: Path) -> None:
    result = nvml.probe(None, sysfs=h100_node(tmp_path, driver=None), load_error="Driver Not Loaded")
    assert result.health.state is Health.FAILED
    assert "(2) but libnvidia-ml could not be loaded: Driver Not Loaded" in result.health.reason
    assert "is the NVIDIA driver installed on the host?" in result.health.reason


def test_gpus_passed_through_to_virtual_machines_are_not_this_nodes_and_stay_absent(tmp_path: Path) -> None:
    result = nvml.probe(None, sysfs=h100_node(tmp_path, driver="vfio-pci"), load_error="x")
    assert result.health.state is Health.ABSENT
    assert result.health.reason == "NVML library not found"


def test_a_node_whose_only_nvidia_functions_are_not_gpus_stays_absent(tmp_path: Path) -> None:
    tree = pci_tree(
        tmp_path,
        [("0000:05:00.0", "0x10de", "0x068000", None), ("0000:65:00.0", "0x10de", "0x040300", None)],
    )  # an NVSwitch and a GPU's HD-audio function
    assert nvml.probe(None, sysfs=tree).health.state is Health.ABSENT


def test_a_cpu_node_and_a_sysfs_without_pci_stay_absent(tmp_path: Path) -> None:
    cpu = pci_tree(tmp_path / "cpu", [("0000:00:00.0", "0x8086", "0x060000", None)])
    assert nvml.probe(None, sysfs=cpu).health.state is Health.ABSENT
    (tmp_path / "bare").mkdir()
    assert nvml.probe(None, sysfs=tmp_path / "bare").health.state is Health.ABSENT


def test_nvml_that_loads_but_counts_no_gpu_fails_when_the_bus_has_gpus(tmp_path: Path) -> None:
    class NoDevices(FakeNvml):  # NVIDIA_VISIBLE_DEVICES=none: the library, no device nodes
        def device_count(self) -> int:
            return 0

    result = nvml.probe(NoDevices("hgx-h100"), sysfs=h100_node(tmp_path))
    assert result.health.state is Health.FAILED
    assert result.health.reason == (
        "NVIDIA GPUs on the PCI bus (2) but NVML sees none; does the pod set NVIDIA_VISIBLE_DEVICES=all?"
    )
    cpu = pci_tree(tmp_path / "cpu", [("0000:00:00.0", "0x8086", "0x060000", None)])
    assert nvml.probe(NoDevices("hgx-h100"), sysfs=cpu).health.state is Health.ABSENT


def test_nvml_off_is_absent_even_with_gpus_on_the_bus(tmp_path: Path) -> None:
    prober = Prober(CollectConfig(NODE, sysfs=h100_node(tmp_path), nvml="off"), links=lambda: ())
    health = prober.collect().health["nvml"]
    assert health.state is Health.ABSENT and health.reason == "NVML off (--nvml=off)"


def test_the_hgx_fixture_board_has_eight_gpus_on_the_bus_and_its_nvswitches_are_not_counted() -> None:
    gpus = nvidia_gpus(HGX_TREE)
    assert [g.bdf for g in gpus] == [
        f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
    ]
    switches = [
        d
        for d in os.listdir(HGX_TREE / "bus" / "pci" / "devices")
        if (HGX_TREE / "bus" / "pci" / "devices" / d / "class").read_text().strip() == "0x068000"
    ]
    assert len(switches) == 4  # NVIDIA functions on the same bus, left out
