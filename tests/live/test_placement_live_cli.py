"""`hypertopo-scheduler run` as a process against the real API server: /healthz turns 200 once
its informers have synced, it binds a gang, /metrics counts the decision and the binds, SIGTERM
stops it cleanly; and the binding benchmark runs end to end on a small scale."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import bench_binding
import pytest
from controlplane.harness import ControlPlane
from placement_live import Cluster, kwok_running, wait_for
from realparts import free_port, http_get

pytestmark = pytest.mark.apiserver
BOUND = re.compile(r'^hypertopo_scheduler_binds_total\{result="bound"\} [1-9]', re.M)  # counted, not zero


@pytest.fixture
def cluster(apiserver: ControlPlane, unique: str) -> Iterator[Cluster]:
    with kwok_running(apiserver):
        c = Cluster(apiserver, unique)
        yield c
        c.cleanup()


def test_run_command_schedules_a_gang_and_serves_health_and_metrics(cluster: Cluster) -> None:
    cluster.leaf_spine(leaves=2, per_leaf=2, gpus=8)
    port = free_port()
    name = f"hypertopo-{cluster.tag}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator.placement.cli", "run", f"--kubeconfig={cluster.plane.kubeconfig}",
         f"--scheduler-name={name}", f"--listen=127.0.0.1:{port}", f"--node-selector={cluster.selector}",
         f"--namespace={cluster.ns}"],  # its Lease: a lone replica leads at once
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for("/healthz 200", lambda: http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)[0] == 200)
        cluster.add_podgroup("cli", 4)
        cluster.add_pods([cluster.pod_body(f"cli-{i}", name, gang="cli", gpus=4) for i in range(4)])
        placement = cluster.wait_bound(4)
        assert len(set(placement.values())) == 2  # 4 x 4 GPUs packed on two 8-GPU nodes

        def counted() -> str | None:
            text = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)[1]
            return text if BOUND.search(text) else None

        # the binds are visible on the API server before the scheduler thread counts the gang's outcome
        metrics = wait_for("the gang's binds counted", counted)
        assert 'hypertopo_scheduler_decisions_total{result="scheduled"} 1.0' in metrics
        assert 'hypertopo_scheduler_binds_total{result="bound"} 4.0' in metrics
        assert "hypertopo_scheduler_decision_duration_seconds_count 1.0" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out.decode()[-2000:]
    assert b"gang live-" in out  # the decision was logged


def test_binding_benchmark_binds_every_pod_of_many_small_gangs(apiserver: ControlPlane, unique: str) -> None:
    result = bench_binding.measure(apiserver, pods=200, gang=4, nodes=20, tag=f"b{unique}")
    assert result["bound"] == 200
    assert result["gangs_scheduled"] == 50
    assert result["status_written"] == 50  # every gang's PodGroup status, written after its binds
    assert result["pods_per_second"] > 0
