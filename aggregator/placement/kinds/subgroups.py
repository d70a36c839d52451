"""Sub-groups of a gang, read as vc-scheduler v1.14 reads Volcano's `spec.subGroupPolicy`, and the
same for scheduler-plugins PodGroups through annotations.

Why: a job is often made of parts that talk much more inside than between each other (a
tensor-parallel group of 8 pods inside a pipeline of 64). Each part must sit inside its own
network domain (its own networkTopology), the whole gang inside the PodGroup's.

Volcano's reading (`pkg/scheduler/api/job_info.go` `getOrCreateSubJob`, `sub_job_info.go`), kept here:
* a pod joins the first policy whose `labelSelector` selects it (none: every pod) AND that has
  `matchLabelKeys` AND whose keys all carry a non-empty value on the pod;
* all pods of one policy with the same values (joined with "-", Volcano's sub-job id) form ONE
  sub-group, whatever their number; `subGroupSize` (default 1) is its minimum: a sub-group is
  placed with at least that many of its pods or not at all, and all of its pods share one domain
  within its networkTopology (hard mode with `highestTierAllowed`);
* every other pod, including every pod of a policy without `matchLabelKeys`, is in the default
  sub-group: no minimum of its own, only the gang's limit;
* `minSubGroups` (default 0: no count asked) is how many sub-groups of that policy must reach their
  minimum for the gang to start; a policy with fewer sub-groups than that keeps the gang waiting.
The gang's own `minMember` still counts pods over all sub-groups.

Annotations for scheduler-plugins PodGroups (one policy over every pod of the gang):
  hypertopo.io/subgroup-size: "8"                        (the sub-group minimum, default 1)
  hypertopo.io/subgroup-label-keys: "rank-group"         (comma-separated, required)
  hypertopo.io/subgroup-mode: hard | soft                (default hard)
  hypertopo.io/subgroup-highest-tier: "1"
  hypertopo.io/subgroup-highest-tier-name: leaf
  hypertopo.io/min-subgroups: "2"                        (default 0: no count)
Without label keys a policy forms no sub-group at all (Volcano's rule), so the annotations refuse
that instead of silently doing nothing. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggregator.placement.core.gang import Mode
from aggregator.placement.kinds.volcano import Topology, network_topology

SIZE_ANNOTATION = "hypertopo.io/subgroup-size"
KEYS_ANNOTATION = "hypertopo.io/subgroup-label-keys"
MODE_ANNOTATION = "hypertopo.io/subgroup-mode"
TIER_ANNOTATION = "hypertopo.io/subgroup-highest-tier"
TIER_NAME_ANNOTATION = "hypertopo.io/subgroup-highest-tier-name"
MIN_ANNOTATION = "hypertopo.io/min-subgroups"
MAX_POLICIES = 64  # a bound on what one PodGroup may ask (Volcano sets none; 64 is far past any job)
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SubGroupError(ValueError):
    """A sub-group policy that cannot be applied to the gang as it is (said in the message)."""


@dataclass(frozen=True)
class Policy:
    name: str
    size: int  # subGroupSize: a sub-group's minimum member count
    min_subgroups: int = 0  # sub-groups that must reach their minimum (0: no count)
    match_labels: Mapping[str, str] | None = None  # labelSelector.matchLabels (None: every pod)
    match_expressions: tuple[Mapping[str, Any], ...] = ()
    match_label_keys: tuple[str, ...] = ()
    topology: Topology | None = None


@dataclass(frozen=True)
class SubGroup:
    name: str  # policy-values, as Volcano names the sub-job (without the job's uid)
    policy: Policy
    pods: tuple[Mapping[str, Any], ...]

    @property
    def minimum(self) -> int:
        return self.policy.size


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def _count(raw: Any, what: str, default: int) -> int:
    if raw is None or raw == "":
        return default
    if isinstance(raw, bool):
        raise SubGroupError(f"{what} must be a whole number, got {raw!r}")
    try:
        value = int(raw)
    except (TypeError, ValueError) as exc:
        raise SubGroupError(f"{what} must be a whole number, got {raw!r}") from exc
    if value < 0:
        raise SubGroupError(f"{what} must not be negative, got {value}")
    return value


def _selector(item: Mapping[str, Any], name: str) -> tuple[Mapping[str, str] | None, tuple[Mapping[str, Any], ...]]:
    selector = item.get("labelSelector")
    if selector is None:
        return None, ()
    if not isinstance(selector, Mapping):
        raise SubGroupError(f"subGroupPolicy {name!r} labelSelector must be an object")
    expressions = tuple(selector.get("matchExpressions") or ())
    for expr in expressions:
        if not isinstance(expr, Mapping) or expr.get("operator") not in OPERATORS:
            op = expr.get("operator") if isinstance(expr, Mapping) else expr
            raise SubGroupError(f"subGroupPolicy {name!r} labelSelector operator {op!r} is not one of "
                                f"{', '.join(OPERATORS)}")
    return dict(selector.get("matchLabels") or {}), expressions


def from_volcano(podgroup: Mapping[str, Any] | None) -> tuple[Policy, ...]:
    """`spec.subGroupPolicy` of a Volcano PodGroup -> policies (SubGroupError when malformed)."""
    raw = ((podgroup or {}).get("spec") or {}).get("subGroupPolicy") or []
    if not isinstance(raw, list):
        raise SubGroupError("spec.subGroupPolicy must be a list")
    if len(raw) > MAX_POLICIES:
        raise SubGroupError(f"spec.subGroupPolicy has {len(raw)} policies, at most {MAX_POLICIES} are read")
    policies = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise SubGroupError(f"spec.subGroupPolicy[{index}] must be an object")
        name = str(item.get("name") or "")
        what = f"subGroupPolicy {name or index!r}"
        size = _count(item.get("subGroupSize"), f"{what} subGroupSize", 1)
        if size < 1:
            raise SubGroupError(f"{what} subGroupSize must be at least 1")
        match_labels, expressions = _selector(item, name)
        policies.append(Policy(
            name=name,
            size=size,
            min_subgroups=_count(item.get("minSubGroups"), f"{what} minSubGroups", 0),
            match_labels=match_labels,
            match_expressions=expressions,
            match_label_keys=tuple(str(k) for k in item.get("matchLabelKeys") or ()),
            topology=network_topology(item.get("networkTopology")),
        ))
    return tuple(policies)


def from_annotations(annotations: Mapping[str, str]) -> tuple[Policy, ...]:
    """The one policy a scheduler-plugins PodGroup may declare through annotations."""
    if SIZE_ANNOTATION not in annotations and KEYS_ANNOTATION not in annotations:
        return ()
    size = _count(annotations.get(SIZE_ANNOTATION), SIZE_ANNOTATION, 1)
    if size < 1:
        raise SubGroupError(f"{SIZE_ANNOTATION} must be at least 1")
    keys = tuple(k.strip() for k in annotations.get(KEYS_ANNOTATION, "").split(",") if k.strip())
    if not keys:
        raise SubGroupError(f"{KEYS_ANNOTATION} is required: pods form sub-groups by the values of these labels")
    tier = _count(annotations.get(TIER_ANNOTATION), TIER_ANNOTATION, 0) or None  # "0" or empty: no tier limit
    mode = Mode.SOFT if annotations.get(MODE_ANNOTATION, "").lower() == "soft" else Mode.HARD
    topology = Topology(mode, tier, annotations.get(TIER_NAME_ANNOTATION) or None)
    has_limit = tier is not None or TIER_NAME_ANNOTATION in annotations
    return (Policy(name="subgroup", size=size, min_subgroups=_count(annotations.get(MIN_ANNOTATION), MIN_ANNOTATION, 0),
                   match_label_keys=keys, topology=topology if has_limit else None),)


def _expression_matches(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    key, op, values = str(expr.get("key", "")), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    return key not in labels  # DoesNotExist (from_volcano admits no other operator)


def selects(policy: Policy, pod: Mapping[str, Any]) -> bool:
    labels = _labels(pod)
    if any(labels.get(k) != v for k, v in (policy.match_labels or {}).items()):
        return False
    return all(_expression_matches(labels, e) for e in policy.match_expressions)


def match_values(policy: Policy, pod: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The pod's values of the policy's keys, or None when the policy does not take the pod
    (not selected, no keys, a key missing or empty): Volcano's `getSubJobMatchValues`."""
    if not policy.match_label_keys or not selects(policy, pod):
        return None
    labels = _labels(pod)
    values = tuple(labels.get(k, "") for k in policy.match_label_keys)
    return None if any(v == "" for v in values) else values


