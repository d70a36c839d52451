"""One scheduling decision for one gang: which nodes its pods may use (taints, tolerations,
nodeSelector, cordons, fabric faults), the core's placement over the scheduler's own view of free
capacity, and a kube-scheduler-style reason when nothing fits.

Why here and not in the core: these are per-pod Kubernetes rules (the core only sees resources
and the HyperNode tree); they become the core's `excluded_nodes`. The placement itself is
`core.place`, never a second algorithm. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.placement import core, degraded, nested, ranks, spares, subgroups, upstream, volcano
from aggregator.placement.gang import Gang, Mode, Placement, PodSpec, Unplaceable, limits_from_annotations
from aggregator.placement.podgroups import GangView
from aggregator.placement.resources import Resources, pod_request
from aggregator.placement.state import FABRIC_TAINT, ClusterState, PodKey, pod_key
from aggregator.placement.topology import Topology

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Decision:
    gang: GangView
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


def _spec_name(key: PodKey) -> str:
    return f"{key[0]}/{key[1]}"


def gang_limits(view: GangView) -> volcano.Topology:
    """The gang's topology limits: a Volcano PodGroup's `spec.networkTopology` when it has one, a
    Kubernetes PodGroup's topology key (hard, up to the tier the key names: `upstream.py`), else
    Volcano's annotations (PodGroup, Job or pod). A gang of one without any is soft."""
    from_spec = volcano.network_topology(volcano.spec(view.podgroup).get("networkTopology")) if view.is_volcano else None
    if from_spec is not None:
        return from_spec
    if view.is_upstream and (key := upstream.topology_key(view.podgroup)):
        return volcano.Topology(Mode.HARD, None, upstream.tier_name(key) or key)
    mode, tier, tier_name = limits_from_annotations(view.annotations)
    if not view.is_group and not view.annotations.get("volcano.sh/network-topology-mode"):
        mode = Mode.SOFT
    return volcano.Topology(mode, tier, tier_name)


def core_gang(view: GangView, usable_anchor: Mapping[PodKey, str],
              request_of: Callable[[Mapping[str, Any]], Resources] = pod_request,
              jobs: ranks.Jobs | None = None) -> Gang:
    """The core's Gang: pending pods to place, at least enough to reach minMember with those placed,
    and the placed members as anchors (re-placement stays close to the rest of the gang).
    `request_of`: a pod's request (the live state's cached parse: it charges the same pods);
    `jobs`: the Volcano Jobs, whose task order ranks their pods (`ranks.pod_rank_key`)."""
    limits = gang_limits(view)
    pods = tuple(PodSpec(_spec_name(pod_key(p)), request_of(p), ranks.pod_rank_key(p, jobs)) for p in view.pending)
    required = max(1, view.min_member - len(view.placed))
    return Gang(
        name=_spec_name(view.key),
        pods=pods,
        min_member=min(required, len(pods)),
        mode=limits.mode,
        highest_tier=limits.highest_tier,
        highest_tier_name=limits.highest_tier_name,
        running={_spec_name(k): n for k, n in usable_anchor.items()},
    )


def subgroup_policies(view: GangView) -> tuple[subgroups.Policy, ...]:
    """Volcano's `spec.subGroupPolicy`, or hypertopo's annotations on other gangs (SubGroupError)."""
    if view.is_volcano:
        return subgroups.from_volcano(view.podgroup)
    return subgroups.from_annotations(view.annotations) if view.is_group else ()


