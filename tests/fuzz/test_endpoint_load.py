"""The metrics/health endpoint under load (issue 22): 1,000 concurrent scrapes while 1,000
half-open connections hold on, on loopback, against the server in its own process. Every scrape is
answered, or refused with `503 Retry-After` and answered on a retry; every half-open connection is
closed by the server; nothing prints a traceback; the server's threads stay a fixed few and its
peak RSS stays inside the agent pod's 192 MiB limit. Figures are printed for the record (-s)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent.parent
SCRAPES = HALF_OPEN = RUDE = 1000
AGENT_MEMORY_LIMIT_KIB = 192 * 1024
DEADLINE_S = 90.0  # the whole run's bound: a scrape not answered by then fails the test
JITTER = random.Random(22)


class Server:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        assert proc.stdout is not None
        self.port = int(json.loads(proc.stdout.readline())["port"])

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        stats: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return stats


@pytest.fixture
def server() -> Iterator[Server]:
    proc = subprocess.Popen([sys.executable, str(HERE / "kits/endpoint_load_server.py")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield Server(proc)
    finally:
        proc.kill()
        proc.wait()


async def _scrape(port: int, outcomes: Counter[str], deadline: float) -> bool:
    """One scraper: GET /metrics until a 200; a 503 must carry Retry-After and is retried after it."""
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: load\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 30)
            writer.close()
        except (TimeoutError, OSError) as exc:
            outcomes[f"error {type(exc).__name__}"] += 1
            await asyncio.sleep(1)
            continue
        status = answer.split(b"\r\n", 1)[0]
        if status.startswith(b"HTTP/1.0 200") and b'hypertopo_load_port_state{device="mlx5_7",port="7"}' in answer:
            outcomes["200"] += 1
            return True
        if status.startswith(b"HTTP/1.0 503") and b"\r\nRetry-After: 1\r\n" in answer:
            outcomes["503 retry-after"] += 1
            await asyncio.sleep(1 + JITTER.random())  # Retry-After, spread as scrapers spread their retries
            continue
        outcomes[f"other {status[:40]!r}"] += 1
        await asyncio.sleep(1)
    return False


async def _half_open(port: int, deadline: float) -> bool:
    """A client that never finishes its request: True once the server has closed it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: slow")  # ... and never the blank line
        await writer.drain()
        await asyncio.wait_for(reader.read(), max(0.1, deadline - time.monotonic()))
        writer.close()
    except ConnectionError:
        return True  # closed by the server, with a reset
    except TimeoutError:
        return False
    return True


async def _rude(port: int) -> None:
    """A client that asks and hangs up at once, without reading the answer."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        await writer.drain()
        writer.transport.abort()
    except OSError:
        pass


async def _load(port: int) -> tuple[list[bool], list[bool], Counter[str]]:
    deadline = time.monotonic() + DEADLINE_S
    outcomes: Counter[str] = Counter()
    half_open = [asyncio.create_task(_half_open(port, deadline)) for _ in range(HALF_OPEN)]
    await asyncio.sleep(0)
    scrapes = [asyncio.create_task(_scrape(port, outcomes, deadline)) for _ in range(SCRAPES)]
    await asyncio.gather(*(_rude(port) for _ in range(RUDE)))
    return list(await asyncio.gather(*scrapes)), list(await asyncio.gather(*half_open)), outcomes


def test_a_thousand_scrapes_and_a_thousand_half_open_connections_stay_bounded(server: Server) -> None:
    before = server.stats()
    started = time.monotonic()
    answered, closed, outcomes = asyncio.run(_load(server.port))
    took = time.monotonic() - started
    after = server.stats()
    server.proc.kill()
    stderr = server.proc.communicate()[1]
    print(f"\n{SCRAPES} scrapes + {HALF_OPEN} half-open + {RUDE} hang-ups in {took:.1f} s; client outcomes "
          f"{dict(outcomes)}; server counts {after['counts']}; threads {before['threads']} -> peak "
          f"{after['peak_threads']}; RSS {before['rss_kib'] // 1024} MiB (peak {before['peak_rss_kib'] // 1024}) -> {after['rss_kib'] // 1024} MiB, "
          f"peak {after['peak_rss_kib'] // 1024} MiB")  # fmt: skip
    assert all(answered), f"{answered.count(False)} scrapes never answered: {dict(outcomes)}"
    assert set(outcomes) <= {"200", "503 retry-after"}, dict(outcomes)  # answered or cleanly refused
    assert all(closed), f"{closed.count(False)} half-open connections still open"
    assert "Traceback" not in stderr and "Error" not in stderr, stderr[-3000:]
    assert after["peak_threads"] <= before["threads"] + 1, "a thread per connection"
    assert after["peak_rss_kib"] < AGENT_MEMORY_LIMIT_KIB
