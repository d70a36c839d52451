"""Volcano's own scheduler and controller manager against a test control plane, for tests in which
the real vc-scheduler consumes what hypertopo writes.

The binaries and Volcano's CRDs come from tests/controlplane/volcano/build_volcano.sh (volcano.sh/
volcano v1.14.1, built once and cached in ~/.cache/hypertopo/volcano); the harness applies the CRDs
to every control plane it starts. A missing build goes through realparts.missing(): a skip outside
CI, a failure under HYPERTOPO_REQUIRE_REAL=1.

    with volcano_running(plane, controller_manager=True) as vc:
        ...  # PodGroups / pods with schedulerName "volcano" are placed by the real vc-scheduler
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from controlplane.harness import ControlPlane, ControlPlaneError, build_volcano
from realparts import free_port, missing, stop_processes

SCHEDULER_NAME = "volcano"  # vc-scheduler's default --scheduler-name, what Volcano users write
# Volcano's Helm default (installer/helm/chart/volcano/config/volcano-scheduler.conf) plus the
# network-topology-aware plugin, which places hard/soft `networkTopology` gangs inside HyperNodes and
# scores HyperNodes by how full they would be (GPUs counted too, as on a GPU cluster).
DEFAULT_CONF: dict[str, Any] = {
    "actions": "enqueue, allocate, backfill",
    "tiers": [
        {"plugins": [
            {"name": "priority"},
            {"name": "gang", "enablePreemptable": False},
            {"name": "conformance"},
        ]},
        {"plugins": [
            {"name": "overcommit"},
            {"name": "drf", "enablePreemptable": False},
            {"name": "predicates"},
            {"name": "proportion"},
            {"name": "nodeorder"},
            {"name": "binpack"},
            {"name": "network-topology-aware", "arguments": {
                "weight": 10,
                "hypernode.binpack.resources": "nvidia.com/gpu",
                "hypernode.binpack.resources.nvidia.com/gpu": 10,
            }},
        ]},
    ],
}
# The controller manager's default set less the JobFlow controllers: their CRDs (flow.volcano.sh)
# live outside config/crd/volcano/bases, so the harness does not install them.
CONTROLLERS = "*,-sharding-controller,-jobflow-controller,-jobtemplate-controller"
SCHEDULER_READY = "Scheduler completes Initialization and start to run"
# What vc-controller-manager logs once a controller's informers have synced; a disabled controller
# logs "Controller <name> is not enable" instead.
CONTROLLERS_READY = {"job-controller": "JobController is running", "pg-controller": "PodgroupController is running",
                     "hyperNode-controller": "HyperNode controller started"}
HYPERNODE_DECISION = re.compile(r'"Allocate job to hyperNode success" job="([^"]+)" hyperNode="([^"]+)"')


def volcano_dir() -> Path:
    """The cache directory holding vc-scheduler, vc-controller-manager and crds/ (built if needed:
    minutes on a cold Go build cache)."""
    try:
        path = build_volcano("all")
    except ControlPlaneError as exc:
        missing(f"Volcano (vc-scheduler, vc-controller-manager) could not be built: {exc}")
    for binary in ("vc-scheduler", "vc-controller-manager"):
        if not os.access(path / binary, os.X_OK):
            missing(f"{path / binary} is missing after tests/controlplane/volcano/build_volcano.sh")
    return path


def volcano_bin_dir() -> Path:
    return volcano_dir()


def volcano_crds() -> list[Path]:
    """Volcano's CRD files (config/crd/volcano/bases of the pinned module), as the harness applies them."""
    try:
        crds = sorted((build_volcano("crds") / "crds").glob("*.yaml"))
    except ControlPlaneError as exc:
        missing(f"Volcano's CRDs could not be fetched: {exc}")
    if not crds:
        missing("Volcano's CRD directory is empty")
    return crds


def scheduler_conf(**network_topology_arguments: Any) -> dict[str, Any]:
    """DEFAULT_CONF, with network-topology-aware arguments replaced or added."""
    conf = copy.deepcopy(DEFAULT_CONF)
    for plugin in conf["tiers"][1]["plugins"]:
        if plugin["name"] == "network-topology-aware":
            plugin["arguments"].update(network_topology_arguments)
    return conf


