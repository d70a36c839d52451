"""Slim records: what the informers keep of each API object, cut down on arrival to what is read.

Why: an informer that keeps whole objects keeps what nobody reads. A kubelet's Node carries
`status.images` (50-100 entries), managedFields of every writer and the heartbeat fields; a
NodeTopology is ~17 kB of JSON that the aggregator parses anyway, so the raw object and its parsed
report were both held. At ~80 MB per 1,000 nodes a replica was OOM-killed past ~13,000 nodes. The
informers (agent.adapters.informer, `transform`) therefore keep, per kind, a smaller dict of the
same shape, so every reader keeps working on it unchanged (the client-go informer transform idea):

- Node (`slim_node`): name, uid, resourceVersion, every label (the scheduler's node selectors and
  the label-level sources may read any), the `hypertopo.io/` annotations, the managedFields
  entries of hypertopo's own field managers (node_marks reads which labels and annotations it
  owns), taints, unschedulable, the Ready condition's status, allocatable.
- NodeTopology (`slim_topology`): name, uid, resourceVersion, the digest of the probe-plan row in
  its status (`measure_rows.PLAN_DIGEST_KEY`) and the parsed report (or why it could not be parsed)
  under `nodetopology.PARSED_KEY`; `report_from_object` returns it as is. The
  report's many equal parts (NVLink entries, the per-GPU link tuples, health values, repeated
  strings) are shared between reports (`share_report`): 144 NVLink entries of an 8-GPU node, equal
  on every healthy node, were half of a parsed report's memory.
- Pod (`slim_pod`, the scheduler's): metadata without managedFields and the kubectl
  last-applied annotation; the spec fields placement, filters and gangs read (containers and init
  containers reduced to name and resources); phase, conditions and nominatedNodeName.
- Agent pod (`slim_agent_pod`, the aggregator's): name, namespace, uid, resourceVersion,
  deletionTimestamp, nodeName, the Ready condition.
- Anything else the scheduler watches (`without_managed_fields`): managedFields dropped.

Every function takes a full object or its own output (a re-list may hand a record back), and label
keys and values are interned: at 100,000 nodes the same thirty keys are one string each.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agent.measure_rows import PLAN_DIGEST_KEY
from agent.report import ComponentHealth, GpuFabric, NodeReport, NvLink, NvLinkDomain
from aggregator.node_marks import DEGRADED_MANAGER, LABEL_MANAGER, LABEL_PREFIX
from aggregator.sources.nodetopology import PARSED_KEY, report_from_object

Obj = dict[str, Any]
OUR_MANAGERS = frozenset({LABEL_MANAGER, DEGRADED_MANAGER})
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
POD_SPEC_KEPT = ("nodeName", "schedulerName", "nodeSelector", "tolerations", "affinity", "overhead",
                 "priority", "priorityClassName", "topologySpreadConstraints", "schedulingGroup")
POD_STATUS_KEPT = ("phase", "conditions", "nominatedNodeName")
# report parts shared between reports when equal: value objects, never a node's own identity
SHARED_CLASSES = (NvLink, ComponentHealth, GpuFabric, NvLinkDomain)
EMPTY: Mapping[str, Any] = MappingProxyType({})  # every empty map of a report (counters, ...): one, read-only
# one node's own names (GUIDs, UUIDs, MACs): never equal to another's, so not worth a shared-table entry
OWN_FIELDS = frozenset({"node_name", "hostname", "uuid", "node_guid", "sys_image_guid", "node_desc", "mac", "gids"})
SHARED_LIMIT = 200_000  # parts remembered; past it the table starts over (sharing is an economy only)


def _text(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _interned(mapping: Mapping[str, Any] | None) -> dict[str, Any]:
    return {_text(k): _text(v) for k, v in (mapping or {}).items()}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _ident(obj: Mapping[str, Any]) -> Obj:
    """apiVersion, kind and the metadata that names an object and its version (events, preconditions)."""
    meta = _meta(obj)
    out: Obj = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    slim: Obj = {"metadata": out}
    for key in ("apiVersion", "kind"):
        if key in obj:
            slim[key] = _text(obj[key])
    return slim


def _our_managed_fields(meta: Mapping[str, Any]) -> list[Obj]:
    """The managedFields entries of hypertopo's own node field managers, metadata part only."""
    kept = []
    for entry in meta.get("managedFields") or []:
        if isinstance(entry, Mapping) and entry.get("manager") in OUR_MANAGERS:
            fields = (entry.get("fieldsV1") or {}).get("f:metadata")
            kept.append({"manager": entry.get("manager"), "operation": entry.get("operation"),
                         "fieldsV1": {"f:metadata": fields} if fields else {}})
    return kept


def slim_node(node: Mapping[str, Any]) -> Obj:
    """The Node as the aggregator and the scheduler read it (module docstring)."""
    meta, spec, status = _meta(node), node.get("spec") or {}, node.get("status") or {}
    slim = _ident(node)
    out = slim["metadata"]
    out["labels"] = _interned(meta.get("labels"))
    ours = {k: v for k, v in (meta.get("annotations") or {}).items() if str(k).startswith(LABEL_PREFIX)}
    if ours:
        out["annotations"] = _interned(ours)
    managed = _our_managed_fields(meta)
    if managed:
        out["managedFields"] = managed
    slim["spec"] = {k: spec[k] for k in ("taints", "unschedulable") if spec.get(k)}
    kept: Obj = {}
    ready = [{"type": "Ready", "status": _text(c.get("status"))}
             for c in status.get("conditions") or () if isinstance(c, Mapping) and c.get("type") == "Ready"]
    if ready:
        kept["conditions"] = ready[-1:]
    if status.get("allocatable"):
        kept["allocatable"] = _interned(status["allocatable"])
    slim["status"] = kept
    return slim


