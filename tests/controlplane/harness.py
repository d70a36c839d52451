"""Starts a real etcd + kube-apiserver on loopback for tests, with RBAC on and hypertopo's CRDs
applied, then Volcano's own CRDs over them (HyperNode, PodGroup, Queue, Job, ...: the cluster looks
like one that runs Volcano), and tears them down. The binaries come from build.sh, Volcano's CRDs
from volcano/build_volcano.sh (built once, then cached).

Kubernetes versions: the suite runs the newest supported release (build.sh, this folder's go.mod),
with the Workload API served (scheduling.k8s.io/v1beta1 PodGroups and Workloads: the GenericWorkload
and TopologyAwareWorkloadScheduling gates on, as a cluster that uses kube-scheduler's gang and
topology-aware scheduling has them). `running(compat=True)`, or HYPERTOPO_KUBERNETES=compat for a
whole run, gives the oldest supported minor instead (`build.sh compat`: its kube-apiserver and
kubectl over the newest build's etcd), which has no Workload API.

Authentication: a static token file holds an admin token (group system:masters) plus any tokens a
test adds through `extra_tokens`; service-account tokens are signed with a key made per run, so
TokenRequest works. The ServiceAccount admission plugin is off: no controller-manager runs to
create `default` service accounts, and tests create the accounts they need.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from realparts import stop_processes

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ADMIN_TOKEN = "hypertopo-test-admin-token"


class ControlPlaneError(RuntimeError):
    pass


# The Kubernetes feature gates that turn kube-scheduler's gang and topology-aware workload
# scheduling on (pkg/features/kube_features.go of the pinned release: GenericWorkload is beta but off
# by default, TopologyAwareWorkloadScheduling alpha). The API server and kube-scheduler need the same.
WORKLOAD_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
# The API version of PodGroup and Workload that kube-scheduler and the Job controller of the pinned
# release use; a beta API, so off unless --runtime-config turns it on.
WORKLOAD_API = "scheduling.k8s.io/v1beta1"
WORKLOAD_API_SINCE = (1, 37)  # the first minor serving WORKLOAD_API
COMPAT_ENV = "HYPERTOPO_KUBERNETES"  # "compat": every control plane of the run is the oldest minor


def use_compat(compat: bool | None = None) -> bool:
    """The oldest supported minor when asked for, else as HYPERTOPO_KUBERNETES says."""
    if compat is not None:
        return compat
    choice = os.environ.get(COMPAT_ENV, "")
    if choice not in ("", "newest", "compat"):
        raise ControlPlaneError(f"{COMPAT_ENV}={choice!r}: expected 'newest' or 'compat'")
    return choice == "compat"


def _build_dir(*args: str) -> Path:
    proc = subprocess.run(["bash", str(HERE / "build.sh"), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"control-plane build {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def build(compat: bool | None = None) -> Path:
    """Builds (or finds cached) the binaries; returns the directory holding them: the newest release
    (kube-apiserver, kubectl, kube-scheduler, kubelet, kube-controller-manager, etcd), or with
    `compat` the oldest supported minor's (kube-apiserver, kubectl)."""
    return _build_dir("compat") if use_compat(compat) else _build_dir()


def version_of(bin_dir: Path) -> tuple[int, int]:
    """(major, minor) of a build, from its cache directory's name (vMAJOR.MINOR.PATCH-KEY)."""
    match = re.match(r"v(\d+)\.(\d+)\.", bin_dir.name)
    if not match:
        raise ControlPlaneError(f"{bin_dir}: not a versioned build directory")
    return int(match.group(1)), int(match.group(2))


