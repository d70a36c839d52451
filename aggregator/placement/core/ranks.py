"""Ranks in fabric order: which pod of a gang goes to which of the nodes the core chose.

Why: NCCL (and MPI launchers) chain nodes into rings in rank order, so every place where
consecutive ranks sit in different NVLink cliques, leaves or spines puts a ring hop on the slower
fabric. Matching pods to nodes by name string (`w-10` before `w-2`) crossed boundaries needlessly.

A pod's rank key comes from its index, where the workload controller wrote one:
`volcano.sh/task-index` within its `volcano.sh/task-spec` task, tasks in the order of the Volcano
Job's `spec.tasks` (when the Job is known; else masters and launchers first, then by task name);
Kubernetes Indexed Jobs' `batch.kubernetes.io/job-completion-index`, JobSet's
`jobset.sigs.k8s.io/job-global-index` or `job-index` (before the completion index), Kubeflow's
`training.kubeflow.org/replica-index` (masters and launchers before workers); else the trailing
number of the pod's name, numerically; the name breaks ties.

Nodes are taken in fabric order: by their HyperNode at every tier from the top down, then by node
name, all in natural order (`node-2` before `node-10`); `Topology.fabric_position` holds that
order, computed once per tree. Every domain's nodes are then contiguous, so the domain boundaries
crossed in rank order are, at every tier, the domains used minus one: the fewest possible for that
node set. A node with k slots takes k consecutive ranks. Only the pod -> node matching changes,
never the nodes chosen or how many pods each takes. Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol

from aggregator.placement.core.topology import Natural, Topology, natural

__all__ = ["RANK_MAP_ANNOTATION", "RankKey", "crossings", "fabric_key", "in_fabric_order", "minimum_crossings",
           "name_key", "natural", "nodes_in_rank_order", "pod_rank_key", "rank_map", "task_order"]

# (task order or leader first, task/replica group, job index, unindexed, index, name)
RankKey = tuple[int, Natural, int, int, int, str]
Jobs = Mapping[tuple[str, str], Mapping[str, Any]]  # (namespace, name) -> Volcano Job

RANK_MAP_ANNOTATION = "hypertopo.io/rank-map"  # on the PodGroup: [[pod, node], ...] in rank order
TASK_INDEX = "volcano.sh/task-index"
TASK_SPEC = "volcano.sh/task-spec"
JOB_NAME = "volcano.sh/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
LEADERS = frozenset({"master", "launcher", "chief", "leader", "driver", "coordinator"})

_TRAILING = re.compile(r"([0-9]+)[^0-9]*$")


class _Pod(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def request(self) -> Any: ...

    @property
    def rank(self) -> RankKey | None: ...


_group_key = lru_cache(maxsize=1024)(natural)  # task and replica names recur pod after pod


def _index(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


@lru_cache(maxsize=16384)
def name_key(name: str) -> RankKey:
    """A rank key from the name alone: its trailing number, then the name."""
    found = _TRAILING.search(name)
    return (1, _group_key(""), 0, 0 if found else 1, int(found.group(1)) if found else 0, name)


def task_order(jobs: Jobs | None, namespace: str, job: str | None, task: str) -> int | None:
    """The position of `task` in its Volcano Job's `spec.tasks`; None when the Job is not known."""
    found = jobs.get((namespace, job)) if jobs and job else None
    tasks = ((found or {}).get("spec") or {}).get("tasks") or ()
    for position, spec in enumerate(tasks):
        if isinstance(spec, Mapping) and spec.get("name") == task:
            return position
    return None


