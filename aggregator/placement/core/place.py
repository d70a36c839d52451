"""The placement core: put a gang in the lowest HyperNode that holds it, touching as few leaves as
possible, packing nodes best-fit; deterministic, and without a dry run in every HyperNode.

Objective, in order:
1. the lowest tier of the gang's lowest common HyperNode (running pods of the gang included);
2. the fewest leaves (immediate HyperNodes of the nodes used), as Slurm's tree plugin fills one
   leaf before the next;
3. best fit: among domains, the one left with the least spare capacity; among leaves and nodes,
   "the smallest that covers what is left, else the largest", which keeps big holes whole;
4. names break the remaining ties, so the same input gives the same answer.
Which pod takes which chosen slot is `ranks.in_fabric_order`: pods in rank order on nodes in fabric
order, so consecutive ranks share the lowest domain.

Given a `FreeIndex` (free capacity with per-domain aggregates kept as pods bind and leave),
`indexed.place` reads the same answer from the aggregates, touching only the domains and leaves
the gang can use; it declines (and the counting below runs) where the aggregates are not exact.

How, counting: `capacity.measure` counts, once per decision, the gang's pods each node/leaf/HyperNode can
hold. Tiers are walked from the lowest up to the limit (soft mode then climbs); in the first tier
with a domain big enough, domains are ranked by the leaves they would need (a sort of their leaf
counts, not an allocation) and the allocation runs once, in the best. Only mixed-shape gangs,
whose counts are upper bounds, may need a second candidate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from aggregator.placement.core import indexed, ranks
from aggregator.placement.core.capacity import Capacity, count_fits, cover, leaf_key, leaves_in, measure
from aggregator.placement.core.free_index import FreeIndex
from aggregator.placement.core.gang import ROOT, Gang, Mode, Placement, PodSpec, Unplaceable
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology

__all__ = ["describe", "lowest_feasible_tier", "place", "resolve_limit", "tier_words", "unknown_tier_name"]


@dataclass(frozen=True)
class _Ask:
    """One decision's fixed inputs, bundled so the helpers stay short."""

    topology: Topology
    free: Mapping[str, Resources]
    gang: Gang
    capacity: Capacity
    anchors: frozenset[str]  # nodes of the gang's running pods
    allowed: frozenset[str] | None  # domains that contain every anchor; None = any


def place(topology: Topology, free: Mapping[str, Resources], gang: Gang, *,
          excluded_nodes: frozenset[str] = frozenset(),
          excluded_domains: frozenset[str] = frozenset()) -> Placement:
    """A node for every pod of `gang` (at least `min_member`), or the reason none fits."""
    if not gang.pods:
        return describe(topology, {}, gang.running.values())
    limit, problem = resolve_limit(topology, gang)
    if problem:
        return Placement({}, failure=Unplaceable(problem, gang.required))
    if isinstance(free, FreeIndex) and free.topology is topology:
        found = indexed.place(topology, free, gang, tier_order(topology, limit, gang.mode),
                              excluded_nodes=excluded_nodes, excluded_domains=excluded_domains)
        if found is not None:
            return describe(topology, found)  # in rank order already
    capacity = measure(topology, free, gang, excluded_nodes=excluded_nodes, excluded_domains=excluded_domains)
    ask = _Ask(topology, free, gang, capacity, frozenset(gang.running.values()), _allowed(topology, gang))
    for tier in tier_order(topology, limit, gang.mode):
        for domain in ranked(ask, tier):
            assignments = _allocate(ask, domain)
            if assignments is not None:
                return describe(topology, ranks.in_fabric_order(topology, assignments, gang.pods), ask.anchors)
    return Placement({}, failure=_explain(ask, limit))


def resolve_limit(topology: Topology, gang: Gang) -> tuple[int | None, str]:
    """The highest tier the gang may span (None = no limit) and a problem, if the name is unknown."""
    limit = gang.highest_tier
    if gang.highest_tier_name:
        named = topology.tier_of_name(gang.highest_tier_name)
        if named is None and gang.mode is Mode.HARD:
            return None, unknown_tier_name(topology, gang.highest_tier_name)
        if named is not None:
            limit = named if limit is None else min(limit, named)
    return limit, ""


