"""Generated gangs with Volcano sub-groups on a small fragmented fabric, for the differential test
against the real vc-scheduler (tests/live/test_subgroups_vs_volcano.py), and the checker that judges a
placement by the case's own bookkeeping (which pod is in which sub-group is decided here, when the
pods are made, not read back through hypertopo's `subgroups` module).

A case owns a pool: 2 spines of 2 leaves of 3 nodes (tiers 1 leaf, 2 spine, 3 pool), 8 GPUs a node,
some of it taken by pods already bound there (fragmentation). Its gang: 1 or 2 sub-group policies
(`matchLabelKeys`, sometimes a `labelSelector`, `subGroupSize`, `minSubGroups`, a hard or soft tier
limit or none), pods without the keys (Volcano's default sub-job), a gang limit or none, and
minMember all pods or fewer. Every pod of the case carries a nodeSelector for its pool, so cases
run side by side without touching each other.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GPUS = 8
SPINES, LEAVES, NODES = 2, 2, 3  # per pool: spines, leaves per spine, nodes per leaf
POOL_LABEL = "hypertopo.io/pool"
TIER_NAMES = {1: "leaf", 2: "spine", 3: "pool"}
NAME_IGNORED = "vc-ignores-subgroup-tier-name"  # the outcome of fix-tiername (see `fixed`)


@dataclass(frozen=True)
class Fabric:
    """One pool's nodes and HyperNodes (tier -> domain -> nodes)."""

    pool: str
    domains: Mapping[str, tuple[int, frozenset[str]]]  # HyperNode -> (tier, nodes below)

    @property
    def nodes(self) -> list[str]:
        top = next(n for n, (t, _) in self.domains.items() if t == 3)
        return sorted(self.domains[top][1])

    def span_tier(self, nodes: Sequence[str]) -> int:
        """Tier of the lowest HyperNode holding all `nodes` (4: none does)."""
        wanted = set(nodes)
        return min((t for t, below in self.domains.values() if wanted <= below), default=4)


def fabric(pool: str) -> tuple[Fabric, list[dict[str, Any]]]:
    """The pool's Fabric and its HyperNode objects."""
    domains: dict[str, tuple[int, frozenset[str]]] = {}
    objects: list[dict[str, Any]] = []

    def hypernode(name: str, tier: int, kind: str, members: Sequence[str]) -> None:
        objects.append({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
                        "metadata": {"name": name, "labels": {POOL_LABEL: pool}},
                        "spec": {"tier": tier, "tierName": TIER_NAMES[tier],
                                 "members": [{"type": kind, "selector": {"exactMatch": {"name": m}}} for m in members]}})

    spines = []
    for s in range(SPINES):
        leaves = []
        for leaf_index in range(LEAVES):
            leaf = f"{pool}-l{s}{leaf_index}"
            nodes = [f"{pool}-n{s}{leaf_index}{n}" for n in range(NODES)]
            hypernode(leaf, 1, "Node", nodes)
            domains[leaf] = (1, frozenset(nodes))
            leaves.append(leaf)
        spine = f"{pool}-s{s}"
        hypernode(spine, 2, "HyperNode", leaves)
        domains[spine] = (2, frozenset().union(*(domains[leaf][1] for leaf in leaves)))
        spines.append(spine)
    hypernode(f"{pool}-top", 3, "HyperNode", spines)
    domains[f"{pool}-top"] = (3, frozenset().union(*(domains[s][1] for s in spines)))
    return Fabric(pool, domains), objects


@dataclass
class Case:
    name: str  # also the PodGroup's and the pool's name
    seed: int
    pod_gpus: int
    taken: dict[str, int]  # node -> GPUs already used there
    policies: list[dict[str, Any]]
    gang_limit: dict[str, Any] | None
    min_member: int
    pods: dict[str, dict[str, str]]  # pod -> labels
    group_of: dict[str, str] = field(default_factory=dict)  # pod -> "policy-values" (absent: default sub-job)

    @property
    def podgroup_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"minMember": self.min_member, "queue": "default", "subGroupPolicy": self.policies}
        if self.gang_limit is not None:
            spec["networkTopology"] = self.gang_limit
        return spec

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for pod, group in sorted(self.group_of.items()):
            out.setdefault(group, []).append(pod)
        return out

    def policy_of(self, group: str) -> dict[str, Any]:
        return next(p for p in self.policies if group.startswith(p["name"] + "-"))

    def describe(self) -> str:
        groups = {g: len(p) for g, p in self.groups().items()}
        default = len(self.pods) - sum(groups.values())
        return (f"{self.name} (seed {self.seed}): {len(self.pods)} pods x {self.pod_gpus} GPUs, minMember "
                f"{self.min_member}, gang limit {self.gang_limit}, sub-groups {groups}, default {default}, "
                f"policies {[{k: v for k, v in p.items() if k != 'name'} for p in self.policies]}, "
                f"taken {dict(sorted((n, g) for n, g in self.taken.items() if g))}")


