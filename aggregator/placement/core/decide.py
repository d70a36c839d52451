"""One scheduling decision for one gang: which nodes its pods may use (taints, tolerations,
nodeSelector, cordons, fabric faults), the core's placement over the scheduler's own view of free
capacity, and a kube-scheduler-style reason when nothing fits.

Why here and not in the core: these are per-pod Kubernetes rules (the core only sees resources
and the HyperNode tree); they become the core's `excluded_nodes`. The placement itself is
`core.place`, never a second algorithm. The gang arrives read (`gang_spec.GangSpec`: its kind,
annotations, sub-groups, ranks and spares, read once); the decision reads nothing of it again. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.placement.core import degraded, nested, ranks, spares
from aggregator.placement.core import place as core
from aggregator.placement.core.gang import Gang, Mode, Placement, Unplaceable
from aggregator.placement.core.resources import Resources, pod_request
from aggregator.placement.core.topology import Topology
from aggregator.placement.kinds import gang_spec
from aggregator.placement.kinds.gang_spec import GangSpec, Limits, spec_name
from aggregator.placement.kinds.podgroups import GangView
from aggregator.placement.live.spare_hold import ReservedSpares
from aggregator.placement.live.state import FABRIC_TAINT, ClusterState, PodKey

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Decision:
    gang: GangSpec
    assignments: Mapping[PodKey, str]  # empty when nothing fits
    placement: Placement | None
    reason: str = ""
    warning: str = ""  # a placed gang's limit that could not be applied (soft mode, unknown tier name)
    spares: tuple[str, ...] | None = None  # the gang's reserved spares after this decision (None: none asked)
    reclaim: tuple[PodKey, ...] = ()  # preemptible pods to evict so that the gang's spares take it

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


def core_gang(view: GangView, usable_anchor: Mapping[PodKey, str],
              request_of: Callable[[Mapping[str, Any]], Resources] = pod_request,
              jobs: ranks.Jobs | None = None) -> Gang:
    """The core's Gang of a gang read on its own (`gang_spec.read`, then `GangSpec.gang`):
    `request_of`: a pod's request (the live state's cached parse: it charges the same pods);
    `jobs`: the Volcano Jobs, whose task order ranks their pods (`ranks.pod_rank_key`)."""
    return gang_spec.read(view, jobs=jobs, request_of=request_of).gang(usable_anchor)


def ignored_limits(topology: Topology, spec: GangSpec) -> str:
    """Soft limits (the gang's, its sub-groups') that name a tier the tree does not have, in the words
    hard mode refuses with: soft mode places without them, and says so ("" when none)."""
    limits = [("", spec.limits)]
    limits += [(f"subGroupPolicy {p.name!r}: ", p.topology) for p in spec.policies if p.topology is not None]
    notes = [prefix + core.unknown_tier_name(topology, lim.highest_tier_name)
             for prefix, lim in limits
             if lim.mode is Mode.SOFT and lim.highest_tier_name and topology.tier_of_name(lim.highest_tier_name) is None]
    return "; ".join(notes) + " (soft mode: placed without that limit)" if notes else ""


def decide(
    state: ClusterState,
    topology: Topology,
    view: GangView,
    *,
    excluded_domains: frozenset[str] = frozenset(),
    filter_cache: dict[Any, dict[str, str]] | None = None,
    degraded_nodes: frozenset[str] = frozenset(),
    reserved: spares.Reservations | None = None,
    default_spares: str = "",
) -> Decision:
    """Reads the gang once (`gang_spec.read`) and places it (`decide_spec`)."""
    spec = gang_spec.read(view, default_spares=default_spares, jobs=state.vc_jobs, request_of=state.request_of)
    return decide_spec(state, topology, spec, excluded_domains=excluded_domains, filter_cache=filter_cache,
                       degraded_nodes=degraded_nodes, reserved=reserved)


def decide_spec(
    state: ClusterState,
    topology: Topology,
    spec: GangSpec,
    *,
    excluded_domains: frozenset[str] = frozenset(),
    filter_cache: dict[Any, dict[str, str]] | None = None,
    degraded_nodes: frozenset[str] = frozenset(),
    reserved: spares.Reservations | None = None,
) -> Decision:
    """Places the gang's pending pods on the scheduler's view of free capacity (assumed pods count);
    of equally good placements, one without `degraded_nodes` (`degraded.prefer_healthy`).
    `reserved`: every gang's spares (`spares`): others' are off limits unless the pods are
    preemptible, the gang's own take its re-placed pods first. Reads nothing of the gang but `spec`.

    The live scheduler holds every reserved spare out of the free index's aggregates
    (`spare_hold`); the spares this gang may use (its own; every one for preemptible pods) are
    counted again for the length of the decision. Others' spares are excluded nodes all the same,
    for the paths that count node by node."""
    if problem := spec.tree_problem(topology):
        return Decision(spec, {}, None, reason=problem)
    reserved = reserved or {}
    index = state.free_index(topology)
    with index.revealed(index.held if spec.preemptible else reserved.get(spec.key, ())):
        return _decide(state, topology, spec, excluded_domains, filter_cache, degraded_nodes, reserved)


def _decide(state: ClusterState, topology: Topology, spec: GangSpec, excluded_domains: frozenset[str],
            filter_cache: dict[Any, dict[str, str]] | None, degraded_nodes: frozenset[str],
            reserved: spares.Reservations) -> Decision:
    excluded = filter_nodes(state, spec.pending, filter_cache)
    others = frozenset() if spec.preemptible else _others(reserved, spec.key)
    blocked_nodes = frozenset(excluded) | others
    anchors = {k: n for k, n in spec.placed.items() if n not in blocked_nodes and _domain_ok(topology, n, excluded_domains)}
    gang = spec.gang(anchors)
    if spec.invalid:
        return Decision(spec, {}, None, reason=spec.invalid)
    count = spec.spare_count
    own = reserved.get(spec.key, ())
    if anchors and own:
        placer = _subgroup_placer(state, spec, anchors) if spec.policies else core.place
        early = _to_spares(state, topology, spec, gang, own, blocked_nodes, excluded_domains, placer)
        if early is not None:
            return early
    chosen: dict[int, tuple[str, ...]] = {}

    def attempt(blocked: frozenset[str]) -> Placement:
        def place(asked: Gang) -> Placement:
            if spec.policies:
                found, nodes = _subgroups_and_spares(topology, state, spec, asked, anchors, blocked,
                                                     excluded_domains, 0 if anchors else count)
                chosen[id(found)] = nodes
                return found
            if count and not anchors:
                found, nodes = spares.place(topology, state.free_index(topology), asked, count, excluded_nodes=blocked,
                                            excluded_domains=excluded_domains)
                chosen[id(found)] = nodes
                return found
            return core.place(topology, state.free_index(topology), asked, excluded_nodes=blocked,
                              excluded_domains=excluded_domains)

        return _with_task_minimums(spec, gang, place)

    levels = degraded.avoid_levels(topology, degraded_nodes)
    placement = degraded.prefer_healthy(attempt(blocked_nodes), levels, lambda avoid: attempt(blocked_nodes | avoid))
    if placement.ok and placement.assignments:
        by_name = spec.names
        kept = chosen.get(id(placement)) if count and not anchors else (spares.remaining(own, placement.assignments.values()) if own else None)
        return Decision(spec, {by_name[name]: node for name, node in placement.assignments.items()}, placement,
                        warning=ignored_limits(topology, spec), spares=kept)
    message = placement.failure.message if placement.failure else "no node fits"
    excluded = {**dict.fromkeys(others, "node(s) were reserved as another gang's spares"), **excluded}
    return Decision(spec, {}, placement, reason=_kube_style(len(state.nodes), excluded, message))


def _others(reserved: spares.Reservations, gang: PodKey) -> frozenset[str]:
    """Other gangs' spares: off limits, except to preemptible pods (evicted when needed). The live
    scheduler's `ReservedSpares` keeps them gathered; a plain mapping is gathered here."""
    return reserved.others(gang) if isinstance(reserved, ReservedSpares) else spares.others(reserved, gang)


