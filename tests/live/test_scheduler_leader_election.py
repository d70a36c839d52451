"""Two `hypertopo-scheduler run` processes on the real API server share one Lease: only the leader
binds; kill -9 of the leader half-way through a gang's binds leaves the standby to finish that gang
inside the same leaf, every pod bound exactly once (no pod recreated, no bind refused, nothing
rolled back), within a lease of the kill."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from placement_live import Cluster, wait_for
from realparts import free_port, stop_processes

from agent.common.adapters.kube import LEASES

pytestmark = pytest.mark.apiserver
REPO = Path(__file__).resolve().parents[2]
LEASE = ("--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5")
GANG = 60  # 1-GPU pods: fits one 8 x 8-GPU leaf, not two half leaves under the hard tier-1 limit
HARD_LEAF = {"volcano.sh/network-topology-mode": "hard", "volcano.sh/network-topology-highest-tier": "1"}


class SchedulerProcess:
    def __init__(self, cluster: Cluster, scheduler_name: str, identity: str) -> None:
        self.port = free_port()
        self.log = cluster.plane.workdir / f"scheduler-{identity}-{self.port}.log"
        argv = [sys.executable, "-m", "aggregator.placement.cli", "run", f"--kubeconfig={cluster.plane.kubeconfig}",
                f"--scheduler-name={scheduler_name}", f"--listen=127.0.0.1:{self.port}",
                f"--node-selector={cluster.selector}", f"--namespace={cluster.ns}", f"--identity={identity}",
                "--bind-workers=1", *LEASE]  # one bind at a time: the gang's binds take long enough to cut
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    def metrics(self) -> dict[str, float]:
        if self.proc.poll() is not None:
            raise AssertionError(f"scheduler exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        values: dict[str, float] = {}
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                                                    timeout=2) as resp:
            for line in resp.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.rpartition(" ")
                    values[name] = float(value)
        return values

    def leading(self) -> bool:
        return self.metrics().get("hypertopo_scheduler_is_leader") == 1.0

    def stop(self) -> None:
        stop_processes([self.proc], timeout=15)


def test_the_standby_finishes_a_gang_whose_leader_was_killed_mid_bind(cluster: Cluster) -> None:
    layout = cluster.leaf_spine(leaves=2, per_leaf=8, gpus=8)
    name = f"hypertopo-{cluster.tag}"
    a = SchedulerProcess(cluster, name, "a")
    b: SchedulerProcess | None = None
    try:
        wait_for("a leads", a.leading, timeout=30)
        b = SchedulerProcess(cluster, name, "b")
        wait_for("b synced", lambda: b.metrics().get("hypertopo_scheduler_pending_pods") is not None, timeout=30)
        assert not b.leading() and a.leading()

        cluster.add_podgroup("ha", GANG, annotations=HARD_LEAF)
        cluster.add_pods([cluster.pod_body(f"ha-{i}", name, gang="ha") for i in range(GANG)])
        uids = {n: p["metadata"]["uid"] for n, p in cluster.pods().items()}
        wait_for("the leader's first binds", lambda: cluster.placement() or None, timeout=30, interval=0.005)
        a.proc.kill()  # kill -9 mid-gang: no lease release, no rollback, binds cut short
        killed = time.monotonic()
        a.proc.wait(timeout=10)
        by_a = cluster.placement()
        assert 0 < len(by_a) < GANG, f"the kill did not land mid-gang: {len(by_a)} of {GANG} bound"
        assert not b.metrics().get('hypertopo_scheduler_binds_total{result="bound"}')  # the standby bound nothing

        wait_for("b leads", b.leading, timeout=15, interval=0.05)
        takeover = time.monotonic() - killed
        placement = cluster.wait_bound(GANG, timeout=30)
        finished = time.monotonic() - killed
        print(f"\nscheduler takeover after kill -9: {takeover:.2f}s (lease 3s, renew deadline 2s, retry 0.5s); "
              f"{len(by_a)} of {GANG} pods bound by the killed leader, the rest by the standby "
              f"{finished:.2f}s after the kill")
        assert takeover < 3 + 0.5 + 2.0  # within the lease (+ one retry period, + scrape slack)

        pods = cluster.pods()
        assert {n: p["metadata"]["uid"] for n, p in pods.items()} == uids  # no pod deleted or recreated
        assert all(placement[n] == node for n, node in by_a.items())  # the old leader's binds stand
        leaves = {leaf for leaf, nodes in layout.items() if set(placement.values()) & set(nodes)}
        assert len(leaves) == 1, placement  # the standby finished the gang in the same leaf
        assert max(Counter(placement.values()).values()) <= 8  # no node over-committed
        # the binds are visible on the API server before b's scheduler thread counts the gang's outcome
        wait_for("b counted its binds", lambda: b.metrics().get('hypertopo_scheduler_binds_total{result="bound"}'),
                 timeout=10)
        m = b.metrics()
        assert m.get('hypertopo_scheduler_binds_total{result="bound"}') == GANG - len(by_a)
        assert not m.get('hypertopo_scheduler_binds_total{result="failed"}')  # no bind refused (409)
        assert not m.get('hypertopo_scheduler_binds_total{result="rolled_back"}')
        lease = cluster.api.get(LEASES, "hypertopo-scheduler", namespace=cluster.ns)
        assert lease["spec"]["holderIdentity"] == "b"
    finally:
        a.stop()
        if b is not None:
            b.stop()
