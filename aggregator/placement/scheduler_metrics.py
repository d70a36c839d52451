"""The scheduler's Prometheus metrics (registry injected) and its small HTTP endpoint serving
/metrics and /healthz on :9732."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.decisions = Counter(
            "hypertopo_scheduler_decisions", "Placement decisions by result (scheduled, unschedulable, waiting).",
            ["result"], registry=registry)
        self.decision_seconds = Histogram(
            "hypertopo_scheduler_decision_duration_seconds", "Time of one gang placement decision (core + filters).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0), registry=registry)
        self.bind_seconds = Histogram(
            "hypertopo_scheduler_gang_bind_duration_seconds", "Time to bind a whole gang (rollback included).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0), registry=registry)
        self.binds = Counter(
            "hypertopo_scheduler_binds", "Pod bindings by result (bound, failed, rolled_back).", ["result"],
            registry=registry)
        self.evictions = Counter(
            "hypertopo_scheduler_evictions", "Fault-driven evictions by outcome (evicted, blocked, gone, error).",
            ["outcome"], registry=registry)
        self.pending = Gauge("hypertopo_scheduler_pending_pods", "Pods of this scheduler waiting for a node.",
                             registry=registry)
        self.failed_nodes = Gauge("hypertopo_scheduler_fabric_failed_nodes",
                                  "Nodes the scheduler treats as failed by the fabric.", registry=registry)


def serve(registry: CollectorRegistry, host: str, port: int, healthy: Callable[[], bool]) -> ThreadingHTTPServer:
    """Starts /metrics and /healthz on a daemon thread; returns the server (call shutdown())."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif self.path.startswith("/healthz"):
                ok = healthy()
                self._send(200 if ok else 503, b"ok\n" if ok else b"not synced\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
