"""A real one-node Kubernetes cluster for tests, made of the parts a user runs.

The control plane runs on the host: etcd and kube-apiserver (tests/controlplane, with the
ServiceAccount and NodeRestriction admission plugins and the Node authorizer on, as on a real
cluster), kube-controller-manager and kube-scheduler (tests/realnode/nodebin, the same pinned
Kubernetes modules). The node lives in a network namespace of its own, joined to the host by a
veth pair (host 10.251.0.1, node 10.251.0.2): containerd, runc and the CNI bridge from Debian, and
kubelet. One script starts containerd and kubelet in a mount namespace of their own, so they share
it (kubelet's volume mounts are where containerd looks; the node's /sys is its own network's) and
everything they mounted goes with it. The node runs lldpd too (its socket in the node's own
/run/lldpd), and its eth1 is cabled to a switch stand-in: lldpd as `leaf-sw1` in a third namespace. Images are imported into containerd from podman (the image
tests/image/build.sh builds from the Dockerfile, and pause from its C source): nothing is pulled.

No kube-proxy runs: a DNAT rule in the node's namespace takes the `kubernetes` Service's address to
the API server, the one Service the pods here use. On this CI machine (cgroup v1 with a v2 hierarchy
beside it, no systemd) kubelet runs with the cgroupfs driver and without QoS cgroups.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.harness import ADMIN_TOKEN, REPO, ControlPlane, ControlPlaneError, _free_port
from realparts import ip, missing, require_binary, require_root, stop_processes

NODE = "hypertopo-node-1"
HOST_IP, NODE_IP, PREFIX = "10.251.0.1", "10.251.0.2", 24
POD_SUBNET = "10.252.0.0/24"
SERVICE_IP = "10.96.0.1"
NODE_TOKEN = "hypertopo-test-node-token"
DEBIAN_PARTS = ("containerd", "ctr", "runc", "iptables", "podman")


def built(script: str, what: str, timeout: float = 3000) -> str:
    """The last stdout line of a build script of the suite (a cache path or an image name); a failed
    build is a missing real component."""
    proc = subprocess.run(["bash", str(REPO / script)], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        missing(f"cannot build {what} ({script}): {proc.stderr.strip()[-800:]}")
    return proc.stdout.strip().splitlines()[-1]


def _run(*argv: str, timeout: float = 120) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc.stdout


def make_certs(workdir: Path) -> tuple[Path, Path, Path]:
    """A CA and the API server's serving certificate for every address pods and tests use."""
    ca_key, ca, key, csr, crt = (workdir / n for n in ("ca.key", "ca.crt", "apiserver.key", "apiserver.csr",
                                                       "apiserver.crt"))  # fmt: skip
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
         "-days", "2", "-subj", "/CN=hypertopo-test-ca")  # fmt: skip
    _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", "/CN=kube-apiserver")  # fmt: skip
    sans = workdir / "san.ext"
    names = ["DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc", "DNS:localhost",
             f"IP:{SERVICE_IP}", f"IP:{HOST_IP}", "IP:127.0.0.1"]  # fmt: skip
    sans.write_text(f"subjectAltName={','.join(names)}\n")
    _run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
         "-out", str(crt), "-days", "2", "-extfile", str(sans))  # fmt: skip
    return ca, crt, key


