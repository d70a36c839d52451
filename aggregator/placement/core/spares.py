"""Warm spares: whole nodes reserved for one gang inside its own lowest domain, so that a node
failure is repaired without the gang's tier rising.

Why: a `restart-pods` replacement lands "where there is room", and on a busy cluster the gang's
leaf has none, so the replacement goes one tier up and the job runs slower for the rest of its
life. A gang that asks `hypertopo.io/spare-nodes: N` (or `P%` of its members, rounded up) on its
PodGroup or Volcano Job is placed only in a domain that holds the gang *and* N more nodes, each
able to take the gang's largest pod; those nodes are reserved for it:

- other gangs' placement does not use them (they are excluded nodes for it);
- preemptible work may use them: pods labelled `hypertopo.io/preemptible: "true"` or with a
  priority below 0. When a spare is needed, those pods are evicted first (`reclaim`);
- a re-placement of the gang (pods recreated after a fault) goes to its free spares before
  anything else, so its lowest domain, and tier, stays the same while a spare is free; when
  more pods are lost than spares are free, the spares take what they can and only the rest is
  placed next to the gang (`replace`);
- the reservation is written on the PodGroup as `hypertopo.io/spares` (a JSON list of nodes), so
  a restarted scheduler derives the same reservations from the PodGroups it lists, and it ends
  with the PodGroup (deleted, or Completed/Failed).

Pure: plain objects in, nodes out; the scheduler writes the annotation and evicts.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aggregator.placement.core import place as core
from aggregator.placement.core import ranks
from aggregator.placement.core.gang import ROOT, Gang, Mode, Placement, PodSpec, Unplaceable
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology

SPARE_REQUEST = "hypertopo.io/spare-nodes"  # on the PodGroup or Volcano Job: "N" or "P%"
RESERVED = "hypertopo.io/spares"  # written on the PodGroup: JSON list of the reserved nodes
PREEMPTIBLE_LABEL = "hypertopo.io/preemptible"  # "true": may run on another gang's spare
MAX_SPARES = 64  # a bound on what one gang may reserve (and on the annotation read back)
MAX_NAME = 253  # a node name's length limit in Kubernetes
ENDED_PHASES = ("Completed", "Failed", "Finished")
_SPARE_POD = "\x00spare-"  # names of the placeholder pods that stand for spares while placing

Reservations = Mapping[tuple[str, str], tuple[str, ...]]  # gang -> its reserved nodes
Placer = Callable[..., Placement]


class SpareRequestError(ValueError):
    """A `hypertopo.io/spare-nodes` value that is not a count or a percentage in bounds."""


def parse_request(raw: str | None, members: int) -> int:
    """How many spares a gang of `members` asks for: "N" (0..MAX_SPARES) or "P%" (0..100, of
    its members, rounded up so that 10 % of 4 is one spare, not none). "" / None: no spares."""
    text = (raw or "").strip()
    if not text:
        return 0
    if len(text) > 8:
        raise SpareRequestError(f"{SPARE_REQUEST}: {text[:16]!r}... is longer than 8 characters")
    if text.endswith("%"):
        if not text[:-1].isdigit() or int(text[:-1]) > 100:
            raise SpareRequestError(f"{SPARE_REQUEST}: {text!r} is not a percentage from 0% to 100%")
        count = math.ceil(int(text[:-1]) * max(members, 0) / 100)
    elif text.isdigit():
        count = int(text)
    else:
        raise SpareRequestError(f"{SPARE_REQUEST}: {text!r} is neither a node count nor a percentage like 10%")
    if count > MAX_SPARES:
        raise SpareRequestError(f"{SPARE_REQUEST}: {text!r} asks {count} spare nodes, at most {MAX_SPARES}")
    return count


def parse_reserved(raw: str | None) -> tuple[str, ...]:
    """The nodes of a `hypertopo.io/spares` annotation; a value that is not a bounded JSON list
    of node names reserves nothing (a hand-edited annotation must not block the cluster)."""
    if not raw or len(raw) > MAX_SPARES * (MAX_NAME + 3) + 2:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        return ()
    if not isinstance(value, list) or len(value) > MAX_SPARES:
        return ()
    return tuple(v for v in value if isinstance(v, str) and 0 < len(v) <= MAX_NAME)


def annotation(nodes: Iterable[str]) -> str:
    """The `hypertopo.io/spares` value for these nodes (sorted: the same set, the same text)."""
    return json.dumps(sorted(set(nodes)), separators=(",", ":"))


def is_preemptible(pod: Mapping[str, Any]) -> bool:
    """Work that may borrow another gang's spare and is evicted first when the spare is needed:
    the label `hypertopo.io/preemptible: "true"`, or a pod priority below 0."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    priority = (pod.get("spec") or {}).get("priority")
    return str(labels.get(PREEMPTIBLE_LABEL, "")).lower() == "true" or (isinstance(priority, int) and priority < 0)


