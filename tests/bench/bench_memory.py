"""Memory per node of the aggregator and the scheduler, this tree's code beside an older commit's.

    python tests/bench/bench_memory.py [--inprocess 5000 20000] [--live 5000] [--old-commit REV]

Objects are sized as in a real cluster: each Node as a kubelet and node-feature-discovery leave it
(60 images, 30 labels, conditions with heartbeats, nodeInfo, kubelet-like managedFields), each NodeTopology the report of an 8-GPU, 8-HCA HGX
node (agent.model_probe on an 8-rail model, with per-port LIDs and GIDs and per-interface MACs as a
real agent reports them), one agent Pod per node (what the aggregator watches) and two workload
Pods per node (what the scheduler watches besides).

* in-process: the objects are served by a stand-in for the API client (pages of 500, decoded from
  JSON as the client decodes them) to the very controller and scheduler classes, each in a child
  process of its own; the aggregator runs one full cycle (a standby: it computes, does not write)
  and the scheduler drains its informers; then RSS is read. The old code runs from `git archive`
  of `--old-commit` (default: the commit before slim records) under PYTHONPATH.
* live (`--live`, tests/bench/bench_memory_live.py): a real etcd + kube-apiserver holds the same objects
  (managedFields the API server's own); two aggregator replicas (leader, standby) and a scheduler
  run as processes, old and new side by side, each pair with its own Lease; RSS once they are
  ready and have settled; the base is the same process's RSS on the same API server before any
  object was created.

Printed per row: RSS in MB, the RSS of the same process before its informers started
(interpreter and imports), and MB per 1,000 nodes both as RSS/nodes and as (RSS - base)/nodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OLD_COMMIT = "ab776d7"  # the commit before the informers kept slim records (issue 29)
RAILS, PER_LEAF, PAGE = 8, 32, 500


# -- objects --------------------------------------------------------------------------------------

def node_name(i: int) -> str:
    return f"n{i + 1:06d}"


def _report_templates(per_leaf: int = PER_LEAF) -> list[str]:
    """JSON of the NodeTopology of each node position under leaf 0 (8 rails), with placeholders;
    `topology_json` puts `per_leaf` (the number of templates) nodes under each leaf."""
    from agent.cluster_model import parse_model
    from agent.common.report import node_topology_object
    from agent.model_probe import report_for

    switches = {f"spine-r{r}": {"switches": [f"leaf0-r{r}"]} for r in range(RAILS)}
    blocks = [{"switch": f"leaf0-r{r}", "nodes": [f"n[000001-{per_leaf:06d}]"]} for r in range(RAILS)]
    model = parse_model({"switches": switches, "blocks": blocks})
    out = []
    for p in range(per_leaf):
        obj = node_topology_object(report_for(model, node_name(p)))
        for d, device in enumerate(obj["spec"].get("rdma", [])):
            for port in device.get("ports", []):
                port["lid"], port["smLid"] = 1000 + d, 1
                port["gids"] = [f"fe80:0000:0000:0000:@GUID{d}@", "0000:0000:0000:0000:0000:ffff:0a00:0001"]
            device["nodeGuid"] = device["sysImageGuid"] = f"@GUID{d}@"
        for k, iface in enumerate(obj["spec"].get("interfaces", [])):
            iface["mac"] = f"@MAC{k}@"
        text = json.dumps(obj).replace(node_name(p), "@NODE@").replace("leaf0-", "@LEAF@-")
        out.append(re.sub(r"GPU-[0-9a-f-]{36}", "GPU-@UUID@", text))
    return out


def topology_json(templates: list[str], i: int) -> str:
    text = templates[i % len(templates)].replace("@NODE@", node_name(i)).replace("@LEAF@", f"leaf{i // len(templates)}")
    for d in range(RAILS):
        guid = f"{i:08x}{d:08x}"
        text = text.replace(f"@GUID{d}@", ":".join(guid[k:k + 4] for k in range(0, 16, 4)))
        text = text.replace(f"@MAC{d}@", ":".join(f"{(i * 8 + d) >> s & 255:02x}" for s in (40, 32, 24, 16, 8, 0)))
    counter = iter(range(1000))
    return re.sub("@UUID@", lambda _: f"{i:08x}-0000-4000-8000-{next(counter):012x}", text)


def node_object(i: int, *, managed: bool) -> dict[str, Any]:
    name = node_name(i)
    labels = {f"feature.node.kubernetes.io/cpu-cpuid.F{k}": "true" for k in range(20)}
    labels |= {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
               "node.kubernetes.io/instance-type": "dgx-h100", "topology.kubernetes.io/zone": "zone-a",
               "topology.kubernetes.io/region": "region-1", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
               "nvidia.com/gpu.count": "8", "nvidia.com/cuda.driver.major": "570", "beta.kubernetes.io/os": "linux"}
    images = [{"names": [f"nvcr.io/nvidia/img{k}@sha256:{(i * 61 + k):064x}", f"nvcr.io/nvidia/img{k}:24.{k % 12}"],
               "sizeBytes": 1_000_000_000 + k} for k in range(60)]
    status = {
        "capacity": {"cpu": "224", "memory": "2113464008Ki", "nvidia.com/gpu": "8", "pods": "110",
                     "ephemeral-storage": "1843217384Ki", "hugepages-2Mi": "0", "rdma/ib": "8"},
        "allocatable": {"cpu": "220", "memory": "2100000000Ki", "nvidia.com/gpu": "8", "pods": "110",
                        "ephemeral-storage": "1698688324681", "hugepages-2Mi": "0", "rdma/ib": "8"},
        "conditions": [{"type": t, "status": "True" if t == "Ready" else "False", "reason": f"Kubelet{t}",
                        "message": f"kubelet says {t}", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}
                       for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
        "addresses": [{"type": "InternalIP", "address": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"},
                      {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:08x}-0000-0000-0000-000000000000",
                     "bootID": f"{i:08x}-1111-0000-0000-000000000000", "kernelVersion": "6.8.0-1015-nvidia",
                     "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.12",
                     "kubeletVersion": "v1.31.0", "kubeProxyVersion": "v1.31.0", "operatingSystem": "linux",
                     "architecture": "amd64"},
        "images": images,
    }
    meta: dict[str, Any] = {"name": name, "labels": labels,
                            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                                            "nfd.node.kubernetes.io/feature-labels": ",".join(sorted(labels)[:20])}}
    if managed:  # in-process: what the API server would record for kubelet and node-feature-discovery
        meta |= {"uid": f"{i:08x}-2222-0000-0000-000000000000", "resourceVersion": str(10 + i),
                 "managedFields": [
                     {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
                      "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {f"f:{k}": {} for k in status},
                                                             "f:metadata": {"f:labels": {f"f:{k}": {} for k in labels}}}},
                     {"manager": "nfd-master", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
                      "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {"f:nfd": {}}}}}]}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta,
            "spec": {"podCIDR": f"10.244.{i & 255}.0/24", "providerID": f"baremetal://{name}"}, "status": status}


def pod_object(i: int, k: int, *, managed: bool) -> dict[str, Any]:
    """k = 0: the node's agent pod; else a workload pod bound to node i."""
    name = f"agent-{node_name(i)}" if k == 0 else f"job{i}-w{k}"
    labels = {"app.kubernetes.io/name": "hypertopo-agent"} if k == 0 else {"app": "train", "job": f"job{i}"}
    meta: dict[str, Any] = {"name": name, "namespace": "hypertopo-system" if k == 0 else "work", "labels": labels,
                            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 1500 + "}"}}
    if managed:
        meta |= {"uid": f"{i:08x}-3333-0000-0000-{k:012x}", "resourceVersion": str(10 + i),
                 "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}}}}]}
    container = {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3", "command": ["torchrun"],
                 "args": ["--nproc-per-node=8", "train.py"], "env": [{"name": f"E{e}", "value": "v"} for e in range(15)],
                 "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
                               "limits": {"nvidia.com/gpu": "4"}} if k else {"requests": {"cpu": "50m"}},
                 "volumeMounts": [{"name": f"v{v}", "mountPath": f"/m{v}"} for v in range(5)]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node_name(i), "containers": [container], "schedulerName": "default-scheduler",
                     "volumes": [{"name": f"v{v}", "emptyDir": {}} for v in range(5)],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "main", "ready": True, "image": "x", "imageID": "y" * 80}]}}


