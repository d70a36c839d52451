"""Kueue's Topology follows hypertopo's node labels (issue 13): levels broadest first, ending with
kubernetes.io/hostname, replaced (levels are immutable) when the tiers change, checked against
Kueue's real CRD (v0.16.2, from its Go module) on the real API server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from realparts import missing

from agent.cluster_model import load_model
from agent.common.api_error import ApiError
from aggregator.adapters.kube import connect
from aggregator.adapters.kueue import TopologyClient
from aggregator.live.kueue_topology import (
    ABSENT_RECHECK_SECONDS,
    HOSTNAME_LABEL,
    RECHECK_SECONDS,
    TopologyKeeper,
    levels_of,
    topology_object,
)
from aggregator.pipeline import ClusterInputs, Pipeline

REPO = Path(__file__).resolve().parents[2]
FAT_TREE = ("hypertopo.io/core", "hypertopo.io/spine", "hypertopo.io/leaf", HOSTNAME_LABEL)


def _hypernodes(model: str) -> list[dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-m", "aggregator", "render", "--model", str(REPO / "tests" / "models" / model)],
                          capture_output=True, text=True, check=True, cwd=REPO)
    items: list[dict[str, Any]] = yaml.safe_load(proc.stdout)["items"]
    return items


def test_levels_are_the_tier_labels_broadest_first_then_the_host_name() -> None:
    assert levels_of(_hypernodes("fat-tree-3tier.yaml")) == FAT_TREE
    assert levels_of(_hypernodes("small-tree.yaml")) == ("hypertopo.io/spine", "hypertopo.io/leaf", HOSTNAME_LABEL)
    assert levels_of([]) == ()


class FakeStore:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.absent = False

    def get(self, name: str) -> dict[str, Any] | None:
        self.calls.append("get")
        if self.absent:
            raise ApiError(404, "Not Found", "404 page not found")
        return self.objects.get(name)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        self.objects[obj["metadata"]["name"]] = {**obj, "metadata": {**obj["metadata"], "uid": "u1"}}
        return obj

    def delete(self, name: str, *, uid: str) -> None:
        self.calls.append(f"delete {uid}")
        del self.objects[name]


def test_the_keeper_creates_once_rechecks_rarely_and_replaces_on_new_tiers() -> None:
    store = FakeStore()
    keeper = TopologyKeeper(store)
    fat = _hypernodes("fat-tree-3tier.yaml")
    assert keeper.sync(fat, now=0.0) == 1 and store.calls == ["get", "create"]
    assert keeper.sync(fat, now=1.0) == 0 and store.calls == ["get", "create"]  # unchanged: no API call
    assert keeper.sync(fat, now=RECHECK_SECONDS + 1) == 0 and store.calls[-1] == "get"  # read back
    del store.objects["hypertopo"]  # someone deleted it
    assert keeper.sync(fat, now=2 * RECHECK_SECONDS + 2) == 1
    small = _hypernodes("small-tree.yaml")
    assert keeper.sync(small, now=2 * RECHECK_SECONDS + 3) == 2  # immutable levels: delete, create
    assert store.calls[-3:] == ["get", "delete u1", "create"]
    assert [lv["nodeLabel"] for lv in store.objects["hypertopo"]["spec"]["levels"]] == [
        "hypertopo.io/spine", "hypertopo.io/leaf", HOSTNAME_LABEL]


def test_the_keeper_leaves_a_foreign_topology_and_waits_for_kueue() -> None:
    store = FakeStore()
    store.objects["hypertopo"] = {"metadata": {"name": "hypertopo"}, "spec": {"levels": [{"nodeLabel": "rack"}]}}
    keeper = TopologyKeeper(store)
    assert keeper.sync(_hypernodes("small-tree.yaml"), now=0.0) == 0 and keeper.foreign
    assert store.objects["hypertopo"]["spec"]["levels"] == [{"nodeLabel": "rack"}]
    absent = FakeStore()
    absent.absent = True
    keeper = TopologyKeeper(absent)
    assert keeper.sync(_hypernodes("small-tree.yaml"), now=0.0) == 0
    assert keeper.sync(_hypernodes("small-tree.yaml"), now=RECHECK_SECONDS + 1) == 0
    assert absent.calls == ["get"]  # Kueue absent: asked again only after ABSENT_RECHECK_SECONDS
    keeper.sync(_hypernodes("small-tree.yaml"), now=ABSENT_RECHECK_SECONDS + 1)
    assert absent.calls == ["get", "get"]


def test_nothing_is_written_by_a_follower() -> None:
    store = FakeStore()
    assert TopologyKeeper(store, may_write=lambda: False).sync(_hypernodes("small-tree.yaml"), now=0.0) == 0
    assert store.calls == []


def kueue_crds() -> Path:
    proc = subprocess.run(["bash", str(REPO / "tests/controlplane/kueue_crds.sh")], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        missing(f"Kueue's CRDs unavailable: {proc.stderr[-500:]}")
    return Path(proc.stdout.strip())


@pytest.fixture(scope="module")
def kueue_api(apiserver: Any) -> Any:
    crds = kueue_crds()
    for kind in ("topologies", "resourceflavors"):
        apiserver.kubectl("apply", "--server-side", "-f", str(crds / f"kueue.x-k8s.io_{kind}.yaml"))
        apiserver.wait_crds_established(f"{kind}.kueue.x-k8s.io")
    return apiserver


@pytest.mark.apiserver
def test_kueues_real_crd_takes_the_topology_and_the_keeper_replaces_it(kueue_api: Any, unique: str) -> None:
    kube = connect(str(kueue_api.kubeconfig))
    name = f"hypertopo-{unique}"
    keeper = TopologyKeeper(TopologyClient(kube), name=name)
    try:
        assert keeper.sync(_hypernodes("fat-tree-3tier.yaml"), now=0.0) == 1
        live = json.loads(kueue_api.kubectl("get", "topologies.kueue.x-k8s.io", name, "-o", "json").stdout)
        assert live["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert tuple(level["nodeLabel"] for level in live["spec"]["levels"]) == FAT_TREE
        # Kueue's CRD makes levels immutable: an in-place update is refused, so the keeper replaces
        edit = json.dumps({"spec": {"levels": [{"nodeLabel": "hypertopo.io/leaf"}, {"nodeLabel": HOSTNAME_LABEL}]}})
        refused = kueue_api.kubectl("patch", "topologies.kueue.x-k8s.io", name, "--type=merge", "-p", edit, check=False)
        assert refused.returncode != 0 and "field is immutable" in refused.stderr
        assert keeper.sync(_hypernodes("small-tree.yaml"), now=1.0) == 2
        live = json.loads(kueue_api.kubectl("get", "topologies.kueue.x-k8s.io", name, "-o", "json").stdout)
        assert [lv["nodeLabel"] for lv in live["spec"]["levels"]] == [
            "hypertopo.io/spine", "hypertopo.io/leaf", HOSTNAME_LABEL]
    finally:
        kueue_api.kubectl("delete", "topologies.kueue.x-k8s.io", name, "--ignore-not-found")


@pytest.mark.apiserver
def test_the_crd_refuses_what_the_keeper_never_writes(kueue_api: Any, unique: str) -> None:
    """The host name anywhere but last, or twice: Kueue's validation, which levels_of respects."""
    bad = topology_object(["kubernetes.io/hostname", "hypertopo.io/leaf"], name=f"bad-{unique}")
    proc = kueue_api.kubectl("create", "-f", "-", input=json.dumps(bad), check=False)
    assert proc.returncode != 0 and "lowest level" in proc.stderr