def ended(podgroup: Mapping[str, Any] | None) -> bool:
    """A gang whose PodGroup is gone or finished holds no spares any more."""
    return podgroup is None or (podgroup.get("status") or {}).get("phase") in ENDED_PHASES


def reservations(podgroups: Mapping[tuple[str, str], Mapping[str, Any]],
                 fresh: Reservations) -> dict[tuple[str, str], tuple[str, ...]]:
    """Every live gang's reserved nodes: what the PodGroups say (so a restart keeps them), with
    `fresh` (decided here, annotation not seen back yet) taking precedence. A gang whose PodGroup
    is gone or has ended holds nothing, whatever was decided for it."""
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for key, group in podgroups.items():
        if ended(group):
            continue
        nodes = fresh.get(key)
        if nodes is None:
            nodes = parse_reserved(((group.get("metadata") or {}).get("annotations") or {}).get(RESERVED))
        if nodes:
            out[key] = nodes
    return out


def others(reserved: Reservations, gang: tuple[str, str]) -> frozenset[str]:
    """Nodes reserved as spares by gangs other than `gang`: off limits to its placement."""
    return frozenset(n for key, nodes in reserved.items() if key != gang for n in nodes)


def _largest(pods: Iterable[PodSpec]) -> Resources:
    """A request covering each of the pods (amount by amount): what one spare must hold."""
    out = Resources()
    for pod in pods:
        r = pod.request
        out = Resources(max(out.gpus, r.gpus), max(out.cpu_milli, r.cpu_milli), max(out.memory, r.memory),
                        max(out.pods, r.pods))
    return out


def inflate(gang: Gang, count: int) -> Gang:
    """The gang plus `count` placeholder pods of its largest request: what must fit in one domain
    for the gang to be placed with its spares (`place`; the simulator's cheap fit check)."""
    spare = _largest(gang.pods)
    extra = tuple(PodSpec(f"{_SPARE_POD}{i:02d}", spare) for i in range(count))
    need = None if gang.min_member is None else gang.required + count
    return Gang(gang.name, gang.pods + extra, need, gang.mode, gang.highest_tier, gang.highest_tier_name,
                gang.running, gang.preferred_nodes)


def place(topology: Topology, free: Mapping[str, Resources], gang: Gang, count: int, *,
          excluded_nodes: frozenset[str] = frozenset(), excluded_domains: frozenset[str] = frozenset(),
          placer: Placer = core.place) -> tuple[Placement, tuple[str, ...]]:
    """The gang's placement and its `count` spares, in the lowest domain holding both.

    The core is asked for the gang plus `count` placeholder pods of the gang's largest request,
    so its own objective (lowest tier, fewest leaves, best fit) picks the domain; the placeholders'
    nodes become the spares, topped up from the domain's other free nodes where a placeholder
    shared a node with a member (several pods per node)."""
    spare = _largest(gang.pods)
    found = placer(topology, free, inflate(gang, count), excluded_nodes=excluded_nodes, excluded_domains=excluded_domains)
    real = {p: n for p, n in found.assignments.items() if not p.startswith(_SPARE_POD)}
    if not found.ok or len(real) < gang.required:
        return _short(gang, count, found.failure.message if found.failure else "no node fits"), ()
    chosen = _swap_out(topology, free, found.assignments, real, gang, count, spare, excluded_nodes)
    taken = set(real.values()) | set(gang.running.values())
    pool = topology.nodes_of(found.domain) if found.domain and found.domain != ROOT else sorted(topology.node_leaf)
    for node in pool:
        if len(chosen) < count and node not in taken and node not in chosen and node not in excluded_nodes \
                and node in free and free[node].covers(spare):
            chosen.append(node)
    if len(chosen) < count:
        return _short(gang, count, f"its domain {found.domain} has {len(chosen)} whole free node(s) besides it"), ()
    ordered = ranks.in_fabric_order(topology, real, gang.pods)
    # the gang's domain is the one holding its members and its spares: what its tier is judged by
    return core.describe(topology, ordered, [*gang.running.values(), *chosen]), tuple(sorted(chosen))


