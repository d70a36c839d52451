"""The hostfile ConfigMap of a bound gang, for MPI-style launchers (issue 24 point 2).

Why a ConfigMap besides the PodGroup's `hypertopo.io/rank-map` annotation: mpirun, Horovod and
DeepSpeed read a hostfile (`host slots=N`, ranks filling each host's slots in file order), and a
launcher pod can mount a ConfigMap without any access to the API server.

Name: `<Volcano Job>-hostfile` for a Volcano Job's gang (a user knows the Job's name before the
PodGroup exists; Volcano names that one `<job>-<uid>`), else `<PodGroup>-hostfile`; in the
PodGroup's namespace, owned by the PodGroup (an ownerReference, so the garbage collector deletes it
with the gang), labelled `app.kubernetes.io/managed-by: hypertopo-scheduler`.

Data: `hostfile`, the nodes in rank order, one line per run of consecutive ranks on one node
(`node-7 slots=8`: ranks fill a node's slots, so this reproduces the placement's rank order);
`rank-map`, the annotation's JSON (`[["pod","node"],...]`, list index = rank) for launchers that
address pods rather than nodes.

The scheduler never changes a ConfigMap of that name that it did not create: it creates the
ConfigMap, and when one exists it updates it by a JSON patch whose first operation tests for the
label above, which the API server refuses for anyone else's. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["MANAGED_BY", "NAME_SUFFIX", "config_map", "config_map_name", "hostfile_text", "update_patch"]

NAME_SUFFIX = "-hostfile"
MANAGED_BY = ("app.kubernetes.io/managed-by", "hypertopo-scheduler")
NAME_LIMIT = 253  # a ConfigMap name is a DNS subdomain
VOLCANO_JOB_KIND = ("batch.volcano.sh", "Job")


def hostfile_text(rank_map: str) -> str:
    """`node slots=k` per run of consecutive ranks on one node, in rank order (trailing newline)."""
    runs: list[list[Any]] = []
    for _, node in json.loads(rank_map) if rank_map else ():
        if runs and runs[-1][0] == node:
            runs[-1][1] += 1
        else:
            runs.append([node, 1])
    return "".join(f"{node} slots={count}\n" for node, count in runs)


def _volcano_job(podgroup: Mapping[str, Any]) -> str | None:
    for owner in (podgroup.get("metadata") or {}).get("ownerReferences") or ():
        group = str(owner.get("apiVersion") or "").split("/")[0]
        if (group, owner.get("kind")) == VOLCANO_JOB_KIND and owner.get("name"):
            return str(owner["name"])
    return None


def config_map_name(podgroup: Mapping[str, Any]) -> str | None:
    """`<Volcano Job>-hostfile` or `<PodGroup>-hostfile`; None when that is too long a name."""
    base = _volcano_job(podgroup) or str((podgroup.get("metadata") or {}).get("name") or "")
    name = base + NAME_SUFFIX
    return name if base and len(name) <= NAME_LIMIT else None


def config_map(podgroup: Mapping[str, Any], api_version: str, rank_map: str) -> dict[str, Any] | None:
    """The ConfigMap for a PodGroup (`api_version`: its group/version) and its rank map; None when
    it has no name or UID to own it by, or the map is empty."""
    meta = podgroup.get("metadata") or {}
    name, uid = config_map_name(podgroup), meta.get("uid")
    if not name or not uid or not rank_map:
        return None
    owner = {"apiVersion": api_version, "kind": "PodGroup", "name": str(meta.get("name")), "uid": str(uid)}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": str(meta.get("namespace") or ""),
                         "labels": {MANAGED_BY[0]: MANAGED_BY[1]}, "ownerReferences": [owner]},
            "data": {"hostfile": hostfile_text(rank_map), "rank-map": rank_map}}


def update_patch(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) that rewrites an existing ConfigMap's data and owner to `obj`'s, and
    that the API server refuses unless the ConfigMap carries our label."""
    label = "/metadata/labels/" + MANAGED_BY[0].replace("~", "~0").replace("/", "~1")
    return [{"op": "test", "path": label, "value": MANAGED_BY[1]},
            {"op": "replace", "path": "/data", "value": obj["data"]},
            {"op": "replace", "path": "/metadata/ownerReferences", "value": obj["metadata"]["ownerReferences"]}]