def _to_spares(state: ClusterState, topology: Topology, spec: GangSpec, gang: Gang, own: tuple[str, ...],
               blocked: frozenset[str], excluded_domains: frozenset[str], placer: spares.Placer) -> Decision | None:
    """A re-placement onto the gang's own free spares, the pods they cannot take placed next to the
    gang by `placer` (`spares.replace`), or the preemptible pods to evict there first; None when no
    spare takes a pod or the rest fits nowhere (the gang is placed as usual)."""
    borrowed: dict[str, Resources] = {}
    victims: dict[str, list[PodKey]] = {}
    for node in own:
        for key in state.on_node.get(node, ()):
            pod = state.pods.get(key)
            if pod is not None and spares.is_preemptible(pod):
                borrowed[node] = borrowed.get(node, Resources()) + state.request_of(pod)
                victims.setdefault(node, []).append(key)
    placement, reclaim = spares.replace(topology, state.free(own), state.free_index(topology), gang, own,
                                        excluded_nodes=blocked, excluded_domains=excluded_domains,
                                        reclaimable=borrowed, placer=placer)
    if reclaim:
        pods = tuple(k for node in reclaim for k in victims.get(node, ()))
        return Decision(spec, {}, None, reason=f"gang {spec.key[1]}: waiting for preemptible pods to leave its spare "
                        f"node(s) {', '.join(reclaim)}", spares=own, reclaim=pods)
    if placement is None or not placement.ok:
        return None
    by_name = spec.names
    return Decision(spec, {by_name[name]: node for name, node in placement.assignments.items()}, placement,
                    spares=spares.remaining(own, placement.assignments.values()))


