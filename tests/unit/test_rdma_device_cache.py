"""The RDMA probe's device cache: later cycles skip re-reading what a registered HCA cannot
change, yet report exactly what an uncached probe reports, a re-registered device included."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from agent_host import HGX_SYSFS

from agent.probes import rdma

DEVICE = Path("class/infiniband/mlx5_3")
PORT = DEVICE / "ports" / "1"


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(HGX_SYSFS, root, symlinks=True)
    return root


def both(sysfs: Path, cache: rdma.DeviceCache) -> rdma.ProbeResult[tuple[rdma.RdmaDevice, ...]]:
    cached = rdma.probe(sysfs, cache)
    assert cached == rdma.probe(sysfs)
    return cached


def device(result: rdma.ProbeResult[tuple[rdma.RdmaDevice, ...]], name: str) -> rdma.RdmaDevice:
    assert result.value is not None
    return next(d for d in result.value if d.name == name)


def test_cached_cycles_report_what_uncached_ones_do(sysfs: Path) -> None:
    cache = rdma.DeviceCache()
    for step in range(3):
        (sysfs / PORT / "counters" / "symbol_error").write_text(f"{step * 9}\n")
        (sysfs / PORT / "state").write_text("1: DOWN\n" if step == 1 else "4: ACTIVE\n")
        result = both(sysfs, cache)
        port = device(result, "mlx5_3").ports[0]
        assert port.counters["symbol_error"] == step * 9
        assert port.state == ("DOWN" if step == 1 else "ACTIVE")


def test_a_device_registered_again_is_read_afresh(sysfs: Path) -> None:
    cache = rdma.DeviceCache()
    before = device(both(sysfs, cache), "mlx5_3")
    target = (sysfs / DEVICE).resolve()  # class/infiniband/<dev> links to the device's directory
    shutil.rmtree(target)  # hot-unplug, then a different card registered under the same name
    shutil.copytree((sysfs / "class" / "infiniband" / "mlx5_4").resolve(), target, symlinks=True)
    (sysfs / DEVICE / "node_guid").write_text("0c42:a103:00ff:0001\n")
    (sysfs / DEVICE / "fw_ver").write_text("28.99.1000\n")
    after = device(both(sysfs, cache), "mlx5_3")
    assert (after.node_guid, after.firmware) == ("0c42:a103:00ff:0001", "28.99.1000")
    assert after.node_guid != before.node_guid


def test_a_counter_file_that_appears_is_read(sysfs: Path) -> None:
    cache = rdma.DeviceCache()
    assert "new_counter" not in device(both(sysfs, cache), "mlx5_3").ports[0].counters
    (sysfs / PORT / "hw_counters" / "new_counter").write_text("17\n")
    assert device(both(sysfs, cache), "mlx5_3").ports[0].counters["new_counter"] == 17


def test_a_garbled_fixed_value_is_reported_every_cycle_until_fixed(sysfs: Path) -> None:
    cache = rdma.DeviceCache()
    (sysfs / DEVICE / "node_guid").write_text("not-a-guid\n")
    for _ in range(2):
        result = both(sysfs, cache)
        assert "mlx5_3/node_guid: not a GUID" in (result.health.reason or "")
        assert device(result, "mlx5_3").node_guid is None
    (sysfs / DEVICE / "node_guid").write_text("0c42:a103:00ff:0002\n")
    result = both(sysfs, cache)
    assert (
        result.health.state is rdma.Health.OK and device(result, "mlx5_3").node_guid == "0c42:a103:00ff:0002"
    )


def test_a_removed_device_is_forgotten(sysfs: Path) -> None:
    cache = rdma.DeviceCache()
    both(sysfs, cache)
    (sysfs / DEVICE).unlink()  # the class link goes with the device
    result = both(sysfs, cache)
    assert result.value is not None and "mlx5_3" not in {d.name for d in result.value}
    assert not any("mlx5_3" in path for path in [*cache._facts, *cache._listings])
