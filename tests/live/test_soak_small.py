"""The soak (tests/bench/bench_soak.py) at a tiny size is a check of its own: on a real API server, two
aggregator replicas under RDMA port flaps, the leader killed with kill -9 mid-run, never delete or
re-create a HyperNode, the standby takes over, every report edit shows in its leaf's condition, and
the tree at the end equals a fresh `hypertopo-aggregator render` of the reports."""

from __future__ import annotations

from bench_soak import Config, soak


def test_a_small_soak_with_a_leader_kill_keeps_every_hypernode_and_ends_equal_to_a_fresh_render() -> None:
    lines: list[str] = []
    cfg = Config(nodes=32, per_leaf=8, churn_per_min=40.0, minutes=0.75, kill_leader_at=15.0, flap_seconds=8.0,
                 lease_flags=["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"],
                 settle_timeout=60.0)
    result = soak(cfg, out=lines.append)
    print("\n".join(lines))
    assert result.converge_s is not None and result.hypernodes == 4
    assert result.deleted == 0 and result.recreated == 0
    assert result.diffs == []
    assert result.kill_at is not None and result.takeover_at is not None
    assert result.new_leader == result.standby != result.killed
    assert result.takeover_at - result.kill_at < 4 + 4  # the lease's duration, then a retry (loaded machine: slack)
    assert len(result.flaps) >= 5
    # every flap shows and then its repair, except one down while nobody led: its repair may come
    # within the hold-down (5 s) of the new leader's first sight of it, damped as any short flap
    for flap in result.flaps:
        assert flap.up_at is not None
        if flap.down_seen is None:
            assert result.kill_at - cfg.flap_seconds <= flap.down_at <= result.takeover_at, flap
        else:
            assert flap.up_seen is not None, flap
    assert result.errors_logged == 0
    assert result.ok