@dataclass
class Volcano:
    """The running Volcano processes of one control plane and their logs."""

    plane: ControlPlane
    scheduler_log: Path
    controller_log: Path | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def log(self, name: str = "vc-scheduler") -> str:
        path = self.scheduler_log if name == "vc-scheduler" else self.controller_log
        return path.read_text(errors="replace") if path and path.exists() else ""

    def check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log(name)[-4000:]}")

    def hypernode_decisions(self) -> dict[str, str]:
        """job ("namespace/podgroup-uid"-like key vc-scheduler logs) -> the HyperNode vc-scheduler chose
        for it (its `Allocate job to hyperNode success` lines; -v=3 or more)."""
        return {m.group(1): m.group(2) for m in HYPERNODE_DECISION.finditer(self.log())}

    def wait_log(self, name: str, ready: Callable[[str], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            text = self.log(name)
            if ready(text):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not ready after {timeout}s:\n{text[-4000:]}")
            time.sleep(0.1)


def _spawn(argv: Sequence[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=dict(env))


@contextlib.contextmanager
def volcano_running(
    plane: ControlPlane,
    *,
    conf: Mapping[str, Any] | None = None,
    scheduler: bool = True,
    controller_manager: bool = False,
    controllers: str = CONTROLLERS,
    schedule_period: float = 1.0,
    verbosity: int = 3,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 60.0,
) -> Iterator[Volcano]:
    """vc-scheduler (unless `scheduler` is False) and, with `controller_manager`, vc-controller-manager
    on `plane` with its admin kubeconfig, leader election off, logs and the scheduler config under
    plane.workdir. Returns once vc-scheduler's informers have synced and the controllers run; stops
    them after. `controllers` is vc-controller-manager's --controllers (default: Volcano's set less
    JobFlow).

    vc-scheduler creates the `default` and `root` Queues itself. It waits for every Volcano CRD,
    which the harness applies. No feature gate has to be set: vc-scheduler aligns its feature-gate
    defaults with the server's version. On the suite's v1.37 API server that is its own library's
    (v1.34) defaults, DynamicResourceAllocation on, and the server serves resource.k8s.io/v1 it then
    watches; on the v1.33 compatibility server DynamicResourceAllocation stays off and
    resource.k8s.io/v1 is never watched."""
    bin_dir = volcano_dir()
    tag = uuid.uuid4().hex[:6]
    conf_path = plane.workdir / f"volcano-scheduler-{tag}.conf"
    conf_path.write_text(yaml.safe_dump(dict(conf or DEFAULT_CONF), sort_keys=False))
    # vc-scheduler serves a klog-level socket in $DEBUG_SOCKET_DIR (default /tmp/klog-socks): keep it
    # per run, so schedulers of concurrent test sessions do not share one.
    socks = plane.workdir / f"volcano-socks-{tag}"
    socks.mkdir(exist_ok=True)
    env = {**os.environ, "DEBUG_SOCKET_DIR": str(socks)}
    vc = Volcano(plane=plane, scheduler_log=plane.workdir / f"vc-scheduler-{tag}.log")
    common = [f"--kubeconfig={plane.kubeconfig}", "--leader-elect=false", f"--v={verbosity}", "--logtostderr"]
    try:
        if scheduler:
            vc.processes["vc-scheduler"] = _spawn(
                [str(bin_dir / "vc-scheduler"), *common, f"--scheduler-conf={conf_path}",
                 f"--scheduler-name={SCHEDULER_NAME}", f"--schedule-period={schedule_period}s",
                 f"--listen-address=127.0.0.1:{free_port()}", f"--healthz-address=127.0.0.1:{free_port()}",
                 "--cache-dumper=false", f"--cache-dump-dir={plane.workdir}", *extra_args],
                vc.scheduler_log, env)
        if controller_manager:
            vc.controller_log = plane.workdir / f"vc-controller-manager-{tag}.log"
            vc.processes["vc-controller-manager"] = _spawn(
                [str(bin_dir / "vc-controller-manager"), *common, f"--controllers={controllers}",
                 f"--scheduler-name={SCHEDULER_NAME}", f"--listen-address=127.0.0.1:{free_port()}",
                 f"--healthz-address=127.0.0.1:{free_port()}"],
                vc.controller_log, env)
        started = time.monotonic()
        if scheduler:
            vc.wait_log("vc-scheduler", lambda text: SCHEDULER_READY in text, ready_timeout)
        if controller_manager:
            vc.wait_log("vc-controller-manager", lambda text: all(
                line in text or f"Controller <{name}> is not enable" in text
                for name, line in CONTROLLERS_READY.items()), ready_timeout)
        print(f"Volcano ready in {time.monotonic() - started:.1f}s "
              f"({', '.join(vc.processes)}; logs in {plane.workdir})")
        yield vc
    finally:
        stop_processes(vc.processes.values(), timeout=10)
