"""Fabric round trips: the summary and latch rules (agent.probes.fabric_rtt) and the real UDP
responder and prober (agent.adapters.udp_probe) on loopback addresses."""

from __future__ import annotations

import socket

import pytest

from agent.adapters.udp_probe import PACKET_SIZE, UdpResponder, UdpTransport, _packet
from agent.common.report import MAX_MEASUREMENTS
from agent.probes.fabric_rtt import TokenBucket, latch, summarise, within_band

T0 = 1_764_000_000.0  # 2025-11-24T16:00:00Z


def test_summary_takes_nearest_rank_percentiles_in_microseconds_and_counts_losses():
    rtts = [i / 1e6 for i in range(1, 99)] + [None, None]  # 1..98 us answered, 2 of 100 lost
    m = summarise("n2", rtts, when=T0)
    # p50: rank ceil(0.5 * 98) = 49 -> 49 us; p99: rank ceil(0.99 * 98) = 98 -> 98 us
    assert (m.p50_us, m.p99_us, m.loss_percent, m.sent) == (49, 98, 2.0, 100)
    assert m.when == "2025-11-24T16:00:00Z"


def test_an_unanswered_peer_measures_as_all_lost():
    m = summarise("n2", [None] * 5, when=T0)
    assert (m.p50_us, m.p99_us, m.loss_percent) == (0, 0, 100.0)


def test_latched_measurements_keep_their_figures_until_a_move_beyond_the_band():
    old = summarise("n2", [100e-6] * 20, when=T0)
    wander = summarise("n2", [118e-6] * 20, when=T0 + 300)  # +18 us: inside max(20 us, 25 %)
    slower = summarise("n2", [200e-6] * 20, when=T0 + 600)  # doubled: beyond the band
    lossy = summarise("n2", [100e-6] * 18 + [None] * 2, when=T0 + 900)  # 10 % loss: a new step
    assert latch([old], [wander]) == (old,)
    assert latch([old], [slower]) == (slower,)
    assert latch([old], [lossy]) == (lossy,)
    assert within_band(old, wander) and not within_band(old, slower)


def test_latch_drops_peers_the_new_plan_left_and_stays_bounded():
    old = [summarise(f"n{i:03}", [1e-4], when=T0) for i in range(3)]
    new = [summarise(f"p{i:03}", [1e-4], when=T0) for i in range(MAX_MEASUREMENTS + 10)]
    out = latch(old, new)
    assert len(out) == MAX_MEASUREMENTS and not any(m.peer.startswith("n") for m in out)


def test_token_bucket_answers_a_burst_then_the_rate():
    bucket = TokenBucket(rate=10.0, burst=3.0)
    assert [bucket.allow(0.0) for _ in range(5)] == [True, True, True, False, False]
    assert bucket.allow(0.1) and not bucket.allow(0.1)  # 0.1 s at 10/s: one more


@pytest.fixture
def responder():
    r = UdpResponder("127.0.0.1", port=0, allowed=lambda: frozenset({"127.0.0.2"}), rate=1000, burst=1000)
    r.start()
    yield r
    r.stop()


def test_udp_round_trips_are_timed_between_allowed_addresses(responder):
    probe = UdpTransport("127.0.0.2", port=responder.port, timeout=0.5, gap=0.0)
    rtts = probe.round_trips("127.0.0.1", 20)
    assert all(r is not None and 0 < r < 0.5 for r in rtts)
    assert responder.answered == 20 and probe.sent == 20


def test_udp_responder_ignores_senders_off_the_allow_list(responder):
    stranger = UdpTransport("127.0.0.3", port=responder.port, timeout=0.05, gap=0.0)
    assert stranger.round_trips("127.0.0.1", 3) == [None, None, None]
    assert responder.answered == 0 and responder.refused == 3


def test_udp_responder_ignores_datagrams_not_of_the_probe_layout(responder):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.2", 0))
        s.settimeout(0.2)
        for data in (_packet(1, 2) + b"x", b"HTPR", b"\0" * PACKET_SIZE):
            s.sendto(data, ("127.0.0.1", responder.port))
        with pytest.raises(TimeoutError):
            s.recvfrom(4096)
    assert responder.answered == 0 and responder.refused == 3


def test_udp_responder_rate_limit_bounds_the_answers():
    r = UdpResponder("127.0.0.1", port=0, allowed=lambda: frozenset({"127.0.0.2"}), rate=0.001, burst=5)
    r.start()
    try:
        rtts = UdpTransport("127.0.0.2", port=r.port, timeout=0.05, gap=0.0).round_trips("127.0.0.1", 12)
    finally:
        r.stop()
    assert sum(x is not None for x in rtts) == 5 and r.answered == 5


def test_a_bandwidth_train_is_timed_by_the_responder_and_answered_by_one_small_report(responder):
    from realparts import wait_for

    from agent.adapters.udp_probe import MAX_TRAINS

    probe = UdpTransport("127.0.0.2", port=responder.port, timeout=0.2, gap=0.0)
    answered = responder.answered
    mbps = probe.burst("127.0.0.1", 32)
    assert mbps is not None and mbps > 1, mbps  # loopback: far above a megabit
    wait_for(lambda: responder.answered > answered, timeout=2, what="the responder's count")  # it counts after sending
    assert responder.train_datagrams >= 2 and responder.answered == answered + 1  # the query, not the train
    assert probe.sent == 33 and responder.trains == {}  # the report consumed the train's record
    stranger = UdpTransport("127.0.0.3", port=responder.port, timeout=0.05, gap=0.0)
    refused = responder.refused
    assert stranger.burst("127.0.0.1", 8) is None
    wait_for(lambda: responder.refused == refused + 9, timeout=2, what="8 datagrams and a query refused")
    assert len(responder.trains) <= MAX_TRAINS
