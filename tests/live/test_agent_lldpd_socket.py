"""The agent reading a host lldpd through its socket (`--lldpd-socket`, issue 23) is one Helm value
(`agent.lldpd`) and one kustomize component (`daemonset/components/lldpd-socket`): both mount the
socket's directory read-only, add the host's `_lldpd` GID to the pod's supplementalGroups and pass
the flag, and change nothing else (no capability). The GID has no default: Helm fails without it and
the component's placeholder is refused by the API server. And for real: the agent as a non-root user
whose only extra group is lldpd's reads a real lldpd's neighbours through a read-only bind mount of
the socket's directory, and is refused without that group."""

from __future__ import annotations

import contextlib
import copy
import grp
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.harness import ControlPlane
from realparts import missing, require_binary, require_root, stop_processes
from renders import docs, kustomize, server_dry_run

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hypertopo"
NS = "hypertopo-system"
AGENT = ("DaemonSet", "hypertopo-agent")
SOCKET = "/run/lldpd/lldpd.socket"
Docs = dict[tuple[str, str], dict[str, Any]]


def template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, "template", "hypertopo", str(CHART), "--namespace", NS, *args],
                          capture_output=True, text=True, check=False, timeout=120)  # fmt: skip


def rendered(helm: str, *args: str) -> Docs:
    proc = template(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return docs(proc.stdout)


def readme_overlay() -> tuple[str, str]:
    """(directory, kustomization text) of docs/install.md's lldpd-socket overlay block."""
    readme = (REPO / "docs" / "install.md").read_text()
    block = re.search(r"```yaml\n# (\S+)/kustomization\.yaml, next to daemonset/[^\n]*\n"
                      r"((?:(?!```).)*components/lldpd-socket.*?)```", readme, re.S)  # fmt: skip
    assert block, "docs/install.md has no overlay block for the lldpd-socket component"
    return block.group(1), block.group(2)


def write_overlay(root: Path, name: str, text: str) -> Path:
    (root / "daemonset").symlink_to(REPO / "daemonset")
    (root / name).mkdir()
    (root / name / "kustomization.yaml").write_text(text)
    return root / name


@pytest.fixture
def overlay(tmp_path: Path) -> Path:
    """The README's overlay directory, next to (a link to) this checkout's daemonset/."""
    return write_overlay(tmp_path, *readme_overlay())


def without_lldpd(agent: dict[str, Any], gid: int) -> dict[str, Any]:
    """`agent` with exactly the socket's mount, group and flag taken out (each asserted present)."""
    agent = copy.deepcopy(agent)
    pod = agent["spec"]["template"]["spec"]
    assert pod.pop("securityContext") == {"supplementalGroups": [gid]}
    container = pod["containers"][0]
    assert container["args"].pop() == f"--lldpd-socket={SOCKET}"
    assert container["volumeMounts"].pop() == {"name": "lldpd", "mountPath": "/run/lldpd", "readOnly": True}
    assert pod["volumes"].pop() == {"name": "lldpd", "hostPath": {"path": "/run/lldpd", "type": "Directory"}}
    return agent


def test_helms_lldpd_value_mounts_the_socket_directory_read_only_adds_the_group_and_passes_the_flag(
    helm: str,
) -> None:
    base = rendered(helm)
    assert "securityContext" not in base[AGENT]["spec"]["template"]["spec"]
    assert not any("lldpd" in arg for arg in base[AGENT]["spec"]["template"]["spec"]["containers"][0]["args"])
    patched = rendered(helm, "--set", "agent.lldpd.enabled=true", "--set", "agent.lldpd.gid=107")
    assert without_lldpd(patched.pop(AGENT), 107) == base.pop(AGENT)  # the container's securityContext too
    assert patched == base


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ([], "agent.lldpd.gid: required with agent.lldpd.enabled"),
        (["--set", "agent.lldpd.gid=_lldpd"], "agent.lldpd.gid: _lldpd is not a group ID"),
        (["--set", "agent.lldpd.gid=107", "--set", "agent.lldpd.socket=/run/lldpd.socket"],
         "agent.lldpd.socket: /run/lldpd.socket is in /run, which would be mounted whole"),
        (["--set", "agent.lldpd.gid=107", "--set", "agent.lldpd.socket=lldpd.socket"],
         'agent.lldpd.socket: "lldpd.socket" is not an absolute path'),
    ],
)  # fmt: skip
def test_helm_refuses_the_lldpd_value_without_a_gid_or_with_a_shared_directory(
    helm: str, values: list[str], error: str
) -> None:
    proc = template(helm, "--set", "agent.lldpd.enabled=true", *values)
    assert proc.returncode != 0
    assert error in proc.stderr


