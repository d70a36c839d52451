"""The RDMA probe against real hosts' sysfs captured by others (../shared/data/sysfs, SOURCES.md).

Expected values come from the captures themselves: node_exporter's expected-metrics lines for its
archive, the archive text for procfs's, the directory tree for the H100 node, the dump's PCI
grouping for gcm's, so a wrong parse cannot agree with them by construction.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

import pytest
import ttar

from agent.common.report import Health, RdmaDevice
from agent.probes import rdma

# IBTA PortState / PortPhysicalState numbers, as node_exporter exports them (*_state_id)
STATE_IDS = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
PHYS_STATE_IDS = {"Sleep": 1, "Polling": 2, "Disabled": 3, "LinkUp": 5}
_METRIC = re.compile(r'^(node_infiniband_\w+)\{device="([^"]+)",port="(\d+)"\} (\S+)$')


@pytest.fixture(scope="module")
def node_exporter_sys(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("node_exporter")
    return ttar.extract(shared_data / "sysfs" / "node_exporter_sys.ttar", dest) / "sys"


@pytest.fixture(scope="module")
def procfs_sys(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("procfs")
    return ttar.extract(shared_data / "sysfs" / "procfs_fixtures.ttar", dest) / "fixtures" / "sys"


def by_port(devices: tuple[RdmaDevice, ...] | None) -> dict[tuple[str, int], object]:
    return {(d.name, p.port): p for d in devices or () for p in d.ports}


def expected_metrics(shared_data: Path) -> dict[str, dict[tuple[str, int], float]]:
    out: dict[str, dict[tuple[str, int], float]] = defaultdict(dict)
    text = (shared_data / "sysfs" / "node_exporter_e2e-output_infiniband_lines.txt").read_text()
    for line in text.splitlines():
        match = _METRIC.match(line)
        if match:
            name, device, port, value = match.groups()
            out[name][(device, int(port))] = float(value)
    return out


def test_node_exporter_archive_matches_its_expected_metrics(
    node_exporter_sys: Path, shared_data: Path
) -> None:
    result = rdma.probe(node_exporter_sys)
    assert result.health.state is Health.OK, result.health.reason
    ports = by_port(result.value)
    metrics = expected_metrics(shared_data)
    assert (
        set(ports)
        == set(metrics["node_infiniband_state_id"])
        == {("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)}
    )
    for key, port in ports.items():
        assert STATE_IDS[port.state] == metrics["node_infiniband_state_id"][key]  # type: ignore[attr-defined]
        assert PHYS_STATE_IDS[port.phys_state] == metrics["node_infiniband_physical_state_id"][key]  # type: ignore[attr-defined]
        rate_bytes = port.rate_gbps * 1e9 / 8  # type: ignore[attr-defined]
        assert rate_bytes == metrics["node_infiniband_rate_bytes_per_second"][key]


def test_node_exporter_counters_match_and_unsupported_ones_are_absent(
    node_exporter_sys: Path, shared_data: Path
) -> None:
    ports = by_port(rdma.probe(node_exporter_sys).value)
    metrics = expected_metrics(shared_data)
    for metric, counter in (("node_infiniband_link_downed_total", "link_downed"),
                            ("node_infiniband_unicast_packets_received_total", "unicast_rcv_packets"),
                            ("node_infiniband_multicast_packets_transmitted_total", "multicast_xmit_packets")):  # fmt: skip
        for key, value in metrics[metric].items():
            assert ports[key].counters[counter] == value  # type: ignore[attr-defined]
    # i40iw0 answers "N/A (no PMA)" for every counter: absent, not zero (node_exporter exports none)
    assert ports[("i40iw0", 1)].counters == {}  # type: ignore[attr-defined]


def test_procfs_archive_gives_its_three_devices_states_and_rates(procfs_sys: Path) -> None:
    result = rdma.probe(procfs_sys)
    assert result.health.state is Health.OK, result.health.reason
    ports = by_port(result.value)
    # read from procfs_fixtures.ttar: hfi1_0 "100 Gb/sec (4X EDR)", mlx4_0 ports 1+2 "40 Gb/sec (4X QDR)",
    # mlx5_0 "25 Gb/sec (1X EDR)" whose phys_state file says "4: ACTIVE"
    got = {k: (p.state, p.phys_state, p.rate_gbps, p.link_layer) for k, p in ports.items()}  # type: ignore[attr-defined]
    assert got == {
        ("hfi1_0", 1): ("ACTIVE", "LinkUp", 100.0, "InfiniBand"),
        ("mlx4_0", 1): ("ACTIVE", "LinkUp", 40.0, "InfiniBand"),
        ("mlx4_0", 2): ("ACTIVE", "LinkUp", 40.0, "InfiniBand"),  # its link_layer file has a blank 2nd line
        ("mlx5_0", 1): ("ACTIVE", "ACTIVE", 25.0, "InfiniBand"),
    }
    firmware = {d.name: (d.firmware, d.node_guid) for d in result.value or ()}
    assert firmware["mlx5_0"] == ("14.28.2006", "0a7f:bc12:45ef:d23b")  # node_guid has no trailing newline
    assert firmware["hfi1_0"] == ("1.27.0", None)


def test_real_h100_node_class_dir_has_eight_ndr_ports_and_a_roce_bond(shared_data: Path) -> None:
    class_dir = shared_data / "sysfs" / "gpud-h100-infiniband" / "sys-class-infiniband-h100.0"
    result = rdma.probe_class_dir(class_dir)
    assert result.health.state is Health.OK, result.health.reason
    devices = {d.name: d for d in result.value or ()}
    assert sorted(devices, key=lambda n: (len(n), n)) == sorted(
        os.listdir(class_dir), key=lambda n: (len(n), n)
    )
    ib = [f"mlx5_{i}" for i in (0, 1, 4, 5, 6, 7, 8, 9)]
    for name in ib:
        (port,) = devices[name].ports
        assert (port.state, port.phys_state, port.rate_gbps, port.link_layer) == (
            "ACTIVE",
            "LinkUp",
            400.0,
            "InfiniBand",
        )
        assert port.counters  # real counters were captured
    (bond,) = devices["mlx5_bond_0"].ports
    assert (bond.state, bond.rate_gbps, bond.link_layer) == ("ACTIVE", 200.0, "Ethernet")
    # files without a trailing newline (as captured) still parse
    assert devices["mlx5_4"].firmware == (class_dir / "mlx5_4" / "fw_ver").read_text().strip()


def materialise_gcm(dump: dict[str, str], root: Path) -> Path:
    """Writes a gcm {sysfs path: content} dump under `root` and adds the class/infiniband links and
    `device` links the kernel would have (the dump keeps files only, not symlinks)."""
    for path, content in dump.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    devices = root / "sys" / "bus" / "pci" / "devices"
    cls = root / "sys" / "class" / "infiniband"
    cls.mkdir(parents=True)
    for pci in os.listdir(devices):
        for hca in (
            os.listdir(devices / pci / "infiniband") if (devices / pci / "infiniband").is_dir() else ()
        ):
            os.symlink(f"../../../{pci}", devices / pci / "infiniband" / hca / "device")
            os.symlink(f"../../bus/pci/devices/{pci}/infiniband/{hca}", cls / hca)
    return root / "sys"


def gcm_mapping(dump: dict[str, str]) -> dict[str, tuple[str, str]]:
    """hca -> (pci, netdev) from the dump's paths: both live under the same PCI function."""
    by_pci: dict[str, dict[str, str]] = defaultdict(dict)
    for path in dump:
        match = re.match(r"/sys/bus/pci/devices/([^/]+)/(infiniband|net)/([^/]+)/", path)
        if match:
            by_pci[match.group(1)][match.group(2)] = match.group(3)
    return {v["infiniband"]: (pci, v["net"]) for pci, v in by_pci.items() if "infiniband" in v}


