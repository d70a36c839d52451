"""The one HTTP endpoint: /metrics speaks OpenMetrics and gzip when the scraper asks for them,
each check answers at its path (503 with its reason when it fails), unknown paths are 404."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from agent.adapters.endpoints import Endpoint, serve

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
