"""What placement is asked (a gang) and what it answers (a placement, or why none fits).

Kept apart from the algorithm so the live scheduler, the simulator and the baseline policies
share one vocabulary. Topology limits follow Volcano's annotations
(`volcano.sh/network-topology-mode`, `volcano.sh/network-topology-highest-tier`) plus
hypertopo's `hypertopo.io/highest-tier-name`, which names a tier instead of numbering it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from aggregator.placement.core.ranks import RankKey
from aggregator.placement.core.resources import Resources

MODE_ANNOTATION = "volcano.sh/network-topology-mode"
HIGHEST_TIER_ANNOTATION = "volcano.sh/network-topology-highest-tier"
HIGHEST_TIER_NAME_ANNOTATION = "hypertopo.io/highest-tier-name"
ROOT = "(cluster)"  # the virtual domain above every HyperNode forest root


class Mode(enum.StrEnum):
    HARD = "hard"  # never place above the highest tier
    SOFT = "soft"  # prefer the limit, climb above it when nothing fits below


@dataclass(frozen=True)
class PodSpec:
    name: str
    request: Resources
    rank: RankKey | None = None  # `ranks.pod_rank_key` of the pod; None = from the name alone


@dataclass(frozen=True)
class Gang:
    """Pods to place now, all or (at least `min_member` of them) nothing.

    `running` holds the gang's pods that already run (pod -> node): a re-placement after
    `restart-pods` must stay in a domain that contains them, as close to them as possible.
    `preferred_nodes` only break ties."""

    name: str
    pods: tuple[PodSpec, ...]
    min_member: int | None = None  # how many of `pods` must be placed; None = all
    mode: Mode = Mode.HARD
    highest_tier: int | None = None
    highest_tier_name: str | None = None
    running: Mapping[str, str] = field(default_factory=dict)
    preferred_nodes: frozenset[str] = frozenset()

    @property
    def required(self) -> int:
        return len(self.pods) if self.min_member is None else max(0, min(self.min_member, len(self.pods)))

    @property
    def homogeneous(self) -> bool:
        return len({p.request for p in self.pods}) <= 1


@dataclass(frozen=True)
class Unplaceable:
    """Why a gang does not fit: a message for the FailedScheduling event and the figures behind it."""

    message: str
    needed_pods: int
    limit_tier: int | None = None
    best_domain: str | None = None
    best_fits: int = 0  # pods of the gang that fit in the best domain under the limit
    short_pods: int = 0
    short_gpus: int = 0
    limiting: str = ""  # the resource that bounds most nodes there


@dataclass(frozen=True)
class Placement:
    assignments: Mapping[str, str]  # pod -> node
    tier: int | None = None  # tier of the lowest common HyperNode of the gang (running pods included)
    domain: str | None = None  # that HyperNode, or ROOT when the gang spans forest roots
    leaves: int = 0  # distinct immediate HyperNodes used
    nodes: int = 0
    failure: Unplaceable | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


def limits_from_annotations(annotations: Mapping[str, str]) -> tuple[Mode, int | None, str | None]:
    """PodGroup/Job annotations -> (mode, highest tier, highest tier name); bad values are ignored.

    Volcano's default mode is hard."""
    mode = Mode.SOFT if annotations.get(MODE_ANNOTATION, "").lower() == "soft" else Mode.HARD
    raw = annotations.get(HIGHEST_TIER_ANNOTATION, "").strip()
    tier = int(raw) if raw.isdigit() and int(raw) > 0 else None
    name = annotations.get(HIGHEST_TIER_NAME_ANNOTATION) or None
    return mode, tier, name
