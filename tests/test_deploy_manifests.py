"""The deployment in daemonset/ is real: it applies to a real API server, every ServiceAccount has
exactly the access it needs, and the admission policy confines each agent to its own node."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane

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
        ("patch", "nodetopologies.hypertopo.io", None, False),
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
        ("update", "leases.coordination.k8s.io", NS, False),
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


def _agent_token_on(installed: ControlPlane, node: str, unique: str) -> str:
    installed.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"agent-{node}", "namespace": NS},
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
        NS,
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
        "nodetopologies.hypertopo.io": {"get", "list", "watch"},
        "nodes": {"get", "list", "watch", "patch"},
        "hypernodes.topology.volcano.sh": {"get", "list", "watch", "create", "patch", "update", "delete"},
        "hypernodes.topology.volcano.sh/status": {"get", "patch", "update"},
        "events": {"create", "patch"},
        "events.events.k8s.io": {"create", "patch"},
        "leases.coordination.k8s.io": {"get", "create", "update", "patch"},
        "pods": {"get", "list", "watch"},
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
