"""Thin adapters to the outside world (NVML, netlink, raw sockets, the Kubernetes API)."""