def _limit(rng: random.Random, tiers: Sequence[int]) -> dict[str, Any] | None:
    roll = rng.random()
    if roll < 0.2:
        return None
    if roll < 0.3:
        return {"mode": "soft", "highestTierAllowed": rng.choice(tiers)}
    return {"mode": "hard", "highestTierAllowed": rng.choice(tiers)}


def generate(name: str, seed: int, nodes: Sequence[str]) -> Case:
    """One case from `seed`: fragmentation of the pool, the gang's policies and pods."""
    rng = random.Random(seed)
    taken = {n: rng.choices((0, 4, 8), weights=(5, 3, 2))[0] for n in nodes}
    pod_gpus = rng.choice((4, 8))
    policies: list[dict[str, Any]] = []
    pods: dict[str, dict[str, str]] = {}
    group_of: dict[str, str] = {}
    for p in range(rng.choice((1, 1, 2))):
        policy_name = f"p{p}"
        keys = ["part"] if rng.random() < 0.7 else ["part", "rail"]
        role = f"r{p}"
        groups = rng.randint(1, 3)
        sizes = [rng.randint(1, 5) for _ in range(groups)]
        size = max(1, rng.randint(1, max(sizes) + 1))
        policy: dict[str, Any] = {"name": policy_name, "matchLabelKeys": keys, "subGroupSize": size,
                                  "labelSelector": {"matchLabels": {"role": role}}}
        if rng.random() < 0.4:
            policy["minSubGroups"] = rng.randint(0, groups + 1)
        limit = _limit(rng, (1, 1, 2))
        if limit is not None:
            policy["networkTopology"] = limit
        policies.append(policy)
        for g, count in enumerate(sizes):
            values = [f"g{g}"] + (["x"] if len(keys) == 2 else [])
            for _ in range(count):
                pod = f"{name}-{len(pods)}"
                pods[pod] = {"role": role, **dict(zip(keys, values, strict=True))}
                group_of[pod] = f"{policy_name}-{'-'.join(values)}"
    for _ in range(rng.choice((0, 0, 1, 2))):  # pods in no sub-group: a key missing, or selected by no policy
        pod = f"{name}-{len(pods)}"
        pods[pod] = {"role": "r0"} if rng.random() < 0.5 else {"role": "none", "part": "g0"}
    gang_limit = _limit(rng, (2, 3, 3))
    min_member = len(pods) if rng.random() < 0.75 else rng.randint(1, len(pods))
    return Case(name, seed, pod_gpus, taken, policies, gang_limit, min_member, pods, group_of)


def blockers(case: Case) -> list[tuple[str, str, int]]:
    """(pod name, node, GPUs) of the pods that take the case's fragmented capacity."""
    return [(f"{case.name}-taken-{i}", node, gpus) for i, (node, gpus) in enumerate(sorted(case.taken.items())) if gpus]


def violations(case: Case, fab: Fabric, placement: Mapping[str, str]) -> list[str]:
    """Every way `placement` (pod -> node, bound pods only) breaks a limit of the case: a sub-group
    bound below its subGroupSize or across more than its hard tier, the gang across more than its
    hard tier, more pods on a node than it had free GPUs for."""
    problems = []
    for group, members in case.groups().items():
        policy = case.policy_of(group)
        bound = [placement[p] for p in members if p in placement]
        if bound and len(bound) < policy["subGroupSize"]:
            problems.append(f"sub-group {group}: {len(bound)} bound, subGroupSize {policy['subGroupSize']}")
        limit = policy.get("networkTopology") or {}
        tier = limit.get("highestTierAllowed", {n: t for t, n in TIER_NAMES.items()}.get(limit.get("highestTierName", "")))
        if bound and limit.get("mode") == "hard" and tier is not None and fab.span_tier(bound) > tier:
            problems.append(f"sub-group {group}: spans tier {fab.span_tier(bound)} > {tier}")
    limit = case.gang_limit or {}
    if placement and limit.get("mode") == "hard" and fab.span_tier(list(placement.values())) > limit["highestTierAllowed"]:
        problems.append(f"gang spans tier {fab.span_tier(list(placement.values()))} > {limit['highestTierAllowed']}")
    used: dict[str, int] = dict(case.taken)
    for node in placement.values():
        used[node] = used.get(node, 0) + case.pod_gpus
    problems += [f"node {n} holds {g} GPUs" for n, g in sorted(used.items()) if g > GPUS]
    problems += [f"pod {p} on {n} outside its pool" for p, n in sorted(placement.items()) if n not in fab.nodes]
    return problems