def ignored_limits(topology: Topology, view: GangView, policies: Iterable[subgroups.Policy]) -> str:
    """Soft limits (the gang's, its sub-groups') that name a tier the tree does not have, in the words
    hard mode refuses with: soft mode places without them, and says so ("" when none)."""
    limits = [("", gang_limits(view))]
    limits += [(f"subGroupPolicy {p.name!r}: ", p.topology) for p in policies if p.topology is not None]
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
    """Places the gang's pending pods on the scheduler's view of free capacity (assumed pods count);
    of equally good placements, one without `degraded_nodes` (`degraded.prefer_healthy`).
    `reserved`: every gang's spares (`spares`): others' are off limits unless the pods are
    preemptible, the gang's own take its re-placed pods first."""
    if view.is_upstream and (problem := upstream.key_problem(view.podgroup, topology)):
        return Decision(view, {}, None, reason=problem)
    excluded = filter_nodes(state, view.pending, filter_cache)
    reserved = reserved or {}
    _exclude_reserved(excluded, view, reserved)
    blocked_nodes = frozenset(excluded)
    anchors = {k: n for k, n in view.placed.items() if n not in blocked_nodes and _domain_ok(topology, n, excluded_domains)}
    gang = core_gang(view, anchors, state.request_of, state.vc_jobs)
    try:
        policies = subgroup_policies(view)
        count = spares.parse_request(view.annotations.get(spares.SPARE_REQUEST, default_spares),
                                     max(view.min_member, len(view.members))) if view.is_group else 0
    except (subgroups.SubGroupError, spares.SpareRequestError) as exc:
        return Decision(view, {}, None, reason=f"invalid {'sub-group policy' if isinstance(exc, subgroups.SubGroupError) else 'spare request'}: {exc}")
    own = reserved.get(view.key, ())
    if anchors and own:
        placer = _subgroup_placer(state, view, policies, anchors) if policies else core.place
        early = _to_spares(state, topology, view, gang, own, blocked_nodes, excluded_domains, placer)
        if early is not None:
            return early
    chosen: dict[int, tuple[str, ...]] = {}

    def attempt(blocked: frozenset[str]) -> Placement:
        def place(asked: Gang) -> Placement:
            if policies:
                found, nodes = _subgroups_and_spares(topology, state, view, asked, policies, anchors, blocked,
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

        return _with_task_minimums(view, gang, place)

    levels = degraded.avoid_levels(topology, degraded_nodes)
    placement = degraded.prefer_healthy(attempt(blocked_nodes), levels, lambda avoid: attempt(blocked_nodes | avoid))
    if placement.ok and placement.assignments:
        by_name = {_spec_name(pod_key(p)): pod_key(p) for p in view.pending}
        kept = chosen.get(id(placement)) if count and not anchors else (spares.remaining(own, placement.assignments.values()) if own else None)
        return Decision(view, {by_name[name]: node for name, node in placement.assignments.items()}, placement,
                        warning=ignored_limits(topology, view, policies), spares=kept)
    message = placement.failure.message if placement.failure else "no node fits"
    return Decision(view, {}, placement, reason=_kube_style(len(state.nodes), excluded, message))


def _exclude_reserved(excluded: dict[str, str], view: GangView, reserved: spares.Reservations) -> None:
    """Other gangs' spares are off limits, except to preemptible pods (evicted when needed)."""
    if not all(spares.is_preemptible(p) for p in view.pending):
        for node in spares.others(reserved, view.key):
            excluded.setdefault(node, "node(s) were reserved as another gang's spares")


def _to_spares(state: ClusterState, topology: Topology, view: GangView, gang: Gang, own: tuple[str, ...],
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
        return Decision(view, {}, None, reason=f"gang {view.key[1]}: waiting for preemptible pods to leave its spare "
                        f"node(s) {', '.join(reclaim)}", spares=own, reclaim=pods)
    if placement is None or not placement.ok:
        return None
    by_name = {_spec_name(pod_key(p)): pod_key(p) for p in view.pending}
    return Decision(view, {by_name[name]: node for name, node in placement.assignments.items()}, placement,
                    spares=spares.remaining(own, placement.assignments.values()))


def _subgroups_and_spares(topology: Topology, state: ClusterState, view: GangView, gang: Gang,
                          policies: tuple[subgroups.Policy, ...], anchors: Mapping[PodKey, str],
                          blocked: frozenset[str], excluded_domains: frozenset[str],
                          count: int) -> tuple[Placement, tuple[str, ...]]:
    """A gang with sub-groups placed as they say (`_place_subgroups`), then its `count` spares
    beside it (`spares.beside`): the nested placement has its own objective, so the spares are
    found around what it chose rather than placed with it."""
    found = _place_subgroups(topology, state, view, gang, policies, anchors, blocked, excluded_domains)
    if not count or not found.ok:
        return found, ()
    return spares.beside(topology, state.free_index(topology), found, gang, count, excluded_nodes=blocked,
                         excluded_domains=excluded_domains)


def _subgroup_placer(state: ClusterState, view: GangView, policies: tuple[subgroups.Policy, ...],
                     anchors: Mapping[PodKey, str]) -> spares.Placer:
    """`spares.replace`'s placer for a gang with sub-groups: the pods its spares did not take are
    placed as its sub-groups say, the pods on spares counted with the running members."""
    keys = {_spec_name(pod_key(p)): pod_key(p) for p in view.pending}

    def placer(topology: Topology, _free: Mapping[str, Resources], rest: Gang, *, excluded_nodes: frozenset[str],
               excluded_domains: frozenset[str]) -> Placement:
        on_spares = {keys[name]: node for name, node in rest.running.items() if name in keys}
        return _place_subgroups(topology, state, view, rest, policies, {**anchors, **on_spares}, excluded_nodes,
                                excluded_domains)

    return placer


def _place_subgroups(topology: Topology, state: ClusterState, view: GangView, gang: Gang,
                     policies: tuple[subgroups.Policy, ...], anchors: Mapping[PodKey, str],
                     blocked: frozenset[str], excluded_domains: frozenset[str]) -> Placement:
    """Splits the gang into its sub-groups as Volcano does (`subgroups.partition`) and places them
    (`nested`); the default sub-group's pods keep only the gang's limits."""
    groups, loose = subgroups.partition(policies, view.members)
    problem = subgroups.too_few_subgroups(policies, groups)
    if problem:
        return Placement({}, failure=Unplaceable(f"gang {gang.name}: {problem}", gang.required))
    specs = {p.name: p for p in gang.pods}

    def part_gang(name: str, pods: Iterable[Mapping[str, Any]], limits: volcano.Topology) -> Gang:
        keys = [pod_key(p) for p in pods]
        return Gang(name=name, pods=tuple(specs[_spec_name(k)] for k in keys if _spec_name(k) in specs),
                    mode=limits.mode, highest_tier=limits.highest_tier, highest_tier_name=limits.highest_tier_name,
                    running={_spec_name(k): anchors[k] for k in keys if k in anchors})

    parts = []
    for g in groups:
        sub = part_gang(f"{gang.name}/{g.name}", g.pods, g.policy.topology or volcano.Topology(Mode.SOFT))
        parts.append(nested.Part(g.name, sub, policy=g.policy.name, minimum=g.minimum, members=len(g.pods),
                                 running=sum(1 for p in g.pods if pod_key(p) in view.placed)))
    own = volcano.Topology(gang.mode, gang.highest_tier, gang.highest_tier_name)
    rest = part_gang(gang.name, loose, own) if loose else None
    return nested.place(topology, state.free_index(topology), gang, parts, rest,
                        required_parts=subgroups.required_by_policy(groups),
                        excluded_nodes=blocked, excluded_domains=excluded_domains)


def _with_task_minimums(view: GangView, gang: Gang, place: Callable[[Gang], Placement]) -> Placement:
    """Volcano's minTaskMember: each task needs its own minimum among the scheduled pods (with
    sub-groups too: vc-scheduler's gang plugin checks both). When a partial placement (minMember
    below the gang's size) leaves a task short, the whole gang is placed instead; when even that
    cannot satisfy it, the gang does not fit."""
    placement = place(gang)
    if not view.is_volcano or not placement.ok or not volcano.min_task_member(view.podgroup):
        return placement
    by_name = {_spec_name(pod_key(p)): p for p in view.members}

    def short(assignments: Mapping[str, str]) -> dict[str, tuple[int, int]]:
        scheduled = [p for name, p in by_name.items() if name in assignments or pod_key(p) in view.placed]
        return volcano.task_shortfall(view.podgroup, scheduled)

    if not short(placement.assignments):
        return placement
    retry = place(Gang(gang.name, gang.pods, None, gang.mode, gang.highest_tier, gang.highest_tier_name, gang.running))
    missing = short(retry.assignments) if retry.ok else short({})
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
