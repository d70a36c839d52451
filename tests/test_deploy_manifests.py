"""The deployment in daemonset/ is real: it applies to a real API server, every ServiceAccount has
exactly the access it needs, the admission policy confines each agent to its own node (in any
namespace an overlay moves it to), an agent makes its Node the owner of its report, and the README's
install steps never touch a HyperNode CRD that exists (Volcano's)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane

from agent.adapters.node_topology import KubeApi
from agent.report import ComponentHealth, Health, NodeReport, node_topology_object

REPO = Path(__file__).resolve().parent.parent
NS = "hypertopo-system"
pytestmark = pytest.mark.apiserver


def rendered(apiserver: ControlPlane) -> list[dict[str, Any]]:
    out = apiserver.kubectl("kustomize", str(REPO / "daemonset")).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def installed(apiserver: ControlPlane) -> Iterator[ControlPlane]:
    """daemonset/ applied for real (no controller-manager runs, so no pods start)."""
    apiserver.kubectl("apply", "--server-side", "-k", str(REPO / "daemonset"))
    yield apiserver


def test_every_manifest_passes_a_server_side_dry_run(apiserver: ControlPlane) -> None:
    apiserver.kubectl("create", "namespace", NS, check=False)
    proc = apiserver.kubectl("apply", "--server-side", "--dry-run=server", "-k", str(REPO / "daemonset"))
    applied = [line for line in proc.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(rendered(apiserver)), proc.stdout


def test_the_aggregator_and_the_scheduler_run_two_replicas_that_elect_a_leader(apiserver: ControlPlane) -> None:
    deployments = {d["metadata"]["name"]: d for d in rendered(apiserver) if d["kind"] == "Deployment"}
    for name in ("hypertopo-aggregator", "hypertopo-scheduler"):
        spec = deployments[name]["spec"]
        assert spec["replicas"] == 2 and "strategy" not in spec, name  # no Recreate: the Lease decides
        container = spec["template"]["spec"]["containers"][0]
        assert "--namespace=$(POD_NAMESPACE)" in container["args"], name  # the Lease's namespace
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
        assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}, name  # identity


def test_no_container_is_privileged_and_the_agent_adds_only_net_raw(apiserver: ControlPlane) -> None:
    for doc in rendered(apiserver):
        if doc["kind"] not in ("DaemonSet", "Deployment"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            ctx = container["securityContext"]
            assert not ctx.get("privileged", False)
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"]
            added = ctx["capabilities"].get("add", [])
            assert added == (["NET_RAW"] if doc["kind"] == "DaemonSet" else [])
            assert "limits" in container["resources"] and "requests" in container["resources"]
        if doc["kind"] == "DaemonSet":
            mounts = doc["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
            assert all(m["readOnly"] for m in mounts)
            args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
            assert "--sysfs=/host/sys" in args and "--procfs=/host/proc" in args


# What each ServiceAccount may do: (verb, resource[, namespace]) -> expected answer.
CAN_I: dict[str, list[tuple[str, str, str | None, bool]]] = {
    "hypertopo-agent": [
        ("patch", "nodetopologies.hypertopo.io", None, True),
        ("create", "nodetopologies.hypertopo.io", None, True),
        ("get", "nodetopologies.hypertopo.io", None, True),
        ("delete", "nodetopologies.hypertopo.io", None, False),
        ("list", "nodetopologies.hypertopo.io", None, False),
        ("patch", "hypernodes.topology.volcano.sh", None, False),
        ("get", "nodes", None, False),
        ("list", "secrets", NS, False),
        ("get", "pods", NS, False),
    ],
    "hypertopo-aggregator": [
        ("watch", "nodetopologies.hypertopo.io", None, True),
        ("delete", "nodetopologies.hypertopo.io", None, True),  # reports of deleted Nodes
        ("patch", "nodetopologies.hypertopo.io", None, False),
        ("create", "nodetopologies.hypertopo.io", None, False),
        ("create", "hypernodes.topology.volcano.sh", None, True),
        ("delete", "hypernodes.topology.volcano.sh", None, True),
        ("patch", "hypernodes.topology.volcano.sh/status", None, True),
        ("patch", "nodes", None, True),
        ("delete", "nodes", None, False),
        ("update", "leases.coordination.k8s.io", NS, True),
        ("update", "leases.coordination.k8s.io", "kube-system", False),
        ("list", "pods", NS, True),
        ("list", "pods", "default", False),
        ("list", "secrets", NS, False),
        ("create", "pods/binding", "default", False),
    ],
    "hypertopo-scheduler": [
        ("create", "pods/binding", "default", True),
        ("create", "pods/eviction", "default", True),
        ("list", "hypernodes.topology.volcano.sh", None, True),
        ("patch", "hypernodes.topology.volcano.sh", None, False),
        ("patch", "podgroups.scheduling.x-k8s.io/status", "default", True),
        ("create", "podgroups.scheduling.x-k8s.io", "default", False),
        ("patch", "podgroups.scheduling.volcano.sh", "default", True),
        ("delete", "podgroups.scheduling.volcano.sh", "default", False),
        ("create", "commands.bus.volcano.sh", "default", True),
        ("patch", "jobs.batch.volcano.sh", "default", False),
        ("create", "events", "default", True),
        ("create", "pods", "default", False),
        ("patch", "nodes", None, False),
        ("get", "secrets", "default", False),
        ("update", "leases.coordination.k8s.io", NS, True),  # leader election between the 2 replicas
        ("update", "leases.coordination.k8s.io", "kube-system", False),
        ("delete", "leases.coordination.k8s.io", NS, False),
    ],
}


@pytest.mark.parametrize("account", sorted(CAN_I))
def test_service_account_can_do_what_it_needs_and_nothing_more(installed: ControlPlane, account: str) -> None:
    for verb, resource, namespace, expected in CAN_I[account]:
        subresource = ""
        if resource.count("/") == 1:
            resource, subresource = resource.split("/")
        args = ["auth", "can-i", verb, resource, f"--as=system:serviceaccount:{NS}:{account}"]
        args += [f"--subresource={subresource}"] if subresource else []
        args += [f"--namespace={namespace}"] if namespace else ["--all-namespaces=false"]
        answer = installed.kubectl(*args, check=False).stdout.strip()
        assert answer == ("yes" if expected else "no"), (
            f"{account} {verb} {resource}/{subresource} in {namespace}"
        )


def test_no_service_account_holds_wildcard_or_secret_access(installed: ControlPlane) -> None:
    for doc in rendered(installed):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], doc["metadata"]["name"]
            assert "secrets" not in rule["resources"]


def _agent_token_on(installed: ControlPlane, node: str, unique: str, namespace: str = NS) -> str:
    installed.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"agent-{node}", "namespace": namespace},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "hypertopo-agent",
            "containers": [{"name": "agent", "image": "hypertopo"}],
        },
    }
    installed.kubectl("create", "-f", "-", input=json.dumps(pod))
    # TokenRequest bound to the pod: the API server embeds the pod's node in the token.
    return installed.kubectl(
        "create",
        "token",
        "hypertopo-agent",
        "-n",
        namespace,
        "--bound-object-kind=Pod",
        f"--bound-object-name=agent-{node}",
    ).stdout.strip()


def _apply_as(installed: ControlPlane, kubeconfig: Path, node: str) -> Any:
    obj = node_topology_object(NodeReport(node_name=node, health={"host": ComponentHealth(Health.OK)}))
    return installed.kubectl(
        "apply",
        "--server-side",
        "--field-manager=hypertopo-agent",
        "-f",
        "-",
        input=json.dumps(obj),
        kubeconfig=kubeconfig,
        check=False,
    )


def test_an_agent_may_write_its_own_nodes_topology_and_not_another_nodes(
    installed: ControlPlane, unique: str
) -> None:
    node_a, node_b = f"node-a-{unique}", f"node-b-{unique}"
    token = _agent_token_on(installed, node_a, unique)
    installed.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_b}}),
    )
    kubeconfig = installed.kubeconfig_for(token, f"agent-{unique}")
    whoami = json.loads(installed.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert whoami["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"] == [node_a]

    # The policy is enforced once the API server has loaded it: poll for the denial first.
    deadline = time.monotonic() + 20
    denied = _apply_as(installed, kubeconfig, node_b)
    while denied.returncode == 0 and time.monotonic() < deadline:
        installed.kubectl("delete", "ntopo", node_b, "--ignore-not-found")
        time.sleep(0.5)
        denied = _apply_as(installed, kubeconfig, node_b)
    assert denied.returncode != 0
    assert (
        f"hypertopo-agent on node {node_a} may write only the NodeTopology named after its own node, not {node_b}"
        in denied.stderr
    )

    allowed = _apply_as(installed, kubeconfig, node_a)
    assert allowed.returncode == 0, allowed.stderr
    assert installed.kubectl("get", "ntopo", node_b, check=False).returncode != 0  # nothing written for B


def _denied_until_enforced(installed: ControlPlane, kubeconfig: Path, node: str) -> Any:
    """Applies `node`'s NodeTopology as that agent until refused (the API server loads a policy
    change within seconds) or 20 s have passed; returns the last attempt."""
    deadline = time.monotonic() + 20
    proc = _apply_as(installed, kubeconfig, node)
    while proc.returncode == 0 and time.monotonic() < deadline:
        installed.kubectl("delete", "ntopo", node, "--ignore-not-found")
        time.sleep(0.5)
        proc = _apply_as(installed, kubeconfig, node)
    return proc


def test_the_own_node_guard_follows_a_namespace_overlay(installed: ControlPlane, unique: str, tmp_path: Path) -> None:
    """`namespace:` in a kustomize overlay moves the agent's ServiceAccount and its RBAC binding;
    the guard must move with them, not stay behind on hypertopo-system."""
    namespace = f"ht-overlay-{unique}"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(REPO / "daemonset", overlay)
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "namespace": namespace, "resources": [base]}  # fmt: skip
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    try:
        installed.kubectl("apply", "--server-side", "-k", str(overlay))
        node_a, node_b = f"node-ova-{unique}", f"node-ovb-{unique}"
        token = _agent_token_on(installed, node_a, unique, namespace=namespace)
        installed.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                                  "metadata": {"name": node_b}}))  # fmt: skip
        kubeconfig = installed.kubeconfig_for(token, f"overlay-agent-{unique}")
        whoami = json.loads(installed.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
        assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:hypertopo-agent"
        denied = _denied_until_enforced(installed, kubeconfig, node_b)
        assert denied.returncode != 0, "an overlay's agent wrote another node's NodeTopology"
        assert (
            f"hypertopo-agent on node {node_a} may write only the NodeTopology named after its own node, not {node_b}"
            in denied.stderr
        )
        allowed = _apply_as(installed, kubeconfig, node_a)  # RBAC follows the overlay too
        assert allowed.returncode == 0, allowed.stderr
    finally:  # the overlay re-bound the cluster-wide roles to its namespace: bind them back
        installed.kubectl("apply", "--server-side", "-k", str(REPO / "daemonset"))
        installed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_an_agent_makes_its_node_the_owner_of_its_report(installed: ControlPlane, unique: str) -> None:
    """So the garbage collector deletes the report of a deleted Node. The agent cannot read Nodes:
    the UID comes from its pod-bound token."""
    node = f"node-own-{unique}"
    token = _agent_token_on(installed, node, unique)
    node_uid = json.loads(installed.kubectl("get", "node", node, "-o", "json").stdout)["metadata"]["uid"]
    api = KubeApi.from_config(str(installed.kubeconfig_for(token, f"owner-{unique}")))
    api.apply(node_topology_object(NodeReport(node_name=node, health={"host": ComponentHealth(Health.OK)})))
    stored = json.loads(installed.kubectl("get", "ntopo", node, "-o", "json").stdout)
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
    ]


def _kinds_and_names(apiserver: ControlPlane, path: Path) -> set[tuple[str, str]]:
    docs = yaml.safe_load_all(apiserver.kubectl("kustomize", str(path)).stdout)
    return {(d["kind"], d["metadata"]["name"]) for d in docs if d}


def test_the_deployment_installs_no_crds_and_the_crd_kustomizations_split_own_from_upstream(
    apiserver: ControlPlane,
) -> None:
    assert not {k for k, _ in _kinds_and_names(apiserver, REPO / "daemonset")} & {"CustomResourceDefinition"}
    crd = "CustomResourceDefinition"
    assert _kinds_and_names(apiserver, REPO / "daemonset" / "crds") == {(crd, "nodetopologies.hypertopo.io")}
    assert _kinds_and_names(apiserver, REPO / "daemonset" / "crds" / "upstream") == {
        (crd, "hypernodes.topology.volcano.sh"),
        (crd, "podgroups.scheduling.x-k8s.io"),
    }


def readme_install_steps() -> list[list[str]]:
    """The kubectl commands of the README's install block that change the cluster (monitoring
    needs prometheus-operator's CRDs and is tested in test_deploy_monitoring)."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Install\n\n```\n(.*?)```", readme, re.S)
    assert block, "README has no Install code block"
    steps = []
    for line in block.group(1).splitlines():
        words = line.split("#", 1)[0].split()
        if words[:2] in (["kubectl", "apply"], ["kubectl", "create"]) and "daemonset/monitoring/" not in words:
            steps.append(words[1:])
    return steps