def beyond_minimum(case: Case) -> bool:
    """Whether a sub-group of the case has more pods than its subGroupSize: vc-scheduler places those
    extra pods one at a time after every sub-group's minimum (see the test's exception)."""
    return any(len(members) > case.policy_of(group)["subGroupSize"] for group, members in case.groups().items())


def _case(name: str, *, pod_gpus: int, taken: Mapping[str, int], policies: list[dict[str, Any]],
          gang_limit: dict[str, Any] | None, pods: Sequence[tuple[dict[str, str], str | None]],
          min_member: int | None = None) -> Case:
    """A case written out: `pods` as (labels, its sub-group or None for the default sub-job)."""
    labels = {f"{name}-{i}": dict(lab) for i, (lab, _) in enumerate(pods)}
    group_of = {f"{name}-{i}": group for i, (_, group) in enumerate(pods) if group}
    return Case(name, 0, pod_gpus, dict(taken), policies, gang_limit,
                len(pods) if min_member is None else min_member, labels, group_of)


def fixed(pools: Sequence[str]) -> dict[str, tuple[Case, str]]:
    """The issue's cases and the exception, each on its pool: pool -> (case, what must happen:
    "both-refuse", "both-bind" or "exception" (vc-scheduler refuses, hypertopo binds))."""
    hard1 = {"mode": "hard", "highestTierAllowed": 1}

    def nodes(pool: str) -> list[str]:
        return fabric(pool)[0].nodes

    a, b, c, d, e = pools
    one_group = [({"part": "0"}, "tp-0")]
    cases = {
        # 8 pods of one sub-group, subGroupSize 4, hard tier 1: no leaf (3 nodes, 6 such pods) holds
        # 8, so the sub-group may not be split into two leaves of 4: Pending in both
        a: (_case("fix-split", pod_gpus=4, taken={}, gang_limit=None, pods=one_group * 8,
                  policies=[{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 4, "networkTopology": hard1}]),
            "both-refuse"),
        # subGroupSize 3 on 8 pods is a minimum, not a divisor: all 8 in one spine
        b: (_case("fix-size3", pod_gpus=4, taken={}, gang_limit=None, pods=one_group * 8,
                  policies=[{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 3,
                             "networkTopology": {"mode": "hard", "highestTierAllowed": 2}}]),
            "both-bind"),
        # pods without the key are in the default sub-job: no leaf limit of their own, so 2 leaf-bound
        # pods and 6 others fit although no leaf has room for all 8 (two free nodes a leaf)
        c: (_case("fix-default", pod_gpus=8, taken={n: 8 for n in nodes(c)[2::3]}, gang_limit=None,
                  pods=[({"part": "0"}, "tp-0")] * 2 + [({}, None)] * 6,
                  policies=[{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 2, "networkTopology": hard1}]),
            "both-bind"),
        # the exception: sub-group tp-0 (6 pods of 4 GPUs, minimum 2) and tp-1 (4 pods, minimum 2),
        # each within a leaf. Room: leaf 00 free (6 pods), leaf 01 room for 5, the others full. vc-scheduler
        # puts tp-0's minimum in leaf 00, then tp-1's minimum in the fuller leaf 00 too, and tp-0's
        # other 4 pods no longer fit there; hypertopo puts tp-0 in leaf 00 and tp-1 in leaf 01
        d: (_case("fix-remainder", pod_gpus=4, gang_limit=None,
                  taken={**{n: 8 for n in nodes(d)[6:]}, nodes(d)[3]: 4},
                  pods=[({"part": "0"}, "tp-0")] * 6 + [({"part": "1"}, "tp-1")] * 4,
                  policies=[{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 2, "networkTopology": hard1}]),
            "exception"),
        # a sub-group limit by tier name only: vc-scheduler v1.14.1 resolves the name on the PodGroup's
        # policy after it has copied the policy into its sub-jobs (allocate.go updateJobTier), so the
        # sub-group runs without a limit and is bound across leaves; hypertopo keeps it to one leaf,
        # which holds 6 such pods, not 8
        e: (_case("fix-tiername", pod_gpus=4, taken={}, gang_limit=None, pods=one_group * 8,
                  policies=[{"name": "tp", "matchLabelKeys": ["part"], "subGroupSize": 8,
                             "networkTopology": {"mode": "hard", "highestTierName": "leaf"}}]),
            NAME_IGNORED),
    }
    return cases