def unknown_tier_name(topology: Topology, name: str) -> str:
    """What a limit naming a tier the tree does not have is told (hard mode refuses with it, soft
    mode places without the limit and says the same)."""
    known = ", ".join(f"{t}={n}" for t, n in sorted(topology.tier_names.items())) or "none"
    return f"highest tier name {name!r} matches no tier (tiers: {known})"


def tier_order(topology: Topology, limit: int | None, mode: Mode) -> list[int]:
    """Tiers to try, lowest first; the virtual ROOT is one above the top tier."""
    every = [*topology.tiers, topology.top_tier + 1]
    if limit is None:
        return every
    within = [t for t in every if t <= limit]
    return within + [t for t in every if t > limit] if mode is Mode.SOFT else within


def _allowed(topology: Topology, gang: Gang) -> frozenset[str] | None:
    if not gang.running:
        return None
    lca = topology.lca(gang.running.values())
    return frozenset({ROOT}) if lca is None else frozenset({*topology.chains[lca], ROOT})


def _domains_of_tier(ask: _Ask, tier: int) -> list[str]:
    topology = ask.topology
    if tier == topology.top_tier + 1:
        return [ROOT]
    return [d for d in topology.by_tier.get(tier, ()) if d not in ask.capacity.blocked]


def ranked(ask: _Ask, tier: int) -> Iterator[str]:
    """Domains of `tier` that can hold the gang, best first (fits all, fewest leaves, best fit, name)."""
    caps = ask.capacity.domain_cap
    total, required = len(ask.gang.pods), max(1, ask.gang.required)
    scored = []
    for domain in _domains_of_tier(ask, tier):
        cap = caps.get(domain, 0)
        if cap < required or (ask.allowed is not None and domain not in ask.allowed):
            continue
        target = min(cap, total)
        scored.append((cap < total, _leaves_needed(ask, domain, target), cap - target, domain))
    scored.sort()
    return (domain for *_, domain in scored)


def _anchor_leaves(ask: _Ask) -> set[str]:
    return {leaf_key(ask.topology, n) for n in ask.anchors}


def _leaves_needed(ask: _Ask, domain: str, target: int) -> int:
    """Fewest new leaves that hold `target` pods once the anchors' leaves are full."""
    leaf_cap = ask.capacity.leaf_cap
    leaves = leaves_in(ask.topology, ask.capacity, domain)
    if not ask.anchors and len(leaves) == 1:
        return 1  # the common case low in the tree: one leaf, no sort needed
    anchored = _anchor_leaves(ask)
    caps = []
    for leaf in leaves:
        if leaf in anchored:
            target -= leaf_cap[leaf]
        else:
            caps.append(leaf_cap[leaf])
    caps.sort(reverse=True)
    used = 0
    for cap in caps:
        if target <= 0:
            break
        target -= cap
        used += 1
    return used


def _slots(ask: _Ask, domain: str, target: int) -> list[tuple[str, int]]:
    """(node, pods) for `target` pods in `domain`: anchors' leaves first, then `cover` on leaves,
    then `cover` on each chosen leaf's nodes."""
    capacity, preferred = ask.capacity, ask.gang.preferred_nodes
    anchored = _anchor_leaves(ask)
    leaves = leaves_in(ask.topology, capacity, domain)

    def leaf_items(keys: Iterable[str]) -> list[tuple[str, int, bool]]:
        return [(k, capacity.leaf_cap[k], any(n in preferred for n in capacity.leaf_nodes[k])) for k in keys]

    picks = cover(leaf_items(k for k in leaves if k in anchored), target)
    left = target - sum(share for _, share in picks)
    picks += cover(leaf_items(k for k in leaves if k not in anchored), left)
    slots: list[tuple[str, int]] = []
    for leaf, share in picks:
        nodes = capacity.leaf_nodes[leaf]
        slots += cover(((n, capacity.node_cap[n], n in preferred) for n in nodes), share)
    return slots