def beside(topology: Topology, free: Mapping[str, Resources], placement: Placement, gang: Gang, count: int, *,
           excluded_nodes: frozenset[str] = frozenset(),
           excluded_domains: frozenset[str] = frozenset()) -> tuple[Placement, tuple[str, ...]]:
    """`count` spares for a gang placed by another path (sub-groups, `nested`), whose objective
    cannot be asked to hold placeholders: whole-enough free nodes in the placement's own domain,
    else in the nearest domain above it that has them (never above a hard tier limit), nodes in
    the leaves the gang uses first. The placement comes back described with its spares (the
    domain they share), or as a failure when no allowed domain holds them."""
    spare = _largest(gang.pods)
    used = {*placement.assignments.values(), *gang.running.values()}
    leaves = {topology.node_leaf.get(n) for n in used}
    limit, _ = core.resolve_limit(topology, gang)
    position = topology.fabric_position
    start = placement.domain or ROOT
    for domain in (*topology.chains.get(start, ()), ROOT):
        tier = topology.domains[domain].tier if domain in topology.domains else topology.top_tier + 1
        if gang.mode is Mode.HARD and limit is not None and tier > limit:
            break
        if domain in excluded_domains:
            continue
        pool = topology.nodes_of(domain) if domain != ROOT else list(topology.node_leaf)
        fit = [n for n in pool if n not in used and n not in excluded_nodes and n in free and free[n].covers(spare)
               and not any(d in excluded_domains for d in topology.chains.get(topology.node_leaf.get(n, ""), ()))]
        if len(fit) >= count:
            fit.sort(key=lambda n: (topology.node_leaf.get(n) not in leaves, position.get(n, -1), n))
            chosen = tuple(sorted(fit[:count]))
            return core.describe(topology, placement.assignments, [*gang.running.values(), *chosen]), chosen
    return _short(gang, count, f"no domain from {start} up holds {count} more whole free node(s)"), ()


def _swap_out(topology: Topology, free: Mapping[str, Resources], assignments: Mapping[str, str],
              real: dict[str, str], gang: Gang, count: int, spare: Resources,
              excluded_nodes: frozenset[str]) -> list[str]:
    """Which of the placement's one-pod nodes become the spares; `real` is updated in place.

    The core placed placeholders like any pod, so they may sit in the middle of the gang; the
    spares are taken instead from the leaves with the most of the placement's pods, last in fabric
    order, so that the members keep the whole domain the core chose and the spares lie inside the
    gang's own lowest domain (a spare outside it would raise the gang's tier when used). A member
    on a chosen node moves to a placeholder's slot, which holds it (a placeholder asks the gang's
    largest request)."""
    slots = Counter(assignments.values())
    running = set(gang.running.values())
    per_leaf = Counter(topology.node_leaf.get(n, n) for n in assignments.values())
    candidates = [n for n, k in slots.items() if k == 1 and n not in running and n not in excluded_nodes
                  and n in free and free[n].covers(spare)]
    candidates.sort(key=lambda n: (-per_leaf[topology.node_leaf.get(n, n)], -topology.fabric_position.get(n, -1), n))
    chosen = candidates[:count]
    vacated = [n for p, n in sorted(assignments.items()) if p.startswith(_SPARE_POD) and n not in chosen]
    for pod, node in sorted(real.items()):
        if node in chosen and vacated:
            real[pod] = vacated.pop()
    return [n for n in chosen if n not in set(real.values())]


