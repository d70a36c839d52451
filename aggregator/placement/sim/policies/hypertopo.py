"""The hypertopo policy: the placement core itself (lowest tier, fewest leaves, best fit)."""

from aggregator.placement.core.place import place

__all__ = ["place"]
