"""A real Prometheus (Debian's) scraping the real node's pods the way prometheus-operator would.

Its scrape jobs are made from daemonset/monitoring/podmonitors.yaml, as prometheus-operator turns a
PodMonitor into a job: the pods of the monitor's namespaces, kept by the monitor's label selector
and port name, then the monitor's own relabelings. So what the test proves is that those
PodMonitors find the three components' pods and their metrics come through. Scraping goes to pod
IPs, not Service IPs: the test cluster runs no kube-proxy, and pod IPs are what the node routes, so
Prometheus runs in the node's network namespace.

Debian's Prometheus is built without Kubernetes service discovery (`kubernetes_sd_configs` is not
a field it knows), so the pods come to it through file discovery instead: `discover` writes, for
every container port of every pod the API server lists, the target and the `__meta_kubernetes_*`
labels Kubernetes discovery (role `pod`) gives it. The selection and relabeling are Prometheus's own.

The scrape interval is 1 s instead of the monitors' 30 s, so a test waits seconds, not minutes.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from controlplane.harness import REPO
from realparts import require_binary, stop_processes

PODMONITORS = REPO / "daemonset" / "monitoring" / "podmonitors.yaml"
PORT = 9091
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _label(name: str) -> str:
    """A pod label's name as Kubernetes service discovery writes it in a meta label."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """File-discovery target groups for `pods`: what Kubernetes discovery of role `pod` finds, one
    target a container port, with its meta labels."""
    groups = []
    for pod in pods:
        meta, ip = pod["metadata"], (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        labels = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"],
                  "__meta_kubernetes_pod_ip": ip, "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
                  **{_label(k): v for k, v in (meta.get("labels") or {}).items()}}  # fmt: skip
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                    **labels, "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}})  # fmt: skip
    return groups


def scrape_job(monitor: dict[str, Any], targets: Path) -> dict[str, Any]:
    """One PodMonitor (one endpoint) as the scrape job prometheus-operator would make of it."""
    meta, spec = monitor["metadata"], monitor["spec"]
    [endpoint] = spec["podMetricsEndpoints"]
    namespaces = spec.get("namespaceSelector", {}).get("matchNames") or [meta["namespace"]]
    keep = [{"source_labels": ["__meta_kubernetes_namespace"], "regex": "|".join(namespaces), "action": "keep"}]
    keep += [{"source_labels": [_label(k)], "regex": v, "action": "keep"}
             for k, v in spec["selector"]["matchLabels"].items()]  # fmt: skip
    keep.append({"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"],
                 "action": "keep"})  # fmt: skip
    keep += [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
             {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}]  # fmt: skip
    keep += [{"source_labels": r["sourceLabels"], "target_label": r["targetLabel"]}
             for r in endpoint.get("relabelings", [])]  # fmt: skip
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        "scrape_interval": "1s",
        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
        "relabel_configs": keep,
    }


@dataclass
class Prometheus:
    url: str
    targets_file: Path

    def discover(self, pods: list[dict[str, Any]]) -> None:
        """Hand Prometheus the pods (in place of Kubernetes discovery, see above)."""
        partial = self.targets_file.with_suffix(".tmp")
        partial.write_text(json.dumps(pod_targets(pods)))
        partial.rename(self.targets_file)

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with NO_PROXY.open(f"{self.url}{path}{query}", timeout=10) as resp:
            doc = json.loads(resp.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.get("/api/v1/targets", state="active")["activeTargets"]
        return active

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The one value of a query that gives one series, None while it gives none."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None


@contextmanager
def scraping(netns: str, address: str, workdir: Path) -> Iterator[Prometheus]:
    """Prometheus in network namespace `netns`, serving on `address`:PORT, scraping the pods handed
    to `discover` that the PodMonitors select."""
    prometheus = require_binary("prometheus")
    targets = workdir / "prometheus-targets.json"
    targets.write_text("[]")
    monitors = [m for m in yaml.safe_load_all(PODMONITORS.read_text()) if m]
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                                      "scrape_configs": [scrape_job(m, targets) for m in monitors]}))  # fmt: skip
    log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(["ip", "netns", "exec", netns, prometheus, f"--config.file={config}",
                             f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                             f"--web.listen-address={address}:{PORT}"], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    server = Prometheus(f"http://{address}:{PORT}", targets)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (workdir / "prometheus.log").read_text()[-2000:]
            try:
                server.get("/api/v1/status/buildinfo")
                break
            except OSError:
                assert time.monotonic() < deadline, (workdir / "prometheus.log").read_text()[-2000:]
                time.sleep(0.2)
        yield server
    finally:
        stop_processes([proc], timeout=10)
        log.close()
