"""The HTTP endpoint of every component: /metrics plus health checks, on one small server.

Why one: the agent, the aggregator and the scheduler each carried a hand-written handler that
always answered the classic text format, uncompressed. Here /metrics is prometheus_client's own
exposition (`MetricsHandler`), so a scraper that asks for OpenMetrics gets it and one that accepts
gzip gets it compressed, the same as any Prometheus exporter. Every other path is a named check:
200 with its message when it passes, 503 when it fails, so kubelet probes and people read the
same answer.

The server itself is `bounded_http.BoundedServer`: a real listen backlog, a cap on open
connections, time limits on reading a request and taking its answer, and clients that hang up
counted in `hypertopo_http_connections_total{outcome}` instead of printed as tracebacks (issue 22).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator, Mapping
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler
from prometheus_client.metrics_core import CounterMetricFamily, Metric

from agent.common.adapters.bounded_http import BoundedServer, Limits, SocketWriter

log = logging.getLogger(__name__)

# A check answers True/False, or (ok, message) when it can say why.
Check = Callable[[], bool | tuple[bool, str]]


def parse_listen(text: str) -> tuple[str, int]:
    """`:9731` -> ("0.0.0.0", 9731); `127.0.0.1:9731`, `[::1]:9730`; else ValueError (a port is
    one a probe and a scrape config can name: not 0)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen must be HOST:PORT or :PORT, not {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class Endpoint:
    """A running server: `port`, `counts` (connection outcomes), `shutdown()`."""

    def __init__(self, server: BoundedServer) -> None:
        self._server = server

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def counts(self) -> Mapping[str, int]:
        return dict(self._server.counts)

    def shutdown(self) -> None:
        self._server.shutdown()


OUTCOMES = ("accepted", "answered", "refused", "evicted", "timed_out", "too_large", "disconnected", "failed")


class _ConnectionCounts:
    """`hypertopo_http_connections_total{outcome}` from the server's own counts."""

    def __init__(self, server: BoundedServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("hypertopo_http_connections", "Connections to the metrics/health endpoint "
                                     "by outcome (refused: 503 at the cap; evicted/timed_out: a request "
                                     "that did not arrive in time; disconnected: the client hung up).",
                                     labels=["outcome"])  # fmt: skip
        counts = dict(self._server.counts)
        for outcome in OUTCOMES:
            family.add_metric([outcome], counts.get(outcome, 0))
        yield family


def serve(registry: CollectorRegistry, listen: str | tuple[str, int], checks: Mapping[str, Check],
          limits: Limits | None = None) -> Endpoint:  # fmt: skip
    """Serves /metrics from `registry` and each check at its path (e.g. "/healthz") on its own
    threads; an address in use raises OSError here, before anything runs."""
    address = parse_listen(listen) if isinstance(listen, str) else listen
    handler = _handler(registry, dict(checks))
    # The handler's `request` is (socket, head): see Handler.setup.
    answer = lambda sock, head, client: handler((sock, head), client, None)  # type: ignore[arg-type]  # noqa: E731
    server = BoundedServer(address, answer, limits or Limits())
    registry.register(_ConnectionCounts(server))
    log.info("serving /metrics and %s on %s:%s", ", ".join(sorted(checks)), *server.server_address[:2])
    return Endpoint(server)


def _handler(registry: CollectorRegistry, checks: dict[str, Check]) -> type[MetricsHandler]:
    class Handler(MetricsHandler):
        """One request: `request` is (socket, the request head already read; a GET has no body)."""

        def setup(self) -> None:
            self.connection, head = self.request
            self.rfile = io.BytesIO(head)
            self.wfile = SocketWriter(self.connection)

        def finish(self) -> None:
            pass  # the server closes the connection

        def do_GET(self) -> None:  # http.server's naming
            path = urlparse(self.path).path
            if path == "/metrics":
                super().do_GET()
            elif path in checks:
                ok, message = _outcome(checks[path])
                self._reply(200 if ok else 503, f"{message}\n".encode())
            else:
                self._reply(404, f"not found: try /metrics, {', '.join(sorted(checks))}\n".encode())

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    Handler.registry = registry
    return Handler


def _outcome(check: Check) -> tuple[bool, str]:
    try:
        result = check()
    except Exception as exc:  # a check that breaks is a failing check, not a dead server
        log.warning("health check failed: %s", exc)
        return False, f"check failed: {exc}"
    if isinstance(result, tuple):
        return result
    return result, "ok" if result else "not ok"
