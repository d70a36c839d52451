"""Round-trip measurements to fabric peers: from raw round trips to a latched `Measurement`.

Why latch: a round trip wanders by a few microseconds every round; writing each new median into
the NodeTopology would make every node cause an API write every cycle. So, as for grey findings,
the published figure moves only when the new round is outside a band around it (a relative band
plus an absolute floor, so a 10 us loopback-class link does not flip on 2 us of noise) or the loss
crosses a step; otherwise the previous figures and their `when` stay, and the live figures go to
the metrics alone.

Also here, because they are policy rather than I/O: the token bucket that rate-limits answers
(time is a parameter), the transport interface the UDP adapter implements today and an RDMA one
(perftest's ib_write_lat, or verbs) can implement later. (Whom a responder answers is decided in
agent.fabric_measure: the probe addresses of the nodes whose plan names it.) Pure: no sockets,
no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from agent.common.report import MAX_MEASUREMENTS, Measurement

RELATIVE_BAND = 0.25  # a median that moves by less than a quarter is the same link
ABSOLUTE_BAND_US = 20  # ... or by less than 20 us
LOSS_STEPS = (0.0, 1.0, 5.0, 20.0, 100.0)  # loss is published by the step it falls in


class RttTransport(Protocol):
    """One way to time round trips to a peer: UDP today (agent.adapters.udp_probe), RDMA where a
    node has it. Each entry of the result is a round trip in seconds, or None when lost."""

    name: str

    def round_trips(self, peer_address: str, count: int) -> list[float | None]: ...


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: a figure that was actually measured, never an interpolation."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def summarise(peer: str, rtts: Sequence[float | None], *, when: float, transport: str = "udp") -> Measurement:
    """One round's measurement: p50/p99 of the answered probes (microseconds), loss of all sent.
    All lost: p50 and p99 are 0 and the loss is 100, which the aggregator reads as unreachable."""
    answered = sorted(r for r in rtts if r is not None)
    sent = len(rtts)
    loss = round(100.0 * (sent - len(answered)) / sent, 1) if sent else 100.0
    p50 = round(_percentile(answered, 0.5) * 1e6) if answered else 0
    p99 = round(_percentile(answered, 0.99) * 1e6) if answered else 0
    stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Measurement(peer, p50, p99, loss, sent, stamp, transport)


def _loss_step(loss: float) -> int:
    return next(i for i, step in enumerate(LOSS_STEPS) if loss <= step)


def within_band(old: Measurement, new: Measurement) -> bool:
    """Whether `new` says nothing `old` did not: medians within the band, same loss step, and
    bandwidth (when either has one) within the relative band."""
    band = max(ABSOLUTE_BAND_US, RELATIVE_BAND * old.p50_us)
    return (
        abs(new.p50_us - old.p50_us) <= band
        and _loss_step(new.loss_percent) == _loss_step(old.loss_percent)
        and _same_bandwidth(old.bandwidth_mbps, new.bandwidth_mbps)
    )


def _same_bandwidth(old: int | None, new: int | None) -> bool:
    if old is None or new is None:
        return old == new
    return abs(new - old) <= RELATIVE_BAND * old


def latch(previous: Iterable[Measurement], current: Iterable[Measurement]) -> tuple[Measurement, ...]:
    """The measurements to publish: `current` peers only (a peer dropped by a new plan goes), each
    kept at its previous figures while within the band; sorted by peer, at most MAX_MEASUREMENTS."""
    before = {m.peer: m for m in previous}
    out: list[Measurement] = []
    for m in current:
        old = before.get(m.peer)
        keep = old is not None and old.transport == m.transport and within_band(old, m)
        out.append(old if keep and old is not None else m)
    return tuple(sorted(out, key=lambda m: m.peer)[:MAX_MEASUREMENTS])


@dataclass
class TokenBucket:
    """Answers at most `rate` probes a second on average, `burst` at once: a peer (or anyone who
    got onto the allow-list) cannot turn the responder into a traffic source. Time is passed in."""

    rate: float
    burst: float
    tokens: float = -1.0
    last: float | None = None

    def allow(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens = self.burst
        if self.last is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
