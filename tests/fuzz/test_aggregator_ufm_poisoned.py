"""A poisoned UFM answer is one failed poll, never a dead poller (issue 22.3).

Each field UFM sends (of a port, a system, a link, an unhealthy-port entry) is replaced, one at a
time, by a value of the wrong type, an odd peer or port string (Unicode digits, a bare "_", a
megabyte), or a value nested thousands deep, and served by the UFM stand-in on loopback to the
real polling loop on its own thread (the one the controller runs as `ufm-poller`). For every
poison the thread lives on; an answer that cannot be read is counted
(`hypertopo_source_errors_total{kind="malformed"}`), marks the source stale
(`hypertopo_source_stale` 1, `stale()` says why) and keeps the last good facts; a poison before
the first good answer keeps `/readyz` failing (the source is not ready); and the next good answer
recovers (stale 0, ready).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from ufm_standin import UfmStandIn, listings

from agent.cluster_model import load_model
from aggregator.adapters.ufm import UfmClient, UfmConfig, UfmPoller, UfmSource
from aggregator.live.controller import readiness

SMALL = load_model(str(Path(__file__).resolve().parent.parent / "models" / "small-tree.yaml"))
GOOD = listings(SMALL)
DEEP = "[" * 5000 + "]" * 5000  # past json's recursion limit
NESTED = "[" * 900 + "1" + "]" * 900  # decodes, but printing it recursed
MARK = "__poison__"

# values of the wrong kind for any field, and odd texts for fields that hold names and numbers
WRONG_TYPES: list[str] = ["[]", "{}", '[["x"]]', '{"a": {"b": 1}}', "true", "1.5e308", "-1", "1" + "0" * 300, "null"]
ODD_TEXTS: list[str] = [json.dumps(t) for t in ("\u0661\u0662", "\u00b2", "_", "0123456789abcdef_\u00b2", "x_1" * 50000,
                                                "leaf1\n", "", " ", "\u202e")]  # fmt: skip
POISONS = [*WRONG_TYPES, *ODD_TEXTS, DEEP, NESTED]


def _fields(listing: str) -> list[str]:
    keys: set[str] = set()
    for item in GOOD[listing]:
        keys.update(item)
    return sorted(keys)


def poisoned(listing: str, field: str, raw: str) -> bytes:
    """The listing as JSON with `field` of every item replaced by the raw JSON text `raw`."""
    items = [{**item, field: MARK} if field in item else item for item in GOOD[listing]]
    return json.dumps(items).replace(json.dumps(MARK), raw).encode()


CASES = [(listing, field) for listing in ("ports", "systems", "unhealthy_ports", "links") for field in _fields(listing)]
CASES += [("ports", "<whole listing>"), ("systems", "<whole listing>")]


def errors(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("hypertopo_source_errors_total", {"source": "ufm", "kind": "malformed"}) or 0.0


def stale(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("hypertopo_source_stale", {"source": "ufm"})


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


class Running:
    """The UFM source with its poller running on a thread of its own, as the controller runs it."""

    def __init__(self, url: str, credentials: str) -> None:
        # polls back to back (a millisecond apart): 1,180 poisons, each served for two polls and
        # then recovered from, spent most of their time in the wait between polls
        config = UfmConfig(url=url, credentials_dir=credentials, interval=0.001, timeout=10.0)
        self.registry = CollectorRegistry()
        self.poller = UfmPoller(UfmClient(config), interval=0.001)
        self.source = UfmSource(self.poller)
        ((name, loop),) = self.source.workers(registry=self.registry)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=loop, args=(self.stop,), name=name, daemon=True)

    def polls_after_now(self, count: int = 2) -> None:
        """Waits for `count` whole polls that started after this call."""
        start = self.poller.polls
        wait_for(lambda: self.poller.polls >= start + count, f"{count} polls")


@pytest.fixture
def credentials(tmp_path: Path) -> str:
    """The stand-in's default account, as a mounted Secret gives it."""
    (tmp_path / "username").write_text("admin\n")
    (tmp_path / "password").write_text("123456\n")
    return str(tmp_path)