def pod_rank_key(pod: Mapping[str, Any], jobs: Jobs | None = None) -> RankKey:
    """The rank key of a pod object (labels, then annotations; a bad value is ignored). `jobs`:
    the Volcano Jobs by (namespace, name), for their task order."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}

    def tag(key: str) -> Any:
        value = labels.get(key)
        return annotations.get(key) if value is None else value

    fallback = name_key(str(meta.get("name") or ""))
    task = str(tag(TASK_SPEC) or "")
    role = str(tag(REPLICA_TYPE) or task)
    order = task_order(jobs, str(meta.get("namespace") or ""), tag(JOB_NAME), task) if task else None
    if order is None:
        order = 0 if role.lower() in LEADERS else 1
    group = _group_key(role.lower() if role else str(tag(JOBSET_REPLICATED_JOB) or ""))
    global_index = _index(tag(JOBSET_GLOBAL_INDEX))
    job = global_index if global_index is not None else _index(tag(JOBSET_JOB_INDEX)) or 0
    for key in (TASK_INDEX, COMPLETION_INDEX, REPLICA_INDEX):
        index = _index(tag(key))
        if index is not None:
            return (order, group, job, 0, index, fallback[5])
    return (order, group, job, *fallback[3:])


def fabric_key(topology: Topology, node: str) -> tuple[tuple[Natural | tuple[()], ...], Natural]:
    """A node's place in the fabric, spelled out: its HyperNode at every tier, top tier first (`()`
    where it has none, so those sort first and every domain stays contiguous), then its own name.
    `Topology.fabric_position` is this order, computed once per tree (the tests hold it to this)."""
    leaf = topology.node_leaf.get(node)
    at = {topology.domains[d].tier: d for d in topology.chains.get(leaf, ())} if leaf is not None else {}
    return tuple(natural(at[t]) if t in at else () for t in reversed(topology.tiers)), natural(node)


def in_fabric_order(topology: Topology, assignments: Mapping[str, str], pods: Sequence[_Pod]) -> dict[str, str]:
    """The same nodes, each taking as many pods of each request as in `assignments`, with pods in
    rank order on nodes in fabric order. Per request shape, so every pod still fits its node; when
    not every pod was placed, the lowest ranks are."""
    if len(assignments) <= 1:
        return dict(assignments)
    position = topology.fabric_position  # the order of `fabric_key`, computed once per tree
    keys: dict[str, tuple[int, Any]] = {
        node: (1, position[node]) if node in position else (0, natural(node))  # in no HyperNode: first
        for node in set(assignments.values())}
    shapes: dict[Any, list[_Pod]] = {}
    for pod in pods:
        shapes.setdefault(pod.request, []).append(pod)
    request = {p.name: p.request for p in pods} if len(shapes) > 1 else {}
    out: dict[str, str] = {}
    for shape, members in shapes.items():
        slots = [node for name, node in assignments.items() if request[name] == shape] if request \
            else list(assignments.values())
        slots.sort(key=keys.__getitem__)
        ranked = sorted(members, key=lambda p: p.rank or name_key(p.name))
        out.update(zip((p.name for p in ranked), slots, strict=False))
    return out


def nodes_in_rank_order(assignments: Mapping[str, str], pods: Iterable[_Pod]) -> list[str]:
    """The nodes of the placed pods, rank by rank (what `crossings` reads)."""
    placed = sorted((p for p in pods if p.name in assignments), key=lambda p: p.rank or name_key(p.name))
    return [assignments[p.name] for p in placed]


def crossings(topology: Topology, nodes_in_rank_order: Iterable[str]) -> dict[int, int]:
    """Tier -> how often consecutive ranks sit in different HyperNodes of that tier (a rank with
    no HyperNode at the tier counts as its own domain)."""
    tiers = topology.tiers
    out = dict.fromkeys(tiers, 0)
    previous: dict[int, str] | None = None
    for node in nodes_in_rank_order:
        leaf = topology.node_leaf.get(node)
        at = {topology.domains[d].tier: d for d in topology.chains.get(leaf, ())} if leaf is not None else {}
        current = {t: at.get(t, f"(none:{node})") for t in tiers}
        if previous is not None:
            for t in tiers:
                out[t] += current[t] != previous[t]
        previous = current
    return out


def minimum_crossings(topology: Topology, nodes: Iterable[str]) -> dict[int, int]:
    """Tier -> the fewest crossings any rank order over `nodes` can have: domains used minus one."""
    used: dict[int, set[str]] = {t: set() for t in topology.tiers}
    for node in set(nodes):
        leaf = topology.node_leaf.get(node)
        at = {topology.domains[d].tier: d for d in topology.chains.get(leaf, ())} if leaf is not None else {}
        for t in used:
            used[t].add(at.get(t, f"(none:{node})"))
    return {t: max(0, len(domains) - 1) for t, domains in used.items()}


def rank_map(pods: Iterable[Mapping[str, Any]], node_of: Callable[[Mapping[str, Any]], str | None],
             jobs: Jobs | None = None) -> str:
    """The gang's rank -> node map as compact JSON, `[["w-0","node-1"],["w-1","node-1"],...]` (the
    list index is the rank), for launchers that build a hostfile; pods without a node are left
    out; "" when none has one. `jobs`: as for `pod_rank_key`."""
    placed = [(pod, node) for pod in pods if (node := node_of(pod))]
    placed.sort(key=lambda item: pod_rank_key(item[0], jobs))
    rows = [[str((pod.get("metadata") or {}).get("name") or ""), node] for pod, node in placed]
    return json.dumps(rows, separators=(",", ":")) if rows else ""
