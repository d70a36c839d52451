"""The simulator's ledger of warm spares (`spares`): which gang holds which spare nodes, the
GPU-hours they stand idle, and whether each recovery kept the gang's tier.

Why apart from `simulate`: the replay loop stays one policy call per decision; this is the
bookkeeping that lets the same trace be replayed with and without spares and compared. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator.placement.core import spares
from aggregator.placement.core.gang import Gang
from aggregator.placement.core.resources import Resources


@dataclass
class SpareBook:
    """`request`: the `hypertopo.io/spare-nodes` value every gang of more than one pod asks
    ("" = none); `capacity`: node -> allocatable, for the GPUs a spare holds idle."""

    request: str
    capacity: Mapping[str, Resources]
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)  # gang -> its spares
    holder: dict[str, str] = field(default_factory=dict)  # spare node -> its gang
    idle_gpus: int = 0
    idle_gpu_seconds: float = 0.0
    recoveries: int = 0
    kept_tier: int = 0
    on_spares: int = 0  # recoveries whose replacements all went to spares
    partly_on_spares: int = 0  # recoveries where the spares took some of the replacements

    def count(self, gang: Gang) -> int:
        """How many spares `gang` asks (single pods ask none: there is no domain to keep)."""
        return spares.parse_request(self.request, len(gang.pods)) if len(gang.pods) > 1 else 0

    def holds(self, node: str) -> bool:
        """Whether `node` is some gang's spare now (off limits to every other placement)."""
        return node in self.holder

    def of(self, gang: str) -> tuple[str, ...]:
        return self.held.get(gang, ())

    def reserve(self, gang: str, nodes: Iterable[str]) -> None:
        self.release(gang)
        self.held[gang] = tuple(nodes)
        self.holder.update(dict.fromkeys(self.held[gang], gang))
        self.idle_gpus += sum(self.capacity[n].gpus for n in self.held[gang])

    def used(self, gang: str, nodes: Iterable[str]) -> None:
        """Spares that took a member are spares no more."""
        left = spares.remaining(self.of(gang), nodes)
        self.reserve(gang, left)

    def release(self, gang: str) -> None:
        """The gang ended (or restarts whole): its spares go back to everyone."""
        nodes = self.held.pop(gang, ())
        for node in nodes:
            self.holder.pop(node, None)
        self.idle_gpus -= sum(self.capacity[n].gpus for n in nodes)

    def accrue(self, seconds: float) -> None:
        self.idle_gpu_seconds += self.idle_gpus * seconds

    def recovered(self, before: int | None, after: int | None, *, on_spares: int, pods: int) -> None:
        """One restart-pods recovery of `pods` pods, `on_spares` of them onto the gang's spares:
        kept its tier when re-placed no higher than before."""
        self.recoveries += 1
        self.kept_tier += after is not None and before is not None and after <= before
        self.on_spares += on_spares == pods > 0
        self.partly_on_spares += 0 < on_spares < pods

    def summary(self) -> dict[str, Any]:
        return {"spare_nodes": self.request or "0", "recoveries": self.recoveries,
                "recoveries_kept_tier": self.kept_tier,
                "recoveries_kept_tier_share": round(self.kept_tier / self.recoveries, 4) if self.recoveries else None,
                "recoveries_on_spares": self.on_spares, "recoveries_partly_on_spares": self.partly_on_spares,
                "spare_gpu_hours": round(self.idle_gpu_seconds / 3600, 2)}