def readme_gid(text: str) -> int:
    gid = yaml.safe_load(yaml.safe_load(text)["patches"][0]["patch"])[0]["value"]
    assert isinstance(gid, int)
    return gid


def test_the_readme_overlay_renders_helms_agent_and_changes_nothing_else(
    helm: str, kubectl: str, overlay: Path
) -> None:
    gid = readme_gid((overlay / "kustomization.yaml").read_text())
    patched = kustomize(kubectl, overlay)
    base = kustomize(kubectl, REPO / "daemonset")
    helms = rendered(helm, "--set", "agent.lldpd.enabled=true", "--set", f"agent.lldpd.gid={gid}")[AGENT]
    assert patched[AGENT] == helms
    assert without_lldpd(patched.pop(AGENT), gid) == base.pop(AGENT)
    assert patched == base


@pytest.mark.apiserver
def test_the_api_server_accepts_the_overlay_and_refuses_the_component_whose_gid_is_not_set(
    apiserver: ControlPlane, kubectl: str, overlay: Path, tmp_path: Path
) -> None:
    proc = server_dry_run(apiserver, kubectl, overlay)
    assert proc.returncode == 0, proc.stderr
    assert "daemonset.apps/hypertopo-agent serverside-applied (server dry run)" in proc.stdout
    name, text = readme_overlay()
    (tmp_path / "unset").mkdir()
    unset = write_overlay(tmp_path / "unset", name, text.split("patches:")[0])  # the component alone
    proc = apiserver.kubectl("apply", "--server-side", "--dry-run=server", "-k", str(unset), check=False)
    assert proc.returncode != 0
    assert "spec.template.spec.securityContext.supplementalGroups[0]: Invalid value: -1" in proc.stderr


# --- a real lldpd, read by the agent as a non-root user with and without lldpd's group ---------------


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=10)


def _wait_until(probe: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.2)
    return probe()


