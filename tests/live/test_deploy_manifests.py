"""The deployment in daemonset/ is real: it applies to a real API server, every ServiceAccount has
exactly the access it needs, the admission policy confines each agent to its own node (name,
spec.nodeName, owners, finalizers; in any namespace an overlay moves it to) and the aggregator to
hypertopo's own HyperNodes, an agent makes its Node the owner of its report, only the agent's
namespace allows privileged pods, and the README's install steps never touch a HyperNode CRD that
exists (Volcano's)."""

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
from renders import node_marks_overlay

from agent.adapters.node_topology import KubeApi
from agent.common.report import ComponentHealth, Health, NodeReport, node_topology_object

REPO = Path(__file__).resolve().parents[2]
NS = "hypertopo-system"
AGENT_NS = "hypertopo-agent"  # the only namespace at Pod Security privileged
NAMESPACE_OF = {"hypertopo-agent": AGENT_NS, "hypertopo-aggregator": NS, "hypertopo-scheduler": NS}
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
    for namespace in (NS, AGENT_NS):  # a dry run creates no namespace for the objects in it
        apiserver.kubectl("create", "namespace", namespace, check=False)
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
            assert "--sysfs=/host/sys" in args


def test_the_agent_mounts_only_host_sys_and_serves_on_the_nodes_own_address(apiserver: ControlPlane) -> None:
    """The host's /proc (every workload's command line) is not mounted: CPU count, memory and
    kernel come from the container's own /proc and uname. Metrics bind to the node's address."""
    (agent,) = [d for d in rendered(apiserver) if d["kind"] == "DaemonSet"]
    pod = agent["spec"]["template"]["spec"]
    assert [v["hostPath"]["path"] for v in pod["volumes"]] == ["/sys"]
    container = pod["containers"][0]
    assert not [a for a in container["args"] if a.startswith("--procfs")]
    assert "--listen=$(HOST_IP):9730" in container["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert env["HOST_IP"] == "status.hostIP"


def test_only_the_agents_namespace_allows_privileged_pods(apiserver: ControlPlane) -> None:
    docs = rendered(apiserver)
    levels = {d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
              for d in docs if d["kind"] == "Namespace"}  # fmt: skip
    assert levels == {NS: "restricted", AGENT_NS: "privileged"}
    workloads = {d["metadata"]["name"]: d["metadata"]["namespace"] for d in docs
                 if d["kind"] in ("DaemonSet", "Deployment")}  # fmt: skip
    assert workloads == {"hypertopo-agent": AGENT_NS, "hypertopo-aggregator": NS, "hypertopo-scheduler": NS}


def test_the_aggregator_and_the_scheduler_are_admitted_at_restricted(installed: ControlPlane) -> None:
    """Pod Security admission itself judges their pod templates in the restricted namespace."""
    for doc in rendered(installed):
        if doc["kind"] != "Deployment":
            continue
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"psa-{doc['metadata']['name']}",
               "namespace": NS}, "spec": doc["spec"]["template"]["spec"]}  # fmt: skip
        proc = installed.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr
    agent = next(d for d in rendered(installed) if d["kind"] == "DaemonSet")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "psa-agent", "namespace": NS},
           "spec": agent["spec"]["template"]["spec"]}  # fmt: skip
    proc = installed.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert proc.returncode != 0 and "violates PodSecurity" in proc.stderr, proc.stderr  # the guard is real