def slim_topology(obj: Mapping[str, Any]) -> Obj:
    """The NodeTopology as its identity plus the parsed report (or the one-line reason it is unreadable)."""
    if PARSED_KEY in obj:
        return dict(obj)
    slim = _ident(obj)
    plan = (obj.get("status") or {}).get("probePlan")  # only its digest: what the plan writer compares
    if isinstance(plan, Mapping) and isinstance(plan.get("digest"), str):
        slim[PLAN_DIGEST_KEY] = plan["digest"]
    try:
        slim[PARSED_KEY] = share_report(report_from_object(obj))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        slim[PARSED_KEY] = str(exc) or type(exc).__name__
    return slim


def _container(container: Any) -> Any:
    if not isinstance(container, Mapping):
        return container
    return {k: container[k] for k in ("name", "resources") if k in container}


def slim_pod(pod: Mapping[str, Any]) -> Obj:
    """The Pod as the scheduler reads it: placement, node filters, gangs, ranks, events, binds."""
    meta, spec, status = _meta(pod), pod.get("spec") or {}, pod.get("status") or {}
    slim = _ident(pod)
    for key, value in meta.items():
        if key not in ("managedFields", "annotations", "labels"):
            slim["metadata"].setdefault(key, value)
    slim["metadata"]["labels"] = _interned(meta.get("labels"))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        slim["metadata"]["annotations"] = _interned(annotations)
    kept: Obj = {k: spec[k] for k in POD_SPEC_KEPT if k in spec}
    for part in ("containers", "initContainers"):
        if part in spec:
            kept[part] = [_container(c) for c in spec[part] or ()]
    slim["spec"] = kept
    slim["status"] = {k: status[k] for k in POD_STATUS_KEPT if k in status}
    return slim


def slim_agent_pod(pod: Mapping[str, Any]) -> Obj:
    """An agent pod as the aggregator reads it: which node, whether Ready, whether going away."""
    meta, spec, status = _meta(pod), pod.get("spec") or {}, pod.get("status") or {}
    slim = _ident(pod)
    if meta.get("deletionTimestamp"):
        slim["metadata"]["deletionTimestamp"] = meta["deletionTimestamp"]
    slim["spec"] = {"nodeName": _text(spec["nodeName"])} if spec.get("nodeName") else {}
    ready = [{"type": "Ready", "status": c.get("status")}
             for c in status.get("conditions") or () if isinstance(c, Mapping) and c.get("type") == "Ready"]
    slim["status"] = {"conditions": ready} if ready else {}
    return slim


def without_managed_fields(obj: Mapping[str, Any]) -> Obj:
    """The object less metadata.managedFields (kinds the scheduler reads nearly whole)."""
    meta = _meta(obj)
    if "managedFields" not in meta:
        return dict(obj)
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


# -- sharing equal parts of parsed reports -----------------------------------------------------------

_shared: dict[Any, Any] = {}  # key -> the shared instance
_shared_ids: set[int] = set()  # ids of the shared instances (alive: _shared holds them)


def share_report(report: NodeReport) -> NodeReport:
    """The same report, its equal value parts replaced by one shared instance each (see the module
    docstring). Reports are frozen and never mutated, so sharing cannot leak a change from one node
    to another; each part is rebuilt before the report is handed to anyone."""
    if len(_shared) > SHARED_LIMIT:
        _shared.clear()
        _shared_ids.clear()
    shared: NodeReport = _share(report)
    return shared


def _share(value: Any) -> Any:
    if type(value) is str:
        return sys.intern(value)
    if type(value) is tuple:
        items = tuple(_share(v) for v in value)
        return _canonical(("tuple", *(_key(v) for v in items)), items)
    if type(value) is dict:
        return {_share(k): _share(v) for k, v in value.items()} if value else EMPTY
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _share_instance(value)
    return value


def _share_instance(value: Any) -> Any:
    fields = {f.name: _share(getattr(value, f.name)) if f.name not in OWN_FIELDS else getattr(value, f.name)
              for f in dataclasses.fields(value)}
    for name, new in fields.items():
        if new is not getattr(value, name):
            object.__setattr__(value, name, new)  # a fresh parse nobody else holds yet
    if not isinstance(value, SHARED_CLASSES):
        return value
    return _canonical((type(value), *(_key(v) for v in fields.values())), value)


def _canonical(key: tuple[Any, ...], value: Any) -> Any:
    """The shared instance equal to `value` (it becomes that instance when it is the first)."""
    if None in key:
        return value
    found = _shared.setdefault(key, value)
    if found is value:
        _shared_ids.add(id(value))
    return found


def _key(value: Any) -> Any:
    """A hashable stand-in for a part: shared parts by identity, plain values by type and value,
    None when the part cannot be compared cheaply (then what holds it is not shared)."""
    if id(value) in _shared_ids:
        return ("id", id(value))
    if value is EMPTY:
        return ("empty",)
    if value is None or isinstance(value, (str, int, float)):
        return ("v", type(value), value)
    return None
