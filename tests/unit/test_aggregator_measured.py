"""The fold of measured round trips (aggregator.measured): per-domain figures, the tier profile,
findings that contradict the tree, and leaf groups from latency alone."""

from __future__ import annotations

import dataclasses

from agent.common.report import Measurement
from agent.measure_plan import Domain, plan
from aggregator.measured import fold, infer_leaves

# two leaves of four under one spine: 10 us inside a leaf, 100 us across the spine
DOMAINS = [
    Domain("leaf-a", 1, ("a1", "a2", "a3", "a4")),
    Domain("leaf-b", 1, ("b1", "b2", "b3", "b4")),
    Domain("spine", 2, ("leaf-a", "leaf-b")),
]
LEAF = {n: d.name for d in DOMAINS if d.tier == 1 for n in d.children}


def m(peer: str, us: int, loss: float = 0.0) -> Measurement:
    return Measurement(peer, us, us + us // 10, loss, 20, "2026-11-25T18:00:00Z")


def measure(rtt) -> dict[str, list[Measurement]]:
    """Every node measures its planned peers; `rtt(a, b)` gives the p50."""
    return {a: [m(p.peer, rtt(a, p.peer)) for p in probes] for a, probes in plan(DOMAINS).items()}


def healthy(a: str, b: str) -> int:
    return 10 if LEAF[a] == LEAF[b] else 100


def test_each_domain_gets_its_inside_and_sibling_figures_and_the_tier_profile():
    result = fold(DOMAINS, measure(healthy))
    assert result.tiers == {1: 10, 2: 100}
    assert result.domains["leaf-a"].inside_us == 10 and result.domains["leaf-a"].sibling_us == 100
    assert result.domains["spine"].inside_us == 100
    assert result.annotations("leaf-b") == {
        "hypertopo.io/measured-inside-p50-us": "10",
        "hypertopo.io/measured-sibling-p50-us": "100",
    }
    assert result.findings == ()


def test_a_node_whose_leaf_mates_measure_like_the_spine_is_a_grey_fault_with_the_numbers():
    def slow_a3(a: str, b: str) -> int:
        return healthy(a, b) + (90 if "a3" in (a, b) else 0)

    result = fold(DOMAINS, measure(slow_a3))
    slow = [f for f in result.findings if f.kind == "slow-in-leaf"]
    assert slow and {f.node for f in slow} == {"a3"}
    assert "p50 100 us, like tier 2 (100 us) rather than the leaf tier (10 us)" in slow[0].text
    faults = result.fabric_faults()
    assert set(faults) == {"a3"} and all(not f.failure and f.cause == "latency" for f in faults["a3"])


def test_a_node_cabled_in_one_leaf_that_measures_like_another_is_named():
    # b4 is really in leaf-a (cabling misreported): 10 us to a*, 100 us to b*
    def really(a: str, b: str) -> int:
        where = {**LEAF, "b4": "leaf-a"}
        return 10 if where[a] == where[b] else 100

    result = fold(DOMAINS, measure(really))
    other = [f for f in result.findings if f.kind == "other-leaf"]
    assert [f.node for f in other] == ["b4"]
    assert other[0].text == "b4 measures like leaf leaf-a (p50 10 us) but is in leaf-b (100 us)"


def test_lossy_pairs_are_findings_and_unreachable_peers_stay_out_of_the_medians():
    measured = measure(healthy)
    measured["a1"] = [m("a2", 0, loss=100.0), m("b1", 100, loss=10.0)]
    result = fold(DOMAINS, measured)
    assert [(f.node, f.kind) for f in result.findings] == [("a2", "loss"), ("b1", "loss")]
    assert result.tiers == {1: 10, 2: 100}


def test_leaf_groups_are_recovered_from_latency_alone_with_a_clear_gap():
    guess = infer_leaves(measure(healthy))
    assert set(guess.groups) == {
        frozenset(LEAF) - {"b1", "b2", "b3", "b4"},
        frozenset({"b1", "b2", "b3", "b4"}),
    }
    assert guess.gap == 10.0 and 10 < guess.cut_us < 100 and guess.coverage == 1.0


def test_without_measurements_every_node_is_its_own_group_and_nothing_is_sure():
    guess = infer_leaves({"a1": [], "a2": []})
    assert guess.groups == (frozenset({"a1"}), frozenset({"a2"})) and guess.coverage == 0.0


THREE = [
    Domain("leaf-a", 1, ("a1", "a2", "a3")),
    Domain("leaf-b", 1, ("b1", "b2", "b3")),
    Domain("leaf-c", 1, ("c1", "c2", "c3")),
    Domain("spine", 2, ("leaf-a", "leaf-b", "leaf-c")),
]
LEAF3 = {n: d.name for d in THREE if d.tier == 1 for n in d.children}


def trains(rate) -> dict[str, list[Measurement]]:
    """Every node measures its planned peers with a bandwidth train; `rate(a, b)` gives its Mbit/s."""
    return {
        a: [dataclasses.replace(m(p.peer, 10 if LEAF3[a] == LEAF3[p.peer] else 100), bandwidth_mbps=rate(a, p.peer))
            for p in probes]
        for a, probes in plan(THREE).items()
    }  # fmt: skip


def test_a_leaf_whose_trains_out_are_slow_has_a_slow_uplink_blamed_on_all_its_nodes():
    result = fold(THREE, trains(lambda a, b: 20 if LEAF3[a] == "leaf-b" and LEAF3[b] != "leaf-b" else 400))
    slow = [f for f in result.findings if f.kind.startswith("slow-")]
    assert {(f.node, f.kind) for f in slow} == {("b1", "slow-uplink"), ("b2", "slow-uplink"), ("b3", "slow-uplink")}
    assert slow[0].text == "leaf-b: bandwidth trains from it to its siblings at 20 Mbit/s, theirs at 400 Mbit/s"
    faults = result.fabric_faults()
    assert set(faults) == {"b1", "b2", "b3"} and all(f.cause == "bandwidth" and not f.failure for f in faults["b2"])


def test_a_leaf_whose_trains_in_are_slow_has_a_slow_downlink_and_its_senders_are_not_blamed():
    result = fold(THREE, trains(lambda a, b: 30 if LEAF3[b] == "leaf-c" and LEAF3[a] != "leaf-c" else 400))
    slow = {(f.node, f.kind) for f in result.findings if f.kind.startswith("slow-")}
    assert slow == {("c1", "slow-downlink"), ("c2", "slow-downlink"), ("c3", "slow-downlink")}


def test_rates_within_a_few_times_of_each_other_are_no_finding():
    result = fold(THREE, trains(lambda a, b: 150 if LEAF3[a] == "leaf-a" else 500))  # 0.3 of the others'
    assert [f for f in result.findings if f.kind.startswith("slow-")] == []
    assert fold(THREE, trains(lambda a, b: None)).findings == ()  # no trains sent: nothing said about bandwidth


def mixed(rdma_nodes: set[str]):
    """Rows from nodes in `rdma_nodes` to peers also there are RDMA (2 us in a leaf, 8 across the
    spine); every other row is UDP (healthy's 10 / 100 us, each ~5x an RDMA one)."""

    def rows() -> dict[str, list[Measurement]]:
        out = {}
        for a, probes in plan(DOMAINS).items():
            out[a] = []
            for p in probes:
                if a in rdma_nodes and p.peer in rdma_nodes:
                    us = 2 if LEAF[a] == LEAF[p.peer] else 8
                    out[a].append(dataclasses.replace(m(p.peer, us), transport="rdma"))
                else:
                    out[a].append(m(p.peer, healthy(a, p.peer)))
        return out

    return rows()


def test_udp_and_rdma_rows_are_never_compared_so_a_mixed_healthy_fabric_has_no_finding():
    # all but a4 measure each other over RDMA: on one scale (leaf 2 us, spine 8 us: RDMA rows are
    # the most) a4's UDP rows to its leaf-mates (10 us) "measure like the spine" (6 findings on a4)
    measured = mixed(set(LEAF) - {"a4"})
    assert {r.transport for rows in measured.values() for r in rows} == {"udp", "rdma"}
    result = fold(DOMAINS, measured)
    assert result.findings == ()
    guess = infer_leaves(measured)
    assert all(g <= set(LEAF) and len({LEAF[n] for n in g}) == 1 for g in guess.groups)


def test_a_slow_node_is_still_found_within_its_transport_and_the_finding_names_it():
    measured = mixed({"a1", "a2", "b1", "b2"})
    for a, rows in measured.items():
        measured[a] = [
            dataclasses.replace(r, p50_us=r.p50_us + 90) if "a3" in (a, r.peer) and r.transport == "udp" else r
            for r in rows
        ]
    slow = [f for f in fold(DOMAINS, measured).findings if f.kind == "slow-in-leaf"]
    assert slow and {f.node for f in slow} == {"a3"} and all(f.text.endswith("(udp)") for f in slow)
