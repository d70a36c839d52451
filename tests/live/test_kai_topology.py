"""KAI Scheduler's Topology follows hypertopo's node labels (issue 26.4): created with the tier label
keys broadest first and kubernetes.io/hostname last, deleted and recreated when the tiers change
(KAI's CRD makes levels immutable), a Topology hypertopo did not create never touched, and KAI
absent is a log line, not a failure. Checked against KAI's real CRD (v0.12.0, from its Go module)
on the real API server."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from realparts import missing
from test_kueue_topology import FAT_TREE, FakeStore, _hypernodes

from agent.common.api_error import ApiError
from aggregator.adapters.kai import KaiTopologyClient
from aggregator.adapters.kube import connect
from aggregator.live.kai_topology import API_VERSION, KaiTopologyKeeper, topology_object
from aggregator.live.kueue_topology import ABSENT_RECHECK_SECONDS, HOSTNAME_LABEL, levels_of

REPO = Path(__file__).resolve().parents[2]
SMALL_TREE = ("hypertopo.io/spine", "hypertopo.io/leaf", HOSTNAME_LABEL)


def levels(obj: dict[str, Any]) -> tuple[str, ...]:
    return tuple(level["nodeLabel"] for level in obj["spec"]["levels"])


def test_the_keeper_writes_kais_object_and_replaces_it_when_the_tiers_change() -> None:
    store = FakeStore()
    keeper = KaiTopologyKeeper(store)
    assert keeper.sync(_hypernodes("fat-tree-3tier.yaml"), now=0.0) == 1
    made = store.objects["hypertopo"]
    assert made["apiVersion"] == "kai.scheduler/v1alpha1" and made["kind"] == "Topology"
    assert made["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "hypertopo"}
    assert levels(made) == FAT_TREE
    assert keeper.sync(_hypernodes("small-tree.yaml"), now=1.0) == 2
    assert store.calls[-3:] == ["get", "delete u1", "create"] and levels(store.objects["hypertopo"]) == SMALL_TREE


def test_kai_absent_is_logged_once_and_asked_again_rarely(caplog: pytest.LogCaptureFixture) -> None:
    absent = FakeStore()
    absent.absent = True
    keeper = KaiTopologyKeeper(absent)
    with caplog.at_level(logging.INFO, logger="aggregator.live.kueue_topology"):
        for now in (0.0, 1.0, 2.0):
            assert keeper.sync(_hypernodes("small-tree.yaml"), now=now) == 0
    said = [r.getMessage() for r in caplog.records]
    assert said == ["KAI's Topology API (kai.scheduler/v1alpha1) is not served; no Topology kept"]
    keeper.sync(_hypernodes("small-tree.yaml"), now=ABSENT_RECHECK_SECONDS + 1)
    assert absent.calls == ["get", "get"]


class ForbiddenStore(FakeStore):
    def get(self, name: str) -> dict[str, Any] | None:
        self.calls.append("get")
        raise ApiError(403, "Forbidden", 'topologies.kai.scheduler "hypertopo" is forbidden')


def test_without_rbac_for_kais_topologies_one_warning_and_asked_again_rarely(caplog: pytest.LogCaptureFixture) -> None:
    """A newer image under older RBAC (no topologies.kai.scheduler): a warning naming the grant, not
    one per reconcile."""
    store = ForbiddenStore()
    keeper = KaiTopologyKeeper(store)
    with caplog.at_level(logging.INFO, logger="aggregator.live.kueue_topology"):
        for now in (0.0, 1.0, 2.0):
            assert keeper.sync(_hypernodes("small-tree.yaml"), now=now) == 0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "KAI Topology hypertopo: not permitted" in said[0] and "kai.scheduler" in said[0]
    assert caplog.records[0].levelno == logging.WARNING
    keeper.sync(_hypernodes("small-tree.yaml"), now=ABSENT_RECHECK_SECONDS + 1)
    assert store.calls == ["get", "get"]


def kai_crds() -> Path:
    proc = subprocess.run(["bash", str(REPO / "tests/controlplane/kai_crds.sh")], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        missing(f"KAI's CRDs unavailable: {proc.stderr[-500:]}")
    return Path(proc.stdout.strip())


def install_kai_topology_crd(plane: Any) -> None:
    plane.kubectl("apply", "--server-side", "-f", str(kai_crds() / "kai.scheduler_topologies.yaml"))
    plane.wait_crds_established("topologies.kai.scheduler")


@pytest.mark.apiserver
def test_without_kais_crd_the_real_api_server_answer_means_absent(apiserver: Any, unique: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The real server's answer for a resource it does not serve (no Kubernetes Status) is what the
    keeper takes for "KAI is not installed". The shared server may hold KAI's CRD by now (another
    test installs it), so the version asked for is one KAI never served."""
    kube = connect(str(apiserver.kubeconfig))
    client = KaiTopologyClient(kube)
    client.resource = dataclasses.replace(client.resource, version="v1alpha0")
    keeper = KaiTopologyKeeper(client, name=f"hypertopo-{unique}")
    with caplog.at_level(logging.INFO, logger="aggregator.live.kueue_topology"):
        assert keeper.sync(_hypernodes("small-tree.yaml"), now=0.0) == 0
    assert keeper.seen.absent_api
    assert any("KAI's Topology API" in r.getMessage() and "is not served" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def kai_api(apiserver: Any) -> Any:
    install_kai_topology_crd(apiserver)
    return apiserver


def get_topology(plane: Any, name: str) -> dict[str, Any]:
    return dict(json.loads(plane.kubectl("get", "topologies.kai.scheduler", name, "-o", "json").stdout))


@pytest.mark.apiserver
def test_kais_real_crd_takes_the_topology_refuses_edits_and_the_keeper_recreates_it(kai_api: Any,
                                                                                    unique: str) -> None:
    kube = connect(str(kai_api.kubeconfig))
    name = f"hypertopo-{unique}"
    keeper = KaiTopologyKeeper(KaiTopologyClient(kube), name=name)
    try:
        assert keeper.sync(_hypernodes("fat-tree-3tier.yaml"), now=0.0) == 1
        live = get_topology(kai_api, name)
        assert live["apiVersion"] == API_VERSION and levels(live) == FAT_TREE
        edit = json.dumps({"spec": {"levels": [{"nodeLabel": "hypertopo.io/leaf"}, {"nodeLabel": HOSTNAME_LABEL}]}})
        refused = kai_api.kubectl("patch", "topologies.kai.scheduler", name, "--type=merge", "-p", edit, check=False)
        assert refused.returncode != 0 and "field is immutable" in refused.stderr
        assert keeper.sync(_hypernodes("small-tree.yaml"), now=1.0) == 2  # delete, create
        again = get_topology(kai_api, name)
        assert levels(again) == SMALL_TREE
        assert again["metadata"]["uid"] != live["metadata"]["uid"]
    finally:
        kai_api.kubectl("delete", "topologies.kai.scheduler", name, "--ignore-not-found")


@pytest.mark.apiserver
def test_a_topology_hypertopo_did_not_create_is_never_touched(kai_api: Any, unique: str) -> None:
    name = f"hypertopo-{unique}"
    foreign = topology_object(["example.com/rack", HOSTNAME_LABEL], name=name)
    foreign["metadata"]["labels"] = {"team": "ml"}
    kai_api.kubectl("create", "-f", "-", input=json.dumps(foreign))
    try:
        before = get_topology(kai_api, name)
        keeper = KaiTopologyKeeper(KaiTopologyClient(connect(str(kai_api.kubeconfig))), name=name)
        for now in (0.0, 61.0, 122.0):  # read back past RECHECK_SECONDS: still left alone
            assert keeper.sync(_hypernodes("fat-tree-3tier.yaml"), now=now) == 0
        assert keeper.foreign
        after = get_topology(kai_api, name)
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert levels(after) == ("example.com/rack", HOSTNAME_LABEL)
    finally:
        kai_api.kubectl("delete", "topologies.kai.scheduler", name, "--ignore-not-found")


@pytest.mark.apiserver
def test_kais_crd_refuses_what_the_keeper_never_writes(kai_api: Any, unique: str) -> None:
    """The host name anywhere but last, or a level twice: KAI's validation, which levels_of respects."""
    for i, bad in enumerate((["kubernetes.io/hostname", "hypertopo.io/leaf"], ["hypertopo.io/leaf"] * 2)):
        proc = kai_api.kubectl("create", "-f", "-", input=json.dumps(topology_object(bad, name=f"bad{i}-{unique}")),
                               check=False)
        assert proc.returncode != 0
        assert ("lowest level" if i == 0 else "must be unique") in proc.stderr


@pytest.mark.apiserver
def test_the_readme_example_is_what_the_keeper_writes_and_kai_takes_it(kai_api: Any) -> None:
    readme = (REPO / "docs" / "scheduling.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(apiVersion: kai.scheduler/v1alpha1\nkind: Topology\n.*?)```", readme, re.S)
    assert block, "the README shows KAI's Topology"
    assert yaml.safe_load(block.group(1)) == topology_object(levels_of(_hypernodes("fat-tree-3tier.yaml")))
    proc = kai_api.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=block.group(1))
    assert "serverside-applied (server dry run)" in proc.stdout