def build_volcano(what: str = "all") -> Path:
    """Volcano's cache directory (vc-scheduler, vc-controller-manager, crds/), built or found cached;
    `what="crds"` only fetches the CRDs (a module download, no compile)."""
    proc = subprocess.run(["bash", str(HERE / "volcano" / "build_volcano.sh"), what],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"Volcano build ({what}) failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


VOLCANO_FIELD_MANAGER = "volcano-install"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ControlPlane:
    bin_dir: Path
    workdir: Path
    bind_address: str = "127.0.0.1"
    etcd_dir: Path | None = None  # where etcd is when bin_dir has none (the compat build)
    port: int = 0
    url: str = ""
    kubeconfig: Path = field(default_factory=Path)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # -- clients -----------------------------------------------------------------------------
    def kubeconfig_for(self, token: str, name: str = "user", server: str | None = None) -> Path:
        """A kubeconfig that authenticates with the given bearer token (optionally through another
        address of the API server, e.g. one reachable from a network namespace)."""
        path = self.workdir / f"kubeconfig-{name}"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": server or self.url, "insecure-skip-tls-verify": True}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def api_client(self, token: str = ADMIN_TOKEN):  # type: ignore[no-untyped-def]
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        config.verify_ssl = False
        config.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(config)

    def env(self) -> dict[str, str]:
        """Environment for subprocesses (agent, aggregator) that should talk to this API server."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    # -- lifecycle ---------------------------------------------------------------------------
    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def start(self, extra_tokens: Sequence[tuple[str, str, Sequence[str]]] = ()) -> None:
        etcd_client, etcd_peer, api_port = _free_port(), _free_port(), _free_port()
        data = self.workdir / "etcd"
        self._spawn(
            "etcd",
            [
                str((self.etcd_dir or self.bin_dir) / "etcd"),
                f"--data-dir={data}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        key = self.workdir / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], capture_output=True, check=True)
        tokens = self.workdir / "tokens.csv"
        lines = [f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"']
        lines += [f'{tok},{user},{user}-uid,"{",".join(groups)}"' for tok, user, groups in extra_tokens]
        tokens.write_text("\n".join(lines) + "\n")
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                f"--bind-address={self.bind_address}",
                f"--secure-port={api_port}",
                f"--cert-dir={self.workdir / 'certs'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                "--disable-admission-plugins=ServiceAccount",
                f"--service-account-key-file={key}",
                f"--service-account-signing-key-file={key}",
                "--service-account-issuer=https://hypertopo.test",
                "--api-audiences=https://hypertopo.test",
                "--service-cluster-ip-range=10.96.0.0/16",
                *self.version_flags(),
                "--v=1",
            ],
        )
        self.port = api_port
        self.url = f"https://127.0.0.1:{api_port}"
        self.kubeconfig = self.kubeconfig_for(ADMIN_TOKEN, "admin")
        self._wait_ready(timeout=90)
        self.kubectl("apply", "--server-side", "-k", str(REPO / "crds"))
        # Then Volcano's own CRDs, as installed where Volcano runs (vc-scheduler waits for each of
        # them). Where both define a CRD (HyperNode), Volcano's takes over under its own field
        # manager; the schemas are the same, only the descriptions differ.
        crds = build_volcano("crds") / "crds"
        self.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={VOLCANO_FIELD_MANAGER}",
                     "-f", str(crds), timeout=120)
        self.wait_crds_established()

    @property
    def version(self) -> tuple[int, int]:
        """(major, minor) of the API server's release."""
        return version_of(self.bin_dir)

    @property
    def workload_api(self) -> bool:
        """Whether this API server serves WORKLOAD_API (PodGroups kube-scheduler reads)."""
        return self.version >= WORKLOAD_API_SINCE

    def version_flags(self) -> list[str]:
        """The API server flags of its release: the Workload API where the release has it."""
        if not self.workload_api:
            return []
        return [f"--feature-gates={WORKLOAD_GATES}", f"--runtime-config={WORKLOAD_API}=true"]

    def wait_crds_established(self, *names: str, timeout: float = 60) -> None:
        """The named CRDs (all of them when none is named) Established. Not `kubectl wait
        --for=condition=Established`: it fails at once ("accessor error: <nil>") on a CRD read
        before the API server gave it any condition, which a freshly applied CRD can be."""
        deadline = time.monotonic() + timeout
        while True:
            listing = self.kubectl("get", "crd", *names, "-o", "json", check=False)
            document = json.loads(listing.stdout or "{}") if listing.returncode == 0 else {}
            items = document.get("items", [document]) if document else []
            established = {
                item["metadata"]["name"]
                for item in items
                if any(c.get("type") == "Established" and c.get("status") == "True"
                       for c in (item.get("status") or {}).get("conditions") or [])
            }
            waiting = sorted(set(names) - established) if names else \
                sorted({item["metadata"]["name"] for item in items} - established)
            if listing.returncode == 0 and not waiting:
                return
            if time.monotonic() > deadline:
                reason = listing.stderr.strip() or ", ".join(waiting)
                raise ControlPlaneError(f"CRDs not Established after {timeout:.0f} s: {reason}")
            time.sleep(0.1)

    def _wait_ready(self, timeout: float) -> None:
        import ssl

        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for proc, name in zip(self.processes, ("etcd", "kube-apiserver"), strict=False):
                if proc.poll() is not None:
                    raise ControlPlaneError(f"{name} exited: {self.log_tail(name)}")
            req = urllib.request.Request(
                f"{self.url}/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except Exception as exc:  # not up yet, keep polling
                last = str(exc)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-apiserver not ready after {timeout}s ({last}): {self.log_tail('kube-apiserver')}"
        )

    def log_tail(self, name: str, size: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def stop(self) -> None:
        # a test server: no need to drain long-running watches
        stop_processes(reversed(self.processes), timeout=3)
        self.processes.clear()


@contextlib.contextmanager
def running(
    extra_tokens: Sequence[tuple[str, str, Sequence[str]]] = (),
    bind_address: str = "127.0.0.1",
    compat: bool | None = None,
) -> Iterator[ControlPlane]:
    """A started control plane; `bind_address="0.0.0.0"` also serves other interfaces (the lab);
    `compat` the oldest supported minor (default: as HYPERTOPO_KUBERNETES says, else the newest)."""
    newest = _build_dir()
    bin_dir = build(compat)
    workdir = Path(tempfile.mkdtemp(prefix="hypertopo-cp-"))
    plane = ControlPlane(bin_dir=bin_dir, workdir=workdir, bind_address=bind_address, etcd_dir=newest)
    try:
        plane.start(extra_tokens)
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