def test_the_readme_install_steps_never_touch_an_existing_hypernode_crd(installed: ControlPlane) -> None:
    """The test API server has a HyperNode CRD already (as a Volcano cluster has Volcano's)."""

    def crd() -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(
            installed.kubectl("get", "crd", "hypernodes.topology.volcano.sh", "-o", "json").stdout
        )
        return doc

    before = crd()
    steps = readme_install_steps()
    assert [s[0] for s in steps] == ["apply", "create", "apply"], steps
    for step in steps:
        proc = installed.kubectl(*[str(REPO / w) if w.startswith("daemonset/") else w for w in step], check=False)
        if proc.returncode != 0:  # only `create` of a CRD that exists may refuse, and only that way
            assert step[0] == "create", proc.stderr
            refusals = [line for line in proc.stderr.splitlines() if line.strip()]
            assert refusals and all("AlreadyExists" in line for line in refusals), proc.stderr
    after = crd()
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["metadata"].get("managedFields") == before["metadata"].get("managedFields")
    installed.kubectl("get", "crd", "nodetopologies.hypertopo.io")


def test_an_agent_token_without_a_node_is_refused(installed: ControlPlane, unique: str) -> None:
    token = installed.kubectl("create", "token", "hypertopo-agent", "-n", NS).stdout.strip()  # not pod-bound
    kubeconfig = installed.kubeconfig_for(token, f"unbound-{unique}")
    deadline = time.monotonic() + 20
    proc = _apply_as(installed, kubeconfig, f"node-x-{unique}")
    while proc.returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        proc = _apply_as(installed, kubeconfig, f"node-x-{unique}")
    assert proc.returncode != 0 and "token names no node" in proc.stderr


