"""The fold of measured round trips (aggregator.measured): per-domain figures, the tier profile,
findings that contradict the tree, and leaf groups from latency alone."""

from __future__ import annotations

from agent.measure_plan import Domain, plan
from agent.report import Measurement
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
