"""The one HTTP endpoint: /metrics speaks OpenMetrics and gzip when the scraper asks for them,
each check answers at its path (503 with its reason when it fails), unknown paths are 404; its
server bounds what clients can cost (slow heads time out, the connection cap refuses with
Retry-After, hang-ups are counted, not printed). The load test is tests/fuzz/test_endpoint_load.py."""

from __future__ import annotations

import gzip
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from agent.common.adapters.bounded_http import BoundedServer, Limits
from agent.common.adapters.endpoints import Endpoint, serve

State = dict[str, bool]


@pytest.fixture
def endpoint() -> Iterator[tuple[Endpoint, State]]:
    registry = CollectorRegistry()
    Counter("hypertopo_test_things", "Things counted.", registry=registry).inc(3)
    state = {"ready": False}

    def broken() -> bool:
        raise RuntimeError("cache lock poisoned")

    server = serve(registry, ("127.0.0.1", 0), {"/healthz": lambda: True,
                                                 "/readyz": lambda: (state["ready"], "first probe not done"),
                                                 "/broken": broken})
    try:
        yield server, state
    finally:
        server.shutdown()


def get(server: Endpoint, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_metrics_are_the_classic_text_format_by_default(endpoint: tuple[Endpoint, State]) -> None:
    status, headers, body = get(endpoint[0], "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"hypertopo_test_things_total 3.0" in body and b"# EOF" not in body


def test_a_scraper_asking_for_openmetrics_gets_openmetrics(endpoint: tuple[Endpoint, State]) -> None:
    status, headers, body = get(endpoint[0], "/metrics", Accept="application/openmetrics-text; version=1.0.0")
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_a_scraper_accepting_gzip_gets_it_compressed(endpoint: tuple[Endpoint, State]) -> None:
    status, headers, body = get(endpoint[0], "/metrics", **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    assert b"hypertopo_test_things_total 3.0" in gzip.decompress(body)


def test_checks_answer_at_their_paths_with_their_reason(endpoint: tuple[Endpoint, State]) -> None:
    server, state = endpoint
    assert get(server, "/healthz")[::2] == (200, b"ok\n")
    assert get(server, "/readyz")[::2] == (503, b"first probe not done\n")
    state["ready"] = True
    assert get(server, "/readyz")[0] == 200


def test_a_check_that_raises_fails_without_taking_the_server_down(endpoint: tuple[Endpoint, State]) -> None:
    status, _, body = get(endpoint[0], "/broken")
    assert status == 503 and b"cache lock poisoned" in body
    assert get(endpoint[0], "/healthz")[0] == 200


def test_unknown_paths_are_404_and_name_the_real_ones(endpoint: tuple[Endpoint, State]) -> None:
    status, _, body = get(endpoint[0], "/nope")
    assert status == 404 and b"/metrics" in body and b"/readyz" in body


# -- the server's bounds (issue 22) ---------------------------------------------------------------


Gated = tuple[BoundedServer, threading.Event, list[str]]


@pytest.fixture
def gated_server() -> Iterator[Callable[..., Gated]]:
    """Makes BoundedServers of 2 connections and 1 worker (other Limits by keyword) whose answers
    wait for their gate; every one is shut down after the test."""
    made: list[Gated] = []

    def make(**limits: Any) -> Gated:
        gate, seen = threading.Event(), []

        def answer(sock: socket.socket, head: bytes, client: object) -> None:
            seen.append(head.decode())
            gate.wait(10)
            sock.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n")

        bounds = Limits(**{"max_connections": 2, "workers": 1, "head_timeout": 0.3, **limits})
        made.append((BoundedServer(("127.0.0.1", 0), answer, bounds), gate, seen))
        return made[-1]

    yield make
    for server, gate, _ in made:
        gate.set()
        server.shutdown()


@pytest.fixture
def gated(gated_server: Callable[..., Gated]) -> Gated:
    return gated_server()


def connect(server: BoundedServer, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
    sock.sendall(data)
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_request_that_never_finishes_is_answered_408_and_closed(gated: Any) -> None:
    server, _, seen = gated
    sock = connect(server, b"GET /metrics HTTP/1.1\r\nHost: slow")
    assert read_all(sock).startswith(b"HTTP/1.0 408")
    assert server.counts["timed_out"] == 1 and seen == []


def test_a_head_over_the_limit_is_refused_431(gated: Any) -> None:
    server, _, seen = gated
    sock = connect(server, b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"x" * 20000)
    assert read_all(sock).startswith(b"HTTP/1.0 431") and seen == []


def test_at_the_cap_a_newcomer_is_told_to_retry_and_the_waiting_ones_are_answered(gated: Any) -> None:
    server, gate, seen = gated
    first, second = connect(server, b"GET /a HTTP/1.0\r\n\r\n"), connect(server, b"GET /b HTTP/1.0\r\n\r\n")
    wait_for(lambda: len(seen) == 1, "the first request to reach the worker")  # the second is queued
    busy = read_all(connect(server, b"GET /c HTTP/1.0\r\n\r\n"))
    assert busy.startswith(b"HTTP/1.0 503") and b"\r\nRetry-After: 1\r\n" in busy
    gate.set()
    assert read_all(first).endswith(b"ok\n") and read_all(second).endswith(b"ok\n")
    assert server.counts["refused"] == 1 and server.counts["answered"] == 2


def test_at_the_cap_a_slow_head_makes_room_for_a_quick_request(gated_server: Callable[..., Gated]) -> None:
    server, gate, seen = gated_server(evict_after=0.0, head_timeout=30)
    gate.set()
    slow = [connect(server, b"GET /metrics HTTP/1.1\r\n"), connect(server, b"GET /metrics HTTP/1.1\r\n")]
    wait_for(lambda: server.counts["accepted"] == 2, "both slow connections to be accepted")
    assert read_all(connect(server, b"GET /quick HTTP/1.0\r\n\r\n")).endswith(b"ok\n")
    assert server.counts["evicted"] >= 1 and seen == ["GET /quick HTTP/1.0\r\n\r\n"]
    for sock in slow:
        sock.close()


def test_a_client_that_hangs_up_before_its_answer_is_counted_without_a_traceback(
    gated: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server, gate, seen = gated
    sock = connect(server, b"GET /metrics HTTP/1.0\r\n\r\n")
    wait_for(lambda: len(seen) == 1, "the request to reach the worker")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset: the answer's write fails
    gate.set()
    wait_for(lambda: server.counts["disconnected"] + server.counts["answered"] == 1, "the answer to end")
    assert server.counts["disconnected"] == 1
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_endpoint_counts_connection_outcomes_in_its_metrics(endpoint: tuple[Endpoint, State]) -> None:
    get(endpoint[0], "/healthz")
    body = get(endpoint[0], "/metrics")[2].decode()
    assert 'hypertopo_http_connections_total{outcome="answered"}' in body
    assert endpoint[0].counts["answered"] >= 1
