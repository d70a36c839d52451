"""hypertopo on the oldest supported Kubernetes minor (issue 26.1): the suite runs the newest
release; this small set runs on the compatibility build (tests/controlplane/compat: kube-apiserver
and kubectl of the oldest minor, over the newest build's etcd), which serves no Workload API. On one
control plane of that minor: the README's install (CRDs, RBAC, admission policies) applies and grants
each ServiceAccount what it needs, hypertopo-scheduler places a gang inside one leaf, and a node whose
report goes unhealthy gets the aggregator's taint and takes its leaf HyperNode to Ready=False."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aggregator_controller_kit import AggregatorProcess
from controlplane.harness import HERE, ControlPlane, ControlPlaneError, running
from placement_live import Cluster, kwok_running, wait_for
from realparts import missing
from test_deploy_manifests import CAN_I, NAMESPACE_OF, readme_install_steps

from agent.cluster_model import load_model
from agent.common.report import ComponentHealth, Health, node_topology_object
from agent.model_probe import report_for
from aggregator.placement.adapters import kube

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tests" / "models" / "small-tree.yaml"
TAINT = "hypertopo.io/fabric-unhealthy"
WORKLOAD_PODGROUPS = "podgroups.scheduling.k8s.io"  # the Workload API's, served from 1.37
# A stand-in agent pod admitted where the install made hypertopo-system Pod Security "restricted".
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
              "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
pytestmark = pytest.mark.apiserver


def compat_minor() -> tuple[int, int]:
    """The oldest supported minor, as compat/go.mod pins it."""
    text = (HERE / "compat" / "go.mod").read_text(encoding="utf-8")
    match = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes v(\d+)\.(\d+)\.", text, re.M)
    assert match, "compat/go.mod pins no k8s.io/kubernetes"
    return int(match.group(1)), int(match.group(2))


@pytest.fixture(scope="module")
def old() -> Iterator[ControlPlane]:
    """A control plane of the oldest minor, kwok keeping its kwok-labelled nodes Ready."""
    try:
        with running(compat=True) as plane, kwok_running(plane):
            plane.kubectl("create", "namespace", "hypertopo-system")
            yield plane
    except ControlPlaneError as exc:
        missing(f"cannot start the oldest-minor control plane: {exc}")


def test_the_api_server_is_the_oldest_minor_and_serves_no_workload_api(old: ControlPlane) -> None:
    version = json.loads(old.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert (int(version["major"]), int(version["minor"])) == compat_minor() == old.version
    assert not old.workload_api
    groups = json.loads(old.kubectl("get", "--raw", "/apis/scheduling.k8s.io").stdout)
    assert [v["version"] for v in groups["versions"]] == ["v1"]


def test_the_readme_install_applies_and_grants_each_account_what_it_needs(old: ControlPlane) -> None:
    steps = readme_install_steps()
    started = time.monotonic()
    for step in steps:
        proc = old.kubectl(*[str(REPO / w) if w.startswith("daemonset/") else w for w in step], check=False)
        if proc.returncode != 0:  # `create` of the CRDs the harness applied already: AlreadyExists only
            assert step[0] == "create" and all("AlreadyExists" in line for line in proc.stderr.splitlines()
                                                 if line.strip()), proc.stderr  # fmt: skip
    print(f"\nREADME install ({len(steps)} kubectl commands) on {old.bin_dir.name}: {time.monotonic() - started:.2f}s")
    policies = json.loads(old.kubectl("get", "validatingadmissionpolicies", "-o", "json").stdout)["items"]
    assert any(p["metadata"]["name"].startswith("hypertopo") for p in policies)
    for account, checks in CAN_I.items():
        for verb, resource, namespace, expected in checks:
            resource, _, subresource = resource.partition("/")
            if resource == WORKLOAD_PODGROUPS and not old.workload_api:
                continue  # a resource this minor does not serve: can-i answers "no" whatever RBAC says
            args = ["auth", "can-i", verb, resource, f"--as=system:serviceaccount:{NAMESPACE_OF[account]}:{account}"]
            args += [f"--subresource={subresource}"] if subresource else []
            args += [f"--namespace={namespace}"] if namespace else ["--all-namespaces=false"]
            answer = old.kubectl(*args, check=False).stdout.strip()
            assert answer == ("yes" if expected else "no"), f"{account} {verb} {resource}/{subresource} in {namespace}"


def test_hypertopo_scheduler_places_a_gang_inside_one_leaf(old: ControlPlane) -> None:
    cluster = Cluster(old, uuid.uuid4().hex[:6])
    try:
        layout = cluster.leaf_spine(leaves=2, per_leaf=4, gpus=8)
        leaf_of = {n: leaf for leaf, nodes in layout.items() for n in nodes}
        with cluster.scheduler():
            limit = {"volcano.sh/network-topology-mode": "hard", "hypertopo.io/highest-tier-name": "leaf"}
            start = time.monotonic()
            cluster.add_gang("g", 4, gpus=8, annotations=limit)
            placed = cluster.wait_bound(4)
            print(f"4 x 8-GPU gang bound by hypertopo-scheduler in {time.monotonic() - start:.2f}s: {placed}")
        assert len({leaf_of[n] for n in placed.values()}) == 1 and len(set(placed.values())) == 4
    finally:
        cluster.cleanup()


def _taints(plane: ControlPlane, node: str) -> list[str]:
    doc = json.loads(plane.kubectl("get", "node", node, "-o", "json").stdout)
    return [t["key"] for t in doc["spec"].get("taints") or []]


def _ready(plane: ControlPlane, hypernode: str) -> str | None:
    got = plane.kubectl("get", "hypernode", hypernode, "-o", "json", check=False)
    if got.returncode != 0:  # not written yet
        return None
    doc: dict[str, Any] = json.loads(got.stdout)
    conditions = (doc.get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), None)


def test_a_node_whose_report_goes_unhealthy_is_tainted_and_its_leaf_goes_not_ready(old: ControlPlane) -> None:
    model = load_model(str(MODEL))
    reports = {n: report_for(model, n) for n in sorted({n for b in model.blocks for n in b.nodes})}
    cluster = Cluster(old, uuid.uuid4().hex[:6])
    aggregator = None
    try:
        cluster.add_nodes(list(reports), gpus=8)
        for n in reports:
            cluster.api.create(kube.PODS, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"agent-{n}", "namespace": "hypertopo-system",
                             "labels": {"app.kubernetes.io/name": "hypertopo-agent"}},
                "spec": {"nodeName": n, "containers": [{"name": "agent", "image": "hypertopo:test",
                                                         "securityContext": RESTRICTED}]}})  # fmt: skip

        def publish(report: Any) -> None:
            old.kubectl("apply", "--server-side", "--field-manager=hypertopo-agent", "-f", "-",
                        input=json.dumps(node_topology_object(report)))

        for report in reports.values():
            publish(report)
        flags = ["--kubeconfig", str(old.kubeconfig), "--no-leader-election", "--model", str(MODEL),
                 "--taint-unhealthy", "--hold-down", "1", "--debounce", "0.05"]
        aggregator = AggregatorProcess(old, flags, name="compat")
        leaf = "leaf-leaf2"
        wait_for(f"{leaf} Ready", lambda: _ready(old, leaf) == "True", timeout=60, interval=0.1)
        victim = "node05"
        broken = dataclasses.replace(reports[victim], health={
            **reports[victim].health, "rdma": ComponentHealth(Health.FAILED, "mlx5_0 port 1 Down")})
        fault = time.monotonic()
        publish(broken)
        wait_for(f"taint {TAINT} on {victim}", lambda: TAINT in _taints(old, victim), timeout=15, interval=0.02)
        tainted = time.monotonic() - fault
        wait_for(f"{leaf} Ready=False", lambda: _ready(old, leaf) == "False", timeout=15, interval=0.05)
        print(f"fault on {victim}: taint after {tainted:.2f}s, {leaf} Ready=False after "
              f"{time.monotonic() - fault:.2f}s (hold-down 1s)")
        assert all(TAINT not in _taints(old, n) for n in reports if n != victim)
        publish(reports[victim])
        wait_for(f"taint on {victim} removed after repair", lambda: TAINT not in _taints(old, victim), timeout=15)
        assert aggregator.stop() == 0
        aggregator = None
    finally:
        if aggregator is not None:
            with contextlib.suppress(Exception):
                aggregator.proc.kill()
        cluster.cleanup()
        old.kubectl("delete", "nodetopologies", "--all", check=False)