@pytest.fixture(scope="module")
def host_lldpd() -> Iterator[tuple[Path, Path]]:
    """(socket directory, directory holding a non-setuid lldpcli): a host lldpd in a network
    namespace whose veth peer runs a second lldpd playing the switch `leaf-sw1`."""
    require_root()
    ip, lldpd, lldpcli = require_binary("ip"), require_binary("lldpd"), require_binary("lldpcli")
    require_binary("unshare")
    require_binary("setpriv")
    suffix = uuid.uuid4().hex[:6]
    work = Path(tempfile.mkdtemp(prefix="htls-"))  # short: the socket path must fit in sun_path
    work.chmod(0o755)
    # Debian's lldpcli is setuid _lldpd and runs only for group adm; the image's is a plain build
    # of the same client (Dockerfile), which a copy (setuid bit dropped) stands for.
    (work / "bin").mkdir()
    shutil.copy(lldpcli, work / "bin" / "lldpcli")
    (work / "bin" / "lldpcli").chmod(0o755)
    namespaces = {"host": f"htlsh-{suffix}", "switch": f"htlss-{suffix}"}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for ns in namespaces.values():
            _run(ip, "netns", "add", ns)
        _run(ip, "link", "add", "swp1", "netns", namespaces["switch"], "type", "veth",
             "peer", "name", "eth0", "netns", namespaces["host"])  # fmt: skip
        for role, ns in namespaces.items():
            for link in ("lo", "swp1" if role == "switch" else "eth0"):
                _run(ip, "-n", ns, "link", "set", link, "up")
            (work / role).mkdir()
            (work / role).chmod(0o755)
            config = work / f"{role}.conf"
            config.write_text(f"configure system hostname {'leaf-sw1' if role == 'switch' else 'gpu-node-1'}\n"
                              "configure lldp tx-interval 1\n")  # fmt: skip
            log = (work / f"{role}.log").open("w")
            processes.append(subprocess.Popen(
                [ip, "netns", "exec", ns, lldpd, "-d", "-u", str(work / role / "lldpd.socket"),
                 "-O", str(config), "-L", lldpcli], stdout=log, stderr=subprocess.STDOUT))  # fmt: skip

        def heard() -> bool:
            out = subprocess.run([lldpcli, "-u", str(work / "host" / "lldpd.socket"), "-f", "json0", "show",
                                  "neighbors"], capture_output=True, text=True, timeout=5, check=False)  # fmt: skip
            return "leaf-sw1" in out.stdout

        assert _wait_until(heard, 15), "\n".join(p.read_text() for p in work.glob("*.log"))
        yield work / "host", work / "bin"
    finally:
        stop_processes(processes, timeout=5)
        for ns in namespaces.values():  # deleting a namespace also deletes its end of the veth pair
            subprocess.run([ip, "netns", "del", ns], capture_output=True, timeout=10, check=False)
        shutil.rmtree(work, ignore_errors=True)


def agent_lldp_as_nobody(socket_dir: Path, bin_dir: Path, groups: str) -> dict[str, Any]:
    """The agent's NodeTopology, run as in the pod: the socket's directory bind-mounted read-only
    at /run/lldpd (a mount namespace of its own), then uid/gid 65534, no capabilities, no new
    privileges and `groups` (setpriv's --groups=GID or --clear-groups) as its only extra groups."""
    agent = Path(sys.executable).parent / "hypertopo-agent"
    script = (
        f"mount --bind {socket_dir} /run/lldpd && mount -o remount,bind,ro /run/lldpd && "
        f"exec setpriv --reuid=65534 --regid=65534 {groups} --no-new-privs --inh-caps=-all "
        f"--bounding-set=-all {agent} probe --nvml off --format json --lldpd-socket={SOCKET}"
    )
    with contextlib.suppress(FileExistsError):
        Path("/run/lldpd").mkdir(mode=0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60, env=env, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report: dict[str, Any] = json.loads(proc.stdout)["spec"]
    return report


@pytest.mark.netns
def test_the_agent_without_root_reads_lldpd_through_a_read_only_mount_only_with_lldpds_group(
    host_lldpd: tuple[Path, Path],
) -> None:
    socket_dir, bin_dir = host_lldpd
    try:
        gid = grp.getgrnam("_lldpd").gr_gid
    except KeyError:
        missing("no _lldpd group (Debian's lldpd package creates it)")
    assert (socket_dir / "lldpd.socket").stat().st_gid == gid
    joined = agent_lldp_as_nobody(socket_dir, bin_dir, f"--groups={gid}")
    assert joined["health"]["lldp"] == {"state": "ok", "reason": ""}
    assert [n["systemName"] for n in joined["lldp"]] == ["leaf-sw1"], joined["lldp"]
    refused = agent_lldp_as_nobody(socket_dir, bin_dir, "--clear-groups")
    assert refused["health"]["lldp"]["state"] == "degraded"
    assert f"unable to connect to socket {SOCKET}: Permission denied" in refused["health"]["lldp"]["reason"]
    assert refused["lldp"] == []
