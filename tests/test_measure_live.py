"""The measuring agents for real: two `hypertopo-agent run --measure-fabric` processes against the
real API server plan from a real HyperNode, find each other's probe address in the NodeTopology
objects, time UDP round trips on loopback addresses and publish them in `spec.measurements`,
which the real CRD schema accepts."""

from __future__ import annotations

import json

import pytest
import yaml
from realparts import free_port, wait_for
from test_agent_runner import agent_process

from agent.adapters.node_topology import KubeApi

pytestmark = pytest.mark.apiserver


def test_two_measuring_agents_publish_each_others_round_trips(apiserver, unique) -> None:  # type: ignore[no-untyped-def]
    nodes = {f"meas-a-{unique}": "127.0.0.61", f"meas-b-{unique}": "127.0.0.62"}
    leaf = f"meas-leaf-{unique}"
    members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in nodes]
    hypernode = {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode", "metadata": {"name": leaf},
                 "spec": {"tier": 1, "members": members}}  # fmt: skip
    apiserver.kubectl("apply", "-f", "-", input=yaml.safe_dump(hypernode))
    port = str(free_port())
    flags = ("--interfaces", "none", "--interval", "1", "--measure-interval", "1", "--measure-count", "5")
    try:
        (a, a_address), (b, b_address) = nodes.items()
        with (
            agent_process(apiserver, a, *flags, "--measure-fabric", a_address, "--measure-port", port),
            agent_process(apiserver, b, *flags, "--measure-fabric", b_address, "--measure-port", port),
        ):
            api = KubeApi.from_config(str(apiserver.kubeconfig))

            def measured(node: str, peer: str) -> dict | None:
                spec = (api.get(node) or {}).get("spec") or {}
                found = [
                    m for m in spec.get("measurements") or [] if m["peer"] == peer and m["lossPercent"] == 0
                ]
                return {**found[0], "probeAddress": spec.get("probeAddress")} if found else None

            seen_a = wait_for(lambda: measured(a, b), timeout=30, what=f"{a} measuring {b}")
            seen_b = wait_for(lambda: measured(b, a), timeout=30, what=f"{b} measuring {a}")
    finally:
        apiserver.kubectl("delete", "hypernode", leaf, "--ignore-not-found")
    for seen, address in ((seen_a, a_address), (seen_b, b_address)):
        assert seen["probeAddress"] == address and seen["sent"] == 5, json.dumps(seen)
        assert 0 < seen["p50Us"] <= seen["p99Us"] < 500_000 and seen["transport"] == "udp"
