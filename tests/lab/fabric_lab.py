"""End-to-end fabric lab: the whole of hypertopo on an emulated fabric.

    sudo python tests/lab/fabric_lab.py            # runs the demo and prints each step

What runs, all of it real:
- network namespaces for 2 leaf switches and 1 spine running Debian's lldpd, and 4 hosts cabled to
  the leaves by veth pairs (tests/lab/fabric_net.py);
- etcd + kube-apiserver (tests/controlplane), serving the hosts' namespaces through a management
  bridge, and kwok keeping the 4 Node objects Ready and bound pods Running;
- one `hypertopo-agent run` inside each host namespace (LLDP on its fabric NIC, netlink events),
  writing its NodeTopology through its own kubeconfig;
- `hypertopo-aggregator run` fed with the switches' own lldpd tables (`lldpcli -f json0`), which
  give the spine tier, and `hypertopo-scheduler run`.

The demo: `kubectl get hn` shows two leaves under a spine, all Ready; a gang of 4 lands in one
leaf; cutting one host's fabric link turns its leaf's Ready False within seconds, and the gang's
pods on that host are evicted and re-placed (`restart-pods`). The lab plays the job controller
that recreates evicted pods, since no controller-manager runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))

from controlplane.harness import ControlPlane, running  # noqa: E402
from fabric_net import MGMT_GATEWAY, FabricNet  # noqa: E402 - sibling module
from placement_live import kwok_running, wait_for  # noqa: E402
from realparts import free_port, stop_processes  # noqa: E402

NS = "hypertopo-system"
GANG_NS = "lab"


class FabricLab:
    def __init__(self, plane: ControlPlane, net: FabricNet, *, log: Callable[[str], None] = print) -> None:
        self.plane, self.net, self.log = plane, net, log
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.node_of = {host: f"lab-{host}" for host in net.hosts}

    # -- kubectl helpers ---------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.plane.kubectl(*args, input=input, check=check).stdout

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def create(self, obj: dict[str, Any]) -> None:
        self.kubectl("create", "-f", "-", input=json.dumps(obj))

    # -- bring-up ----------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.net.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env or os.environ.copy()
        )

    def log_of(self, name: str) -> str:
        path = self.net.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def start(self) -> None:
        self.kubectl("create", "namespace", NS)
        self.kubectl("create", "namespace", GANG_NS)
        for host, node in self.node_of.items():
            amounts = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
            self.create(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node, "labels": {"type": "kwok", "kubernetes.io/hostname": node}},
                    "status": {"capacity": amounts, "allocatable": amounts},
                }
            )
            # TaintNodesByCondition taints new nodes not-ready; with no node lifecycle controller
            # here to lift it once kwok reports Ready, the lab lifts it.
            self.kubectl("patch", "node", node, "--type=merge", "-p", '{"spec":{"taints":null}}')
            # The agent pod whose readiness is the agent's liveness for the aggregator.
            self.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"hypertopo-agent-{node}",
                        "namespace": NS,
                        "labels": {"app.kubernetes.io/name": "hypertopo-agent"},
                    },
                    "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "hypertopo"}]},
                }
            )
            self._start_agent(host, node)
        self.log("agents started in the host namespaces")
        tables = []
        for switch, expected in [("spine1", len(self.net.leaves)), *[(leaf, 1) for leaf in self.net.leaves]]:
            path = self.net.workdir / f"{switch}.lldp.json"
            path.write_text(self.net.wait_switch_neighbours(switch, expected))
            tables.append(str(path))
        self.log(f"switch LLDP tables collected: {', '.join(Path(t).name for t in tables)}")
        bin_dir = str(Path(sys.executable).parent)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        self._spawn(
            "aggregator",
            [sys.executable, "-m", "aggregator", "run", f"--kubeconfig={self.plane.kubeconfig}", f"--namespace={NS}",
             "--hold-down=1", "--period=5", "--debounce=0.1", "--taint-unhealthy", f"--listen=127.0.0.1:{free_port()}", "--switch-lldp", *tables],
            env,
        )  # fmt: skip
        self._spawn(
            "scheduler",
            [sys.executable, "-m", "aggregator.placement.cli", "run", f"--kubeconfig={self.plane.kubeconfig}",
             f"--listen=127.0.0.1:{free_port()}", "--unknown-grace=30", "--resync=1"],
            env,
        )  # fmt: skip
        self.log("aggregator and scheduler started")

    def _start_agent(self, host: str, node: str) -> None:
        kubeconfig = self.plane.kubeconfig_for(
            "hypertopo-test-admin-token", f"agent-{host}", server=f"https://{MGMT_GATEWAY}:{self.plane.port}"
        )
        argv = self.net.exec_argv(
            host, sys.executable, "-m", "agent", "run", f"--node-name={node}", f"--kubeconfig={kubeconfig}",
            "--interfaces=^fab", "--nvml=off", f"--listen={self.net.mgmt_ip(host)}:9730", "--interval=5",
        )  # fmt: skip
        self._spawn(f"agent-{host}", argv, {**os.environ, "PYTHONPATH": str(HERE.parent.parent)})

    def stop(self) -> None:
        stop_processes(self.procs.values(), timeout=10)

    # -- observations --------------------------------------------------------------------------
    def hypernodes(self) -> dict[str, dict[str, Any]]:
        items = self.get_json("hypernodes")["items"]
        return {hn["metadata"]["name"]: hn for hn in items}

    @staticmethod
    def ready_of(hn: dict[str, Any]) -> str:
        conditions = (hn.get("status") or {}).get("conditions") or []
        return next((c["status"] for c in conditions if c["type"] == "Ready"), "")

    def leaf_of_node(self, node: str) -> str | None:
        for name, hn in self.hypernodes().items():
            if hn["spec"].get("tierName") != "leaf":
                continue
            members = {
                m["selector"]["exactMatch"]["name"]
                for m in hn["spec"].get("members", [])
                if m["type"] == "Node"
            }
            if node in members:
                return name
        return None

    def tree_is_ready(self) -> dict[str, dict[str, Any]] | None:
        hns = self.hypernodes()
        leaves = [hn for hn in hns.values() if hn["spec"].get("tierName") == "leaf"]
        spines = [hn for hn in hns.values() if hn["spec"].get("tierName") == "spine"]
        if len(leaves) != 2 or len(spines) != 1:
            return None
        spine_members = {m["selector"]["exactMatch"]["name"] for m in spines[0]["spec"]["members"]}
        if spine_members != {hn["metadata"]["name"] for hn in leaves}:
            return None
        if any(self.ready_of(hn) != "True" for hn in hns.values()):
            return None
        if (spines[0].get("status") or {}).get("nodeCount") != len(self.node_of):
            return None
        return hns

    # -- the gang ------------------------------------------------------------------------------
    def submit_gang(self, name: str, size: int, gpus_per_pod: int) -> None:
        self.create(
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {
                    "name": name,
                    "namespace": GANG_NS,
                    "annotations": {
                        "hypertopo.io/on-fabric-fault": "restart-pods",
                        "volcano.sh/network-topology-mode": "soft",
                    },
                },
                "spec": {"minMember": size},
            }
        )
        for i in range(size):
            self.create_gang_pod(name, f"{name}-{i}", gpus_per_pod)

    def create_gang_pod(self, gang: str, pod: str, gpus: int) -> None:
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": GANG_NS,
                    "labels": {"scheduling.x-k8s.io/pod-group": gang, "lab/gpus": str(gpus)},
                },
                "spec": {
                    "schedulerName": "hypertopo-scheduler",
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            }
        )

    def gang_pods(self, gang: str) -> dict[str, dict[str, Any]]:
        items = self.get_json("pods", "-n", GANG_NS, "-l", f"scheduling.x-k8s.io/pod-group={gang}")["items"]
        return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}

    def placement(self, gang: str) -> dict[str, str]:
        return {name: p["spec"].get("nodeName", "") for name, p in self.gang_pods(gang).items()}

    def recreate_missing(self, gang: str, size: int, gpus: int, serial: int) -> list[str]:
        """Plays the job controller: replaces evicted pods of the gang with new ones."""
        current = self.gang_pods(gang)
        created = []
        for i in range(size - len(current)):
            name = f"{gang}-r{serial}-{i}"
            self.create_gang_pod(gang, name, gpus)
            created.append(name)
        return created


@contextlib.contextmanager
def lab(log: Callable[[str], None] = print) -> Iterator[FabricLab]:
    net = FabricNet()
    try:
        net.up()
        log(f"fabric up: {', '.join(net.switches)} (lldpd) and hosts {', '.join(net.hosts)}")
        with running(bind_address="0.0.0.0") as plane, kwok_running(plane):
            the_lab = FabricLab(plane, net, log=log)
            try:
                the_lab.start()
                yield the_lab
            finally:
                the_lab.stop()
    finally:
        net.down()


def demo() -> int:
    if os.geteuid() != 0:
        print("fabric lab: needs root (it makes network namespaces and veth pairs); run `sudo make demo`",
              file=sys.stderr)
        return 2
    # A `kill` (SIGTERM) unwinds like Ctrl-C, so the namespaces, lldpd and the control plane go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("fabric lab: starting lldpd switches and hosts in network namespaces, etcd + kube-apiserver + kwok,\n"
          "an agent per host, the aggregator and the scheduler (about a minute) ...")
    with lab() as the_lab:
        t0 = time.monotonic()
        wait_for("two Ready leaves under a spine", the_lab.tree_is_ready, timeout=60)
        print(f"\nHyperNode tree Ready after {time.monotonic() - t0:.1f}s:\n" + the_lab.kubectl("get", "hn"))
        the_lab.submit_gang("train", size=4, gpus_per_pod=4)
        placed = wait_for(
            "gang bound", lambda: (p := the_lab.placement("train")) and all(p.values()) and p, timeout=30
        )
        leaves = {the_lab.leaf_of_node(node) for node in placed.values()}
        print(f"gang placed: {placed} -> leaves {sorted(leaves)}")
        victim_node = sorted(placed.values())[0]
        victim_host = next(h for h, n in the_lab.node_of.items() if n == victim_node)
        leaf = the_lab.leaf_of_node(victim_node)
        t_cut = time.monotonic()
        the_lab.net.set_host_link(victim_host, up=False)
        print(f"cut {victim_host}'s fabric link ({victim_node}, in {leaf})")
        wait_for(
            f"{leaf} Ready False",
            lambda: the_lab.ready_of(the_lab.hypernodes()[leaf or ""]) == "False",
            timeout=15,
        )
        print(f"{leaf} Ready=False after {time.monotonic() - t_cut:.2f}s:\n" + the_lab.kubectl("get", "hn"))
        moved = [p for p, n in placed.items() if n == victim_node]
        wait_for("evictions", lambda: not (set(moved) & set(the_lab.gang_pods("train"))), timeout=30)
        the_lab.recreate_missing("train", 4, 4, serial=1)
        after = wait_for(
            "replacements bound",
            lambda: (p := the_lab.placement("train")) and all(p.values()) and p,
            timeout=30,
        )
        print(f"after the fault: {after}")
        return 0


if __name__ == "__main__":
    sys.exit(demo())
