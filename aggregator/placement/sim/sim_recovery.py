"""The simulator's ledger of recoveries in time: how long each gang a fault broke took to be
whole again (time to whole) and the share of each gang's life it was whole (whole-time ratio).

Why apart from `simulate`: the replay loop decides; this only keeps the clock readings, the way
the live scheduler's `recovery.py` does for real gangs, so the same trace replayed with and
without spares gives comparable figures. The definitions follow the live metrics:

- a recovery opens when a fault takes a member of a running gang (a second fault before the gang
  is whole again belongs to the same recovery) and ends when every member runs again: a
  re-placed pod, or the whole gang after a restart, runs `delay` seconds after it is bound
  (image, rendezvous, checkpoint load); meanwhile the gang makes no progress;
- a gang's whole-time ratio is the time it ran whole over the time since it first ran whole,
  until it ends (or the replay does).

Only `restart-pods` and `restart-gang` gangs open recoveries: a gang left alone on a fault
(`none`) keeps running as far as the replay knows. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class WholeBook:
    """`delay`: seconds from a replacement (or restarted gang) bound to running."""

    delay: float = 0.0
    first_whole: dict[str, float] = field(default_factory=dict)  # gang -> when it first ran whole
    broken_since: dict[str, float] = field(default_factory=dict)  # gang -> the fault that opened its recovery
    not_whole: dict[str, float] = field(default_factory=dict)  # gang -> seconds not whole, closed recoveries
    to_whole: list[float] = field(default_factory=list)  # seconds of every closed recovery
    whole_seconds: float = 0.0  # over ended gangs
    life_seconds: float = 0.0
    ratios: list[float] = field(default_factory=list)  # per ended gang

    def started(self, gang: str, at: float) -> float:
        """The gang was bound whole at `at`; returns when it runs whole. A first start runs at
        once (the baseline every job pays); a restart after a fault pays `delay`."""
        if gang in self.broken_since:
            return at + self.delay
        self.first_whole.setdefault(gang, at)
        return at

    def is_broken(self, gang: str) -> bool:
        return gang in self.broken_since

    def broken(self, gang: str, at: float) -> None:
        """A fault took a member of the gang (a running one: only those have run whole)."""
        self.broken_since.setdefault(gang, at)

    def whole(self, gang: str, at: float) -> None:
        """Every member of the gang runs again: its recovery is over."""
        since = self.broken_since.pop(gang, None)
        if since is not None:
            self.to_whole.append(at - since)
            self.not_whole[gang] = self.not_whole.get(gang, 0.0) + at - since

    def ended(self, gang: str, at: float) -> None:
        """The gang finished (or the replay ended with it running or waiting to restart)."""
        first = self.first_whole.pop(gang, None)
        if first is None:
            return
        since = self.broken_since.pop(gang, None)
        down = self.not_whole.pop(gang, 0.0) + (at - since if since is not None else 0.0)
        life = at - first
        self.life_seconds += life
        self.whole_seconds += life - down
        self.ratios.append((life - down) / life if life > 0 else 1.0)

    def close(self, at: float) -> int:
        """The replay is over: gangs still alive end now; returns how many recoveries never ended."""
        open_ = len(self.broken_since)
        for gang in list(self.first_whole):
            self.ended(gang, at)
        return open_

    def summary(self, unfinished: int) -> dict[str, Any]:
        times = sorted(self.to_whole)
        mean = round(sum(times) / len(times), 3) if times else None
        p99 = round(times[max(0, -(-99 * len(times) // 100) - 1)], 3) if times else None
        return {"recovery_seconds": self.delay, "recoveries_whole_again": len(times), "recoveries_never_whole": unfinished,
                "time_to_whole_s": {"mean": mean, "p99": p99},
                "whole_time_ratio": round(self.whole_seconds / self.life_seconds, 5) if self.life_seconds > 0 else None,
                "whole_time_ratio_mean_per_gang": round(sum(self.ratios) / len(self.ratios), 5) if self.ratios else None}