@pytest.mark.parametrize("capture", ["learn_good", "learn_ib_misbound_if"])
def test_gcm_dump_gives_its_hca_to_ipoib_mapping(capture: str, shared_data: Path, tmp_path: Path) -> None:
    dump = json.loads((shared_data / "sysfs" / "gcm" / f"{capture}.json").read_text())
    result = rdma.probe(materialise_gcm(dump, tmp_path))
    expected = gcm_mapping(dump)
    assert len(expected) == 8
    got = {d.name: (d.pci_address, d.ports[0].netdev) for d in result.value or ()}
    assert got == expected
    assert all(p.rate_gbps == 200.0 and p.state == "ACTIVE" for d in result.value or () for p in d.ports)
    # the capture was anonymised: GUIDs and LIDs hold their own names, which the probe must call garbled
    assert result.health.state is Health.DEGRADED
    assert "mlx5_0/node_guid: not a GUID: 'node_guid'" in result.health.reason
    assert "mlx5_0/ports/1/lid: not an integer: 'lid'" in result.health.reason


def test_misbound_capture_swaps_the_pci_functions_of_mlx5_0_and_mlx5_1(
    shared_data: Path, tmp_path: Path
) -> None:
    good = json.loads((shared_data / "sysfs" / "gcm" / "learn_good.json").read_text())
    bad = json.loads((shared_data / "sysfs" / "gcm" / "learn_ib_misbound_if.json").read_text())
    pci = {}
    for name, dump in (("good", good), ("bad", bad)):
        devices = rdma.probe(materialise_gcm(dump, tmp_path / name)).value or ()
        pci[name] = {d.name: d.pci_address for d in devices}
    assert pci["good"]["mlx5_0"] == pci["bad"]["mlx5_1"] == "0000:0c:00.0"
    assert pci["good"]["mlx5_1"] == pci["bad"]["mlx5_0"] == "0000:12:00.0"
