"""The RDMA probe against the hand-written sysfs trees in tests/fixtures/sysfs (see build_trees.py)."""

from __future__ import annotations

import filecmp
import importlib.util
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.common.report import (
    ComponentHealth,
    Health,
    NodeReport,
    RdmaDevice,
    node_topology_object,
    report_from_spec,
)
from agent.probes import rdma

TREES = Path(__file__).parent.parent / "fixtures" / "sysfs"
# DGX H100: HCA i sits beside GPU i on one PCIe switch (build_trees.HGX_PAIRS)
HGX_NIC_BUSES = ["18", "40", "4f", "5e", "9a", "c0", "ce", "dc"]


def devices(tree: str) -> dict[str, RdmaDevice]:
    result = rdma.probe(TREES / tree)
    assert result.value is not None, result.health
    return {d.name: d for d in result.value}


def test_hgx_board_has_eight_ndr_hcas_active_on_ib0_to_ib7() -> None:
    result = rdma.probe(TREES / "hgx-h100-ib")
    assert result.health.state is Health.OK, result.health.reason
    assert result.value is not None
    assert [d.name for d in result.value] == [f"mlx5_{i}" for i in range(8)]
    for i, dev in enumerate(result.value):
        (port,) = dev.ports
        assert (port.port, port.state, port.phys_state, port.link_layer) == (
            1,
            "ACTIVE",
            "LinkUp",
            "InfiniBand",
        )
        assert port.rate_gbps == 400.0
        assert port.netdev == f"ib{i}"
        assert port.lid == 0x21 + i and port.sm_lid == 1  # sysfs writes LIDs in hex: "0x21"
        assert dev.pci_address == f"0000:{HGX_NIC_BUSES[i]}:00.0"
        assert dev.numa_node == (0 if i < 4 else 1)
        assert dev.node_guid == f"946d:ae03:00a1:b20{i}" == dev.sys_image_guid
        assert dev.firmware == "28.39.1002" and dev.node_desc == f"hgx-h100-01 mlx5_{i}"


def test_unused_gid_entries_are_skipped_and_the_port_gid_kept() -> None:
    port = devices("hgx-h100-ib")["mlx5_3"].ports[0]
    assert port.gids == ("fe80:0000:0000:0000:946d:ae03:00a1:b203",)  # entries 1, 2 are all zero


def test_counters_include_hw_counters_but_never_reach_the_wire() -> None:
    dev = devices("hgx-h100-ib")["mlx5_1"]
    counters = dev.ports[0].counters
    # build_trees.counters(errors=port % 2): symbol_error=1, port_rcv_errors=3, hw local_ack_timeout_err=1
    assert counters["symbol_error"] == 1 and counters["port_rcv_errors"] == 3
    assert counters["out_of_buffer"] == 0 and counters["local_ack_timeout_err"] == 1
    report = NodeReport(node_name="n1", health={}, rdma=(dev,))
    wire = node_topology_object(report)["spec"]["rdma"][0]["ports"][0]
    assert "counters" not in wire and wire["netdev"] == "ib1"
    back = report_from_spec(node_topology_object(report)["spec"]).rdma[0]
    assert back.ports[0].counters == {} and back.ports[0].rate_gbps == 400.0


def test_roce_port_reports_ethernet_link_layer_its_netdev_and_gids() -> None:
    result = rdma.probe(TREES / "roce")
    assert result.health.state is Health.OK
    (dev,) = result.value or ()
    (port,) = dev.ports
    assert port.link_layer == "Ethernet" and port.netdev == "eth2"
    assert port.rate_gbps == 100.0 and port.state == "ACTIVE"
    assert "0000:0000:0000:0000:0000:ffff:0a00:0002" in port.gids  # RoCEv2 GID of 10.0.0.2
    assert len(port.gids) == 4  # the fifth, all-zero entry is unused
    assert dev.pci_address == "0000:a1:00.0" and dev.numa_node == 1


def test_down_port_is_reported_down_and_polling_without_degrading_the_probe() -> None:
    result = rdma.probe(TREES / "down-port")
    assert result.health.state is Health.OK
    (dev,) = result.value or ()
    up, down = dev.ports
    assert (up.state, up.phys_state, up.netdev) == ("ACTIVE", "LinkUp", "ib0")  # not the child ib0.8001
    assert (down.port, down.state, down.phys_state, down.netdev) == (2, "DOWN", "Polling", "ib1")
    summary = NodeReport(node_name="n", health={"rdma": result.health}, rdma=(dev,)).summary()
    assert summary.rdma_ports_up == 1


