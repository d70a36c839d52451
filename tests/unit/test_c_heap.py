"""agent.common.c_heap: the arena cap and the rate-limited trim of the C heap (issue 29)."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import pytest

from agent.common import c_heap


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def test_the_trimmer_releases_at_most_once_per_period() -> None:
    now = [100.0]
    calls: list[float] = []

    def release() -> bool:
        calls.append(now[0])
        return True

    trimmer = c_heap.HeapTrimmer(period=30.0, clock=lambda: now[0], release=release)
    assert trimmer.maybe_release()  # the first call trims
    now[0] += 29.9
    assert not trimmer.maybe_release()
    now[0] += 0.2
    assert trimmer.maybe_release()
    assert calls == [100.0, 130.1] and trimmer.released == 2


def test_an_operators_malloc_arena_max_is_left_to_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    called: list[tuple[int, int]] = []
    monkeypatch.setattr(c_heap, "_libc", lambda: called.append((0, 0)))
    assert c_heap.limit_arenas(2)
    assert called == []  # glibc read the operator's value at start: not overridden


def test_without_glibc_both_say_they_did_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(c_heap, "_libc", lambda: None)
    assert not c_heap.limit_arenas(2)
    assert not c_heap.release_free_heap()


@pytest.mark.skipif(c_heap._libc() is None, reason="the C library is not glibc")
def test_freed_malloc_pages_held_by_a_thread_arena_go_back_to_the_system() -> None:
    """What the live aggregator's informer threads do: decode large values (glibc's malloc), keep
    a few, drop the rest. The pages stay resident until the trim hands them back."""
    kept: list[ctypes.Array[ctypes.c_char]] = []

    def decode_and_slim() -> None:
        chunks = [ctypes.create_string_buffer(2048) for _ in range(40_000)]  # ~80 MB from malloc
        for chunk in chunks:
            ctypes.memset(chunk, 1, 2048)  # resident
        kept.extend(chunks[i] for i in range(0, len(chunks), 997))  # one slim record every ~2 MB
        del chunks

    worker = threading.Thread(target=decode_and_slim)
    worker.start()
    worker.join()
    before = _rss()
    assert c_heap.release_free_heap()
    assert before - _rss() > 20 << 20, "the trim handed back less than 20 MB of ~80 MB freed"
    assert len(kept) == 41
