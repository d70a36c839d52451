"""The side-by-side benchmark with the real Volcano scheduler (tests/bench/bench_vs_volcano.py), small enough
for the suite so it cannot rot: on a 40-node kwok cluster (leaves of 16, 16 and 8 nodes under one
spine, the HyperNodes the aggregator's pipeline renders), the real vc-scheduler (v1.14.1, with the
network-topology-aware plugin) and hypertopo-scheduler, one at a time, each bind the same hard-mode
gangs within their tier limit, and each leaves a gang that fits no HyperNode of its allowed tier
unbound. Speed is not checked here: the benchmark prints it."""

from __future__ import annotations

import pytest
from aggregator_controller_kit import private_plane
from bench_vs_volcano import HYPERTOPO, VOLCANO, GangResult, cluster, describe
from volcano_live import volcano_dir

pytestmark = pytest.mark.apiserver
PLACE_TIMEOUT = 60.0  # generous: vc-scheduler runs a cycle a second, the machine may be busy
UNPLACEABLE_WINDOW = 5.0  # five vc-scheduler cycles; hypertopo judges a gang at once


def test_volcano_and_hypertopo_place_the_same_gangs_within_the_tier_limit() -> None:
    volcano_dir()  # a missing Volcano build skips (fails under HYPERTOPO_REQUIRE_REAL=1) before any setup
    results: dict[str, list[GangResult]] = {}
    with private_plane() as plane, cluster(plane, nodes=40, lease_seconds=600) as bench:
        assert bench.setup.tiers == {1: 3, 2: 1}  # three leaves under one spine
        for which in (VOLCANO, HYPERTOPO):
            with bench.scheduler(which) as name:
                results[which] = [bench.gang(which, name, 4, 1, PLACE_TIMEOUT),
                                  bench.gang(which, name, 20, 2, PLACE_TIMEOUT),
                                  bench.gang(which, name, 20, 1, UNPLACEABLE_WINDOW)]
    for small, wide, too_wide in results.values():
        print("\n".join([describe(small, PLACE_TIMEOUT), describe(wide, PLACE_TIMEOUT),
                         describe(too_wide, UNPLACEABLE_WINDOW)]))
        assert small.placed and small.bound == 4 and not small.violation, describe(small, PLACE_TIMEOUT)
        assert small.span_tier == 1
        # 20 nodes fit no 16-node leaf: the gang spans the spine, and the bench saw it do so
        assert wide.placed and wide.bound == 20 and not wide.violation, describe(wide, PLACE_TIMEOUT)
        assert wide.span_tier == 2
        # hard tier 1 with 20 pods: neither scheduler may bind any of them
        assert not too_wide.placed and too_wide.bound == 0, describe(too_wide, UNPLACEABLE_WINDOW)
        assert "phase" in too_wide.why