@pytest.mark.apiserver
def test_the_readme_resource_flavor_names_the_topology(kueue_api: Any) -> None:
    readme = (REPO / "docs" / "scheduling.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\n.*?)```", readme, re.S)
    assert block, "the README shows a ResourceFlavor"
    flavor = yaml.safe_load(block.group(1))
    assert flavor["spec"]["topologyName"] == "hypertopo"
    proc = kueue_api.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=block.group(1))
    assert "serverside-applied (server dry run)" in proc.stdout


def test_render_models_reach_the_same_levels_through_the_pipeline() -> None:
    """The controller's hook reads desired.hypernodes: the Pipeline's own objects give the levels."""
    model = load_model(str(REPO / "tests" / "models" / "fat-tree-3tier.yaml"))
    desired = Pipeline().compute(ClusterInputs(reports={}, model=model), now=0.0)
    assert levels_of(desired.hypernodes) == FAT_TREE


@pytest.mark.apiserver
def test_the_aggregator_run_with_node_labels_keeps_a_topology_of_the_labels_it_writes() -> None:
    """End to end: `hypertopo-aggregator run --node-labels` on an API server of its own, with
    Kueue's CRD, Nodes of the modelled fat-tree and the model as the fabric source."""
    from aggregator_controller_kit import private_plane, wait_for
    from realparts import free_port

    model = REPO / "tests" / "models" / "fat-tree-3tier.yaml"
    crds = kueue_crds()
    with private_plane() as plane:
        plane.kubectl("apply", "--server-side", "-f", str(crds / "kueue.x-k8s.io_topologies.yaml"))
        plane.wait_crds_established("topologies.kueue.x-k8s.io")
        nodes = load_model(str(model)).nodes()
        items = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in nodes]
        plane.kubectl("apply", "--server-side", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                             "items": items}))
        argv = [sys.executable, "-m", "aggregator", "run", "--kubeconfig", str(plane.kubeconfig), "--listen",
                f"127.0.0.1:{free_port()}", "--no-leader-election", "--agent-selector", "", "--hold-down", "0",
                "--model", str(model), "--node-labels"]
        log = plane.workdir / "aggregator-kueue.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            def topology() -> dict[str, Any] | None:
                got = plane.kubectl("get", "topologies.kueue.x-k8s.io", "hypertopo", "-o", "json", check=False)
                assert proc.poll() is None, log.read_text()[-3000:]
                return json.loads(got.stdout) if got.returncode == 0 else None

            live = wait_for(topology, timeout=60, what="the Kueue Topology")
            levels = tuple(level["nodeLabel"] for level in live["spec"]["levels"])
            assert levels == FAT_TREE
            wait_for(lambda: set(levels[:-1]) <= set(
                json.loads(plane.kubectl("get", "node", nodes[0], "-o", "json").stdout)["metadata"]["labels"]),
                timeout=30, what="the node labels")
        finally:
            proc.terminate()
            proc.wait(30)