def _short(gang: Gang, count: int, why: str) -> Placement:
    message = f"gang {gang.name}: no domain holds it and its {count} spare node(s) ({SPARE_REQUEST}): {why}"
    return Placement({}, failure=Unplaceable(message, gang.required + count))


def to_spares(topology: Topology, free: Mapping[str, Resources], gang: Gang, spares: Iterable[str], *,
              excluded_nodes: frozenset[str] = frozenset(),
              reclaimable: Mapping[str, Resources] | None = None) -> tuple[dict[str, str], tuple[str, ...]]:
    """The gang's pending pods that its own spares take now, one pod per spare, in the pods' order
    and the spares' fabric order: (pod -> spare, spares whose preemptible pods must leave first).

    Partial on purpose: with two pods lost and one spare free, one pod goes to the spare and the
    other is placed next to the gang (`replace`), instead of both being placed as if the gang had
    no spare. A pod that fits a spare only once its borrowers (`reclaimable`) are gone names that
    spare in the second element."""
    usable = sorted((n for n in spares if n not in excluded_nodes and n in free),
                    key=lambda n: topology.fabric_position.get(n, -1))
    borrowed = reclaimable or {}
    out: dict[str, str] = {}
    reclaim: list[str] = []
    for pod in gang.pods:
        node = next((n for n in usable if free[n].covers(pod.request)), None)
        if node is None:
            node = next((n for n in usable if (free[n] + borrowed.get(n, Resources())).covers(pod.request)), None)
            if node is None:
                continue
            reclaim.append(node)
        usable.remove(node)
        out[pod.name] = node
    return ({} if reclaim else out), tuple(reclaim)


def replace(topology: Topology, spare_free: Mapping[str, Resources], free: Mapping[str, Resources], gang: Gang,
            spares: Iterable[str], *, excluded_nodes: frozenset[str] = frozenset(),
            excluded_domains: frozenset[str] = frozenset(), reclaimable: Mapping[str, Resources] | None = None,
            placer: Placer = core.place) -> tuple[Placement | None, tuple[str, ...]]:
    """A re-placement of the gang's pending pods: its own free spares first (`to_spares`), the
    pods left over placed by `placer` next to the running members and the pods on spares (they
    are the gang's anchors then), so the gang's domain rises only by what the spares could not
    take. `spare_free`: free resources of the spares; `free`: of every other node.

    Returns (placement, spares to reclaim first). None with no reclaim: no spare took a pod (the
    caller places as usual); None with reclaim: the pods wait for the borrowers to leave. When
    the left-over pods fit nowhere, the placement is the placer's failure."""
    own = tuple(spares)
    on_spares, reclaim = to_spares(topology, spare_free, gang, own, excluded_nodes=excluded_nodes,
                                   reclaimable=reclaimable)
    if reclaim or not on_spares:
        return None, reclaim
    anchors = {**gang.running, **on_spares}
    rest = tuple(p for p in gang.pods if p.name not in on_spares)
    if not rest:
        return core.describe(topology, ranks.in_fabric_order(topology, on_spares, gang.pods), gang.running.values()), ()
    need = None if gang.min_member is None else max(0, gang.min_member - len(on_spares))
    found = placer(topology, free, Gang(gang.name, rest, need, gang.mode, gang.highest_tier, gang.highest_tier_name,
                                        anchors, gang.preferred_nodes),
                   excluded_nodes=excluded_nodes | set(own), excluded_domains=excluded_domains)
    if not found.ok:
        return found, ()
    chosen = {**on_spares, **found.assignments}
    return core.describe(topology, ranks.in_fabric_order(topology, chosen, gang.pods), gang.running.values()), ()


def remaining(spares: Iterable[str], used: Iterable[str], failed: Iterable[str] = ()) -> tuple[str, ...]:
    """The spares still free for the gang: a spare that took a member, or that failed, is no spare."""
    gone = set(used) | set(failed)
    return tuple(n for n in spares if n not in gone)
