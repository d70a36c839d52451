"""Thin adapters to the Kubernetes API for the aggregator."""
