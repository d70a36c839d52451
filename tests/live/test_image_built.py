"""The image that ships, built from the Dockerfile unchanged (tests/image/build.sh, podman over a
local Debian base where no registry can be reached), runs its three commands and probes a node.
It is checked inside its own root filesystem (`podman image mount` + chroot, with /proc and /sys
mounted as in a container, as the image's user 65532): on the CI machine podman's runtime cannot start a container
(cgroup v1 with v2 beside it; the real-node tests run it through containerd and runc instead)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from realnode.node import built
from realparts import require_binary, require_root

from agent.adapters.rdma_probe import BANDWIDTH, LATENCY, perftest_argv
from agent.measure_transport import RdmaEndpoint

pytestmark = pytest.mark.timeout(1800)
COMMANDS = ("hypertopo-agent", "hypertopo-aggregator", "hypertopo-scheduler")
TARGET_BYTES = 250_000_000


@pytest.fixture(scope="module")
def image() -> str:
    require_root()
    require_binary("podman")
    return built("tests/image/build.sh", "the project's image")


@pytest.fixture(scope="module")
def rootfs(image: str) -> Iterator[str]:
    path = subprocess.run(["podman", "image", "mount", image], capture_output=True, text=True, check=True).stdout
    try:
        yield path.strip()
    finally:
        subprocess.run(["podman", "image", "unmount", image], capture_output=True, check=False)


def in_image(rootfs: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/opt/hypertopo/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    # the host's /proc and a sysfs, as a container has them, in a mount namespace that ends with it
    script = 'mount -t proc proc "$0/proc" && mount -t sysfs sysfs "$0/sys" && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, rootfs,
            require_binary("chroot"), "--userspec=65532:65532", rootfs, *argv]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_the_image_is_under_its_size_target_and_prints_its_size(image: str) -> None:
    inspect = json.loads(subprocess.run(["podman", "image", "inspect", image], capture_output=True, text=True,
                                        check=True).stdout)[0]  # fmt: skip
    history = subprocess.run(["podman", "history", "--format", "{{.Size}}\t{{.CreatedBy}}", image],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    print(f"\nimage {image}: {inspect['Size'] / 1e6:.1f} MB (target < {TARGET_BYTES / 1e6:.0f} MB)\n{history}")
    assert inspect["Config"]["User"] == "65532"
    assert inspect["Size"] < TARGET_BYTES


@pytest.mark.parametrize("command", COMMANDS)
def test_each_console_script_runs_in_the_image(rootfs: str, command: str) -> None:
    proc = in_image(rootfs, command, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == [command, "0.1.0"]


def test_the_agent_in_the_image_probes_a_fake_hgx_node(rootfs: str) -> None:
    proc = in_image(rootfs, "hypertopo-agent", "probe", "--nvml", "fake:hgx-h100", "--node-name", "hgx-1",
                    "--format", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["kind"], report["spec"]["nodeName"]) == ("NodeTopology", "hgx-1")
    assert report["spec"]["summary"]["gpus"] == 8
    assert len(report["spec"]["nvml"]["gpus"]) == 8


@pytest.mark.parametrize("kind", [LATENCY, BANDWIDTH])
def test_the_images_perftest_loads_its_verbs_libraries_and_parses_the_agents_command_line(
    rootfs: str, kind: int
) -> None:
    """The image's perftest (the measured fabric's RDMA transport) runs as the image's user with the
    libraries it links (libibverbs, librdmacm, the providers): on the adapter's own command line it
    gets past the loader and its parser and stops only at finding a device (this host has none)."""
    argv = perftest_argv(kind, RdmaEndpoint("mlx5_0", 1, 3, "Ethernet"), 21, 9732, bind=None, peer="10.77.0.2")
    proc = in_image(rootfs, *argv)
    output = proc.stdout + proc.stderr
    assert "error while loading shared libraries" not in output and proc.returncode != 127, output
    assert "Unable to find the Infiniband/RoCE device" in output, output
    assert "Invalid Command" not in output


def test_the_agent_in_the_image_finds_both_perftest_tools_on_its_path(rootfs: str) -> None:
    """`--measure-transport auto` takes RDMA only with both tools on PATH (agent.measure_transport):
    in the image that check finds them, so only the pod's devices decide."""
    proc = in_image(rootfs, "python", "-c",
                    "from agent.measure_transport import missing_tools; print(missing_tools())")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