def partition(policies: Sequence[Policy], pods: Sequence[Mapping[str, Any]]) -> tuple[list[SubGroup], list[Mapping[str, Any]]]:
    """(sub-groups, pods of the default sub-group): each pod in the sub-group of the first policy
    that takes it. Sub-groups are named `policy-values` as Volcano names sub-jobs, so values that
    join alike ("a-b","c" and "a","b-c") share one, as they do in Volcano."""
    found: dict[str, tuple[Policy, list[Mapping[str, Any]]]] = {}
    default: list[Mapping[str, Any]] = []
    for pod in sorted(pods, key=_name):
        for policy in policies:
            values = match_values(policy, pod)
            if values is not None:
                name = f"{policy.name}-{'-'.join(values)}"
                found.setdefault(name, (policy, []))[1].append(pod)
                break
        else:
            default.append(pod)
    groups = [SubGroup(name, policy, tuple(members)) for name, (policy, members) in sorted(found.items())]
    return groups, default


def too_few_subgroups(policies: Sequence[Policy], groups: Sequence[SubGroup]) -> str:
    """Why the gang cannot start whatever the capacity ("" when it may): a policy with fewer
    sub-groups than its minSubGroups, as Volcano's gang plugin refuses such a job."""
    for policy in policies:
        have = sum(1 for g in groups if g.policy.name == policy.name)
        if have < policy.min_subgroups:
            return (f"subGroupPolicy {policy.name!r} has {have} sub-group(s) among the gang's pods, "
                    f"minSubGroups is {policy.min_subgroups}")
    return ""


def required_by_policy(groups: Sequence[SubGroup]) -> dict[str, int]:
    """Policy name -> how many of its sub-groups must reach their minimum (minSubGroups > 0 only)."""
    return {g.policy.name: g.policy.min_subgroups for g in groups if g.policy.min_subgroups > 0}
