"""A clock that tests move by hand, for code that takes its time source as an argument."""

from __future__ import annotations


class FakeClock:
    """Calling it gives `now`; a test sets or advances `now` to make time pass at once."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
