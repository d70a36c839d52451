"""The C heap of a long-running hypertopo process: few arenas, free pages handed back.

Why: the aggregator and the scheduler decode whole API pages and watch events (JSON strings and
dicts over 512 bytes come from glibc's malloc, not Python's small-object allocator), keep a slim
record of each, and free the rest. glibc gives every thread that allocates while another holds
the heap an arena of its own (up to eight per core), and a freed page inside an arena stays
resident until the arena is trimmed. With an informer thread per kind, an HTTP pool and a
reconcile thread, a live aggregator at 5,000 nodes held ~6 MB of such free heap after start-up
and ~20 MB more after its first computes and writes (measured with mallinfo2 against a real API
server): RSS the pod's memory limit counts and nobody uses.

So a process that runs for long calls `limit_arenas` once at start (Python threads allocate one
at a time under the GIL: more arenas buy no speed) and `HeapTrimmer.maybe_release` after work
that frees much (a compute, a re-list); the trim is rate-limited because it walks the free lists.
Where the C library is not glibc, both do nothing and say so (False).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable

M_ARENA_MAX = -8  # mallopt's parameter number in glibc's malloc.h
DEFAULT_ARENAS = 2  # the main arena and one for the threads (the GIL lets one allocate at a time)
TRIM_PERIOD = 30.0  # seconds between two trims at most; a trim of ~100 MB of heap takes ~1-5 ms


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc names: AttributeError elsewhere)
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(count: int = DEFAULT_ARENAS) -> bool:
    """Caps glibc's malloc arenas at `count` (M_ARENA_MAX), unless the operator set
    MALLOC_ARENA_MAX, which glibc reads itself and this leaves alone. False where not glibc."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return True
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, count) == 1)


def release_free_heap() -> bool:
    """Hands the C heap's free pages back to the system (glibc's `malloc_trim`, every arena);
    False where the C library has none."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0) >= 0)


class HeapTrimmer:
    """`release_free_heap` at most once per `period` seconds (the caller's hot path calls it
    after each compute; most calls return at once)."""

    def __init__(self, period: float = TRIM_PERIOD, clock: Callable[[], float] = time.monotonic,
                 release: Callable[[], bool] = release_free_heap) -> None:  # fmt: skip
        self.period, self.clock, self.release = period, clock, release
        self._last: float | None = None
        self.released = 0  # trims made (for tests and logs)

    def maybe_release(self) -> bool:
        """Trims if the last trim is `period` seconds old (or there was none); True if it did."""
        now = self.clock()
        if self._last is not None and now - self._last < self.period:
            return False
        self._last = now
        self.released += 1
        return self.release()
