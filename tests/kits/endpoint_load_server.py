"""The metrics/health endpoint alone in a process, for tests/fuzz/test_endpoint_load.py: serves a
registry about the size of an agent's on 127.0.0.1, prints {"port": N}, then answers each `stats`
line on stdin with its peak RSS, thread counts and connection counts as one JSON line."""

from __future__ import annotations

import json
import logging
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client import CollectorRegistry, Gauge

from agent.common.adapters.endpoints import serve


def _peak_rss_kib() -> int:
    """This process's own high-water mark (VmHWM). Not getrusage's ru_maxrss: that survives
    execve, so a server started from a large pytest process would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/status has no VmHWM")


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    registry = CollectorRegistry()
    gauge = Gauge("hypertopo_load_port_state", "A port's state.", ["device", "port"], registry=registry)
    for device in range(8):
        for port in range(8):
            gauge.labels(f"mlx5_{device}", str(port)).set(port)  # an RDMA node's port states
    peak = {"threads": threading.active_count()}

    def sample() -> None:
        while True:
            peak["threads"] = max(peak["threads"], threading.active_count())
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True, name="sampler").start()
    endpoint = serve(registry, ("127.0.0.1", 0), {"/healthz": lambda: True})
    print(json.dumps({"port": endpoint.port}), flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            statm = Path("/proc/self/statm").read_text().split()
            print(json.dumps({
                "rss_kib": int(statm[1]) * resource.getpagesize() // 1024,
                "peak_rss_kib": _peak_rss_kib(),
                "threads": threading.active_count(), "peak_threads": peak["threads"],
                "counts": endpoint.counts,
            }), flush=True)
    endpoint.shutdown()


if __name__ == "__main__":
    main()
