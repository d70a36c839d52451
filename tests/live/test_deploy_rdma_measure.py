"""Measuring the fabric over RDMA (issue 27.1) is opt-in: one Helm value (`agent.rdmaMeasure`) and
one kustomize component (`daemonset/components/rdma-measure`, with docs/install.md's overlay).
Both give the agent, and nothing else, what perftest needs: the host's /dev/infiniband read-write,
CAP_IPC_LOCK beside NET_RAW (memory registration past the memlock limit), the two flags, and where
asked the RDMA device plugin's resource. Off, the render is the default one (tests/live/test_helm_chart.py
holds that to `kubectl kustomize daemonset/`); bad values fail the chart with the reason; the API
server accepts the overlay in the agent's namespace (Pod Security `privileged`)."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane
from renders import docs, kustomize, server_dry_run

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hypertopo"
NS = "hypertopo-system"
AGENT = ("DaemonSet", "hypertopo-agent")
RESOURCE = "rdma/rdma_shared_device_a"
Docs = dict[tuple[str, str], dict[str, Any]]


def template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, "template", "hypertopo", str(CHART), "--namespace", NS, *args],
                          capture_output=True, text=True, check=False, timeout=120)  # fmt: skip


def rendered(helm: str, *args: str) -> Docs:
    proc = template(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return docs(proc.stdout)


def on(*values: str) -> list[str]:
    args = ["--set", "agent.rdmaMeasure.enabled=true"]
    for value in values:
        args += ["--set", value]
    return args


def without_rdma(agent: dict[str, Any], args: list[str], resource: str | None) -> dict[str, Any]:
    """`agent` with exactly RDMA's additions taken out, each asserted present and last in its list."""
    agent = copy.deepcopy(agent)
    pod = agent["spec"]["template"]["spec"]
    container = pod["containers"][0]
    taken = [container["args"].pop() for _ in args][::-1]
    assert sorted(taken) == sorted(args)  # the chart and the overlay may order the two flags apart
    assert container["securityContext"]["capabilities"]["add"].pop() == "IPC_LOCK"
    assert container["volumeMounts"].pop() == {"name": "infiniband", "mountPath": "/dev/infiniband"}
    assert pod["volumes"].pop() == {"name": "infiniband", "hostPath": {"path": "/dev/infiniband", "type": "Directory"}}
    if resource is not None:
        assert container["resources"]["limits"].pop(resource) == "1"
    return agent


def test_rdma_is_off_by_default_and_the_agent_gets_no_device_nor_ipc_lock(helm: str) -> None:
    container = rendered(helm)[AGENT]["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}
    assert [m["name"] for m in container["volumeMounts"]] == ["sys"]
    assert not any(arg.startswith("--measure") for arg in container["args"])
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}


@pytest.mark.parametrize(
    ("values", "flags", "resource"),
    [
        (["agent.rdmaMeasure.fabric=ib0"], ["--measure-transport=auto", "--measure-fabric=ib0"], None),
        (["agent.rdmaMeasure.fabric=10.77.0.1", "agent.rdmaMeasure.transport=rdma", f"agent.rdmaMeasure.resource={RESOURCE}"],
         ["--measure-transport=rdma", "--measure-fabric=10.77.0.1"], RESOURCE),
    ],
)  # fmt: skip
def test_helms_rdma_value_adds_the_devices_ipc_lock_and_the_flags_to_the_agent_and_nothing_else(
    helm: str, values: list[str], flags: list[str], resource: str | None
) -> None:
    base = rendered(helm)
    patched = rendered(helm, *on(*values))
    assert without_rdma(patched.pop(AGENT), flags, resource) == base.pop(AGENT)
    assert patched == base


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ([], 'agent.rdmaMeasure.fabric: "" is not an interface name or address (required'),
        (["agent.rdmaMeasure.fabric=ib0 --x"], 'agent.rdmaMeasure.fabric: "ib0 --x" is not an interface name'),
        (["agent.rdmaMeasure.fabric=ib0", "agent.rdmaMeasure.transport=udp"],
         'agent.rdmaMeasure.transport: "udp" is not auto or rdma'),
        (["agent.rdmaMeasure.fabric=ib0", "agent.rdmaMeasure.resource=rdma"],
         'agent.rdmaMeasure.resource: "rdma" is not an extended resource name'),
    ],
)  # fmt: skip
def test_helm_refuses_the_rdma_value_without_a_fabric_or_with_a_bad_transport_or_resource(
    helm: str, values: list[str], error: str
) -> None:
    proc = template(helm, *on(*values))
    assert proc.returncode != 0
    assert error in proc.stderr