@pytest.fixture
def running(credentials: str) -> Iterator[tuple[UfmStandIn, Running]]:
    with UfmStandIn(GOOD) as standin:
        run = Running(standin.url, credentials)
        run.thread.start()
        yield standin, run
        run.stop.set()
        run.thread.join(timeout=15)


def _serve(standin: UfmStandIn, listing: str, field: str, raw: str) -> None:
    body = raw.encode() if field == "<whole listing>" else poisoned(listing, field, raw)
    standin.behaviour.raw = {listing: body}


def test_a_poisoned_first_answer_keeps_readyz_failing_until_a_good_one(
    running: tuple[UfmStandIn, Running], credentials: str
) -> None:
    standin, run = running
    run.stop.set()  # restarted below with the poison in place before its first poll
    run.thread.join(timeout=15)
    fresh = Running(standin.url, credentials)
    standin.behaviour.raw = {"ports": poisoned("ports", "number", DEEP)}
    fresh.thread.start()
    try:
        fresh.polls_after_now()
        assert fresh.thread.is_alive()
        assert errors(fresh.registry) >= 1 and stale(fresh.registry) == 1
        assert not fresh.source.ready()  # /readyz: no facts to build on
        assert "nested too deep" in (fresh.source.stale() or "")
        ok, body = readiness(fresh.source.ready(), [fresh.source])  # what /readyz answers
        assert not ok and body.startswith("not ready: ") and "ufm stale: malformed" in body, body
        standin.behaviour.raw = {}
        wait_for(lambda: stale(fresh.registry) == 0, "recovery")
        assert fresh.source.ready() and fresh.source.stale() is None
        assert readiness(fresh.source.ready(), [fresh.source]) == (True, "ok")
    finally:
        fresh.stop.set()
        fresh.thread.join(timeout=15)


def test_every_poisoned_field_is_a_failed_poll_or_a_read_never_a_dead_poller(running: tuple[UfmStandIn, Running]) -> None:
    standin, run = running
    wait_for(lambda: stale(run.registry) == 0, "the first good answer")
    good = run.poller.snapshot()[1]
    assert good is not None
    failed: list[str] = []
    for listing, field in CASES:
        for raw in POISONS:
            before = errors(run.registry)
            _serve(standin, listing, field, raw)
            run.polls_after_now()
            what = f"{listing}.{field} = {raw[:40]!r}"
            assert run.thread.is_alive(), what
            assert not run.poller.dead, what
            if errors(run.registry) > before:  # unreadable: counted, stale, last good facts kept
                failed.append(what)
                assert stale(run.registry) == 1, what
                assert run.source.stale() is not None, what
                assert run.source.ready(), what  # the last good facts are still there to build on
            standin.behaviour.raw = {}
            wait_for(lambda: stale(run.registry) == 0, f"recovery after {what}")
    assert run.poller.snapshot()[1] == good  # the fabric as it was, after all that
    # every value nested past the decoder's limit, and a listing that is no array, failed its poll
    deep = {f"{listing}.{field} = {DEEP[:40]!r}" for listing, field in CASES if listing != "links"}
    assert deep <= set(failed), sorted(deep - set(failed))[:5]
    assert f"ports.<whole listing> = {'{}'!r}" in failed
    print(f"\nUFM poisons: {len(CASES) * len(POISONS)} served, {len(failed)} failed polls, the rest read")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the SystemExit, on purpose
def test_a_poller_loop_that_ends_unasked_is_stale_and_not_ready(running: tuple[UfmStandIn, Running]) -> None:
    _, run = running
    wait_for(lambda: run.source.ready(), "the first good answer")

    def stopped(*_: Any) -> Any:
        raise SystemExit("gone")  # not an Exception: nothing in a poll catches it

    run.poller.client.fetch = stopped  # type: ignore[method-assign]
    wait_for(lambda: not run.thread.is_alive(), "the loop to end")
    assert run.poller.dead and stale(run.registry) == 1
    assert not run.source.ready()
