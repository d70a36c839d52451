"""hypertopo aggregator: joins node reports and fabric dumps into a fabric graph, infers tiers and
reconciles Volcano HyperNodes with Ready conditions."""

__version__ = "0.1.0"
