"""A gang read once: whatever PodGroup kind it comes from (Volcano, scheduler-plugins, Kubernetes'
own `scheduling.k8s.io`), with its annotations, its sub-groups, its pods' ranks and requests and
the spares it asks, into one frozen `GangSpec`. `decide` places that spec and never goes back to
the PodGroup, the annotations or the pods' labels while it decides.

Why one step: the reading rules are per kind (`volcano`, `upstream`, `subgroups`, `gang`'s
annotations, `spares`' request, `ranks`), the placing rules are not. Read in one place, a bad input
is found before any placement starts, each kind's reading is tested on its own (spec in, spec
out), and following a decision means reading one spec and the placement, not a walk back and
forth through the readers.

What stays for decision time: what depends on the cluster at that moment, which the spec cannot
know when it is read: the node filters (taints, selectors), the anchors left usable, the tree
a Kubernetes PodGroup's topology key must name (`tree_problem`). Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aggregator.placement.core import ranks, spares
from aggregator.placement.core.gang import MODE_ANNOTATION, Gang, Mode, PodSpec, limits_from_annotations
from aggregator.placement.core.resources import Resources, pod_request
from aggregator.placement.core.topology import Topology
from aggregator.placement.kinds import subgroups, upstream, volcano
from aggregator.placement.kinds.podgroups import GangView
from aggregator.placement.live.state import K8S, SINGLE, VOLCANO, PodKey, pod_key

__all__ = ["GangSpec", "Limits", "SubGroupSpec", "read", "spec_name"]

Limits = volcano.Topology  # mode, highest tier, highest tier name: the gang's or a sub-group's


def spec_name(key: PodKey) -> str:
    """A pod's name as the placement core knows it: `namespace/name`."""
    return f"{key[0]}/{key[1]}"


@dataclass(frozen=True)
class SubGroupSpec:
    """One sub-group of the gang (`subgroups.partition`): its pods share one domain within `limits`
    and are placed `minimum` or more at a time."""

    name: str  # policy-values, as Volcano names the sub-job
    policy: str
    minimum: int
    limits: Limits | None  # the policy's networkTopology; None: no limit of its own
    pods: tuple[PodKey, ...]  # by pod name


@dataclass(frozen=True)
class GangSpec:
    """Everything a placement decision needs to know about one gang, read at one moment."""

    key: PodKey
    flavour: str  # state.XK8S, state.VOLCANO, state.K8S or state.SINGLE
    group_name: str  # the PodGroup's metadata.name ("" without one)
    pending: tuple[Mapping[str, Any], ...]  # the pods to place (the node filters read them; binding their uid)
    members: tuple[PodKey, ...]  # live members, by key
    placed: Mapping[PodKey, str]  # member -> node (bound or assumed)
    min_member: int
    pods: tuple[PodSpec, ...]  # `pending` as the core sees them: name, request, rank
    limits: Limits = field(default_factory=Limits)
    topology_key: str = ""  # a Kubernetes PodGroup's topology key, checked against the tree (`tree_problem`)
    policies: tuple[subgroups.Policy, ...] = ()
    subgroups: tuple[SubGroupSpec, ...] = ()
    loose: tuple[PodKey, ...] = ()  # the default sub-group's pods (with policies only)
    too_few_subgroups: str = ""  # a policy's minSubGroups the pods cannot meet ("" when they can)
    required_parts: Mapping[str, int] = field(default_factory=dict)  # policy -> sub-groups needed
    spare_count: int = 0  # spares asked (`spares.parse_request`)
    preemptible: bool = False  # every pending pod may borrow another gang's spare
    min_task_member: Mapping[str, int] = field(default_factory=dict)  # Volcano task -> minimum
    tasks: Mapping[PodKey, str] = field(default_factory=dict)  # member -> Volcano task (with minimums only)
    invalid: str = ""  # why the gang's own description cannot be followed ("" when it can)

    @property
    def is_group(self) -> bool:
        return self.flavour != SINGLE

    @property
    def is_volcano(self) -> bool:
        return self.flavour == VOLCANO

    @property
    def is_upstream(self) -> bool:
        return self.flavour == K8S

    @property
    def names(self) -> dict[str, PodKey]:
        """Pending pods by their core name."""
        return {spec_name(pod_key(p)): pod_key(p) for p in self.pending}

    def gang(self, anchors: Mapping[PodKey, str]) -> Gang:
        """The core's Gang: the pending pods, at least enough to reach minMember with those placed,
        and `anchors` (the placed members still usable) as its running pods."""
        required = max(1, self.min_member - len(self.placed))
        return Gang(name=spec_name(self.key), pods=self.pods, min_member=min(required, len(self.pods)),
                    mode=self.limits.mode, highest_tier=self.limits.highest_tier,
                    highest_tier_name=self.limits.highest_tier_name,
                    running={spec_name(k): n for k, n in anchors.items()})

    def tree_problem(self, topology: Topology) -> str:
        """Why the gang cannot be placed on this tree whatever the capacity ("" when it can): a
        Kubernetes PodGroup's topology key that names no tier."""
        return upstream.unknown_key(self.topology_key, self.group_name, topology) if self.topology_key else ""

    def task_shortfall(self, assigned: Iterable[str]) -> dict[str, tuple[int, int]]:
        """Tasks left below their minTaskMember by these assignments (core names) with the placed
        members: task -> (have, need), as `volcano.task_shortfall` counts them."""
        chosen = set(assigned)
        have = Counter(self.tasks.get(k, "") for k in self.members if spec_name(k) in chosen or k in self.placed)
        return {task: (have[task], need) for task, need in sorted(self.min_task_member.items()) if have[task] < need}