def _allocate(ask: _Ask, domain: str) -> dict[str, str] | None:
    """Pod -> node inside `domain`, or None when a mixed-shape gang does not really fit there."""
    target = min(ask.capacity.domain_cap.get(domain, 0), len(ask.gang.pods))
    slots = _slots(ask, domain, target)
    if ask.gang.homogeneous:  # which pod takes which slot: `ranks.in_fabric_order` decides
        names = iter(ask.gang.pods)
        return {next(names).name: node for node, share in slots for _ in range(share)}
    pods = sorted(ask.gang.pods, key=lambda p: (p.request, p.name), reverse=True)
    return _pack_mixed(ask, domain, pods, slots)


def _pack_mixed(ask: _Ask, domain: str, pods: list[PodSpec], slots: list[tuple[str, int]]) -> dict[str, str] | None:
    """First fit, largest pod first: on the chosen slots, then on any node of the domain."""
    out = _packed(ask, domain, pods, slots)
    return out if len(out) >= ask.gang.required else None


def _packed(ask: _Ask, domain: str, pods: list[PodSpec], slots: list[tuple[str, int]]) -> dict[str, str]:
    """What `_pack_mixed` places, however few (its reason counts the same pods)."""
    left = {node: ask.free[node] for node, _ in slots}
    room = dict(slots)
    out: dict[str, str] = {}
    rest = [n for leaf in leaves_in(ask.topology, ask.capacity, domain) for n in ask.capacity.leaf_nodes[leaf]]
    for pod in pods:
        node = next((n for n, _ in slots if room[n] > 0 and left[n].covers(pod.request)), None)
        if node is None:
            node = next((n for n in rest if left.setdefault(n, ask.free[n]).covers(pod.request)), None)
        if node is None:
            continue
        room[node] = room.get(node, 0) - 1
        left[node] = left[node] - pod.request
        out[pod.name] = node
    return out


def describe(topology: Topology, assignments: Mapping[str, str], anchors: Iterable[str] = ()) -> Placement:
    """A Placement for given assignments: lowest common HyperNode, its tier, leaves and nodes used."""
    nodes = set(assignments.values()) | set(anchors)
    if not nodes:
        return Placement(dict(assignments))
    lca = topology.lca(nodes)
    domain = lca if lca is not None else ROOT
    tier = topology.domains[lca].tier if lca is not None else topology.top_tier + 1
    leaves = len({leaf_key(topology, n) for n in nodes})
    return Placement(dict(assignments), tier=tier, domain=domain, leaves=leaves, nodes=len(nodes))


def lowest_feasible_tier(topology: Topology, free: Mapping[str, Resources], gang: Gang, *,
                         excluded_nodes: frozenset[str] = frozenset(),
                         excluded_domains: frozenset[str] = frozenset()) -> int | None:
    """The lowest tier with a domain big enough for the gang by aggregate count, ignoring limits
    (exact for single-shape gangs); None when nothing holds it."""
    if isinstance(free, FreeIndex) and free.topology is topology:
        answered, tier = indexed.lowest_tier(topology, free, gang, tier_order(topology, None, Mode.SOFT),
                                             excluded_nodes=excluded_nodes, excluded_domains=excluded_domains)
        if answered:
            return tier
    capacity = measure(topology, free, gang, excluded_nodes=excluded_nodes, excluded_domains=excluded_domains)
    ask = _Ask(topology, free, gang, capacity, frozenset(gang.running.values()), _allowed(topology, gang))
    for tier in tier_order(topology, None, Mode.SOFT):
        if next(ranked(ask, tier), None) is not None:
            return tier
    return None


def tier_words(topology: Topology, limit: int | None) -> str:
    """A tier limit in words: its tier name, or what a limit below or above every tier means."""
    if limit is None:
        return "the cluster"
    lowest = min(topology.tiers, default=1)
    if limit < lowest:
        return f"tier <= {limit} (below every HyperNode tier, the lowest is {lowest}: no domain qualifies)"
    if limit > topology.top_tier:
        return f"tier <= {limit} (above the top tier {topology.top_tier}: the whole cluster)"
    name = topology.tier_names.get(limit)
    return f"tier <= {limit} ({name})" if name else f"tier <= {limit}"


