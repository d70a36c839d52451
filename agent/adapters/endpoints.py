"""The HTTP endpoint of every component: /metrics plus health checks, on one small server.

Why one: the agent, the aggregator and the scheduler each carried a hand-written handler that
always answered the classic text format, uncompressed. Here /metrics is prometheus_client's own
exposition (`MetricsHandler`), so a scraper that asks for OpenMetrics gets it and one that accepts
gzip gets it compressed, the same as any Prometheus exporter. Every other path is a named check:
200 with its message when it passes, 503 when it fails, so kubelet probes and people read the
same answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import ThreadingHTTPServer
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

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
    """A running server: `port`, `shutdown()`."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(registry: CollectorRegistry, listen: str | tuple[str, int], checks: Mapping[str, Check]) -> Endpoint:
    """Serves /metrics from `registry` and each check at its path (e.g. "/healthz") on a daemon
    thread; an address in use raises OSError here, before anything runs."""
    address = parse_listen(listen) if isinstance(listen, str) else listen
    server = ThreadingHTTPServer(address, _handler(registry, dict(checks)))
    server.daemon_threads = True
    log.info("serving /metrics and %s on %s:%s", ", ".join(sorted(checks)), *server.server_address[:2])
    return Endpoint(server)


def _handler(registry: CollectorRegistry, checks: dict[str, Check]) -> type[MetricsHandler]:
    class Handler(MetricsHandler):
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
