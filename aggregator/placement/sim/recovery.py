"""Recovery measured: how long a gang takes to be whole again after a fabric fault, whether it
came back at the same tier, and the share of its life it has spent whole.

Why: what a training job loses to a fault is the time until it runs whole again and any speed
it loses for the rest of its life if it comes back spread wider. Per gang:

* a **recovery** opens the first time the scheduler sees a member on a failed node ("fault
  seen"); it wants as many members placed as were placed then (at least minMember). It reaches
  **bound** once that many members are placed and none on a failed node (every replacement bound;
  for policy `none`, when the node heals), and **running** once that many are Running too; then it
  closes. The gang's tier (that of the lowest HyperNode holding every placed member) at the fault
  and at bound is kept, so "tier after vs before" is known. A second fault during a recovery
  belongs to the same recovery.
* the **whole time**: from the first time all members (at least minMember, none waiting) were
  Running, the time the gang has been whole, all members Running and its FabricHealthy True, over
  the time since that first moment.

Pure: counts and times in, observations out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Look:
    """What the scheduler sees of one gang at one moment."""

    placed_ok: int  # members placed (bound or assumed) on nodes that are not failed
    running_ok: int  # of those, Running
    hit: bool  # a member sits on a failed node
    healthy: bool  # FabricHealthy is True
    want: int  # members the gang should have: max(live members, minMember)
    tier: int | None  # tier of the lowest HyperNode holding every placed member


@dataclass(frozen=True)
class Observed:
    stage: str  # "bound" or "running"
    seconds: float
    tier_before: int | None
    tier_after: int | None


@dataclass
class Recovery:
    seen: float
    want: int
    tier_before: int | None
    bound_at: float | None = None
    tier_after: int | None = None


@dataclass
class GangClock:
    """One gang's recovery in progress and whole-time account."""

    recovery: Recovery | None = None
    first_running: float | None = None
    whole_since: float | None = None
    whole_total: float = 0.0

    def waiting(self, look: Look) -> int:
        """Members an open recovery still waits for (0 when none is open)."""
        if self.recovery is None:
            return 0
        return max(0, self.recovery.want - look.placed_ok)

    def update(self, look: Look, now: float) -> list[Observed]:
        """Moves the account to `now` given `look`; the recovery stages reached."""
        out = self._recover(look, now)
        whole = look.running_ok >= max(look.want, 1) and not look.hit and look.healthy and self.recovery is None
        if self.first_running is None and look.running_ok >= max(look.want, 1) and not look.hit:
            self.first_running = now
        if whole and self.whole_since is None:
            self.whole_since = now
        elif not whole and self.whole_since is not None:
            self.whole_total += now - self.whole_since
            self.whole_since = None
        return out

    def _recover(self, look: Look, now: float) -> list[Observed]:
        rec = self.recovery
        if rec is None:
            if look.hit:
                self.recovery = Recovery(now, look.want, look.tier)
            return []
        if look.hit or look.placed_ok < rec.want:
            return []
        out = []
        if rec.bound_at is None:
            rec.bound_at, rec.tier_after = now, look.tier
            out.append(Observed("bound", now - rec.seen, rec.tier_before, look.tier))
        if look.running_ok >= rec.want:
            out.append(Observed("running", now - rec.seen, rec.tier_before, rec.tier_after))
            self.recovery = None
        return out

    def ratio(self, now: float) -> float | None:
        """Whole time over time since first Running (None before the gang first ran whole)."""
        if self.first_running is None:
            return None
        span = now - self.first_running
        whole = self.whole_total + (now - self.whole_since if self.whole_since is not None else 0.0)
        return 1.0 if span <= 0 else min(1.0, whole / span)