# -- in-process: a stand-in client serving generated pages ----------------------------------------

def _decode(page: list[str], transform: Any, _n: int) -> list[dict[str, Any]]:
    decoded = json.loads("[" + ",".join(page) + "]")
    return [transform(o) for o in decoded] if transform is not None else decoded


class PagedObjects:
    """list() answers generated objects, decoded from JSON page by page as KubeClient decodes them
    (and transformed per page when the informer passes a transform); watch() idles."""

    def __init__(self, nodes: int, templates: list[str]) -> None:
        self.nodes, self.templates = nodes, templates
        self.stop = threading.Event()

    def _texts(self, plural: str, label_selector: str | None) -> Iterator[str]:
        if plural == "nodes":
            return (json.dumps(node_object(i, managed=True)) for i in range(self.nodes))
        if plural == "nodetopologies":
            return (topology_json(self.templates, i) for i in range(self.nodes))
        if plural == "pods":
            ks = (0,) if label_selector else (0, 1, 2)
            return (json.dumps(pod_object(i, k, managed=True)) for i in range(self.nodes) for k in ks)
        return iter(())

    def list(self, resource: Any, *, label_selector: str | None = None, transform: Any = None,
             limit: int = PAGE, **_: Any) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        page: list[str] = []
        for n, text in enumerate(self._texts(resource.plural, label_selector), start=1):
            page.append(text)
            if len(page) == limit:
                items.extend(_decode(page, transform, n))
                page = []
        items.extend(_decode(page, transform, 0))
        return items, "1"

    def watch(self, resource: Any, **_: Any) -> Iterator[Any]:
        self.stop.wait(3600)
        return iter(())

    def __getattr__(self, name: str) -> Any:  # writes: never made by a standby; events: dropped
        return lambda *a, **k: {}


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _options_as_run(options: Any, args: Any) -> Any:
    """The controller's Options as `run` builds them where it matters for memory: the Node labels
    kept (the old code has no such option and keeps every label)."""
    if "node_label_keys" not in {f.name for f in dataclasses.fields(options)}:
        return options()
    from aggregator.live.slim import labels_read
    from aggregator.registry import load_sources

    return options(node_label_keys=labels_read(load_sources(args, live=True)))