# Everything each ServiceAccount may do in its own namespace (cluster roles included), exactly.
EXACT_RULES: dict[str, dict[str, set[str]]] = {
    "hypertopo-agent": {"nodetopologies.hypertopo.io": {"get", "create", "patch"}},
    "hypertopo-aggregator": {
        "nodetopologies.hypertopo.io": {"get", "list", "watch", "delete"},
        "nodes": {"get", "list", "watch", "patch"},
        "hypernodes.topology.volcano.sh": {"get", "list", "watch", "create", "patch", "update", "delete"},
        "hypernodes.topology.volcano.sh/status": {"get", "patch", "update"},
        "events": {"create", "patch"},
        "events.events.k8s.io": {"create", "patch"},
        "leases.coordination.k8s.io": {"get", "create", "update", "patch"},
        "pods": {"get", "list", "watch"},
        "topologies.kueue.x-k8s.io": {"get", "create", "delete"},  # Kueue's Topology, with --node-labels
    },
    "hypertopo-scheduler": {
        "pods": {"get", "list", "watch", "delete"},
        "pods/binding": {"create"},
        "pods/eviction": {"create"},
        "pods/status": {"patch"},
        "nodes": {"get", "list", "watch"},
        "hypernodes.topology.volcano.sh": {"get", "list", "watch"},
        "podgroups.scheduling.x-k8s.io": {"get", "list", "watch"},
        "podgroups.scheduling.x-k8s.io/status": {"get", "patch", "update"},
        "podgroups.scheduling.volcano.sh": {"get", "list", "watch", "patch"},
        "queues.scheduling.volcano.sh": {"get", "list", "watch"},
        "jobs.batch.volcano.sh": {"get", "list", "watch"},
        "commands.bus.volcano.sh": {"create"},
        "events": {"create", "patch"},
        "events.events.k8s.io": {"create", "patch"},
        "leases.coordination.k8s.io": {"get", "create", "update"},
    },
}
DEFAULT_SELF_REVIEWS = {"selfsubjectreviews.authentication.k8s.io", "selfsubjectaccessreviews.authorization.k8s.io",
                        "selfsubjectrulesreviews.authorization.k8s.io"}  # fmt: skip


@pytest.mark.parametrize("account", sorted(EXACT_RULES))
def test_service_account_holds_exactly_the_listed_rules(installed: ControlPlane, account: str) -> None:
    out = installed.kubectl(
        "auth", "can-i", "--list", f"--as=system:serviceaccount:{NS}:{account}", "-n", NS
    ).stdout
    granted: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        if not line[:1].strip():
            continue  # non-resource URLs (discovery, health): granted to everyone
        resource, verbs = line.split()[0], line[line.rindex("[") + 1 : line.rindex("]")].split()
        if resource not in DEFAULT_SELF_REVIEWS:
            granted.setdefault(resource, set()).update(verbs)
    assert granted == EXACT_RULES[account]
