"""One scheduling decision for one gang: which nodes its pods may use (taints, tolerations,
nodeSelector, cordons, fabric faults), the core's placement over the scheduler's own view of free
capacity, and a kube-scheduler-style reason when nothing fits.

Why here and not in the core: these are per-pod Kubernetes rules (the core only sees resources
and the HyperNode tree); they become the core's `excluded_nodes`. The placement itself is
`core.place`, never a second algorithm. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.placement import core
from aggregator.placement.gang import Gang, Mode, Placement, PodSpec, limits_from_annotations
from aggregator.placement.podgroups import GangView
from aggregator.placement.resources import pod_request
from aggregator.placement.state import FABRIC_TAINT, ClusterState, PodKey, pod_key
from aggregator.placement.topology import Topology

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Decision:
    gang: GangView
    assignments: Mapping[PodKey, str]  # empty when nothing fits
    placement: Placement | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.assignments)


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes toleration matching: key (empty key + Exists = every key), operator Equal
    (default) / Exists, and effect (empty = every effect)."""
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("key") and tol.get("key") != taint.get("key"):
            continue
        if not tol.get("key") and tol.get("operator") != "Exists":
            continue
        if tol.get("operator") == "Exists" or (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def why_not(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """The filter a node fails for a pod (kube-scheduler's wording), or None when it passes."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "node(s) were unschedulable"
    pod_spec = pod.get("spec") or {}
    for taint in spec.get("taints") or []:
        if taint.get("key") == FABRIC_TAINT:
            return f"node(s) had fabric fault taint {{{FABRIC_TAINT}}}"
        if taint.get("effect") in BLOCKING_EFFECTS and not tolerates(pod_spec.get("tolerations") or [], taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return "node(s) didn't match Pod's node affinity/selector"
    return None


def filter_nodes(state: ClusterState, pods: Iterable[Mapping[str, Any]],
                 cache: dict[Any, dict[str, str]] | None = None) -> dict[str, str]:
    """Nodes none of `pods` may use -> the reason (the first pod's first failing filter).

    Pods of one gang share their tolerations and nodeSelector, so the result is kept in `cache`
    per (node generation, pod constraints); the caller drops the cache when nodes change."""
    excluded: dict[str, str] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        signature = (state.topology_generation, repr(spec.get("tolerations")), repr(spec.get("nodeSelector")))
        found = cache.get(signature) if cache is not None else None
        if found is None:
            found = {name: r for name, node in state.nodes.items() if (r := why_not(pod, node))}
            if cache is not None:
                cache[signature] = found
        for name, reason in found.items():
            excluded.setdefault(name, reason)
    return excluded


def _spec_name(key: PodKey) -> str:
    return f"{key[0]}/{key[1]}"


def core_gang(view: GangView, usable_anchor: Mapping[PodKey, str]) -> Gang:
    """The core's Gang: pending pods to place, at least enough to reach minMember with those placed,
    and the placed members as anchors (re-placement stays close to the rest of the gang)."""
    mode, tier, tier_name = limits_from_annotations(view.annotations)
    if not view.is_group and not view.annotations.get("volcano.sh/network-topology-mode"):
        mode = Mode.SOFT
    pods = tuple(PodSpec(_spec_name(pod_key(p)), pod_request(p)) for p in view.pending)
    required = max(1, view.min_member - len(view.placed))
    return Gang(
        name=_spec_name(view.key),
        pods=pods,
        min_member=min(required, len(pods)),
        mode=mode,
        highest_tier=tier,
        highest_tier_name=tier_name,
        running={_spec_name(k): n for k, n in usable_anchor.items()},
    )


def decide(
    state: ClusterState,
    topology: Topology,
    view: GangView,
    *,
    excluded_domains: frozenset[str] = frozenset(),
    filter_cache: dict[Any, dict[str, str]] | None = None,
) -> Decision:
    """Places the gang's pending pods on the scheduler's view of free capacity (assumed pods count)."""
    excluded = filter_nodes(state, view.pending, filter_cache)
    blocked_nodes = frozenset(excluded)
    anchors = {k: n for k, n in view.placed.items() if n not in blocked_nodes and _domain_ok(topology, n, excluded_domains)}
    gang = core_gang(view, anchors)
    placement = core.place(topology, state.free(), gang, excluded_nodes=blocked_nodes, excluded_domains=excluded_domains)
    if placement.ok and placement.assignments:
        by_name = {_spec_name(pod_key(p)): pod_key(p) for p in view.pending}
        return Decision(view, {by_name[name]: node for name, node in placement.assignments.items()}, placement)
    message = placement.failure.message if placement.failure else "no node fits"
    return Decision(view, {}, placement, reason=_kube_style(len(state.nodes), excluded, message))


def _domain_ok(topology: Topology, node: str, excluded_domains: frozenset[str]) -> bool:
    leaf = topology.node_leaf.get(node)
    if leaf is None:
        return True
    return topology.usable.get(leaf, True) and not any(d in excluded_domains for d in topology.chains.get(leaf, ()))


def _kube_style(total: int, excluded: Mapping[str, str], message: str) -> str:
    """`0/8 nodes are available: 1 node(s) had ...; <the core's reason>` as kube-scheduler writes."""
    counts = Counter(excluded.values())
    parts = [f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    head = f"0/{total} nodes are available"
    return f"{head}: {', '.join(parts)}. {message}" if parts else f"{head}: {message}"