def _subgroups_and_spares(topology: Topology, state: ClusterState, spec: GangSpec, gang: Gang,
                          anchors: Mapping[PodKey, str], blocked: frozenset[str], excluded_domains: frozenset[str],
                          count: int) -> tuple[Placement, tuple[str, ...]]:
    """A gang with sub-groups placed as they say (`_place_subgroups`), then its `count` spares
    beside it (`spares.beside`): the nested placement has its own objective, so the spares are
    found around what it chose rather than placed with it."""
    found = _place_subgroups(topology, state, spec, gang, anchors, blocked, excluded_domains)
    if not count or not found.ok:
        return found, ()
    return spares.beside(topology, state.free_index(topology), found, gang, count, excluded_nodes=blocked,
                         excluded_domains=excluded_domains)


def _subgroup_placer(state: ClusterState, spec: GangSpec, anchors: Mapping[PodKey, str]) -> spares.Placer:
    """`spares.replace`'s placer for a gang with sub-groups: the pods its spares did not take are
    placed as its sub-groups say, the pods on spares counted with the running members."""
    keys = spec.names

    def placer(topology: Topology, _free: Mapping[str, Resources], rest: Gang, *, excluded_nodes: frozenset[str],
               excluded_domains: frozenset[str]) -> Placement:
        on_spares = {keys[name]: node for name, node in rest.running.items() if name in keys}
        return _place_subgroups(topology, state, spec, rest, {**anchors, **on_spares}, excluded_nodes, excluded_domains)

    return placer


def _place_subgroups(topology: Topology, state: ClusterState, spec: GangSpec, gang: Gang,
                     anchors: Mapping[PodKey, str], blocked: frozenset[str],
                     excluded_domains: frozenset[str]) -> Placement:
    """The gang's sub-groups (read with the spec, as Volcano forms them) placed by `nested`; the
    default sub-group's pods keep only the gang's limits."""
    if spec.too_few_subgroups:
        return Placement({}, failure=Unplaceable(f"gang {gang.name}: {spec.too_few_subgroups}", gang.required))
    specs = {p.name: p for p in gang.pods}

    def part_gang(name: str, keys: Iterable[PodKey], limits: Limits) -> Gang:
        return Gang(name=name, pods=tuple(specs[spec_name(k)] for k in keys if spec_name(k) in specs),
                    mode=limits.mode, highest_tier=limits.highest_tier, highest_tier_name=limits.highest_tier_name,
                    running={spec_name(k): anchors[k] for k in keys if k in anchors})

    parts = []
    for g in spec.subgroups:
        sub = part_gang(f"{gang.name}/{g.name}", g.pods, g.limits or Limits(Mode.SOFT))
        parts.append(nested.Part(g.name, sub, policy=g.policy, minimum=g.minimum, members=len(g.pods),
                                 running=sum(1 for k in g.pods if k in spec.placed)))
    own = Limits(gang.mode, gang.highest_tier, gang.highest_tier_name)
    rest = part_gang(gang.name, spec.loose, own) if spec.loose else None
    return nested.place(topology, state.free_index(topology), gang, parts, rest, required_parts=spec.required_parts,
                        excluded_nodes=blocked, excluded_domains=excluded_domains)


def _with_task_minimums(spec: GangSpec, gang: Gang, place: Callable[[Gang], Placement]) -> Placement:
    """Volcano's minTaskMember: each task needs its own minimum among the scheduled pods (with
    sub-groups too: vc-scheduler's gang plugin checks both). When a partial placement (minMember
    below the gang's size) leaves a task short, the whole gang is placed instead; when even that
    cannot satisfy it, the gang does not fit."""
    placement = place(gang)
    if not placement.ok or not spec.min_task_member:
        return placement
    if not spec.task_shortfall(placement.assignments):
        return placement
    retry = place(Gang(gang.name, gang.pods, None, gang.mode, gang.highest_tier, gang.highest_tier_name, gang.running))
    missing = spec.task_shortfall(retry.assignments) if retry.ok else spec.task_shortfall(())
    if retry.ok and not missing:
        return retry
    detail = ", ".join(f"task {t or '(none)'} has {have} of minTaskMember {need}" for t, (have, need) in missing.items())
    return Placement({}, failure=Unplaceable(f"gang {gang.name}: minTaskMember not met: {detail}", gang.required))


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
