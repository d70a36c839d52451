"""The UFM poller (aggregator.adapters.ufm) against a UFM stand-in on loopback: basic and token
authentication from Secret-style files, optional listings an older UFM lacks, large chunked
responses, TLS verified by default; and every way UFM fails (401, 403, 500, a hang past the
timeout, HTML, a truncated body, a dropped connection, JSON of the wrong shape) keeps the last good
facts, marks the source stale in metrics and says what happened in one clear log line, repeated
only with back-off."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from ufm_standin import Fault, UfmStandIn, listings

from agent.cluster_model import load_model
from aggregator.adapters.ufm import UfmClient, UfmConfig, UfmFetchError, UfmPoller, read_credentials

MODELS = Path(__file__).resolve().parent.parent / "models"
SMALL = load_model(str(MODELS / "small-tree.yaml"))
LOGGER = "aggregator.adapters.ufm"


def secret(tmp_path: Path, **files: str) -> str:
    """A directory as a mounted Secret gives it: one file per key."""
    root = tmp_path / "ufm-secret"
    root.mkdir(exist_ok=True)
    for name, value in files.items():
        (root / name).write_text(value + "\n")
    return str(root)


@pytest.fixture
def standin() -> Iterator[UfmStandIn]:
    with UfmStandIn(listings(SMALL), username="ufmuser", password="s3cret", token="tok-123") as server:
        yield server


def poller(url: str, creds: str, registry: CollectorRegistry | None = None, **config: object) -> UfmPoller:
    cfg = UfmConfig(url=url, credentials_dir=creds, interval=0.05, timeout=float(config.pop("timeout", 10.0)), **config)  # type: ignore[arg-type]
    return UfmPoller(UfmClient(cfg), interval=0.05, registry=registry or CollectorRegistry(), clock=lambda: 1700000000.0)


def stale(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("hypertopo_source_stale", {"source": "ufm"})


# --- answering -------------------------------------------------------------------------------------


LISTED = ["resources/ports", "resources/links", "resources/systems", "app/unhealthy_ports"]


def test_basic_auth_reads_all_four_listings(standin: UfmStandIn, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    p = poller(standin.url, secret(tmp_path, username="ufmuser", password="s3cret"), registry)
    assert stale(registry) == 1  # nothing fetched yet
    assert p.poll_once()
    assert list(standin.paths()) == [f"/ufmRest/{n}" for n in LISTED]
    assert p.facts is not None and (p.facts.switch_count(), p.facts.host_count(), len(p.facts.links)) == (3, 8, 10)
    assert stale(registry) == 0
    assert registry.get_sample_value("hypertopo_source_last_success_timestamp_seconds", {"source": "ufm"}) == 1700000000.0


def test_a_token_goes_to_the_token_path(standin: UfmStandIn, tmp_path: Path) -> None:
    p = poller(standin.url, secret(tmp_path, token="tok-123"))
    assert p.poll_once()
    assert {path for path, _ in standin.requests} == {f"/ufmRestV3/{n}" for n in LISTED}
    assert {auth for _, auth in standin.requests} == {"Basic tok-123"}


def test_a_rotated_secret_is_read_on_the_next_poll(standin: UfmStandIn, tmp_path: Path) -> None:
    creds = secret(tmp_path, username="ufmuser", password="old")
    p = poller(standin.url, creds)
    assert not p.poll_once()
    secret(tmp_path, password="s3cret")
    assert p.poll_once()


def test_credentials_files_missing_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UfmFetchError, match=r"expected files `username` and `password`, or `token`") as caught:
        read_credentials(secret(tmp_path, username="only-a-user"))
    assert caught.value.kind == "credentials"


def test_listings_an_older_ufm_lacks_are_skipped_after_one_404(standin: UfmStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    standin.behaviour.missing = {"links", "systems", "unhealthy_ports"}
    p = poller(standin.url, secret(tmp_path, username="ufmuser", password="s3cret"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert p.poll_once() and p.poll_once()
    assert [path.rsplit("/", 1)[1] for path in standin.paths()] == ["ports", "links", "systems", "unhealthy_ports", "ports"]
    assert p.facts is not None and len(p.facts.links) == 10  # the ports' peer fields carry the cabling
    assert sum("no links listing (404)" in r.getMessage() for r in caplog.records) == 1


def test_a_large_fabric_comes_whole_in_chunks(tmp_path: Path) -> None:
    big = load_model(str(MODELS / "fat-tree-3tier.yaml"))
    with UfmStandIn(listings(big)) as server:
        server.behaviour.chunked = True
        p = poller(server.url, secret(tmp_path, username="admin", password="123456"))
        assert p.poll_once()
        assert p.facts is not None and len(p.facts.ports) == len(listings(big)["ports"])


def test_a_changed_fabric_bumps_the_generation_and_calls_back(standin: UfmStandIn, tmp_path: Path) -> None:
    calls: list[int] = []
    p = poller(standin.url, secret(tmp_path, username="ufmuser", password="s3cret"))
    p.on_change = lambda: calls.append(p.generation)
    assert p.poll_once() and p.poll_once()
    assert calls == [1]  # the same fabric again is no change
    standin.set(listings(SMALL, faults={("node03", 0): Fault("down")}))
    assert p.poll_once()
    assert calls == [1, 2]
    assert p.facts is not None and len(p.facts.links) == 10  # the down cable is remembered


# --- TLS --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "ufm.crt", root / "ufm.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ufm-standin",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


def test_tls_is_verified_against_the_ca_bundle(certificate: tuple[str, str], tmp_path: Path) -> None:
    creds = secret(tmp_path, username="admin", password="123456")
    with UfmStandIn(listings(SMALL), tls=certificate) as server:
        assert server.url.startswith("https://")
        unknown = poller(server.url, creds)
        assert not unknown.poll_once()  # verification is on by default: a self-signed UFM is refused
        with pytest.raises(UfmFetchError, match="CERTIFICATE_VERIFY_FAILED"):
            unknown.client.fetch()
        assert poller(server.url, creds, ca_bundle=certificate[0]).poll_once()
        assert poller(server.url, creds, verify=False).poll_once()


# --- outages ----------------------------------------------------------------------------------------

OUTAGES = [
    ("401", "auth", "401 credentials refused: check the UFM Secret"),
    ("403", "auth", "403 access denied for this user: check the UFM Secret"),
    ("500", "http", "HTTP 500 Internal Server Error"),
    ("hang", "timeout", "no answer within 1s"),
    ("html", "malformed", "not JSON (Expecting value: line 1 column 1 (char 0)); it starts '<html><body>UFM is starting"),
    ("truncated", "malformed", "not JSON"),
    ("drop", "unreachable", "GET http://127.0.0.1:"),
    ("not-array", "malformed", "UFM answered JSON that is not its documented shape: ports: expected a JSON array of objects, got dict"),
    ("empty", "empty", "UFM lists no ports at all (still discovering after a restart?)"),
]


@pytest.mark.parametrize(("fail", "kind", "said"), OUTAGES, ids=[o[0] for o in OUTAGES])
def test_an_outage_keeps_the_last_good_facts_marks_stale_and_says_why(
    standin: UfmStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture, fail: str, kind: str, said: str
) -> None:
    registry = CollectorRegistry()
    timeout = 1.0 if fail == "hang" else 10.0  # a loaded machine must not turn other failures into timeouts
    p = poller(standin.url, secret(tmp_path, username="ufmuser", password="s3cret"), registry, timeout=timeout)
    assert p.poll_once()
    good, generation = p.facts, p.generation
    standin.behaviour.fail, standin.behaviour.hang_seconds = fail, 3.0
    with caplog.at_level(logging.INFO, logger=LOGGER):
        caplog.clear()  # only what the failed poll logs (a test before may have left INFO on)
        assert not p.poll_once()
    assert p.facts is good and p.generation == generation
    assert stale(registry) == 1
    assert registry.get_sample_value("hypertopo_source_errors_total", {"source": "ufm", "kind": kind}) == 1
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert line.startswith(f"UFM poll failed ({kind}, 1 in a row): ") and said in line
    assert line.endswith("; keeping the last good fabric facts")
    standin.behaviour.fail = None
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert p.poll_once()
    assert stale(registry) == 0 and p.facts == good
    assert caplog.records[-1].getMessage().startswith("UFM answers again after 1 failed poll(s): 3 switches, 8 hosts")


def test_unreachable_before_any_answer_says_there_are_no_facts_yet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with UfmStandIn(listings(SMALL)) as server:
        url = server.url
    p = poller(url, secret(tmp_path, username="admin", password="123456"))  # nothing listens there now
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not p.poll_once()
    [line] = [r.getMessage() for r in caplog.records]
    assert "(unreachable, 1 in a row)" in line and "Connection refused" in line
    assert line.endswith("; no fabric facts from UFM yet") and p.facts is None


def test_repeated_failures_are_logged_with_back_off(standin: UfmStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = poller(standin.url, secret(tmp_path, username="ufmuser", password="s3cret"))
    standin.behaviour.fail = "500"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(9):
            assert not p.poll_once()
        standin.behaviour.fail = "401"  # a new kind of failure is told at once
        assert not p.poll_once()
    counts = [r.getMessage().split("(", 1)[1].split(")", 1)[0] for r in caplog.records]
    assert counts == ["http, 1 in a row", "http, 2 in a row", "http, 4 in a row", "http, 8 in a row", "auth, 10 in a row"]


def test_the_poller_thread_polls_until_stopped(standin: UfmStandIn, tmp_path: Path) -> None:
    p = poller(standin.url, secret(tmp_path, username="ufmuser", password="s3cret")).start()
    try:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(standin.requests) < 9:
            time.sleep(0.02)
    finally:
        p.stop()
    assert len(standin.requests) >= 9 and p.facts is not None