def port_dir(tree: Path, device: str, port: int) -> Path:
    return (tree / "class" / "infiniband" / device).resolve() / "ports" / str(port)


def test_a_port_never_cabled_is_unused_not_down_and_the_component_stays_ok() -> None:
    judged = rdma.judge(rdma.probe(TREES / "down-port"))
    (dev,) = judged.value or ()
    assert [(p.port, p.health) for p in dev.ports] == [(1, Health.OK), (2, Health.UNUSED)]
    assert judged.health.state is Health.OK
    wire = node_topology_object(NodeReport(node_name="n", health={"rdma": judged.health}, rdma=(dev,)))
    assert [p["health"] for p in wire["spec"]["rdma"][0]["ports"]] == ["ok", "unused"]
    assert report_from_spec(wire["spec"]).rdma[0].ports[1].health is Health.UNUSED


def test_a_port_in_use_that_is_down_degrades_the_component_naming_the_port(tmp_path: Path) -> None:
    tree = tmp_path / "sys"
    shutil.copytree(TREES / "down-port", tree, symlinks=True)
    (port_dir(tree, "mlx5_0", 2) / "counters" / "link_downed").write_text("1\n")  # its link went down once
    judged = rdma.judge(rdma.probe(tree))
    (dev,) = judged.value or ()
    assert dev.ports[1].health is Health.FAILED
    assert judged.health == ComponentHealth(Health.DEGRADED, "mlx5_0 port 2 DOWN (phys_state Polling)")
    # seen ACTIVE by this agent before (the counter may have been reset): in use, too
    seen = rdma.judge(rdma.probe(TREES / "down-port"), seen_active={("mlx5_0", 2)})
    assert seen.health.state is Health.DEGRADED and (seen.value or ())[0].ports[1].health is Health.FAILED


def test_an_hca_with_no_port_cabled_is_unused(tmp_path: Path) -> None:
    tree = tmp_path / "sys"
    shutil.copytree(TREES / "down-port", tree, symlinks=True)
    (port_dir(tree, "mlx5_0", 1) / "state").write_text("1: DOWN\n")
    (port_dir(tree, "mlx5_0", 1) / "phys_state").write_text("3: Disabled\n")
    judged = rdma.judge(rdma.probe(tree))
    assert judged.health == ComponentHealth(Health.UNUSED, "no RDMA port cabled: mlx5_0 port 1, mlx5_0 port 2")
    assert NodeReport(node_name="n", health={"rdma": judged.health}).overall_health() is Health.OK


def test_a_sysfs_root_that_is_not_mounted_fails_instead_of_saying_absent(tmp_path: Path) -> None:
    for root, why in ((tmp_path / "host" / "sys", "does not exist"), (tmp_path, "has no class/ directory")):
        result = rdma.probe(root)
        assert result.health.state is Health.FAILED and result.value is None
        assert result.health.reason == (
            f"host sysfs root missing: {root} {why} (is the host's /sys mounted there? see --sysfs)"
        )


def test_garbled_files_degrade_with_a_reason_naming_each_file_and_lose_nothing_else() -> None:
    result = rdma.probe(TREES / "garbled")
    assert result.health.state is Health.DEGRADED
    reason = result.health.reason
    for bad in ("mlx5_0/node_guid", "mlx5_0/ports/1/rate", "mlx5_0/ports/1/state", "mlx5_0/ports/1/lid",
                "mlx5_0/ports/1/gids/0", "mlx5_0/ports/1/counters/symbol_error"):  # fmt: skip
        assert bad in reason
    assert "mlx5_1" not in reason
    bad_dev, good_dev = result.value or ()
    port = bad_dev.ports[0]
    assert (port.state, port.rate_gbps, port.lid, bad_dev.node_guid) == (rdma.UNKNOWN_STATE, None, None, None)
    assert port.phys_state == "LinkUp" and port.sm_lid == 1  # the readable files still count
    assert bad_dev.firmware == "28.39.1002" and bad_dev.pci_address == "0000:51:00.0"
    assert "symbol_error" not in port.counters and port.counters["port_rcv_errors"] == 3
    assert good_dev.node_guid == "946d:ae03:00a1:b2ff" and good_dev.ports[0].state == "ACTIVE"
    assert good_dev.ports[0].rate_gbps == 400.0 and good_dev.ports[0].netdev == "ib1"