# What each ServiceAccount may do: (verb, resource[, namespace]) -> expected answer.
CAN_I: dict[str, list[tuple[str, str, str | None, bool]]] = {
    "hypertopo-agent": [
        ("patch", "nodetopologies.hypertopo.io", None, True),
        ("create", "nodetopologies.hypertopo.io", None, True),
        ("get", "nodetopologies.hypertopo.io", None, True),
        ("delete", "nodetopologies.hypertopo.io", None, False),
        ("list", "nodetopologies.hypertopo.io", None, False),
        ("patch", "nodetopologies.hypertopo.io/status", None, False),  # its probe plan is the aggregator's to write
        ("list", "hypernodes.topology.volcano.sh", None, False),  # measuring reads its own NodeTopology only
        ("patch", "hypernodes.topology.volcano.sh", None, False),
        ("get", "nodes", None, False),
        ("list", "secrets", AGENT_NS, False),
        ("get", "pods", AGENT_NS, False),
    ],
    "hypertopo-aggregator": [
        ("watch", "nodetopologies.hypertopo.io", None, True),
        ("delete", "nodetopologies.hypertopo.io", None, True),  # reports of deleted Nodes
        ("patch", "nodetopologies.hypertopo.io", None, False),
        ("create", "nodetopologies.hypertopo.io", None, False),
        ("patch", "nodetopologies.hypertopo.io/status", None, True),  # each node's probe plan (--measured-fabric)
        ("create", "hypernodes.topology.volcano.sh", None, True),
        ("delete", "hypernodes.topology.volcano.sh", None, True),
        ("patch", "hypernodes.topology.volcano.sh/status", None, True),
        ("patch", "nodes", None, False),  # only with components/node-marks
        ("delete", "nodes", None, False),
        ("create", "topologies.kueue.x-k8s.io", None, False),  # only with components/node-marks
        ("update", "leases.coordination.k8s.io", NS, True),
        ("update", "leases.coordination.k8s.io", "kube-system", False),
        ("list", "pods", AGENT_NS, True),  # the agent pods' readiness
        ("list", "pods", NS, False),
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
        ("patch", "podgroups.scheduling.k8s.io/status", "default", True),
        ("update", "podgroups.scheduling.k8s.io/status", "default", False),
        ("delete", "podgroups.scheduling.k8s.io", "default", False),
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
        args = ["auth", "can-i", verb, resource, f"--as=system:serviceaccount:{NAMESPACE_OF[account]}:{account}"]
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


def _agent_token_on(installed: ControlPlane, node: str, unique: str, namespace: str = AGENT_NS) -> str:
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


def _apply_object_as(installed: ControlPlane, kubeconfig: Path, obj: dict[str, Any]) -> Any:
    return installed.kubectl("apply", "--server-side", "--field-manager=hypertopo-agent", "-f", "-",
                             input=json.dumps(obj), kubeconfig=kubeconfig, check=False)  # fmt: skip


def test_an_agent_may_not_claim_another_node_in_its_own_object(installed: ControlPlane, unique: str) -> None:
    """The aggregator files a report under spec.nodeName, so the object's name alone proves nothing:
    node A writing its own object with spec.nodeName B, another Node as owner or a finalizer is
    refused (issue 22); its own clean object is admitted."""
    node_a, node_b = f"node-ida-{unique}", f"node-idb-{unique}"
    token = _agent_token_on(installed, node_a, unique)
    installed.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                              "metadata": {"name": node_b}}))  # fmt: skip
    uid_of = {n: json.loads(installed.kubectl("get", "node", n, "-o", "json").stdout)["metadata"]["uid"]
              for n in (node_a, node_b)}  # fmt: skip
    kubeconfig = installed.kubeconfig_for(token, f"identity-{unique}")
    own = node_topology_object(NodeReport(node_name=node_a, health={"host": ComponentHealth(Health.OK)}))

    def variant(spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
        return {**own, "metadata": {**own["metadata"], **meta}, "spec": {**own["spec"], **(spec or {})}}

    def owner(node: str, kind: str = "Node") -> dict[str, str]:
        return {"apiVersion": "v1", "kind": kind, "name": node, "uid": uid_of[node]}

    refused = {
        f"may report only its own node, not spec.nodeName {node_b}": variant({"nodeName": node_b}),
        "may name only its own Node as owner": variant(ownerReferences=[owner(node_b)]),
        "may name only its own Node as owner of": variant(ownerReferences=[owner(node_a, kind="Pod")]),
        "may not add finalizers": variant(finalizers=["example.com/pin"]),
    }
    deadline = time.monotonic() + 20  # the API server loads a policy change within seconds
    for message, obj in refused.items():
        proc = _apply_object_as(installed, kubeconfig, obj)
        while proc.returncode == 0 and time.monotonic() < deadline:
            installed.kubectl("delete", "ntopo", node_a, "--ignore-not-found")
            time.sleep(0.5)
            proc = _apply_object_as(installed, kubeconfig, obj)
        assert proc.returncode != 0, f"admitted: {message}"
        assert f"hypertopo-agent on node {node_a} {message}" in proc.stderr, proc.stderr
    assert installed.kubectl("get", "ntopo", node_a, check=False).returncode != 0  # nothing was written
    allowed = _apply_object_as(installed, kubeconfig, variant(ownerReferences=[owner(node_a)]))
    assert allowed.returncode == 0, allowed.stderr
    stored = json.loads(installed.kubectl("get", "ntopo", node_a, "-o", "json").stdout)
    assert stored["spec"]["nodeName"] == node_a and stored["metadata"]["ownerReferences"] == [owner(node_a)]


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
    """`namespace:` in a kustomize overlay of daemonset/agent/ moves the agent's ServiceAccount and
    its RBAC binding; the guard must move with them, not stay behind on hypertopo-agent."""
    namespace = f"ht-overlay-{unique}"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(REPO / "daemonset" / "agent", overlay)
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
    token = installed.kubectl("create", "token", "hypertopo-agent", "-n", AGENT_NS).stdout.strip()  # not pod-bound
    kubeconfig = installed.kubeconfig_for(token, f"unbound-{unique}")
    deadline = time.monotonic() + 20
    proc = _apply_as(installed, kubeconfig, f"node-x-{unique}")
    while proc.returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        proc = _apply_as(installed, kubeconfig, f"node-x-{unique}")
    assert proc.returncode != 0 and "token names no node" in proc.stderr


# Everything each ServiceAccount may do, exactly: cluster-wide, and in each namespace besides.
CLUSTER_RULES: dict[str, dict[str, set[str]]] = {
    "hypertopo-agent": {"nodetopologies.hypertopo.io": {"get", "create", "patch"}},
    "hypertopo-aggregator": {
        "nodetopologies.hypertopo.io": {"get", "list", "watch", "delete"},
        "nodetopologies.hypertopo.io/status": {"patch"},  # each node's probe plan (--measured-fabric)
        "nodes": {"get", "list", "watch"},  # patch only with components/node-marks
        "hypernodes.topology.volcano.sh": {"get", "list", "watch", "create", "patch", "update", "delete"},
        "hypernodes.topology.volcano.sh/status": {"get", "patch", "update"},
        "events": {"create", "patch"},
        "events.events.k8s.io": {"create", "patch"},
    },
    "hypertopo-scheduler": {
        "pods": {"get", "list", "watch", "delete"},
        "pods/binding": {"create"},
        "pods/eviction": {"create"},
        "pods/status": {"patch"},
        "nodes": {"get", "list", "watch"},
        "hypernodes.topology.volcano.sh": {"get", "list", "watch"},
        "podgroups.scheduling.x-k8s.io": {"get", "list", "watch", "patch"},  # annotations
        "podgroups.scheduling.x-k8s.io/status": {"get", "patch", "update"},
        "podgroups.scheduling.k8s.io": {"get", "list", "watch", "patch"},  # Kubernetes' own: annotations
        "podgroups.scheduling.k8s.io/status": {"patch"},  # its conditions, by strategic merge
        "podgroups.scheduling.volcano.sh": {"get", "list", "watch", "patch"},
        "queues.scheduling.volcano.sh": {"get", "list", "watch"},
        "jobs.batch.volcano.sh": {"get", "list", "watch"},
        "commands.bus.volcano.sh": {"create"},
        "events": {"create", "patch"},
        "events.events.k8s.io": {"create", "patch"},
        "configmaps": {"create", "patch"},  # a bound gang's hostfile, in the gang's namespace
    },
}
NAMESPACE_RULES: dict[str, dict[str, dict[str, set[str]]]] = {
    "hypertopo-agent": {},
    "hypertopo-aggregator": {NS: {"leases.coordination.k8s.io": {"get", "create", "update", "patch"}},
                             AGENT_NS: {"pods": {"get", "list", "watch"}}},
    "hypertopo-scheduler": {NS: {"leases.coordination.k8s.io": {"get", "create", "update"},
                                 "configmaps": {"get", "create", "patch"}}},  # the breaker's ConfigMap
}
DEFAULT_SELF_REVIEWS = {"selfsubjectreviews.authentication.k8s.io", "selfsubjectaccessreviews.authorization.k8s.io",
                        "selfsubjectrulesreviews.authorization.k8s.io"}  # fmt: skip
# What the API server itself grants every service account: from Kubernetes 1.37 (ClusterTrustBundle
# on by default) its bootstrap binding system:cluster-trust-bundle-discovery, read-only.
DEFAULT_SERVICE_ACCOUNT_GRANTS = {"clustertrustbundles.certificates.k8s.io": {"get", "list", "watch"}}


@pytest.mark.parametrize("account", sorted(CLUSTER_RULES))
def test_service_account_holds_exactly_the_listed_rules(installed: ControlPlane, account: str) -> None:
    defaults = {resource.split(".")[0] for resource in DEFAULT_SERVICE_ACCOUNT_GRANTS}
    assert not [rule for doc in rendered(installed) if doc["kind"] in ("ClusterRole", "Role") for rule in doc["rules"]
                if defaults & set(rule.get("resources", []))], "hypertopo grants what the test takes for a default"
    for namespace in (NS, AGENT_NS, "default"):
        out = installed.kubectl(
            "auth", "can-i", "--list", f"--as=system:serviceaccount:{NAMESPACE_OF[account]}:{account}", "-n", namespace
        ).stdout
        granted: dict[str, set[str]] = {}
        for line in out.splitlines()[1:]:
            if not line[:1].strip():
                continue  # non-resource URLs (discovery, health): granted to everyone
            resource, verbs = line.split()[0], line[line.rindex("[") + 1 : line.rindex("]")].split()
            if resource not in DEFAULT_SELF_REVIEWS and DEFAULT_SERVICE_ACCOUNT_GRANTS.get(resource) != set(verbs):
                granted.setdefault(resource, set()).update(verbs)
        want = {**CLUSTER_RULES[account]}
        for resource, extra in NAMESPACE_RULES[account].get(namespace, {}).items():
            want[resource] = want.get(resource, set()) | extra
        assert granted == want, f"{account} in {namespace}"


AGGREGATOR = f"--as=system:serviceaccount:{NS}:hypertopo-aggregator"
OWNER_LABELS = {"volcano.sh/network-topology-source": "hypertopo", "app.kubernetes.io/managed-by": "hypertopo"}


def _hypernode(name: str, labels: dict[str, str]) -> str:
    return json.dumps({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
                       "metadata": {"name": name, "labels": labels},
                       "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "n1"}}}]}})  # fmt: skip


def test_the_aggregator_may_write_only_hypernodes_labelled_as_hypertopos(installed: ControlPlane, unique: str) -> None:
    """RBAC grants every HyperNode; the admission policy narrows it to those carrying hypertopo's
    ownership labels before and after the write, so Volcano's own are out of reach."""
    ours, theirs, unlabelled = f"hn-ours-{unique}", f"hn-volcano-{unique}", f"hn-bare-{unique}"
    installed.kubectl("create", "-f", "-", input=_hypernode(theirs, {"volcano.sh/network-topology-source": "volcano"}))

    def as_aggregator(*args: str, data: str | None = None) -> Any:
        return installed.kubectl(*args, AGGREGATOR, input=data, check=False)

    deadline = time.monotonic() + 20  # the API server loads a new policy within seconds
    refused = as_aggregator("create", "-f", "-", data=_hypernode(unlabelled, {}))
    while refused.returncode == 0 and time.monotonic() < deadline:
        installed.kubectl("delete", "hypernode", unlabelled, "--ignore-not-found")
        time.sleep(0.5)
        refused = as_aggregator("create", "-f", "-", data=_hypernode(unlabelled, {}))
    assert refused.returncode != 0 and "hypertopo-aggregator may write only hypernodes labelled " in refused.stderr
    adopt = as_aggregator("label", "hypernode", theirs, "--overwrite", "volcano.sh/network-topology-source=hypertopo",
                          "app.kubernetes.io/managed-by=hypertopo")  # fmt: skip
    assert adopt.returncode != 0 and f"{theirs} is not hypertopo's" in adopt.stderr, adopt.stderr
    delete = as_aggregator("delete", "hypernode", theirs)
    assert delete.returncode != 0 and f"{theirs} is not hypertopo's" in delete.stderr, delete.stderr
    assert as_aggregator("create", "-f", "-", data=_hypernode(ours, OWNER_LABELS)).returncode == 0
    unlabel = as_aggregator("label", "hypernode", ours, "app.kubernetes.io/managed-by-")
    assert unlabel.returncode != 0 and "may write only hypernodes labelled" in unlabel.stderr, unlabel.stderr
    assert as_aggregator("delete", "hypernode", ours).returncode == 0
    assert installed.kubectl("get", "hypernode", theirs).returncode == 0  # Volcano's is untouched
    installed.kubectl("delete", "hypernode", theirs)


SCHEDULER = f"--as=system:serviceaccount:{NS}:hypertopo-scheduler"


def _configmap(namespace: str, name: str, labels: dict[str, str]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "data": {"hostfile": "n1 slots=8\n"},
                       "metadata": {"name": name, "namespace": namespace, "labels": labels}})


def test_the_scheduler_may_write_only_its_own_configmaps_outside_its_namespace(
    installed: ControlPlane, unique: str
) -> None:
    """RBAC grants ConfigMap create and patch everywhere (a gang's hostfile goes in the gang's
    namespace); the admission policy narrows it to ConfigMaps labelled as the scheduler's, before
    and after the write, so another workload's configuration stays out of its reach. In its own
    namespace (the breaker's state) RBAC alone decides."""
    namespace = f"cm-{unique}"
    installed.kubectl("create", "namespace", namespace)
    try:
        installed.kubectl("create", "-f", "-", input=_configmap(namespace, "theirs", {"team": "ml"}).replace("n1 slots", "n0 slots"))

        def as_scheduler(*args: str, data: str | None = None) -> Any:
            return installed.kubectl(*args, SCHEDULER, input=data, check=False)

        deadline = time.monotonic() + 20  # the API server loads a new policy within seconds
        refused = as_scheduler("create", "-f", "-", data=_configmap(namespace, "bare", {}))
        while refused.returncode == 0 and time.monotonic() < deadline:
            installed.kubectl("delete", "configmap", "bare", "-n", namespace, "--ignore-not-found")
            time.sleep(0.5)
            refused = as_scheduler("create", "-f", "-", data=_configmap(namespace, "bare", {}))
        assert refused.returncode != 0 and "hypertopo-scheduler may write only ConfigMaps labelled" in refused.stderr
        labels = {"app.kubernetes.io/managed-by": "hypertopo-scheduler"}

        def apply(name: str, labels: dict[str, str]) -> Any:  # a patch without a read (RBAC has no get)
            return as_scheduler("apply", "--server-side", "--force-conflicts", "--field-manager=test", "-f", "-",
                                data=_configmap(namespace, name, labels))  # fmt: skip

        for attempt, message in ((labels, "theirs is not hypertopo-scheduler's"),  # adopting it by the label
                                 ({"team": "ml"}, "may write only ConfigMaps labelled")):  # changing its data
            proc = apply("theirs", attempt)
            assert proc.returncode != 0 and message in proc.stderr, proc.stderr
        for _ in range(2):  # created, then patched
            written = apply("job-hostfile", labels)
            assert written.returncode == 0, written.stderr
        unlabel = apply("job-hostfile", {})  # the same field manager drops the label it set
        assert unlabel.returncode != 0 and "may write only ConfigMaps labelled" in unlabel.stderr, unlabel.stderr
        stored = json.loads(installed.kubectl("get", "configmap", "theirs", "-n", namespace, "-o", "json").stdout)
        assert stored["metadata"]["labels"] == {"team": "ml"} and stored["data"] == {"hostfile": "n0 slots=8\n"}
        breaker = f"breaker-{unique}"  # its own namespace: unlabelled, as the breaker writes its state
        made = as_scheduler("create", "-f", "-", data=_configmap(NS, breaker, {"app.kubernetes.io/part-of": "hypertopo"}))
        assert made.returncode == 0, made.stderr
        installed.kubectl("delete", "configmap", breaker, "-n", NS)
    finally:
        installed.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")


def test_with_node_marks_the_aggregator_may_change_only_hypertopos_marks_on_nodes(
    installed: ControlPlane, unique: str, tmp_path: Path
) -> None:
    """components/node-marks grants Node patch, and its policy keeps the aggregator's Node writes
    to hypertopo.io/ labels, annotations and taints: no other mark, no cordon."""
    overlay = node_marks_overlay(tmp_path / "node-marks")
    node = f"node-marks-{unique}"
    installed.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "labels": {"team": "ml"}}, "spec": {"taints": [
            {"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}))  # fmt: skip
    try:
        installed.kubectl("apply", "--server-side", "-k", str(overlay))

        def as_aggregator(*args: str) -> Any:
            return installed.kubectl(*args, AGGREGATOR, check=False)

        deadline = time.monotonic() + 20  # RBAC and the policy are loaded within seconds
        refused = as_aggregator("label", "node", node, "team=other", "--overwrite")
        while "may change only hypertopo.io/ labels" not in refused.stderr and time.monotonic() < deadline:
            installed.kubectl("label", "node", node, "team=ml", "--overwrite")
            time.sleep(0.5)
            refused = as_aggregator("label", "node", node, "team=other", "--overwrite")
        assert refused.returncode != 0 and f"may change only hypertopo.io/ labels on Node {node}" in refused.stderr
        for allowed in (("label", "node", node, "hypertopo.io/leaf=leaf-1"),
                        ("annotate", "node", node, "hypertopo.io/fabric-degraded=2024-01-01T00:00:00Z"),
                        ("taint", "node", node, "hypertopo.io/fabric-unhealthy=true:NoSchedule")):  # fmt: skip
            proc = as_aggregator(*allowed)
            assert proc.returncode == 0, proc.stderr
        for args, message in (
            (("label", "node", node, "team-"), "labels"),
            (("annotate", "node", node, "example.com/x=1"), "annotations"),
            (("taint", "node", node, "nvidia.com/gpu:NoSchedule-"), "taints"),
            (("cordon", node), "may not cordon"),
        ):
            proc = as_aggregator(*args)  # (kubectl cordon exits 0 when refused: the stored Node says)
            assert "denied request: hypertopo-aggregator" in proc.stderr and message in proc.stderr, (args, proc.stderr)
        stored = json.loads(installed.kubectl("get", "node", node, "-o", "json").stdout)
        assert stored["metadata"]["labels"]["team"] == "ml" and not stored["spec"].get("unschedulable")
        taints = {t["key"] for t in stored["spec"]["taints"]} - {"node.kubernetes.io/not-ready"}  # the API server's
        assert taints == {"nvidia.com/gpu", "hypertopo.io/fabric-unhealthy"}
    finally:  # the base again: no Node patch for the tests after this one
        for kind in ("clusterrolebinding", "clusterrole", "validatingadmissionpolicybinding",
                     "validatingadmissionpolicy"):  # fmt: skip
            installed.kubectl("delete", kind, "hypertopo-aggregator-node-marks", "--ignore-not-found")
        installed.kubectl("delete", "node", node, "--ignore-not-found")
