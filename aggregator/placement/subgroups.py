"""Sub-groups of a gang: Volcano's `spec.subGroupPolicy`, and the same for scheduler-plugins
PodGroups through annotations.

Why: a job is often made of parts that talk much more inside than between each other (a
tensor-parallel group of 8 pods inside a pipeline of 64). Each part must sit inside its own
network domain (its own networkTopology), the whole gang inside the PodGroup's.

Volcano's rule, kept here: a policy selects pods (`labelSelector`, default every pod), groups them
by the values of `matchLabelKeys` (Volcano's job controller uses `volcano.sh/partition-id`), and
each group of `subGroupSize` pods is one sub-group with the policy's networkTopology. When a group
holds more than `subGroupSize` pods, its pods (in name order) are cut into sub-groups of that size;
a size that does not divide the group is a configuration error, reported, never guessed around.
`minSubGroups` sub-groups (0: all of them) must fit for the gang to start.

Annotations for scheduler-plugins PodGroups (one policy over every pod of the gang):
  hypertopo.io/subgroup-size: "8"
  hypertopo.io/subgroup-label-keys: "rank-group"        (comma-separated, optional)
  hypertopo.io/subgroup-mode: hard | soft               (default hard)
  hypertopo.io/subgroup-highest-tier: "1"
  hypertopo.io/subgroup-highest-tier-name: leaf
  hypertopo.io/min-subgroups: "2"                       (default 0: all)
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggregator.placement.gang import Mode
from aggregator.placement.volcano import Topology, network_topology

SIZE_ANNOTATION = "hypertopo.io/subgroup-size"
KEYS_ANNOTATION = "hypertopo.io/subgroup-label-keys"
MODE_ANNOTATION = "hypertopo.io/subgroup-mode"
TIER_ANNOTATION = "hypertopo.io/subgroup-highest-tier"
TIER_NAME_ANNOTATION = "hypertopo.io/subgroup-highest-tier-name"
MIN_ANNOTATION = "hypertopo.io/min-subgroups"


class SubGroupError(ValueError):
    """A sub-group policy that cannot be applied to the gang as it is (said in the message)."""


@dataclass(frozen=True)
class Policy:
    name: str
    size: int
    min_subgroups: int = 0
    match_labels: Mapping[str, str] | None = None  # labelSelector.matchLabels (None: every pod)
    match_expressions: tuple[Mapping[str, Any], ...] = ()
    match_label_keys: tuple[str, ...] = ()
    topology: Topology | None = None


@dataclass(frozen=True)
class SubGroup:
    name: str  # policy[/label values][#n]
    policy: Policy
    pods: tuple[Mapping[str, Any], ...]


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def _positive(raw: Any, what: str, default: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError) as exc:
        raise SubGroupError(f"{what} must be a whole number, got {raw!r}") from exc
    if value < 0:
        raise SubGroupError(f"{what} must not be negative, got {value}")
    return value


def from_volcano(podgroup: Mapping[str, Any] | None) -> tuple[Policy, ...]:
    """`spec.subGroupPolicy` of a Volcano PodGroup -> policies (SubGroupError when malformed)."""
    raw = ((podgroup or {}).get("spec") or {}).get("subGroupPolicy") or []
    if not isinstance(raw, list):
        raise SubGroupError("spec.subGroupPolicy must be a list")
    policies = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise SubGroupError(f"spec.subGroupPolicy[{index}] must be an object")
        name = str(item.get("name") or f"subgroup-{index}")
        size = _positive(item.get("subGroupSize"), f"subGroupPolicy {name!r} subGroupSize", 1)
        if size < 1:
            raise SubGroupError(f"subGroupPolicy {name!r} subGroupSize must be at least 1")
        selector = item.get("labelSelector") or {}
        policies.append(Policy(
            name=name,
            size=size,
            min_subgroups=_positive(item.get("minSubGroups"), f"subGroupPolicy {name!r} minSubGroups", 0),
            match_labels=dict(selector.get("matchLabels") or {}) if selector else None,
            match_expressions=tuple(selector.get("matchExpressions") or ()),
            match_label_keys=tuple(str(k) for k in item.get("matchLabelKeys") or ()),
            topology=network_topology(item.get("networkTopology")),
        ))
    return tuple(policies)


def from_annotations(annotations: Mapping[str, str]) -> tuple[Policy, ...]:
    """The one policy a scheduler-plugins PodGroup may declare through annotations."""
    if SIZE_ANNOTATION not in annotations:
        return ()
    size = _positive(annotations[SIZE_ANNOTATION], SIZE_ANNOTATION, 1)
    if size < 1:
        raise SubGroupError(f"{SIZE_ANNOTATION} must be at least 1")
    keys = tuple(k.strip() for k in annotations.get(KEYS_ANNOTATION, "").split(",") if k.strip())
    tier = _positive(annotations.get(TIER_ANNOTATION), TIER_ANNOTATION, 0) or None
    mode = Mode.SOFT if annotations.get(MODE_ANNOTATION, "").lower() == "soft" else Mode.HARD
    topology = Topology(mode, tier, annotations.get(TIER_NAME_ANNOTATION) or None)
    has_limit = tier is not None or TIER_NAME_ANNOTATION in annotations
    return (Policy(name="subgroup", size=size, min_subgroups=_positive(annotations.get(MIN_ANNOTATION), MIN_ANNOTATION, 0),
                   match_label_keys=keys, topology=topology if has_limit else None),)


def _expression_matches(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    key, op, values = str(expr.get("key", "")), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise SubGroupError(f"labelSelector operator {op!r} is not one of In, NotIn, Exists, DoesNotExist")


def selects(policy: Policy, pod: Mapping[str, Any]) -> bool:
    labels = _labels(pod)
    if policy.match_labels is None and not policy.match_expressions:
        return True
    if any(labels.get(k) != v for k, v in (policy.match_labels or {}).items()):
        return False
    return all(_expression_matches(labels, e) for e in policy.match_expressions)


def partition(policies: Sequence[Policy], pods: Sequence[Mapping[str, Any]]) -> tuple[list[SubGroup], list[Mapping[str, Any]]]:
    """(sub-groups, pods in none): a pod joins the first policy that selects it.

    SubGroupError when a group's pod count is not a multiple of its policy's subGroupSize."""
    claimed: set[str] = set()
    groups: list[SubGroup] = []
    for policy in policies:
        by_values: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
        for pod in sorted(pods, key=_name):
            if _name(pod) in claimed or not selects(policy, pod):
                continue
            claimed.add(_name(pod))
            values = tuple(_labels(pod).get(k, "") for k in policy.match_label_keys)
            by_values.setdefault(values, []).append(pod)
        for values, members in sorted(by_values.items()):
            label = policy.name + ("/" + ",".join(values) if values else "")
            if len(members) % policy.size:
                raise SubGroupError(f"subGroupSize {policy.size} of policy {policy.name!r} does not divide the "
                                    f"{len(members)} pods of sub-group {label!r}")
            chunks = [members[i:i + policy.size] for i in range(0, len(members), policy.size)]
            for n, chunk in enumerate(chunks):
                name = label if len(chunks) == 1 else f"{label}#{n}"
                groups.append(SubGroup(name, policy, tuple(chunk)))
    rest = [p for p in pods if _name(p) not in claimed]
    return groups, rest


def required_subgroups(groups: Sequence[SubGroup]) -> int:
    """How many sub-groups must fit: per policy its minSubGroups (0 = every sub-group it made)."""
    counts: dict[str, int] = {}
    minimums: dict[str, int] = {}
    for group in groups:
        counts[group.policy.name] = counts.get(group.policy.name, 0) + 1
        minimums[group.policy.name] = group.policy.min_subgroups
    return sum(min(minimums[name], n) if minimums[name] else n for name, n in counts.items())