def test_no_infiniband_class_is_absent_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "class" / "net").mkdir(parents=True)
    result = rdma.probe(tmp_path)
    assert (result.value, result.health.state, result.health.reason) == (None, Health.ABSENT, rdma.NO_DEVICES)
    (tmp_path / "class" / "infiniband").mkdir()
    assert rdma.probe(tmp_path).health.state is Health.ABSENT


def test_dangling_device_link_and_missing_ports_dir_degrade(tmp_path: Path) -> None:
    cls = tmp_path / "class" / "infiniband"
    (cls / "mlx5_9").mkdir(parents=True)
    os.symlink("../../devices/gone/infiniband/mlx5_8", cls / "mlx5_8")
    result = rdma.probe(tmp_path)
    assert result.health.state is Health.DEGRADED
    assert "mlx5_8: not a device directory" in result.health.reason
    assert "mlx5_9/ports: missing" in result.health.reason
    assert [d.name for d in result.value or ()] == ["mlx5_9"]


@pytest.mark.parametrize(
    ("text", "state"),
    [("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"), ("2: INIT", "INIT"), ("3: ARMED", "ARMED"),
     ("5: LinkUp", "LinkUp"), ("2: Polling", "Polling"), ("3: Disabled", "Disabled"),
     ("7: Phy Test", "Phy Test"), ("ACTIVE", None), ("4:", None), ("", None), ("4: ??", None)],
)  # fmt: skip
def test_port_state_text_loses_its_number(text: str, state: str | None) -> None:
    assert rdma.parse_state(text) == state


@pytest.mark.parametrize(
    ("text", "rate"),
    [("400 Gb/sec (4X NDR)", 400.0), ("200 Gb/sec (2X NDR)", 200.0), ("2.5 Gb/sec (1X SDR)", 2.5),
     ("10 Gb/sec (4X)", 10.0), ("fast", None), ("Gb/sec", None), ("400", None), ("-1 Gb/sec", None)],
)  # fmt: skip
def test_rate_text_becomes_gigabits(text: str, rate: float | None) -> None:
    assert rdma.parse_rate(text) == rate


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=64), which=st.sampled_from(["state", "phys_state", "rate", "lid", "gids/0"]))
def test_any_bytes_in_a_port_file_never_raise(tmp_path: Path, junk: bytes, which: str) -> None:
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "gids").mkdir(parents=True, exist_ok=True)
    for name in ("state", "phys_state", "rate", "lid", "gids/0", "link_layer"):
        (port / name).write_text("x\n")
    (port / which).write_bytes(junk)
    result = rdma.probe(tmp_path)
    assert result.value is not None and result.value[0].ports[0].port == 1
    assert result.health.state is Health.DEGRADED  # "x" in the other files is garbled too


def _load_builder() -> object:
    spec = importlib.util.spec_from_file_location("build_trees", TREES / "build_trees.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _same_tree(a: Path, b: Path) -> list[str]:
    """Differences between two trees, symlink targets included (filecmp follows links)."""
    diffs = []
    names_a = {p.relative_to(a) for p in a.rglob("*")}
    names_b = {p.relative_to(b) for p in b.rglob("*")}
    diffs += [f"only in one: {n}" for n in sorted(names_a ^ names_b)]
    for rel in sorted(names_a & names_b):
        pa, pb = a / rel, b / rel
        if pa.is_symlink() or pb.is_symlink():
            if not (pa.is_symlink() and pb.is_symlink() and os.readlink(pa) == os.readlink(pb)):
                diffs.append(f"link differs: {rel}")
        elif pa.is_file() and not filecmp.cmp(pa, pb, shallow=False):
            diffs.append(f"content differs: {rel}")
    return diffs


def test_committed_trees_are_what_build_trees_writes(tmp_path: Path) -> None:
    builder = _load_builder()
    builder.build_all(tmp_path)  # type: ignore[attr-defined]
    for tree in builder.TREES:  # type: ignore[attr-defined]
        assert _same_tree(TREES / tree, tmp_path / tree) == [], f"regenerate {tree} with build_trees.py"


def test_an_unlistable_infiniband_class_is_a_failed_probe_not_absent(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "infiniband").write_text("not a directory\n")
    result = rdma.probe(tmp_path)
    assert result.value is None and result.health.state is Health.FAILED
    assert "cannot list RDMA devices" in result.health.reason