def read(view: GangView, *, default_spares: str = "", jobs: ranks.Jobs | None = None,
         request_of: Callable[[Mapping[str, Any]], Resources] = pod_request) -> GangSpec:
    """The one reading of a gang. `default_spares`: the namespace's `hypertopo.io/spare-nodes`
    when the gang says none; `jobs`: the Volcano Jobs whose task order ranks their pods;
    `request_of`: a pod's request (the live state's cached parse). A sub-group policy or spare
    request that cannot be followed is kept as `invalid` (the decision refuses with it)."""
    members = tuple(pod_key(p) for p in view.members)
    base = GangSpec(
        key=view.key, flavour=view.flavour, group_name=str(((view.podgroup or {}).get("metadata") or {}).get("name", "")),
        pending=view.pending, members=members, placed=dict(view.placed), min_member=view.min_member,
        pods=tuple(PodSpec(spec_name(pod_key(p)), request_of(p), ranks.pod_rank_key(p, jobs)) for p in view.pending),
        limits=_limits(view), topology_key=upstream.topology_key(view.podgroup) if view.is_upstream else "",
        preemptible=all(spares.is_preemptible(p) for p in view.pending),
    )
    tasks = volcano.min_task_member(view.podgroup) if view.is_volcano else {}
    if tasks:
        base = replace(base, min_task_member=tasks, tasks={pod_key(p): volcano.task_of(p) for p in view.members})
    try:
        policies = _policies(view)
        count = spares.parse_request(view.annotations.get(spares.SPARE_REQUEST, default_spares),
                                     max(view.min_member, len(view.members))) if view.is_group else 0
    except (subgroups.SubGroupError, spares.SpareRequestError) as exc:
        what = "sub-group policy" if isinstance(exc, subgroups.SubGroupError) else "spare request"
        return replace(base, invalid=f"invalid {what}: {exc}")
    return replace(base, spare_count=count, **_partition(policies, view.members)) if policies \
        else replace(base, spare_count=count)


def _limits(view: GangView) -> Limits:
    """The gang's topology limits: a Volcano PodGroup's `spec.networkTopology` when it has one, a
    Kubernetes PodGroup's topology key (hard, up to the tier the key names: `upstream.py`), else
    Volcano's annotations (PodGroup, Job or pod). A gang of one without any is soft."""
    from_spec = volcano.network_topology(volcano.spec(view.podgroup).get("networkTopology")) if view.is_volcano else None
    if from_spec is not None:
        return from_spec
    if view.is_upstream and (key := upstream.topology_key(view.podgroup)):
        return Limits(Mode.HARD, None, upstream.tier_name(key) or key)
    mode, tier, tier_name = limits_from_annotations(view.annotations)
    if not view.is_group and not view.annotations.get(MODE_ANNOTATION):
        mode = Mode.SOFT
    return Limits(mode, tier, tier_name)


def _policies(view: GangView) -> tuple[subgroups.Policy, ...]:
    """Volcano's `spec.subGroupPolicy`, or hypertopo's annotations on other gangs (SubGroupError)."""
    if view.is_volcano:
        return subgroups.from_volcano(view.podgroup)
    return subgroups.from_annotations(view.annotations) if view.is_group else ()


def _partition(policies: tuple[subgroups.Policy, ...], members: tuple[Mapping[str, Any], ...]) -> dict[str, Any]:
    """The gang's sub-groups as Volcano forms them (`subgroups.partition`), as spec fields."""
    groups, loose = subgroups.partition(policies, members)
    parts = tuple(SubGroupSpec(g.name, g.policy.name, g.minimum, g.policy.topology, tuple(pod_key(p) for p in g.pods))
                  for g in groups)
    return {"policies": policies, "subgroups": parts, "loose": tuple(pod_key(p) for p in loose),
            "too_few_subgroups": subgroups.too_few_subgroups(policies, groups),
            "required_parts": subgroups.required_by_policy(groups)}