def docs_overlay() -> tuple[str, str]:
    """(directory, kustomization text) of docs/install.md's rdma-measure overlay block."""
    page = (REPO / "docs" / "install.md").read_text()
    block = re.search(r"```yaml\n# (\S+)/kustomization\.yaml, next to daemonset/[^\n]*\n"
                      r"((?:(?!```).)*components/rdma-measure.*?)```", page, re.S)  # fmt: skip
    assert block, "docs/install.md has no overlay block for the rdma-measure component"
    return block.group(1), block.group(2)


@pytest.fixture
def overlay(tmp_path: Path) -> Path:
    """docs/install.md's overlay directory, next to (a link to) this checkout's daemonset/."""
    name, text = docs_overlay()
    (tmp_path / "daemonset").symlink_to(REPO / "daemonset")
    (tmp_path / name).mkdir()
    (tmp_path / name / "kustomization.yaml").write_text(text)
    return tmp_path / name


def overlay_choices(text: str) -> tuple[str, str]:
    """(--measure-fabric value, resource name) the docs overlay's patch sets."""
    ops = yaml.safe_load(yaml.safe_load(text)["patches"][0]["patch"])
    fabric = next(op["value"] for op in ops if str(op["value"]).startswith("--measure-fabric="))
    resource = next(op["path"] for op in ops if "/resources/limits/" in op["path"])
    return fabric.split("=", 1)[1], resource.rsplit("/", 1)[1].replace("~1", "/")


def test_the_docs_overlay_renders_helms_agent_and_changes_nothing_else(
    helm: str, kubectl: str, overlay: Path
) -> None:
    fabric, resource = overlay_choices((overlay / "kustomization.yaml").read_text())
    patched = kustomize(kubectl, overlay)
    base = kustomize(kubectl, REPO / "daemonset")
    helms = rendered(helm, *on(f"agent.rdmaMeasure.fabric={fabric}", f"agent.rdmaMeasure.resource={resource}"))
    assert patched[AGENT] == helms[AGENT]
    flags = ["--measure-transport=auto", f"--measure-fabric={fabric}"]
    assert without_rdma(patched.pop(AGENT), flags, resource) == base.pop(AGENT)
    assert patched == base


def test_the_component_alone_adds_only_the_devices_ipc_lock_and_auto(kubectl: str, tmp_path: Path) -> None:
    (tmp_path / "daemonset").symlink_to(REPO / "daemonset")
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../daemonset]\n"
        "components: [../daemonset/components/rdma-measure]\n"
    )
    patched = kustomize(kubectl, tmp_path / "only")
    base = kustomize(kubectl, REPO / "daemonset")
    assert without_rdma(patched.pop(AGENT), ["--measure-transport=auto"], None) == base.pop(AGENT)
    assert patched == base


@pytest.mark.apiserver
def test_the_api_server_accepts_the_docs_overlay_and_helms_rdma_render(
    apiserver: ControlPlane, kubectl: str, helm: str, overlay: Path, tmp_path: Path
) -> None:
    proc = server_dry_run(apiserver, kubectl, overlay)
    assert proc.returncode == 0, proc.stderr
    assert "daemonset.apps/hypertopo-agent serverside-applied (server dry run)" in proc.stdout
    render = template(helm, *on("agent.rdmaMeasure.fabric=ib0", f"agent.rdmaMeasure.resource={RESOURCE}"))
    assert render.returncode == 0, render.stderr
    agent_only = tmp_path / "agent.yaml"
    agent_only.write_text(yaml.safe_dump(docs(render.stdout)[AGENT]))
    proc = apiserver.kubectl("apply", "--server-side", "--dry-run=server", "-f", str(agent_only), check=False)
    assert proc.returncode == 0, proc.stderr
