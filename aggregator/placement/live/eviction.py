"""Evictions for fabric faults: through the Eviction API (policy/v1), so PodDisruptionBudgets
hold; rate-limited by a token bucket; a 429 (the budget refuses now) is retried later, never
forced; an eviction is offered once per pod UID, unless it is withdrawn before its attempt (the
fault-storm breaker, `breaker.py`).

Runs its own thread so a slow or refusing API server never stalls scheduling decisions.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from aggregator.placement.core.rescheduler import Eviction

log = logging.getLogger(__name__)


class EvictApi(Protocol):
    def evict(self, namespace: str, name: str, uid: str) -> None: ...


@dataclass
class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up. Pure: time is passed in."""

    rate: float
    burst: float
    tokens: float = -1.0
    stamp: float = 0.0

    def wait(self, now: float) -> float:
        """Seconds until a token is available (0 = take one now)."""
        if self.tokens < 0:
            self.tokens, self.stamp = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def take(self) -> None:
        self.tokens -= 1


@dataclass(order=True)
class _Item:
    not_before: float
    seq: int
    eviction: Eviction = field(compare=False)
    attempts: int = field(default=0, compare=False)


Outcome = str  # "evicted" | "blocked" (429, will retry) | "gone" | "error" (will retry) | "dropped"


class EvictionQueue(threading.Thread):
    """Call `offer()` from the scheduler loop; `on_result(eviction, outcome, detail)` is called
    from this thread after each attempt."""

    def __init__(
        self,
        api: EvictApi,
        on_result: Callable[[Eviction, Outcome, str], None],
        *,
        rate: float = 5.0,
        burst: int = 10,
        retry_seconds: float = 5.0,
        max_attempts: int = 120,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="evictions", daemon=True)
        self.api, self.on_result, self.clock = api, on_result, clock
        self.bucket = TokenBucket(rate, burst)
        self.retry_seconds, self.max_attempts = retry_seconds, max_attempts
        self._heap: list[_Item] = []
        self._offered: set[str] = set()
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stopped = False

    def offer(self, eviction: Eviction) -> bool:
        """Queues an eviction unless this pod UID was already offered; True when queued."""
        with self._cv:
            if eviction.uid in self._offered:
                return False
            self._offered.add(eviction.uid)
            heapq.heappush(self._heap, _Item(self.clock(), next(self._seq), eviction))
            self._cv.notify()
            return True

    def withdraw(self) -> list[Eviction]:
        """Takes back every eviction not yet attempted (or waiting for a retry) and forgets their
        pods, so they may be offered again later (the fault-storm breaker opened)."""
        with self._cv:
            taken = [item.eviction for item in self._heap]
            self._heap.clear()
            self._offered.difference_update(ev.uid for ev in taken)
            return taken

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()

    def run(self) -> None:
        while True:
            item = self._next()
            if item is None:
                return
            self._attempt(item)

    def _next(self) -> _Item | None:
        """Blocks until an item is due and a token is free (or the queue stops)."""
        with self._cv:
            while not self._stopped:
                now = self.clock()
                delay = (self._heap[0].not_before - now) if self._heap else None
                if delay is not None and delay <= 0:
                    delay = self.bucket.wait(now)
                    if delay == 0:
                        self.bucket.take()
                        return heapq.heappop(self._heap)
                self._cv.wait(timeout=delay)
            return None

    def _attempt(self, item: _Item) -> None:
        ev = item.eviction
        try:
            self.api.evict(ev.pod[0], ev.pod[1], ev.uid)
        except Exception as exc:
            status = int(getattr(exc, "status", 0) or 0)
            if status in (404, 409):  # gone, or a newer pod under the same name (UID precondition)
                self.on_result(ev, "gone", str(exc))
                return
            item.attempts += 1
            if item.attempts >= self.max_attempts:
                self.on_result(ev, "dropped", str(exc))
                return
            self.on_result(ev, "blocked" if status == 429 else "error", str(exc))
            with self._cv:
                item.not_before = self.clock() + self.retry_seconds
                heapq.heappush(self._heap, item)
            return
        self.on_result(ev, "evicted", "")
