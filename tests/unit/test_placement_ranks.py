"""Ranks in fabric order (issue 24, point 2): pods take the chosen nodes in rank order, nodes in
fabric order, so the domain boundaries crossed in rank order are the fewest possible at every tier;
a pod's rank comes from the index its controller wrote, else its name's trailing number."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections import Counter
from typing import Any

from aggregator.placement.core import ranks
from aggregator.placement.core.decide import core_gang
from aggregator.placement.core.free_index import FreeIndex
from aggregator.placement.core.gang import Gang, Mode, PodSpec
from aggregator.placement.core.place import place
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology, build


def _member(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}


def _hypernode(name: str, tier: int, members: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"tier": tier, "tierName": f"t{tier}", "members": members}}


def random_tree(rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, Resources]]:
    """1-4 tiers, 1-4 children per HyperNode (some skipping tiers; a second root maybe lower), names unpadded (`n2` vs `n10`, `hn2` vs `hn10`)
    and created in shuffled order; some nodes sit directly under a higher tier or in no HyperNode;
    free GPUs fragmented (0-8 of 8 free)."""
    objs: list[dict[str, Any]] = []
    free: dict[str, Resources] = {}
    numbers = list(range(400))
    rng.shuffle(numbers)
    node_ids = iter(numbers)
    domain_ids = itertools.count()

    def node() -> dict[str, Any]:
        name = f"n{next(node_ids)}"
        free[name] = Resources(rng.choice((0, 1, 2, 4, 6, 8, 8, 8)), 64_000, 2**40, 110)
        return _member("Node", name)

    def subtree(tier: int) -> str:
        name = f"hn{next(domain_ids)}"  # the name says nothing of the tier
        if tier == 1:
            members = [node() for _ in range(rng.randint(1, 4))]
        else:
            # now and then a child skips tiers (a leaf straight under a spine)
            members = [_member("HyperNode", subtree(tier - 1 if rng.random() < 0.8 else rng.randint(1, tier - 1)))
                       for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.2:
                members.append(node())  # a node joining this tier directly
        objs.append(_hypernode(name, tier, members))
        return name

    top = rng.randint(1, 4)
    subtree(top)
    if rng.random() < 0.5:
        subtree(rng.randint(1, top))  # a second root, maybe lower
    if rng.random() < 0.2:
        node()  # a node in no HyperNode
    rng.shuffle(objs)
    return objs, free


def random_gang(rng: random.Random) -> Gang:
    pods = rng.randint(2, 40)
    shapes = [Resources(g, 1000, 2**30, 1) for g in rng.sample((1, 2, 4, 8), rng.choice((1, 1, 1, 2)))]
    names = [f"w-{i}" for i in range(pods)]
    rng.shuffle(names)
    return Gang("g", tuple(PodSpec(n, rng.choice(shapes)) for n in names), mode=Mode.SOFT,
                min_member=rng.choice((None, None, pods - 1)))


def rank_order_nodes(assignments: dict[str, str], pods: tuple[PodSpec, ...]) -> list[str]:
    placed = [p for p in pods if p.name in assignments]
    return [assignments[p.name] for p in sorted(placed, key=lambda p: ranks.name_key(p.name))]


def test_rank_order_crosses_the_fewest_domain_boundaries_at_every_tier_on_random_fragmented_trees() -> None:
    rng = random.Random(24)
    placed = 0
    for _ in range(400):
        objs, free = random_tree(rng)
        topology = build(objs)
        gang = random_gang(rng)
        for where in (free, FreeIndex(topology, free)):  # the counting core and the index read alike
            result = place(topology, where, gang)
            if not result.ok or not result.assignments:
                continue
            placed += 1
            for shape in {p.request for p in gang.pods}:  # a mixed gang is ordered per shape
                members = tuple(p for p in gang.pods if p.request == shape)
                order = rank_order_nodes(dict(result.assignments), members)
                assert ranks.crossings(topology, order) == ranks.minimum_crossings(topology, order), (objs, gang)
            wanted = sorted((p for p in gang.pods), key=lambda p: ranks.name_key(p.name))
            if gang.homogeneous:  # the lowest ranks are the ones placed
                assert set(result.assignments) == {p.name for p in wanted[:len(result.assignments)]}
    assert placed > 300  # the property was checked on many real placements


def test_the_fabric_order_kept_with_the_tree_is_the_fabric_key_order_on_random_trees() -> None:
    """`Topology.fabric_position` (computed once per tree, what a decision reads) orders nodes as
    `ranks.fabric_key` spells the order out: HyperNode per tier top-down, then name, natural."""
    rng = random.Random(2424)
    for _ in range(300):
        objs, _ = random_tree(rng)
        topology = build(objs)
        nodes = list(topology.node_leaf)
        by_key = sorted(nodes, key=lambda n: ranks.fabric_key(topology, n))
        assert sorted(nodes, key=topology.fabric_position.__getitem__) == by_key, objs
        assert set(topology.fabric_position) == set(nodes)


def test_natural_order_compares_any_two_names_and_reads_numbers_as_numbers() -> None:
    names = ["n10", "n2", "n1x", "n1x2", "n01", "n1", "", "x", "10", "2", "a-10-b", "a-9-b", "a-9-b1"]
    assert sorted(names, key=ranks.natural) == ["", "2", "10", "a-9-b", "a-9-b1", "a-10-b", "n01", "n1", "n1x",
                                                "n1x2", "n2", "n10", "x"]


def test_rank_ordering_keeps_every_node_and_its_pod_count_per_shape() -> None:
    rng = random.Random(7)
    for _ in range(200):
        objs, free = random_tree(rng)
        topology = build(objs)
        gang = random_gang(rng)
        nodes = sorted(free)
        given = {p.name: rng.choice(nodes) for p in gang.pods if rng.random() < 0.9}
        ordered = ranks.in_fabric_order(topology, given, gang.pods)
        request = {p.name: p.request for p in gang.pods}
        assert Counter((request[p], n) for p, n in ordered.items()) == Counter((request[p], n) for p, n in given.items())


def _two_cliques() -> tuple[Topology, dict[str, Resources]]:
    """Two NVL72-like cliques of 18 nodes (4 GPUs each) under one leaf; clique B has 9 nodes free."""
    objs = [_hypernode("nvl-a", 1, [_member("Node", f"node-{i}") for i in range(1, 19)]),
            _hypernode("nvl-b", 1, [_member("Node", f"node-{i}") for i in range(19, 37)]),
            _hypernode("leaf-1", 2, [_member("HyperNode", "nvl-a"), _member("HyperNode", "nvl-b")])]
    free = {f"node-{i}": Resources(4 if i <= 27 else 0, 64_000, 2**40, 110) for i in range(1, 37)}
    return build(objs), free


def test_a_27_rank_job_over_two_nvlink_cliques_crosses_once_not_three_times() -> None:
    topology, free = _two_cliques()
    gang = Gang("job", tuple(PodSpec(f"w-{i}", Resources(4, 1000, 2**30, 1)) for i in range(27)))
    for where in (free, FreeIndex(topology, free)):
        result = place(topology, where, gang)
        in_rank_order = [result.assignments[f"w-{i}"] for i in range(27)]
        cliques = "".join(topology.node_leaf[n][-1].upper() for n in in_rank_order)
        assert cliques == "A" * 18 + "B" * 9
        assert ranks.crossings(topology, in_rank_order) == {1: 1, 2: 0}
        # the same slots matched to pods by name string (w-10..w-19 before w-2), as before, cross three times
        by_string = dict(zip(sorted(result.assignments), in_rank_order, strict=True))
        old = "".join(topology.node_leaf[by_string[f"w-{i}"]][-1].upper() for i in range(27))
        assert old == "AAABBBBBBBAAAAAAAAAAAAAAABB"
        assert ranks.crossings(topology, [by_string[f"w-{i}"] for i in range(27)])[1] == 3
        assert in_rank_order[:3] == ["node-1", "node-2", "node-3"]  # nodes in natural order too


def test_a_node_with_several_slots_takes_consecutive_ranks() -> None:
    objs = [_hypernode("nvl-0", 1, [_member("Node", "b"), _member("Node", "a")])]
    topology = build(objs)
    free = {"a": Resources(8, 64_000, 2**40, 110), "b": Resources(8, 64_000, 2**40, 110)}
    gang = Gang("job", tuple(PodSpec(f"w-{i}", Resources(2, 1000, 2**30, 1)) for i in (7, 0, 3, 5, 1, 6, 2, 4)))
    result = place(topology, free, gang)
    assert [result.assignments[f"w-{i}"] for i in range(8)] == ["a"] * 4 + ["b"] * 4


def _pod(name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}


def _order(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in sorted(pods, key=ranks.pod_rank_key)]


def test_trailing_numbers_rank_numerically_so_w2_comes_before_w10() -> None:
    pods = [_pod(f"w-{i}") for i in (10, 2, 1, 0, 11)]
    assert _order(pods) == ["w-0", "w-1", "w-2", "w-10", "w-11"]
    assert _order([_pod("job-w-9-x"), _pod("job-w-10-x")]) == ["job-w-9-x", "job-w-10-x"]


def test_the_indexed_job_completion_index_ranks_over_the_name() -> None:
    key = "batch.kubernetes.io/job-completion-index"
    pods = [_pod("train-zz", annotations={key: "2"}), _pod("train-aa", annotations={key: "10"}),
            _pod("train-mm", labels={key: "0"})]
    assert _order(pods) == ["train-mm", "train-zz", "train-aa"]


def test_the_volcano_task_index_ranks_within_its_task_with_the_master_first() -> None:
    def vc(name: str, task: str, index: int) -> dict[str, Any]:
        return _pod(name, annotations={"volcano.sh/task-spec": task, "volcano.sh/task-index": str(index)})

    pods = [vc("j-worker-10", "worker", 10), vc("j-worker-2", "worker", 2), vc("j-master-0", "master", 0),
            vc("j-worker-0", "worker", 0)]
    assert _order(pods) == ["j-master-0", "j-worker-0", "j-worker-2", "j-worker-10"]


def test_volcano_tasks_rank_in_the_order_of_their_jobs_spec_tasks() -> None:
    """With the Volcano Job known, its `spec.tasks` order ranks the tasks (here the workers before
    the parameter server, as the Job lists them); without it, the leader-first fallback."""
    def vc(name: str, task: str, index: int) -> dict[str, Any]:
        return _pod(name, labels={"volcano.sh/task-spec": task, "volcano.sh/task-index": str(index),
                                  "volcano.sh/job-name": "j"})

    pods = [vc("j-ps-0", "ps", 0), vc("j-worker-1", "worker", 1), vc("j-chief-0", "chief", 0),
            vc("j-worker-0", "worker", 0), vc("j-ps-1", "ps", 1)]
    job = {"metadata": {"name": "j", "namespace": "ns"},
           "spec": {"tasks": [{"name": "worker", "replicas": 2}, {"name": "ps", "replicas": 2},
                              {"name": "chief", "replicas": 1}]}}
    jobs = {("ns", "j"): job}
    by_job = [p["metadata"]["name"] for p in sorted(pods, key=lambda p: ranks.pod_rank_key(p, jobs))]
    assert by_job == ["j-worker-0", "j-worker-1", "j-ps-0", "j-ps-1", "j-chief-0"]
    assert _order(pods) == ["j-chief-0", "j-ps-0", "j-ps-1", "j-worker-0", "j-worker-1"]  # no Job: leader first
    other = {("other-ns", "j"): job}  # a Job of the same name elsewhere is not this one's
    assert [p["metadata"]["name"] for p in sorted(pods, key=lambda p: ranks.pod_rank_key(p, other))] == _order(pods)
    where = {"j-worker-0": "n1", "j-worker-1": "n1", "j-ps-0": "n2", "j-ps-1": "n2", "j-chief-0": "n3"}
    rows = json.loads(ranks.rank_map(pods, lambda p: where[p["metadata"]["name"]], jobs))
    assert [name for name, _ in rows] == by_job  # the published map ranks as placement did


def test_jobset_and_kubeflow_replica_indexes_rank_pods() -> None:
    def js(name: str, job: int, completion: int) -> dict[str, Any]:
        return _pod(name, labels={"jobset.sigs.k8s.io/job-index": str(job),
                                  "batch.kubernetes.io/job-completion-index": str(completion)})

    assert _order([js("x-1-0", 1, 0), js("x-0-1", 0, 1), js("x-0-0", 0, 0)]) == ["x-0-0", "x-0-1", "x-1-0"]

    def kf(name: str, kind: str, index: int) -> dict[str, Any]:
        return _pod(name, labels={"training.kubeflow.org/replica-type": kind, "training.kubeflow.org/replica-index": str(index)})

    assert _order([kf("p-worker-1", "worker", 1), kf("p-master-0", "master", 0), kf("p-worker-0", "worker", 0)]) \
        == ["p-master-0", "p-worker-0", "p-worker-1"]


def test_the_live_scheduler_gang_carries_each_pod_rank_from_its_labels() -> None:
    from aggregator.placement.kinds.podgroups import GangView

    key = "batch.kubernetes.io/job-completion-index"
    pods = [_pod("zeta", labels={key: "1"}), _pod("alpha", labels={key: "0"})]
    view = GangView(key=("ns", "g"), podgroup=None, members=tuple(pods), pending=tuple(pods), placed={}, min_member=2,
                    annotations={}, flavour="x-k8s")
    gang = core_gang(view, {})
    topology, _ = _two_cliques()
    free = {f"node-{i}": Resources(1, 64_000, 2**40, 110) for i in (30, 4, 12)}  # one pod per node
    result = place(topology, free, Gang(gang.name, gang.pods))
    assert [p.rank[4] for p in gang.pods if p.rank] == [1, 0]
    assert result.assignments == {"ns/alpha": "node-4", "ns/zeta": "node-12"}


def test_the_simulator_reports_rank_order_crossings_against_the_minimum_per_tier() -> None:
    """Every gang the simulator starts is read in rank order; hypertopo's placements cross the
    fewest boundaries at every tier, and the report tells a policy whose order does not apart."""
    from agent.cluster_model import parse_model
    from aggregator.placement.sim.policies import policy
    from aggregator.placement.sim.simulate import Simulation, model_hypernodes, node_capacity
    from aggregator.placement.sim.trace import parse_trace

    model = parse_model({"switches": {"core": {"switches": ["s1", "s2"]}, "s1": {"switches": ["l1", "l2"]},
                                      "s2": {"switches": ["l3", "l4"]}},
                         "blocks": [{"switch": f"l{i}", "nodes": [f"n[{4 * i - 3}-{4 * i}]"]} for i in range(1, 5)]})
    topology = build(model_hypernodes(model))
    rng = random.Random(3)  # gangs of 2-24 pods of 2-8 GPUs on 16 nodes of 8, arriving as others leave
    trace = parse_trace({"jobs": [{"name": f"j{i}", "arrival": i, "pods": rng.randint(2, 24),
                                   "gpus_per_pod": rng.choice((2, 4, 8)), "duration": rng.randint(1, 6), "mode": "soft"}
                                  for i in range(60)]})
    ours = Simulation(topology, node_capacity(model.nodes()), trace, policy("hypertopo")).run()
    report = ours["rank_order_crossings"]
    assert report and all(row["crossed"] == row["minimum"] for row in report.values()), report
    started, total = (int(x) for x in ours["gangs_at_minimum_crossings"].split("/"))
    assert started == total > 0
    assert sum(row["minimum"] for row in report.values()) > 0  # some gangs spanned domains: the check had work

    def by_string(topology: Topology, free: Any, gang: Gang, **kw: Any) -> Any:
        """hypertopo's nodes, matched to pods backwards in rank order: its boundaries no longer minimal."""
        placed = policy("hypertopo")(topology, free, gang, **kw)
        if not placed.ok:
            return placed
        order = sorted(placed.assignments, key=ranks.name_key)
        nodes = sorted(placed.assignments.values(), key=topology.fabric_position.__getitem__)
        shuffled = dict(zip(order, nodes[::2] + nodes[1::2], strict=True))
        return dataclasses.replace(placed, assignments=shuffled)

    theirs = Simulation(topology, node_capacity(model.nodes()), trace, by_string).run()
    assert any(row["crossed"] > row["minimum"] for row in theirs["rank_order_crossings"].values())