@dataclass
class RealNodeCluster(ControlPlane):
    """A control plane on the host and one real node (kubelet + containerd) in its namespace."""

    node_bin: Path = field(default_factory=Path)
    images: tuple[str, ...] = ()
    netns: str = ""
    host_link: str = ""
    switch_netns: str = ""
    node_processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # -- control plane ---------------------------------------------------------------------
    def start(self, extra_tokens: object = ()) -> None:
        self._start_apiserver()
        admin = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            str(self.node_bin / "kube-controller-manager"), f"--kubeconfig={admin}", "--leader-elect=false",
            f"--service-account-private-key-file={self.workdir / 'sa.key'}",
            f"--root-ca-file={self.workdir / 'ca.crt'}", "--bind-address=127.0.0.1",
            f"--secure-port={_free_port()}", "--controllers=*,-nodeipam",
            "--v=1",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            str(self.node_bin / "kube-scheduler"), f"--kubeconfig={admin}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={_free_port()}", "--v=1",
        ])  # fmt: skip

    def _start_apiserver(self) -> None:
        etcd_client, etcd_peer, api_port = _free_port(), _free_port(), _free_port()
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"), f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}", "--unsafe-no-fsync", "--log-level=warn",
        ])  # fmt: skip
        sa_key = self.workdir / "sa.key"
        _run("openssl", "genrsa", "-out", str(sa_key), "2048")
        _, crt, key = make_certs(self.workdir)
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n'
                          f'{NODE_TOKEN},system:node:{NODE},node-uid,"system:nodes"\n')  # fmt: skip
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            "--bind-address=0.0.0.0", f"--advertise-address={HOST_IP}", f"--secure-port={api_port}",
            f"--tls-cert-file={crt}", f"--tls-private-key-file={key}", f"--token-auth-file={tokens}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc", "--api-audiences=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true",
            "--kubelet-preferred-address-types=InternalIP", "--v=1",
        ])  # fmt: skip
        self.port = api_port
        self.url = f"https://127.0.0.1:{api_port}"
        self.kubeconfig = self.kubeconfig_for(ADMIN_TOKEN, "admin")
        self._wait_ready(timeout=90)

    # -- the node --------------------------------------------------------------------------
    def start_node(self) -> None:
        """The node's namespace and link, then containerd (images imported) and kubelet."""
        self.netns = f"htrn-{uuid.uuid4().hex[:6]}"
        self.host_link = f"htrn{self.netns[-6:]}"
        ip("netns", "add", self.netns)
        ip("link", "add", self.host_link, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("addr", "add", f"{HOST_IP}/{PREFIX}", "dev", self.host_link)
        ip("link", "set", self.host_link, "up")
        for args in (("link", "set", "lo", "up"), ("addr", "add", f"{NODE_IP}/{PREFIX}", "dev", "eth0"),
                     ("link", "set", "eth0", "up"), ("route", "add", "default", "via", HOST_IP)):  # fmt: skip
            ip("-n", self.netns, *args)
        self._cable_switch()
        for chain in ("OUTPUT", "PREROUTING"):  # the `kubernetes` Service, where kube-proxy would DNAT it
            _run("ip", "netns", "exec", self.netns, "iptables", "-t", "nat", "-A", chain, "-d", SERVICE_IP,
                 "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", f"{HOST_IP}:{self.port}")  # fmt: skip
        node_dir = self.workdir / "node"
        node_dir.mkdir(mode=0o755)
        self._write_node_config(node_dir)
        log = open(self.workdir / "node.log", "wb")  # noqa: SIM115 - closed with the process
        self.node_processes.append(subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.netns}", "--", "unshare", "--mount", "--propagation", "slave",
             "--", "bash", str(node_dir / "start.sh")], stdout=log,
            stderr=subprocess.STDOUT))  # fmt: skip
        self._wait_node_ready(node_dir, timeout=180)

    def _cable_switch(self) -> None:
        """A switch stand-in: lldpd as `leaf-sw1` in a namespace of its own, cabled to the node's eth1."""
        self.switch_netns = f"htsw-{self.netns[-6:]}"
        self.workdir.chmod(0o755)  # Debian's lldpcli (setuid _lldpd) reads the configs and sockets here
        ip("netns", "add", self.switch_netns)
        ip("link", "add", "swp1", "netns", self.switch_netns, "type", "veth", "peer", "name", "eth1", "netns",
           self.netns)  # fmt: skip
        for ns, link in ((self.switch_netns, "lo"), (self.switch_netns, "swp1"), (self.netns, "eth1")):
            ip("-n", ns, "link", "set", link, "up")
        (self.workdir / "switch").mkdir(mode=0o755)
        (self.workdir / "switch.conf").write_text("configure system hostname leaf-sw1\n"
                                                  "configure system capabilities enabled bridge\n"
                                                  "configure lldp tx-interval 1\n")  # fmt: skip
        log = open(self.workdir / "switch.log", "wb")  # noqa: SIM115 - closed with the process
        self.node_processes.append(subprocess.Popen(
            ["ip", "netns", "exec", self.switch_netns, "lldpd", "-d", "-u", str(self.workdir / "switch/lldpd.socket"),
             "-O", str(self.workdir / "switch.conf")], stdout=log, stderr=subprocess.STDOUT))  # fmt: skip

    def tag_image(self, image: str, tag: str) -> str:
        """`image` in the node's containerd under another tag too (a release, as a registry would
        hand it out, without a pull); returns the new name."""
        name = f"{image.rsplit(':', 1)[0]}:{tag}"
        _run("ctr", "-a", str(self.workdir / "node" / "containerd.sock"), "-n", "k8s.io", "images", "tag", "--force",
             image, name)  # fmt: skip
        return name

    def cable(self, up: bool) -> None:
        """Plug or cut the switch's end of the node's eth1."""
        ip("-n", self.switch_netns, "link", "set", "swp1", "up" if up else "down")

    def _write_node_config(self, node_dir: Path) -> None:
        sock = node_dir / "containerd.sock"
        cni = node_dir / "cni"
        cni.mkdir()
        (cni / "10-bridge.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "hypertopo-node",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
                 "ipam": {"type": "host-local", "dataDir": str(node_dir / "ipam"),
                          "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }))  # fmt: skip
        pause = next(image for image in self.images if image.startswith("registry.k8s.io/pause:"))
        (node_dir / "containerd.toml").write_text(f"""version = 2
root = "{node_dir / 'containerd'}"
state = "{node_dir / 'containerd-state'}"
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # kubelet asks -998 for every sandbox; lowering it needs CAP_SYS_RESOURCE, which this machine's
  # root does not have (runc: "can't get final child's PID from pipe"): keep the parent's instead
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true  # pods' network namespaces go with the cluster's folder
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
""")
        kubeconfig = self.kubeconfig_for(NODE_TOKEN, "node", server=f"https://{HOST_IP}:{self.port}")
        (node_dir / "kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "failCgroupV1": False,
            "failSwapOn": False, "containerRuntimeEndpoint": f"unix://{sock}",
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "clusterDomain": "cluster.local", "podCIDR": POD_SUBNET, "resolvConf": "/etc/resolv.conf",
            "nodeStatusUpdateFrequency": "2s", "syncFrequency": "5s", "fileCheckFrequency": "5s",
        }))  # fmt: skip
        # In the node's network namespace and a mount namespace of its own (a slave of the host's):
        # a sysfs of the node's network (what `ip netns exec` mounts, but with the host's cgroup
        # hierarchies mounted again under it: kubelet and runc need them), then containerd, its
        # images and kubelet, all in that one mount namespace.
        (node_dir / "start.sh").write_text(f"""set -e
grep -E '^[^ ]+ /sys/fs/cgroup/[^ ]+ cgroup2? ' /proc/mounts > {node_dir / 'cgroups'}
umount -l /sys
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
while read -r source dir type options _; do
  mkdir -p "$dir" && mount -t "$type" -o "$options" "$source" "$dir"
done < {node_dir / 'cgroups'}
# the node's own lldpd, its socket where Debian's lldpd with `-u /run/lldpd/lldpd.socket` has it
mkdir -p /run/lldpd && mount -t tmpfs -o mode=755 lldpd /run/lldpd
printf 'configure system hostname {NODE}\\nconfigure lldp tx-interval 1\\n' > {node_dir / 'lldpd.conf'}
lldpd -d -u /run/lldpd/lldpd.socket -I eth1 -O {node_dir / 'lldpd.conf'} > {self.workdir / 'lldpd.log'} 2>&1 &
containerd --config {node_dir / 'containerd.toml'} > {self.workdir / 'containerd.log'} 2>&1 &
for _ in $(seq 300); do [ -S {sock} ] && break; sleep 0.1; done
for archive in {' '.join(str(node_dir / f'image-{i}.tar') for i in range(len(self.images)))}; do
  ctr -a {sock} -n k8s.io images import "$archive" >/dev/null
done
exec {self.node_bin / 'kubelet'} --config={node_dir / 'kubelet.yaml'} --kubeconfig={kubeconfig} \\
  --root-dir={node_dir / 'kubelet'} --cert-dir={node_dir / 'pki'} --hostname-override={NODE} \\
  --node-ip={NODE_IP} --v=1 > {self.workdir / 'kubelet.log'} 2>&1
""")
        for i, image in enumerate(self.images):
            _run("podman", "save", "--format", "docker-archive", "-o", str(node_dir / f"image-{i}.tar"), image,
                 timeout=300)  # fmt: skip

    def _wait_node_ready(self, node_dir: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.node_processes[0].poll() is not None:
                raise ControlPlaneError(f"node exited: {self.log_tail('node')}{self.log_tail('kubelet')}")
            got = self.kubectl("get", "node", NODE, "-o", "json", check=False)
            if got.returncode == 0:
                conditions = json.loads(got.stdout)["status"].get("conditions") or []
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    for image in node_dir.glob("image-*.tar"):
                        image.unlink()
                    return
            time.sleep(0.5)
        raise ControlPlaneError(f"node {NODE} not Ready after {timeout:.0f} s: {self.log_tail('kubelet')}")

    def stop(self) -> None:
        stop_processes(self.node_processes, timeout=10)
        if self.netns:
            # containerd, its shims and the containers: every process left in the node's namespace
            for _ in range(3):
                pids = [int(p) for p in _run("ip", "netns", "pids", self.netns).split()]
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
                if not pids:
                    break
                time.sleep(0.5)
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
            subprocess.run(["ip", "link", "del", self.host_link], capture_output=True, check=False)
        if self.switch_netns:
            subprocess.run(["ip", "netns", "del", self.switch_netns], capture_output=True, check=False)
        super().stop()


def require_node_parts() -> None:
    """Root, and the Debian parts of the node (tests/setup.sh installs them)."""
    require_root()
    for name in DEBIAN_PARTS:
        require_binary(name)
    if not Path("/usr/lib/cni/bridge").exists():
        missing("the CNI plugins are not installed (containernetworking-plugins; tests/setup.sh installs them)")

