"""The `hypertopo-agent` command line: probe prints the NodeTopology object (absent hardware exits 0),
--model prints a modelled node's report, --help explains every flag, bad usage exits 2 in one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from agent_host import HGX_SYSFS, lldp_frame
from realparts import require_binary, require_root

from agent.common.report import API_GROUP, API_VERSION, KIND

REPO = Path(__file__).resolve().parents[2]
MODEL = """
switches:
  spine1: {switches: [leaf1, leaf2]}
blocks:
  - switch: leaf1
    nodes: ["gb[1-18]"]
    annotations: {accelerator.topology.test/domain: nvl72-a}
  - switch: leaf2
    nodes: ["h[1-4]"]
"""


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "agent", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)


def test_probe_on_this_machine_exits_0_and_says_gpus_and_rdma_are_absent() -> None:
    proc = agent("probe", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["apiVersion"] == f"{API_GROUP}/{API_VERSION}" and obj["kind"] == KIND
    health = obj["spec"]["health"]
    assert health["nvml"]["state"] == "absent" and health["nvml"]["reason"]
    assert health["rdma"]["state"] == "absent" and health["rdma"]["reason"]
    assert health["net"]["state"] in ("ok", "absent")  # absent only on a host with nothing but lo
    assert bool(obj["spec"]["interfaces"]) == (health["net"]["state"] == "ok")
    assert "nvml=absent" in proc.stderr


def test_probe_with_the_fake_and_a_fixture_tree_prints_yaml_with_gpus_and_hcas() -> None:
    proc = agent("probe", "--nvml", "fake:hgx-h100", "--sysfs", str(HGX_SYSFS), "--node-name", "n1")
    assert proc.returncode == 0, proc.stderr
    obj = yaml.safe_load(proc.stdout)
    assert obj["metadata"]["name"] == "n1"
    assert obj["spec"]["summary"]["gpus"] == 8 and obj["spec"]["summary"]["rdmaPortsUp"] == 8
    assert all(len(gpu["nvlinks"]) == 18 for gpu in obj["spec"]["nvml"]["gpus"])


def test_probe_exits_1_when_a_probe_failed_and_still_prints_the_object(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "infiniband").write_text("")  # a file where a directory must be
    proc = agent("probe", "--sysfs", str(tmp_path), "--nvml", "fake:gb200-nvl72", "--format", "json")
    health = json.loads(proc.stdout)["spec"]["health"]
    assert health["rdma"]["state"] == "failed" and "cannot list RDMA devices" in health["rdma"]["reason"]
    assert health["nvml"]["state"] == "ok"
    assert proc.returncode == 1
    assert "probe failed for: rdma" in proc.stderr


def test_probe_with_a_sysfs_root_that_is_not_mounted_says_rdma_failed_not_absent(tmp_path: Path) -> None:
    root = tmp_path / "host" / "sys"  # --sysfs points where the host's /sys was never mounted
    proc = agent("probe", "--sysfs", str(root), "--nvml", "off", "--format", "json")
    rdma = json.loads(proc.stdout)["spec"]["health"]["rdma"]
    assert rdma == {"state": "failed", "reason": f"host sysfs root missing: {root} does not exist "
                    "(is the host's /sys mounted there? see --sysfs)"}  # fmt: skip
    assert proc.returncode == 1 and "probe failed for: rdma" in proc.stderr


def test_probe_without_cap_net_raw_says_lldp_failed_and_why(unique: str) -> None:
    """The DaemonSet adds NET_RAW; a container without it must not report LLDP as fine."""
    require_root()
    ip, setpriv = require_binary("ip"), require_binary("setpriv")
    dummy, peer = f"htd{unique}a", f"htd{unique}b"
    subprocess.run([ip, "link", "add", dummy, "type", "veth", "peer", "name", peer], check=True, timeout=10)
    try:
        subprocess.run([ip, "link", "set", dummy, "up"], check=True, timeout=10)
        no_net_raw = [setpriv, "--bounding-set=-net_raw", "--inh-caps=-net_raw", "--"]
        argv = [*no_net_raw, sys.executable, "-m", "agent", "probe", "--format", "json", "--nvml", "off",
                "--interfaces", f"^{dummy}$", "--lldp-wait", "0.5"]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    finally:
        subprocess.run([ip, "link", "del", dummy], capture_output=True, timeout=10, check=False)
    lldp = json.loads(proc.stdout)["spec"]["health"]["lldp"]
    assert lldp["state"] == "failed", lldp
    assert lldp["reason"].startswith(f"cannot listen on {dummy}: Operation not permitted")
    assert "CAP_NET_RAW" in lldp["reason"]
    assert proc.returncode == 1 and "probe failed for: lldp" in proc.stderr


def test_probe_model_prints_the_report_a_modelled_node_would_publish(tmp_path: Path) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(MODEL)
    proc = agent("probe", "--model", str(model), "--node", "gb7", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    spec = json.loads(proc.stdout)["spec"]
    assert spec["nodeName"] == "gb7" and spec["summary"]["gpus"] > 0
    assert spec["nvml"]["domain"]["state"] == "completed"
    assert any(n.get("systemName") == "leaf1" for n in spec["lldp"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["probe", "--model", "MODEL", "--node", "nobody"], "is not in model"),
        (["probe", "--model", "MODEL"], "--model needs --node"),
        (["probe", "--node", "gb1"], "--node is only used with --model"),
    ],
)
def test_model_usage_errors_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(MODEL)
    proc = agent(*[str(model) if a == "MODEL" else a for a in args])
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read model"), ("switches: [1, 2\n", "is not valid YAML"), ("switches: 7\n", "model.yaml")],
)
def test_a_model_file_that_cannot_be_used_exits_1_with_one_line(
    tmp_path: Path, content: str | None, message: str
) -> None:
    model = tmp_path / "model.yaml"
    if content is not None:
        model.write_text(content)
    proc = agent("probe", "--model", str(model), "--node", "gb1")
    assert proc.returncode == 1, proc.stderr  # input, not usage (issue 13)
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["probe", "--bogus"], "unrecognized arguments: --bogus"),
        (["probe", "--nvml", "on"], "--nvml must be auto, off or fake:PROFILE"),
        (["probe", "--nvml", "fake:dgx-z9"], "unknown NVML fake profile 'dgx-z9'"),
        (["probe", "--interfaces", "eth[0"], "not a valid regular expression"),
        (["probe", "--lldp-wait", "-1"], "must not be negative"),
        (["probe", "--format", "xml"], "invalid choice: 'xml'"),
        (["run"], "the following arguments are required: --node-name"),
        (["run", "--node-name", "n1", "--interval", "0"], "must be greater than zero"),
        (["run", "--node-name", "n1", "--listen", "nowhere"], "--listen must be HOST:PORT"),
        ([], "the following arguments are required"),
    ],
)
def test_bad_usage_exits_2_with_a_message(args: list[str], message: str) -> None:
    proc = agent(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ([], ["probe", "run", "--log-level"]),
        (
            ["probe"],
            ["--format", "--sysfs", "--procfs", "--nvml", "--interfaces", "--lldp-wait", "--model", "--node"],
        ),
        (
            ["run"],
            [
                "--node-name",
                "--kubeconfig",
                "--interval",
                "--listen",
                "--ready-grace",
                "--verify-interval",
                "--nvml",
            ],
        ),
    ],
)
def test_help_explains_every_flag(command: list[str], flags: list[str]) -> None:
    proc = agent(*command, "--help")
    assert proc.returncode == 0
    for flag in flags:
        assert flag in proc.stdout, flag
    assert "default" in proc.stdout


def test_console_script_is_installed_and_runs() -> None:
    proc = subprocess.run(
        ["hypertopo-agent", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and "NodeTopology" in proc.stdout


@pytest.mark.netns
def test_probe_lldp_wait_reports_the_switch_heard_on_a_veth(unique: str) -> None:
    require_root()
    ip = require_binary("ip")
    a, b = f"htv{unique}a", f"htv{unique}b"
    subprocess.run([ip, "link", "add", a, "type", "veth", "peer", "name", b], check=True, timeout=10)
    stop = threading.Event()
    try:
        for name in (a, b):
            subprocess.run([ip, "link", "set", name, "up"], check=True, timeout=10)

        def switch() -> None:  # plays the switch: one LLDPDU on the far end every 100 ms
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
                sock.bind((b, 0))
                while not stop.wait(0.1):
                    sock.send(lldp_frame(system_name=f"leaf-{unique}", port="swp12"))

        threading.Thread(target=switch, daemon=True).start()
        proc = agent(
            "probe", "--format", "json", "--nvml", "off", "--interfaces", f"^{a}$", "--lldp-wait", "1"
        )
    finally:
        stop.set()
        subprocess.run([ip, "link", "del", a], capture_output=True, timeout=10, check=False)
    assert proc.returncode == 0, proc.stderr
    lldp = json.loads(proc.stdout)["spec"]["lldp"]
    assert [(n["interface"], n["systemName"], n["portId"]) for n in lldp] == [(a, f"leaf-{unique}", "swp12")]


def test_run_without_any_kubernetes_configuration_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    argv = [sys.executable, "-m", "agent", "run", "--node-name", "n1", "--nvml", "off"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, env=env, check=False)
    assert proc.returncode == 2
    assert "no usable Kubernetes configuration" in proc.stderr


def test_run_on_a_taken_listen_address_exits_1_with_the_reason(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = agent(
            "run",
            "--node-name",
            "n1",
            "--nvml",
            "off",
            "--kubeconfig",
            str(kubeconfig),
            "--listen",
            f"127.0.0.1:{port}",
        )
    assert proc.returncode == 1
    assert "cannot run" in proc.stderr and "Address already in use" in proc.stderr