@pytest.mark.apiserver
def test_installed_with_node_marks_the_aggregator_may_write_only_hypertopos_kai_topologies(tmp_path: Path) -> None:
    """daemonset/ with components/node-marks grants KAI's Topologies (without it: none), and the
    aggregator's admission policy keeps its writes to Topologies labelled as hypertopo's."""
    from aggregator_controller_kit import private_plane, wait_for
    from renders import node_marks_overlay

    aggregator = "--as=system:serviceaccount:hypertopo-system:hypertopo-aggregator"
    with private_plane() as plane:
        install_kai_topology_crd(plane)
        plane.kubectl("apply", "--server-side", "-k", str(REPO / "daemonset"))
        can = plane.kubectl("auth", "can-i", "create", "topologies.kai.scheduler", aggregator, check=False)
        assert can.stdout.strip() == "no"
        plane.kubectl("apply", "--server-side", "-k", str(node_marks_overlay(tmp_path / "node-marks")))
        foreign = topology_object(["example.com/rack", HOSTNAME_LABEL], name="racks")
        foreign["metadata"]["labels"] = {}
        plane.kubectl("create", "-f", "-", input=json.dumps(foreign))

        def as_aggregator(*args: str, data: str | None = None) -> Any:
            return plane.kubectl(*args, aggregator, input=data, check=False)

        def refused_unlabelled() -> bool:  # RBAC and the policy are loaded within seconds
            proc = as_aggregator("create", "-f", "-", data=json.dumps({**foreign, "metadata": {"name": "bare"}}))
            plane.kubectl("delete", "topologies.kai.scheduler", "bare", "--ignore-not-found")
            return "may write only topologies labelled app.kubernetes.io/managed-by=hypertopo" in proc.stderr

        wait_for(refused_unlabelled, timeout=30, what="the policy refusing an unlabelled Topology")
        delete = as_aggregator("delete", "topologies.kai.scheduler", "racks")
        assert delete.returncode != 0 and "racks is not hypertopo's" in delete.stderr, delete.stderr
        ours = json.dumps(topology_object(FAT_TREE))
        assert as_aggregator("create", "-f", "-", data=ours).returncode == 0
        assert as_aggregator("get", "topologies.kai.scheduler", "hypertopo").returncode == 0
        assert as_aggregator("delete", "topologies.kai.scheduler", "hypertopo").returncode == 0
        assert levels(get_topology(plane, "racks")) == ("example.com/rack", HOSTNAME_LABEL)
