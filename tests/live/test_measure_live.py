"""The measured fabric end to end, every part real: two `hypertopo-agent run --measure-fabric`
processes and a `hypertopo-aggregator run --measured-fabric` against a real API server. The
aggregator plans from the tree a model gives it and writes each agent's row into that agent's own
NodeTopology status; each agent reads only that object, times UDP round trips on loopback
addresses to the peer its row names, answers only the prober its row names, and publishes the
figures in `spec.measurements` (the real CRD schema accepts both); the aggregator folds them into
the leaf HyperNode's annotation."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml
from aggregator_controller_kit import live, private_plane, set_ready
from controlplane.harness import ControlPlane
from realparts import free_port, wait_for
from test_agent_runner import agent_process
from test_measure_controller_live import aggregator

from agent.adapters.node_topology import KubeApi
from aggregator.sources.measured import INSIDE

pytestmark = pytest.mark.apiserver
NODES = {"meas-a": "127.0.0.61", "meas-b": "127.0.0.62"}


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with private_plane() as cp:
        yield cp


def test_two_measuring_agents_measure_each_other_on_the_aggregators_plan(plane: ControlPlane) -> None:
    model = plane.workdir / "measure-model.yaml"
    model.write_text(yaml.safe_dump({"switches": {"spine1": {"switches": ["leaf1"]}},
                                     "blocks": [{"switch": "leaf1", "nodes": list(NODES)}]}))  # fmt: skip
    nodes = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in NODES]
    plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    for n in NODES:
        set_ready(plane, "node", n)
    port = str(free_port())
    flags = ("--interfaces", "none", "--interval", "1", "--measure-interval", "1", "--measure-count", "5")
    api = KubeApi.from_config(str(plane.kubeconfig))

    def measured(node: str, peer: str) -> dict | None:
        obj = api.get(node) or {}
        spec, plan = obj.get("spec") or {}, (obj.get("status") or {}).get("probePlan") or {}
        found = [m for m in spec.get("measurements") or [] if m["peer"] == peer and m["lossPercent"] == 0]
        return {**found[0], "probeAddress": spec.get("probeAddress"), "plan": plan} if found else None

    (a, a_address), (b, b_address) = NODES.items()
    with (
        aggregator(plane, "--model", str(model), "--agent-selector", ""),
        agent_process(plane, a, *flags, "--measure-fabric", a_address, "--measure-port", port),
        agent_process(plane, b, *flags, "--measure-fabric", b_address, "--measure-port", port),
    ):
        seen_a = wait_for(lambda: measured(a, b), timeout=40, what=f"{a} measuring {b}")
        seen_b = wait_for(lambda: measured(b, a), timeout=40, what=f"{b} measuring {a}")
        leaf = next(name for name, o in live(plane).items() if o["spec"]["tier"] == 1)
        inside = wait_for(lambda: live(plane)[leaf]["metadata"].get("annotations", {}).get(INSIDE), timeout=20,
                          what="the leaf's measured annotation")  # fmt: skip
    for seen, address, peer, peer_address in ((seen_a, a_address, b, b_address), (seen_b, b_address, a, a_address)):
        assert seen["probeAddress"] == address and seen["sent"] == 5, json.dumps(seen)
        assert 0 < seen["p50Us"] <= seen["p99Us"] < 500_000 and seen["transport"] == "udp"
        assert seen["plan"]["peers"] == [{"node": peer, "address": peer_address}]
        assert seen["plan"]["probers"] == [peer_address]
    assert 0 < int(inside) < 500_000