def child_inprocess(role: str, nodes: int) -> None:
    """In a child process (PYTHONPATH picks the code): build, list, compute once; print JSON."""
    templates = _report_templates()
    kube = PagedObjects(nodes, templates)
    if role == "aggregator":
        from aggregator.live.controller import (
            Controller,
            Options,
            build_parser,
            freeze_start_up_heap,
            pipeline_compute,
        )
        from aggregator.live.metrics import AggregatorMetrics

        args = build_parser().parse_args([])
        compute = pipeline_compute(args)
        controller = Controller(kube, compute, options=_options_as_run(Options, args), metrics=AggregatorMetrics(),
                                may_write=lambda: False)  # type: ignore[arg-type]
        gc.collect()
        base, started = rss_mb(), time.monotonic()  # interpreter, imports, generators: before any object
        controller.start()
        while not controller.synced():
            time.sleep(0.2)
        gc.collect()
        controller.cycle()
        freeze_start_up_heap()
        sizes = {"hypernodes": len(compute(controller.view(), 0.0).hypernodes)}
    else:
        from aggregator.placement.live.scheduler import Options as SchedulerOptions
        from aggregator.placement.live.scheduler import Scheduler

        scheduler = Scheduler(kube, SchedulerOptions(), leading=lambda: False)
        gc.collect()
        base, started = rss_mb(), time.monotonic()
        scheduler.start()
        while not (scheduler.synced() and len(scheduler.state.pods) >= 3 * nodes and scheduler._queue.empty()):
            time.sleep(0.2)
        time.sleep(1.0)
        gc.collect()
        sizes = {"pods": len(scheduler.state.pods)}
    print(json.dumps({"rss": rss_mb(), "base": base, "seconds": round(time.monotonic() - started, 1), **sizes}))
    sys.stdout.flush()
    os._exit(0)


def _code_dirs(old_commit: str) -> dict[str, str]:
    old = Path(tempfile.gettempdir()) / f"hypertopo-mem-{old_commit}"
    if not (old / "aggregator").is_dir():
        old.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", old_commit, "agent", "aggregator"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    return {"old": str(old), "new": str(REPO)}


def _row(what: str, nodes: int, code: str, rss: float, base: float, extra: str = "") -> None:
    above = f"base {base:6.1f} MB  ({(rss - base) / nodes * 1000:5.1f} MB/1000 above base)" if base else ""
    print(f"{what:<28} {code:<4} {nodes:>7} nodes  RSS {rss:8.1f} MB  {rss / nodes * 1000:6.1f} MB/1000  {above} {extra}",
          flush=True)


def run_inprocess(sizes: list[int], dirs: dict[str, str], old_max: int) -> None:
    for nodes in sizes:
        for role in ("aggregator", "scheduler"):
            for code, path in dirs.items():
                if code == "old" and nodes > old_max:
                    print(f"in-process {role:<17} old  {nodes:>7} nodes  not run (--old-max {old_max}: it would "
                          f"need ~{nodes * (0.2 if role == 'aggregator' else 0.1):,.0f} MB)", flush=True)
                    continue
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, str(REPO / "tests")])}
                proc = subprocess.run([sys.executable, __file__, "--child", role, str(nodes)], env=env,
                                      capture_output=True, text=True, check=False, cwd="/")
                if proc.returncode != 0:
                    print(f"{role} {code} {nodes}: failed: {proc.stderr[-800:]}", flush=True)
                    continue
                out = json.loads(proc.stdout.strip().splitlines()[-1])
                _row(f"in-process {role}", nodes, code, out["rss"], out["base"],
                     f"[{out['seconds']} s; {', '.join(f'{k} {v}' for k, v in out.items() if k in ('hypernodes', 'pods'))}]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inprocess", type=int, nargs="*", default=[5000])
    parser.add_argument("--live", type=int, nargs="*", default=[])
    parser.add_argument("--old-commit", default=OLD_COMMIT)
    parser.add_argument("--old-max", type=int, default=20_000,
                        help="largest cluster the old code is run at (it holds ~200 MB per 1,000 nodes)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_inprocess(args.child[0], int(args.child[1]))
        return 0
    dirs = _code_dirs(args.old_commit)
    if args.inprocess:
        run_inprocess(args.inprocess, dirs, args.old_max)
    if args.live:
        from bench_memory_live import run_live

        run_live(args.live, {k: v for k, v in dirs.items() if k != "old" or max(args.live) <= args.old_max})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
