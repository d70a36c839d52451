"""The whole chain on an emulated fabric (tests/lab/fabric_lab.py): switches running real lldpd in
network namespaces, agents in the host namespaces, the aggregator and the scheduler against a real
API server. Two Ready leaves under a spine; a gang of 4 lands in one leaf; cutting one host's link
turns its leaf's Ready False within 5 s and only that host's pods of the gang are moved."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from realparts import require_binary, require_root

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lab"))

from fabric_lab import FabricLab, lab, wait_for

pytestmark = [pytest.mark.netns, pytest.mark.apiserver]


@pytest.fixture(scope="module")
def fabric() -> Iterator[FabricLab]:
    require_root()
    require_binary("lldpd")
    require_binary("lldpcli")
    with lab(log=lambda line: print(f"lab: {line}")) as the_lab:
        yield the_lab


def test_the_fabric_lab_end_to_end(fabric: FabricLab) -> None:
    hns = wait_for("two Ready leaves under a Ready spine", fabric.tree_is_ready, timeout=60)
    table = fabric.kubectl("get", "hn")
    print(table)
    assert {hn["spec"]["tierName"] for hn in hns.values()} == {"leaf", "spine"}
    leaf_of = {node: fabric.leaf_of_node(node) for node in fabric.node_of.values()}
    assert leaf_of["lab-h1"] == leaf_of["lab-h2"] != leaf_of["lab-h3"] == leaf_of["lab-h4"]

    # A gang of 4 pods x 4 GPUs (16 GPUs = one leaf of 2 x 8-GPU nodes) lands in one leaf.
    fabric.submit_gang("train", size=4, gpus_per_pod=4)
    placed = wait_for("gang bound", lambda: (p := fabric.placement("train")) and all(p.values()) and p)
    assert len({leaf_of[node] for node in placed.values()}) == 1, placed

    # Cut the leaf port of one host that runs gang pods.
    victim = sorted(placed.values())[0]
    host = next(h for h, n in fabric.node_of.items() if n == victim)
    leaf = leaf_of[victim]
    assert leaf is not None
    cut = time.monotonic()
    fabric.net.set_host_link(host, up=False)
    wait_for(f"{leaf} Ready=False", lambda: fabric.ready_of(fabric.hypernodes()[leaf]) == "False", timeout=5)
    print(f"{leaf} Ready=False {time.monotonic() - cut:.2f}s after the cut")
    condition = next(c for c in fabric.hypernodes()[leaf]["status"]["conditions"] if c["type"] == "Ready")
    assert condition["reason"] == "LinkFailed" and victim in condition["message"]
    assert fabric.leaf_of_node(victim) == leaf  # the cut node stays in its leaf, as an unhealthy member

    # restart-pods: only the victim's pods are evicted; the others stay where they are.
    on_victim = {pod for pod, node in placed.items() if node == victim}
    elsewhere = {pod: node for pod, node in placed.items() if node != victim}
    wait_for("victim's pods evicted", lambda: not (on_victim & set(fabric.gang_pods("train"))), timeout=30)
    current = fabric.placement("train")
    assert {pod: current.get(pod) for pod in elsewhere} == elsewhere
    fabric.recreate_missing("train", size=4, gpus=4, serial=1)  # the lab plays the job controller
    after = wait_for("replacements bound", lambda: (p := fabric.placement("train")) and all(p.values()) and p)
    assert len(after) == 4 and victim not in after.values()

    # Repair: the leaf is Ready again.
    fabric.net.set_host_link(host, up=True)
    wait_for(f"{leaf} Ready=True", lambda: fabric.ready_of(fabric.hypernodes()[leaf]) == "True", timeout=15)
