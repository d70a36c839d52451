"""The fold (aggregator.measured) gives what the per-pair fold it replaced gives
(tests/bench/measured_fold_reference.py), on randomized trees and measurements: equal Fold objects
(domain figures, tier profile, findings with their order and texts) and equal leaf guesses, with
mixed UDP and RDMA rows, lossy and unanswered pairs, bandwidth trains with slow uplinks and
downlinks, slow nodes, mis-cabled nodes, peers outside the tree, trees with several roots, reports
over the row limit and fabrics with more findings than are kept."""

from __future__ import annotations

import random
from collections import Counter

import measured_fold_reference as reference

from agent.common.report import MAX_MEASUREMENTS, Measurement
from agent.measure_plan import Domain, plan
from aggregator.measured import MAX_FINDINGS, fold, infer_leaves, leaf_cut

CASES = 240
TIER_US = {
    "udp": (10, 30, 90, 250, 700),
    "rdma": (2, 6, 18, 50, 140),
}  # by the tier the two meet at (0: never)


def random_tree(rng: random.Random) -> tuple[list[Domain], dict[str, str], dict[str, list[str]]]:
    """1 to 4 tiers of lopsided domains, sometimes two roots; -> (domains, leaf of each node,
    each domain's chain from the node's leaf up)."""
    domains: list[Domain] = []
    level = []
    for i in range(rng.randint(2, 9)):
        name = f"leaf{i}"
        domains.append(Domain(name, 1, tuple(f"n{i}-{k}" for k in range(rng.randint(1, 7)))))
        level.append(name)
    for tier in range(2, rng.randint(1, 4) + 1):
        above: list[str] = []
        rng.shuffle(level)
        while level:
            size = rng.randint(1, 4)
            take, level = level[:size], level[size:]
            if rng.random() < 0.15:  # lopsided: these go on up unwrapped, children of a domain two tiers up
                above += take
                continue
            name = f"t{tier}-{len(above)}"
            domains.append(Domain(name, tier, tuple(take)))
            above.append(name)
        level = above
    leaf_of = {n: d.name for d in domains if d.tier == 1 for n in d.children}
    parent = {c: d.name for d in domains if d.tier > 1 for c in d.children}
    chain = {}
    for n, leaf in leaf_of.items():
        up, here = [], leaf
        while here:
            up.append(here)
            here = parent.get(here, "")
        chain[n] = up
    return domains, leaf_of, chain


def tier_between(chain: dict[str, list[str]], tiers: dict[str, int], a: str, b: str) -> int:
    common = set(chain.get(a, ())) & set(chain.get(b, ()))
    return min((tiers[d] for d in common), default=0)


def random_measurements(rng: random.Random, domains: list[Domain], leaf_of: dict[str, str],
                        chain: dict[str, list[str]]) -> dict[str, list[Measurement]]:  # fmt: skip
    nodes = sorted(leaf_of)
    tiers = {d.name: d.tier for d in domains}
    slow = set(rng.sample(nodes, k=min(len(nodes), rng.choice((0, 0, 1, 2)))))
    moved = dict(zip(rng.sample(nodes, k=min(len(nodes), rng.choice((0, 0, 1, 2)))), rng.sample(nodes, k=len(nodes)),
                     strict=False))  # fmt: skip  # a mis-cabled node measures like where another is
    share = rng.choice((0.0, 0.0, 0.3, 0.9, 1.0))  # of the nodes that measure over RDMA
    rdma = {n for n in nodes if rng.random() < share}
    slow_up = rng.choice([None, *(d.name for d in domains)])
    slow_down = rng.choice([None, *(d.name for d in domains)])
    lossy = rng.choice((0.0, 0.05, 0.6))  # 0.6: more findings than kept
    planned = plan(domains) if rng.random() < 0.7 else {}
    if rng.random() < 0.03:
        return {n: [] for n in nodes}  # reports with nothing measured yet
    out: dict[str, list[Measurement]] = {}
    for a in [*nodes, "stranger"] if rng.random() < 0.2 else nodes:
        peers = [p.peer for p in planned.get(a, ())] or rng.sample(
            nodes, k=min(len(nodes), rng.randint(0, 6))
        )
        if rng.random() < 0.1:
            peers += ["outsider", a]
        if rng.random() < 0.05:
            peers = peers * (MAX_MEASUREMENTS // max(len(peers), 1) + 2)  # over the row limit
        rows = []
        for b in peers:
            transport = "rdma" if a in rdma and (b in rdma or rng.random() < 0.5) else "udp"
            here, there = moved.get(a, a), moved.get(b, b)
            us = TIER_US[transport][tier_between(chain, tiers, here, there)] * rng.uniform(0.8, 1.25)
            us *= rng.uniform(3, 8) if {a, b} & slow else 1
            loss = rng.choice((0.0, 5.0, 10.0, 20.0, 100.0, float("nan"))) if rng.random() < lossy else 0.0
            us = (
                0 if loss == 100.0 or rng.random() < 0.02 else max(1, round(us))
            )  # 0: nothing came back, or under 1 us
            mbps = None
            if rng.random() < 0.4:
                mbps = rng.randint(400, 900)
                if slow_up in chain.get(a, ()) and slow_up not in chain.get(b, ()):
                    mbps //= 10
                if slow_down in chain.get(b, ()) and slow_down not in chain.get(a, ()):
                    mbps //= 8
            rows.append(Measurement(b, us, us * 2, loss, 20, "2026-11-26T00:00:00Z", transport, mbps))
        out[a] = rows
    return out


def test_the_fold_and_the_leaf_guesses_equal_the_per_pair_fold_on_randomized_fabrics():
    seen: Counter[str] = Counter()
    for seed in range(CASES):
        rng = random.Random(seed)
        domains, leaf_of, chain = random_tree(rng)
        measured = random_measurements(rng, domains, leaf_of, chain)
        old = reference.fold(domains, measured)
        assert fold(domains, measured) == old, f"seed {seed}"
        assert infer_leaves(measured) == reference.infer_leaves(measured), f"seed {seed}"
        cut = leaf_cut(old.tiers)
        if cut is not None:
            assert infer_leaves(measured, cut) == reference.infer_leaves(measured, cut), f"seed {seed}"
        seen.update(f.kind for f in old.findings)
        transports = {m.transport for ms in measured.values() for m in ms}
        seen.update(
            k
            for k, v in {
                "mixed": len(transports) > 1,
                "one transport": len(transports) == 1,
                "capped": len(old.findings) == MAX_FINDINGS,
                "nothing": not transports,
            }.items()
            if v
        )
    # the corpus reaches every kind of finding and every path: an equality over healthy fabrics alone proves little
    kinds = (
        "slow-in-leaf",
        "other-leaf",
        "loss",
        "slow-uplink",
        "slow-downlink",
        "mixed",
        "one transport",
        "capped",
        "nothing",
    )
    assert all(seen[k] for k in kinds), seen
