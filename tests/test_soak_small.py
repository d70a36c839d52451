"""The soak (tests/bench_soak.py) at a tiny size is a check of its own: on a real API server, two
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
    assert result.takeover_at - result.kill_at < 4 + 2  # the lease's duration and a retry or two
    assert len(result.flaps) >= 5
    downs_shown = [f for f in result.flaps if f.down_seen is not None]
    ups = [f for f in result.flaps if f.up_at is not None]
    assert all(f.up_seen is not None for f in ups)  # every repair shows, the gap's included
    assert len(downs_shown) >= len(result.flaps) - 1  # a flap wholly inside the leaderless gap may never show
    assert result.errors_logged == 0
    assert result.ok
