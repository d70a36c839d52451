"""The agent's /metrics: golden exposition for a fixture host, promtool lint, and the mapping from
report to series (dcgm-exporter labels, absent is not zero, failed probes show as 0)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from agent_host import HGX_SYSFS, LINKS, NODE, fixture_prober
from prometheus_client import CollectorRegistry, generate_latest
from realparts import require_binary, wait_for

from agent.collect import CollectConfig, Prober
from agent.metrics import AgentMetrics, PublishCounts
from agent.probes.nvml import XidWatcher
from agent.probes.nvml_fake import FakeNvml

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "agent_metrics.prom"
DURATION = re.compile(r"^(hypertopo_probe_duration_seconds\{[^}]*\}) \S+$", re.M)


def registry_for(prober: Prober, counts: PublishCounts | None = None) -> CollectorRegistry:
    counts = counts or PublishCounts()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        AgentMetrics(lambda: prober.latest, lambda: counts, version="0.1.0", python_version="3.x")
    )
    return registry


def exposition(registry: CollectorRegistry) -> str:
    """The text exposition with probe durations masked (they are the only non-deterministic values)."""
    return DURATION.sub(r"\1 <duration>", generate_latest(registry).decode())


def golden_prober() -> Prober:
    """Fixture host with one NVLink down, ECC errors and two XID 74 events seen by the watcher."""
    fake = FakeNvml("hgx-h100")
    fake.set_link(3, 7, up=False)
    fake.set_uncorrected_ecc(5, 2)
    prober = fixture_prober(fake)
    watcher = XidWatcher(fake, lambda gpu, xid: None, poll_ms=10)
    assert watcher.start()
    try:
        fake.inject_xid(2, 74)
        fake.inject_xid(2, 74)
        wait_for(lambda: watcher.counts().get(2, {}).get(74) == 2, timeout=5)
        prober.xid_watcher = watcher
        prober.collect()
    finally:
        watcher.stop()
    return prober


def test_metrics_exposition_matches_golden_for_hgx_h100_host() -> None:
    text = exposition(registry_for(golden_prober(), PublishCounts(writes=3, errors=1)))
    if os.environ.get("HYPERTOPO_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no golden file: run with HYPERTOPO_UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(), "metrics differ from tests/golden/agent_metrics.prom"


def test_promtool_finds_no_problem_in_the_exposition() -> None:
    promtool = require_binary("promtool")
    text = generate_latest(registry_for(golden_prober())).decode()
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr


def test_every_nvlink_of_every_gpu_is_a_series_and_the_down_one_is_zero() -> None:
    registry = registry_for(golden_prober())
    text = generate_latest(registry).decode()
    assert len(re.findall(r"^hypertopo_nvlink_up\{", text, re.M)) == 8 * 18
    labels = {"gpu": "3", "link": "7", "Hostname": NODE, "pci_bus_id": "00000000:5D:00.0"}
    down = [
        line
        for line in text.splitlines()
        if line.startswith("hypertopo_nvlink_up{") and line.endswith(" 0.0")
    ]
    assert len(down) == 1
    assert all(f'{k}="{v}"' in down[0] for k, v in labels.items()), down[0]


def test_xid_and_ecc_counters_carry_dcgm_labels() -> None:
    text = generate_latest(registry_for(golden_prober())).decode()
    xid = [line for line in text.splitlines() if line.startswith("hypertopo_gpu_xid_events_total{")]
    assert len(xid) == 1 and 'gpu="2"' in xid[0] and 'xid="74"' in xid[0] and xid[0].endswith(" 2.0")
    assert 'pci_bus_id="00000000:3A:00.0"' in xid[0] and 'UUID="GPU-' in xid[0]
    ecc = [
        line for line in text.splitlines() if line.startswith("hypertopo_gpu_uncorrected_ecc_errors_total{")
    ]
    assert [line.rsplit(" ", 1)[1] for line in ecc if 'gpu="5"' in line] == ["2.0"]


def test_rdma_ports_report_state_and_rate_in_bytes_per_second() -> None:
    registry = registry_for(golden_prober())
    labels = {"device": "mlx5_0", "port": "1", "link_layer": "InfiniBand", "netdev": "ib0"}
    assert registry.get_sample_value("hypertopo_rdma_port_up", labels) == 1
    assert registry.get_sample_value("hypertopo_rdma_port_rate_bytes_per_second", labels) == 400e9 / 8


def test_a_failing_probe_shows_success_zero_and_others_still_report() -> None:
    def broken_links() -> list[object]:
        raise OSError("netlink socket closed")

    config = CollectConfig(NODE, sysfs=HGX_SYSFS, nvml="fake:hgx-h100")
    prober = Prober(config, links=broken_links)
    prober.collect()
    registry = registry_for(prober)
    assert registry.get_sample_value("hypertopo_probe_success", {"probe": "net"}) == 0
    assert registry.get_sample_value("hypertopo_probe_success", {"probe": "nvml"}) == 1
    assert (
        registry.get_sample_value("hypertopo_component_health", {"component": "net", "state": "failed"}) == 1
    )
    assert registry.get_sample_value("hypertopo_probe_duration_seconds", {"probe": "rdma"}) > 0


def test_absent_gpus_give_no_gpu_series_rather_than_zeros() -> None:
    prober = Prober(CollectConfig(NODE, sysfs=HGX_SYSFS, nvml="off"), links=lambda: LINKS)
    prober.collect()
    text = generate_latest(registry_for(prober)).decode()
    assert not re.search(r"^hypertopo_(gpu|nvlink)_\w+\{", text, re.M)
    assert 'hypertopo_component_health{component="nvml",state="absent"} 1.0' in text


def test_before_the_first_probe_only_build_and_publish_series_exist() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentMetrics(lambda: None, lambda: PublishCounts(writes=0, errors=4)))
    assert registry.get_sample_value("hypertopo_publish_errors_total") == 4
    assert registry.get_sample_value("hypertopo_probe_success", {"probe": "nvml"}) is None
    text = generate_latest(registry).decode()
    assert "hypertopo_build_info{" in text
