"""The live scheduler's view of the cluster: Nodes, Pods, HyperNodes and PodGroups as the
informers last saw them, plus the scheduler's own *assumed* pods (decided, bind not yet seen).

Why a charge ledger: two decisions must never double-book a node. Every pod that holds resources
on a node (bound per the API, or assumed by us and not yet confirmed) has exactly one charge
(node, request); `used` is the sum of charges, kept incrementally, so a decision reads free
capacity in O(nodes) instead of re-summing every pod, and an assumption is released by dropping
its charge. The same changes feed a `FreeIndex` (per-domain aggregates the placement core reads)
node by node. Pure: plain dicts in, `Resources` out; the informer threads feed it via one queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator.placement.core.free_index import FreeIndex
from aggregator.placement.core.resources import Resources, node_allocatable, pod_request
from aggregator.placement.core.topology import Topology
from aggregator.placement.kinds import upstream

PodKey = tuple[str, str]  # (namespace, name)
FABRIC_TAINT = "hypertopo.io/fabric-unhealthy"
GANG_LABEL = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins PodGroup (a pod label)
VOLCANO_GANG_ANNOTATION = "scheduling.k8s.io/group-name"  # Volcano PodGroup (a pod annotation)
FINISHED = ("Succeeded", "Failed")
GROUP_KINDS = ("PodGroup", "VolcanoPodGroup", "K8sPodGroup")  # the informers' kinds of PodGroup
XK8S, VOLCANO, SINGLE = "x-k8s", "volcano", ""
K8S = "k8s"  # Kubernetes' own PodGroup (scheduling.k8s.io): pods name it in spec.schedulingGroup


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name", ""))


def is_finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED


def gang_ref(pod: Mapping[str, Any]) -> tuple[PodKey, str]:
    """The gang a pod belongs to and its flavour: Kubernetes' own PodGroup (the pod's
    `spec.schedulingGroup`, an immutable API field, so it comes first), a scheduler-plugins
    PodGroup (label), a Volcano PodGroup (annotation, as Volcano's job controller writes it) or
    SINGLE (a gang of one)."""
    namespace, name = pod_key(pod)
    k8s_group = upstream.group_name(pod)
    if k8s_group:
        return (namespace, k8s_group), K8S
    meta = pod.get("metadata") or {}
    group = (meta.get("labels") or {}).get(GANG_LABEL)
    if group:
        return (namespace, str(group)), XK8S
    group = (meta.get("annotations") or {}).get(VOLCANO_GANG_ANNOTATION)
    if group:
        return (namespace, str(group)), VOLCANO
    return (namespace, name), SINGLE


def gang_key(pod: Mapping[str, Any]) -> tuple[PodKey, bool]:
    """The gang a pod belongs to and whether it is a named group (else a gang of one)."""
    key, flavour = gang_ref(pod)
    return key, flavour != SINGLE


@dataclass
class ClusterState:
    """Mutable cache, owned by the scheduler loop thread (never shared across threads)."""

    scheduler_name: str
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[PodKey, dict[str, Any]] = field(default_factory=dict)
    hypernodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    podgroups: dict[PodKey, dict[str, Any]] = field(default_factory=dict)  # scheduler-plugins
    vc_podgroups: dict[PodKey, dict[str, Any]] = field(default_factory=dict)  # Volcano
    k8s_podgroups: dict[PodKey, dict[str, Any]] = field(default_factory=dict)  # Kubernetes' own (upstream.py)
    vc_jobs: dict[PodKey, dict[str, Any]] = field(default_factory=dict)  # Volcano batch Jobs
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)  # Volcano Queues
    queues_known: bool = False  # Volcano's Queue CRD answered (else no queue is enforced)
    assumed: dict[PodKey, str] = field(default_factory=dict)
    # generation: bumps on every change that can make an unschedulable gang fit (or stop fitting)
    generation: int = 0
    # bumps when what the tree, the node filters or fault handling read changes: a HyperNode's spec
    # or conditions, a Node coming or going, or its labels, annotations, taints or unschedulable.
    # Not on a Node's status heartbeat (hundreds a second at 100,000 nodes), nor on a HyperNode's
    # node count: each bump costs the scheduler a rebuild of the tree and its aggregates.
    topology_generation: int = 0
    # bumps when capacity may have grown: a charge released or moved, a node's allocatable changed.
    # With topology_generation it tells a gang that did not fit whether retrying can succeed
    # (binds only take capacity away)
    freed_generation: int = 0
    _allocatable: dict[str, Resources] = field(default_factory=dict)
    _used: dict[str, Resources] = field(default_factory=dict)
    _charges: dict[PodKey, tuple[str, Resources]] = field(default_factory=dict)
    _requests: dict[PodKey, tuple[tuple[Any, ...], Resources]] = field(default_factory=dict)  # see _request
    _free: dict[str, Resources] = field(default_factory=dict)  # changed only through _set_free
    # what Volcano's queue admission weighs: the free capacity of the schedulable nodes, each
    # amount floored at 0, summed; kept as `_free` changes instead of summed over every node
    free_total: Resources = field(default_factory=Resources)
    _unschedulable: set[str] = field(default_factory=set)
    # indexes of our own pods, kept as pods change so a cycle never scans every pod
    gangs: dict[PodKey, dict[PodKey, bool]] = field(default_factory=dict)  # gang -> {pod: True}
    pending_keys: set[PodKey] = field(default_factory=set)
    dirty_gangs: set[PodKey] = field(default_factory=set)  # gangs whose pods changed (status to write)
    _gang_of: dict[PodKey, PodKey] = field(default_factory=dict)
    # every pod in a named gang, whoever schedules it (fault handling acts on all of them)
    members: dict[PodKey, dict[PodKey, bool]] = field(default_factory=dict)
    _member_of: dict[PodKey, PodKey] = field(default_factory=dict)
    on_node: dict[str, set[PodKey]] = field(default_factory=dict)  # node -> pods charged there
    # the placement core's aggregates over `_free` for the current topology, fed by changed nodes
    _aggregates: FreeIndex | None = None
    _index_stale: set[str] = field(default_factory=set)
    # nodes the aggregates count as holding nothing: every gang's reserved spares (`spare_hold`)
    _held: set[str] = field(default_factory=set)

    # -- informer input -----------------------------------------------------------------------
    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """One watch event (ADDED / MODIFIED / DELETED) for kind Node, Pod, HyperNode or PodGroup."""
        deleted = event == "DELETED"
        if kind == "Pod":
            self._apply_pod(obj, deleted)
        elif kind == "Node":
            if not self._apply_node(obj, deleted):
                return  # a heartbeat: nothing a decision reads has changed
        elif kind == "HyperNode":
            old = self.hypernodes.get(object_key(obj))
            _put(self.hypernodes, object_key(obj), obj, deleted)
            if not deleted and old is not None and _tree_view(old) == _tree_view(obj):
                return  # its node count or metadata: nothing a decision reads
            self.topology_generation += 1
        elif kind in GROUP_KINDS:
            _put(self.group_table(kind), pod_key(obj), obj, deleted)
            self.dirty_gangs.add(pod_key(obj))
        elif kind == "Queue":
            _put(self.queues, object_key(obj), obj, deleted)
            self.queues_known = True
        elif kind == "VolcanoJob":
            _put(self.vc_jobs, pod_key(obj), obj, deleted)
        self.generation += 1

    def resync(self, kind: str, items: Iterable[dict[str, Any]]) -> None:
        """A fresh list: objects missing from it were deleted while we were not watching."""
        items = list(items)
        tables: dict[str, dict[Any, dict[str, Any]]] = {
            "Pod": self.pods, "Node": self.nodes, "HyperNode": self.hypernodes, "PodGroup": self.podgroups,
            "VolcanoPodGroup": self.vc_podgroups, "K8sPodGroup": self.k8s_podgroups, "Queue": self.queues,
            "VolcanoJob": self.vc_jobs,
        }
        if kind == "Queue":
            self.queues_known = True
        known = list(tables[kind])
        fresh = {object_key(o) if kind in ("Node", "HyperNode", "Queue") else pod_key(o) for o in items}
        for gone in [k for k in known if k not in fresh]:
            self.apply(kind, "DELETED", self._stub(kind, gone))
        for obj in items:
            self.apply(kind, "MODIFIED", obj)

    @staticmethod
    def _stub(kind: str, key: Any) -> dict[str, Any]:
        if isinstance(key, tuple):
            return {"metadata": {"namespace": key[0], "name": key[1]}}
        return {"metadata": {"name": key}}

    def _apply_node(self, node: dict[str, Any], deleted: bool) -> bool:
        """False when nothing the scheduler reads changed (a status heartbeat): then neither the
        tree nor the free capacity is touched."""
        name = object_key(node)
        old = self.nodes.get(name)
        _put(self.nodes, name, node, deleted)
        if deleted:
            self._allocatable.pop(name, None)
            self._set_free(name, None)
            self._unschedulable.discard(name)
            self.topology_generation += 1
            return True
        changed = old is None or _node_view(old) != _node_view(node)
        if changed:
            self.topology_generation += 1
            self._set_schedulable(name, not (node.get("spec") or {}).get("unschedulable"))
        allocatable = node_allocatable(node)
        if allocatable != self._allocatable.get(name):
            self.freed_generation += 1
            self._allocatable[name] = allocatable
            self._set_free(name, allocatable - self._used.get(name, Resources()))
            changed = True
        return changed

    def _set_free(self, node: str, free: Resources | None) -> None:
        """Every change of a node's free capacity: the index learns of it, the total follows."""
        old = self._free.get(node)
        if free is None:
            self._free.pop(node, None)
        else:
            self._free[node] = free
        self._index_stale.add(node)
        if node not in self._unschedulable:
            self.free_total = self.free_total + _floored(free) - _floored(old)

    def _set_schedulable(self, node: str, schedulable: bool) -> None:
        if schedulable == (node not in self._unschedulable):
            return
        free = _floored(self._free.get(node))
        if schedulable:
            self._unschedulable.discard(node)
            self.free_total = self.free_total + free
        else:
            self._unschedulable.add(node)
            self.free_total = self.free_total - free

    def _apply_pod(self, pod: dict[str, Any], deleted: bool) -> None:
        key = pod_key(pod)
        _put(self.pods, key, pod, deleted)
        if deleted:
            self._requests.pop(key, None)
        if deleted or (pod.get("spec") or {}).get("nodeName"):
            self.assumed.pop(key, None)  # confirmed (or gone): the API's word replaces ours
        self._recharge(key)
        self._index(key)

    # -- the scheduler's own decisions --------------------------------------------------------
    def assume(self, key: PodKey, node: str) -> None:
        self.assumed[key] = node
        self._recharge(key)
        self._index(key)
        self.generation += 1

    def forget(self, key: PodKey) -> None:
        """Releases an assumption (a bind that failed or was rolled back)."""
        if self.assumed.pop(key, None) is not None:
            self._recharge(key)
            self._index(key)
            self.generation += 1

    def _recharge(self, key: PodKey) -> None:
        pod = self.pods.get(key)
        node = self.node_of(key)
        charge = None if pod is None or node is None or is_finished(pod) else (node, self._request(key, pod))
        old = self._charges.get(key)
        if old == charge:  # a bound pod's status update: same node, same request
            return
        if old is not None:
            del self._charges[key]
            self._charge(old[0], Resources() - old[1])
            held = self.on_node.get(old[0])
            if held is not None:
                held.discard(key)
                if not held:
                    del self.on_node[old[0]]
            self.freed_generation += 1
        if charge is None:
            return
        self._charges[key] = charge
        self._charge(charge[0], charge[1])
        self.on_node.setdefault(charge[0], set()).add(key)

    def request_of(self, pod: Mapping[str, Any]) -> Resources:
        """A pod's request, through the same cache that charges it (decisions read it too)."""
        return self._request(pod_key(pod), pod)

    def _request(self, key: PodKey, pod: Mapping[str, Any]) -> Resources:
        """The pod's request, parsed again only when what it is computed from changed: a pod is
        charged at its list, at our assumption and at its bind event, and parsing its quantity
        strings each time was a fifth of the scheduler's CPU per bound pod."""
        spec = pod.get("spec") or {}
        basis = (tuple((c.get("resources") or {}).get("requests") for c in spec.get("containers") or ()),
                 tuple((c.get("resources") or {}).get("requests") for c in spec.get("initContainers") or ()),
                 spec.get("overhead"))
        cached = self._requests.get(key)
        if cached is not None and cached[0] == basis:
            return cached[1]
        request = pod_request(pod)
        self._requests[key] = (basis, request)
        return request

    def _charge(self, node: str, amount: Resources) -> None:
        self._used[node] = used = self._used.get(node, Resources()) + amount
        if node in self._allocatable:
            self._set_free(node, self._allocatable[node] - used)

    def _index(self, key: PodKey) -> None:
        """Keeps the gang and pending indexes of our pods current for one pod."""
        pod = self.pods.get(key)
        old_gang = self._gang_of.pop(key, None)
        if old_gang is not None:
            self.gangs.get(old_gang, {}).pop(key, None)
            if not self.gangs.get(old_gang, True):
                del self.gangs[old_gang]
            self.dirty_gangs.add(old_gang)
        self.pending_keys.discard(key)
        old_member = self._member_of.pop(key, None)
        if old_member is not None:
            self.members.get(old_member, {}).pop(key, None)
            if not self.members.get(old_member, True):
                del self.members[old_member]
        if pod is None:
            return
        gang, flavour = gang_ref(pod)
        if flavour != SINGLE:
            self._member_of[key] = gang
            self.members.setdefault(gang, {})[key] = True
        if not self.is_ours(pod):
            return
        self._gang_of[key] = gang
        self.gangs.setdefault(gang, {})[key] = True
        self.dirty_gangs.add(gang)
        if self._needs_node(key, pod):
            self.pending_keys.add(key)

    def _needs_node(self, key: PodKey, pod: Mapping[str, Any]) -> bool:
        return (
            key not in self.assumed
            and not (pod.get("spec") or {}).get("nodeName")
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and not is_finished(pod)
        )

    # -- reads --------------------------------------------------------------------------------
    def node_of(self, key: PodKey) -> str | None:
        """Where a pod is, or is about to be: its spec.nodeName, else our assumption."""
        pod = self.pods.get(key)
        bound = (pod.get("spec") or {}).get("nodeName") if pod else None
        return str(bound) if bound else self.assumed.get(key)

    def free(self, nodes: Iterable[str] | None = None) -> dict[str, Resources]:
        """Allocatable minus every charge, for the given nodes (default: all known nodes)."""
        if nodes is None:
            return dict(self._free)
        return {n: self._free[n] for n in nodes if n in self._free}

    def free_index(self, topology: Topology) -> FreeIndex:
        """`free()` as a `FreeIndex` for `topology`: built once per topology, then brought up to
        date with only the nodes whose free capacity changed since the last call (binds, pods
        leaving, node updates), so a decision never copies or scans every node."""
        if self._aggregates is None or self._aggregates.topology is not topology:
            self._aggregates = FreeIndex(topology, self._free, self._held)
        else:
            for node in self._index_stale:
                self._aggregates.set(node, self._free.get(node))
        self._index_stale.clear()
        return self._aggregates

    def hold(self, nodes: Iterable[str]) -> None:
        """Hold nodes out of the free index's aggregates (`FreeIndex.hold`), through its rebuilds."""
        nodes = [n for n in nodes if n not in self._held]
        self._held.update(nodes)
        if self._aggregates is not None:
            self._aggregates.hold(nodes)

    def release(self, nodes: Iterable[str]) -> None:
        nodes = [n for n in nodes if n in self._held]
        self._held.difference_update(nodes)
        if self._aggregates is not None:
            self._aggregates.release(nodes)

    def podgroup_of(self, key: PodKey, flavour: str) -> dict[str, Any] | None:
        """The PodGroup object of a gang of that flavour, when the informers have seen it."""
        if flavour == XK8S:
            return self.podgroups.get(key)
        if flavour == VOLCANO:
            return self.vc_podgroups.get(key)
        if flavour == K8S:
            return self.k8s_podgroups.get(key)
        return None

    def group_table(self, kind: str) -> dict[PodKey, dict[str, Any]]:
        """The PodGroups of one informer kind (`GROUP_KINDS`)."""
        return {"PodGroup": self.podgroups, "VolcanoPodGroup": self.vc_podgroups}.get(kind, self.k8s_podgroups)

    def is_ours(self, pod: Mapping[str, Any]) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") == self.scheduler_name

    def pending(self) -> list[dict[str, Any]]:
        """Our pods that still need a node: unbound, unassumed, not being deleted, not finished."""
        return [self.pods[key] for key in self.pending_keys]


def _floored(free: Resources | None) -> Resources:
    """Free capacity with each amount floored at 0 (an over-committed node offers nothing)."""
    if free is None:
        return Resources()
    return Resources(max(free.gpus, 0), max(free.cpu_milli, 0), max(free.memory, 0), max(free.pods, 0))


def _node_view(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the tree (label members), the node filters (selectors, taints, unschedulable) and fault
    handling (the fabric taint, the degraded annotation) read from a Node, allocatable apart."""
    metadata, spec = node.get("metadata") or {}, node.get("spec") or {}
    return metadata.get("labels"), metadata.get("annotations"), spec.get("taints"), spec.get("unschedulable")


def _tree_view(hypernode: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the tree, fault handling and degraded placement read from a HyperNode: its spec and
    its conditions (not its node count, which the spec already decides)."""
    return hypernode.get("spec"), (hypernode.get("status") or {}).get("conditions")


def _put(table: dict[Any, dict[str, Any]], key: Any, obj: dict[str, Any], deleted: bool) -> None:
    if deleted:
        table.pop(key, None)
    else:
        table[key] = obj