def _shape(request: Resources) -> str:
    return f"{request.gpus}-GPU" if request.gpus else f"{request.cpu_milli}m-CPU"


def _explain(ask: _Ask, limit: int | None) -> Unplaceable:
    """Why nothing fits, in numbers that add up: what the gang needs, what the roomiest domain within
    the limit holds, the difference; per pod shape for a mixed-shape gang."""
    topology, capacity, gang = ask.topology, ask.capacity, ask.gang
    top = topology.top_tier + 1
    ceiling = top if limit is None else limit
    options = [(capacity.domain_cap.get(d, 0), t, d) for t in topology.tiers if t <= ceiling
               for d in _domains_of_tier(ask, t) if ask.allowed is None or d in ask.allowed]
    if ceiling >= top:
        options.append((capacity.domain_cap.get(ROOT, 0), top, ROOT))
    fits, _, best = min(options, default=(0, 0, None), key=lambda o: (-o[0], o[1], o[2] or ""))
    need = gang.required
    where = tier_words(topology, limit)
    if best is None:
        message = f"gang {gang.name}: no HyperNode within {where} can hold it"
        if ask.allowed is not None:
            message += " together with its running pods"
        smallest = sorted(p.request.gpus for p in gang.pods)[:need]
        return Unplaceable(message, need, limit_tier=limit, short_pods=need, short_gpus=sum(smallest))
    if gang.homogeneous:
        gpus = gang.pods[0].request.gpus
        short_gpus = (need - fits) * gpus
        head = (f"gang {gang.name}: needs {need} pods ({gpus} GPUs each) in one domain within {where}; "
                f"the largest, {best}, holds {fits}: {need - fits} pods ({short_gpus} GPUs) short")
    else:
        fits, short_gpus, head = _explain_mixed(ask, best, need, where)
    limiting = _limiting(ask, best)
    message = head + (f"; most nodes there are short of {limiting}" if limiting else "")
    return Unplaceable(message, need, limit_tier=limit, best_domain=best, best_fits=fits,
                       short_pods=need - fits, short_gpus=short_gpus, limiting=limiting)


def _explain_mixed(ask: _Ask, domain: str, need: int, where: str) -> tuple[int, int, str]:
    """(pods the domain holds, GPUs of the pods it leaves out, the words) for a mixed-shape gang: the
    pods the allocation packs there (largest first, fewer than needed or the gang would have been
    placed), and per shape the pods needed and the room for that shape alone."""
    gang = ask.gang
    nodes = [n for leaf in leaves_in(ask.topology, ask.capacity, domain) for n in ask.capacity.leaf_nodes[leaf]]
    pods = sorted(gang.pods, key=lambda p: (p.request, p.name), reverse=True)
    target = min(ask.capacity.domain_cap.get(domain, 0), len(pods))
    packed = _packed(ask, domain, pods, _slots(ask, domain, target))  # what the allocation there placed
    fits = len(packed)
    short_gpus = sum(sorted(p.request.gpus for p in pods if p.name not in packed)[:need - fits])
    counts = Counter(p.request for p in gang.pods)
    shapes = []
    for request, wanted in sorted(counts.items(), reverse=True):
        room = sum(count_fits(ask.free[n], request) for n in nodes)
        shapes.append(f"{wanted} {_shape(request)} pod(s), room for {room} alone"
                      + (f" ({wanted - room} short)" if room < wanted else ""))
    of = f"{need} of its {len(gang.pods)} pods" if need < len(gang.pods) else f"{need} pods"
    head = (f"gang {gang.name}: needs {of} in one domain within {where}; the roomiest, {domain}, holds "
            f"{fits} of them (largest first): {need - fits} pods ({short_gpus} GPUs) short; "
            f"per shape: {'; '.join(shapes)}")
    return fits, short_gpus, head


def _limiting(ask: _Ask, domain: str) -> str:
    nodes = ask.free.keys() if domain == ROOT else ask.topology.nodes_of(domain)
    request = max(p.request for p in ask.gang.pods)
    counts = Counter(ask.free[n].limiting(request) for n in nodes
                     if n in ask.free and ask.capacity.node_cap.get(n, 0) < len(ask.gang.pods))
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if counts else ""
