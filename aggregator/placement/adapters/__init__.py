"""Adapters of the placement plugin: the Kubernetes client lives here and nowhere else in placement."""
