"""Slim records: what the informers keep of each API object, cut down on arrival to what is read.

Why: an informer that keeps whole objects keeps what nobody reads. A kubelet's Node carries
`status.images` (50-100 entries), managedFields of every writer and the heartbeat fields; a
NodeTopology is ~17 kB of JSON that the aggregator parses anyway, so the raw object and its parsed
report were both held. At ~80 MB per 1,000 nodes a replica was OOM-killed past ~13,000 nodes. The
informers (agent.common.adapters.informer, `transform`) therefore keep, per kind, a smaller dict of the
same shape, so every reader keeps working on it unchanged (the client-go informer transform idea):

- Node (`slim_node`): name, uid, resourceVersion, every label (the scheduler's node selectors and
  the label-level sources may read any), the `hypertopo.io/` annotations, the managedFields
  entries of hypertopo's own field managers (node_marks reads which labels and annotations it
  owns), taints, unschedulable, the Ready condition's status, allocatable. The aggregator's own
  record (`aggregator_node`) keeps of the labels only hypertopo's and those its label levels name
  (no other aggregator module reads a label; the scheduler's node selectors may read any), and no
  allocatable: a kubelet's thirty labels were most of what an aggregator kept per Node.
- NodeTopology (`slim_topology`): name, uid, resourceVersion, the digest of the probe-plan row in
  its status (`measure_rows.PLAN_DIGEST_KEY`) and the parsed report (or why it could not be parsed)
  under `nodetopology.PARSED_KEY`; `report_from_object` returns it as is. The
  report is the aggregator's copy (aggregator.live.slim_report): the fields no aggregator module reads
  (GPU UUIDs, MACs, LIDs, ...) dropped (`trim_report`), its equal parts (NVLink domain, health
  values, interfaces, repeated strings) shared between reports (`share_report`).
- Pod (`slim_pod`, the scheduler's): metadata without managedFields and the kubectl
  last-applied annotation; the spec fields placement, filters and gangs read (containers and init
  containers reduced to name and resources); phase, conditions and nominatedNodeName.
- Agent pod (`slim_agent_pod`, the aggregator's): name, namespace, uid, resourceVersion,
  deletionTimestamp, nodeName, the Ready condition.
- HyperNode (`slim_hypernode`, the aggregator's): the whole object (reconcile compares its spec,
  labels, annotations, status and managedFields with what it wants), each member entry replaced
  by the one instance `aggregator.render.member` keeps of it, which the desired HyperNodes hold
  too: an entry per node, three dicts and two strings, is then held once, not twice.
- Anything else the scheduler watches (`without_managed_fields`): managedFields dropped.

Every function takes a full object or its own output (a re-list may hand a record back), and label
keys and values are interned: at 100,000 nodes the same thirty keys are one string each.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from agent.common.measure_rows import PLAN_DIGEST_KEY
from aggregator.live.node_marks import DEGRADED_MANAGER, LABEL_MANAGER, LABEL_PREFIX
from aggregator.live.slim_report import share_report, trim_report
from aggregator.render import MEMBER_TYPES, member
from aggregator.sources import Source
from aggregator.sources.nodetopology import PARSED_KEY, report_from_object

Obj = dict[str, Any]
OUR_MANAGERS = frozenset({LABEL_MANAGER, DEGRADED_MANAGER})
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
POD_SPEC_KEPT = ("nodeName", "schedulerName", "nodeSelector", "tolerations", "affinity", "overhead",
                 "priority", "priorityClassName", "topologySpreadConstraints", "schedulingGroup")
POD_STATUS_KEPT = ("phase", "conditions", "nominatedNodeName")
SHARED_META = ("namespace", "generateName", "ownerReferences")  # what a job's pods have in common


def _text(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _interned(mapping: Mapping[str, Any] | None) -> dict[str, Any]:
    return {_text(k): _text(v) for k, v in (mapping or {}).items()}


# -- equal parts shared between records -------------------------------------------------------------

_parts: dict[Any, Any] = {}  # the key of a JSON value -> the one instance kept of it
PARTS_LIMIT = 50_000  # distinct parts remembered; past it the table starts over (sharing is an economy only)
_SCALARS = (str, int, float, bool, type(None))


def _part_key(value: Any) -> Any:
    """A hashable stand-in for a JSON value, its types included (1, 1.0 and True stay apart)."""
    kind = type(value)
    if kind is dict:
        return (dict, tuple((k, _part_key(v)) for k, v in value.items()))
    if kind is list:
        return (list, tuple(_part_key(v) for v in value))
    if kind in _SCALARS:
        return (kind, value)
    raise TypeError(kind.__name__)


def shared(value: Any) -> Any:
    """The one instance kept of a JSON value equal to `value` (`value` itself when it is the first).

    The parts that repeat from record to record (a job's tolerations, containers and labels, a
    node type's allocatable, a Ready condition) are then held once, not once per pod or node.
    Records are read, never changed (as client-go's informer caches), so a part may be shared."""
    if type(value) in _SCALARS:
        return _text(value)  # a string is shared by interning it, not by a table entry
    try:
        key = _part_key(value)
    except TypeError:
        return value
    found = _parts.get(key)
    if found is None:
        if len(_parts) >= PARTS_LIMIT:
            _parts.clear()
        found = _parts[key] = value
    return found


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _ident(obj: Mapping[str, Any], *, shared_name: bool = False) -> Obj:
    """apiVersion, kind and the metadata that names an object and its version (events, preconditions).
    `shared_name`: the name is interned (a node's name, which its Node, its NodeTopology, its report
    and the HyperNode member entries all hold: one string, not one per record)."""
    meta = _meta(obj)
    out: Obj = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    if shared_name and "name" in out:
        out["name"] = _text(out["name"])
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


def slim_node(node: Mapping[str, Any], *, label_keys: Collection[str] | None = None,
              allocatable: bool = True) -> Obj:
    """The Node as the aggregator and the scheduler read it (module docstring). `label_keys`: the
    labels kept besides hypertopo's own (None: every label); `allocatable`: whether it is kept. The
    aggregator keeps only the labels its label levels name and no allocatable (module docstring)."""
    meta, spec, status = _meta(node), node.get("spec") or {}, node.get("status") or {}
    slim = _ident(node, shared_name=True)
    out = slim["metadata"]
    labels = meta.get("labels") or {}
    if label_keys is not None:
        labels = {k: v for k, v in labels.items() if k in label_keys or str(k).startswith(LABEL_PREFIX)}
    # the aggregator's few labels are equal on every node of a leaf; the scheduler's name the node
    out["labels"] = _interned(labels) if label_keys is None else shared(_interned(labels))
    ours = {k: v for k, v in (meta.get("annotations") or {}).items() if str(k).startswith(LABEL_PREFIX)}
    if ours:
        out["annotations"] = _interned(ours)
    managed = _our_managed_fields(meta)
    if managed:
        out["managedFields"] = managed
    slim["spec"] = shared({k: shared(spec[k]) for k in ("taints", "unschedulable") if spec.get(k)})
    kept: Obj = {}
    ready = [{"type": "Ready", "status": _text(c.get("status"))}
             for c in status.get("conditions") or () if isinstance(c, Mapping) and c.get("type") == "Ready"]
    if ready:
        kept["conditions"] = ready[-1:]
    if allocatable and status.get("allocatable"):
        kept["allocatable"] = _interned(status["allocatable"])
    slim["status"] = shared(kept)
    return slim


def aggregator_node(label_keys: Collection[str] | None) -> Callable[[Mapping[str, Any]], Obj]:
    """The aggregator's Node record: `slim_node` with the labels of `label_keys` (the label
    levels' keys; None: every label) besides hypertopo's own, and without allocatable."""
    keys = None if label_keys is None else frozenset(label_keys)
    return functools.partial(slim_node, label_keys=keys, allocatable=False)


def labels_read(sources: Iterable[Source]) -> frozenset[str] | None:
    """The Node label keys the sources read (their label levels); None when a source reads labels
    without naming which (then every label is kept)."""
    keys: set[str] = set()
    for source in sources:
        if source.node_labels_matter:
            levels = getattr(source, "levels", None)
            if levels is None:
                return None
            keys.update(levels)
    return frozenset(keys)


def slim_topology(obj: Mapping[str, Any]) -> Obj:
    """The NodeTopology as its identity plus the parsed report (or the one-line reason it is unreadable)."""
    if PARSED_KEY in obj:
        return dict(obj)
    slim = _ident(obj, shared_name=True)
    plan = (obj.get("status") or {}).get("probePlan")  # only its digest: what the plan writer compares
    if isinstance(plan, Mapping) and isinstance(plan.get("digest"), str):
        slim[PLAN_DIGEST_KEY] = plan["digest"]
    try:
        slim[PARSED_KEY] = share_report(trim_report(report_from_object(obj)))
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
            slim["metadata"].setdefault(key, shared(value) if key in SHARED_META else value)
    slim["metadata"]["labels"] = shared(_interned(meta.get("labels")))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        slim["metadata"]["annotations"] = shared(_interned(annotations))
    kept: Obj = {k: shared(spec[k]) for k in POD_SPEC_KEPT if k in spec}
    for part in ("containers", "initContainers"):
        if part in spec:
            kept[part] = shared([_container(c) for c in spec[part] or ()])
    slim["spec"] = kept
    slim["status"] = shared({k: _pod_status(k, status[k]) for k in POD_STATUS_KEPT if k in status})
    return slim


def _pod_status(key: str, value: Any) -> Any:
    """A kept status field; of the conditions their type, status and reason (no reader wants
    their times or messages, which made every pod's conditions differ)."""
    if key != "conditions" or not isinstance(value, list):
        return _text(value)
    return [{k: _text(c[k]) for k in ("type", "status", "reason") if k in c} if isinstance(c, Mapping) else c
            for c in value]


def slim_agent_pod(pod: Mapping[str, Any]) -> Obj:
    """An agent pod as the aggregator reads it: which node, whether Ready, whether going away."""
    meta, spec, status = _meta(pod), pod.get("spec") or {}, pod.get("status") or {}
    slim = _ident(pod)
    if meta.get("deletionTimestamp"):
        slim["metadata"]["deletionTimestamp"] = meta["deletionTimestamp"]
    slim["spec"] = {"nodeName": _text(spec["nodeName"])} if spec.get("nodeName") else {}
    ready = [{"type": "Ready", "status": _text(c.get("status"))}
             for c in status.get("conditions") or () if isinstance(c, Mapping) and c.get("type") == "Ready"]
    slim["status"] = shared({"conditions": ready} if ready else {})
    return slim


def without_managed_fields(obj: Mapping[str, Any]) -> Obj:
    """The object less metadata.managedFields (kinds the scheduler reads nearly whole)."""
    meta = _meta(obj)
    if "managedFields" not in meta:
        return dict(obj)
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def slim_hypernode(obj: Mapping[str, Any]) -> Obj:
    """The HyperNode with its member entries shared with the desired ones (module docstring); an
    entry of another shape (a regular-expression or label selector, an extra field) is kept as is."""
    spec = obj.get("spec")
    members = spec.get("members") if isinstance(spec, Mapping) else None
    if not isinstance(members, list) or not members:
        return obj if isinstance(obj, dict) else dict(obj)
    kept = [_shared_member(entry) for entry in members]
    if all(a is b for a, b in zip(kept, members, strict=True)):  # already this function's output
        return obj if isinstance(obj, dict) else dict(obj)
    return {**obj, "spec": {**spec, "members": kept}}  # type: ignore[dict-item]


def _shared_member(entry: Any) -> Any:
    if type(entry) is not dict or len(entry) != 2 or entry.get("type") not in MEMBER_TYPES:
        return entry
    selector = entry.get("selector")
    exact = selector.get("exactMatch") if type(selector) is dict and len(selector) == 1 else None
    if type(exact) is not dict or len(exact) != 1 or type(exact.get("name")) is not str:
        return entry
    return member(entry["type"], exact["name"])
