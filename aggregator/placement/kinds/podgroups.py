"""Gangs as the live scheduler finds them in the cluster: pods labelled
`scheduling.x-k8s.io/pod-group: NAME` plus their PodGroup (scheduler-plugins coscheduling),
annotated `scheduling.k8s.io/group-name: NAME` plus their Volcano PodGroup, or naming
Kubernetes' own PodGroup in `spec.schedulingGroup.podGroupName` (`upstream.py`), and the
scheduler-plugins PodGroup status the scheduler writes back (Volcano's is `volcano.py`).

Why pods and PodGroup are read together: minMember and scheduleTimeoutSeconds live on the
PodGroup, the topology limits and the fault policy may sit on either (PodGroup first, then the
pods, as Volcano reads its Job/PodGroup annotations). A pod without the label is a gang of one.
Pure: dicts in, frozen dataclasses out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggregator.placement.kinds import upstream, volcano
from aggregator.placement.live.state import (
    GANG_LABEL,
    K8S,
    SINGLE,
    VOLCANO,
    XK8S,
    ClusterState,
    PodKey,
    gang_key,
    gang_ref,
    is_finished,
    pod_key,
)

__all__ = ["GANG_LABEL", "GangView", "collect", "gang_key", "gangs_on_nodes", "group_status", "status_patch", "view_of"]
FAULT_ANNOTATION = "hypertopo.io/on-fabric-fault"
# restart-pods-on-degraded: restart-pods on failures, and moves pods off nodes that stay degraded
# (aggregator.placement.core.degraded)
RESTART_ON_DEGRADED = "restart-pods-on-degraded"
FAULT_POLICIES = ("restart-pods", "restart-gang", "none", RESTART_ON_DEGRADED)


@dataclass(frozen=True)
class GangView:
    """One gang at one moment: its live members, which of them need a node, where the others are."""

    key: PodKey  # (namespace, PodGroup name) or (namespace, pod name) for a single pod
    podgroup: Mapping[str, Any] | None
    members: tuple[Mapping[str, Any], ...]  # live pods (not finished, not being deleted)
    pending: tuple[Mapping[str, Any], ...]  # our members that need a node now
    placed: Mapping[PodKey, str]  # member -> node (bound or assumed)
    min_member: int
    annotations: Mapping[str, str]  # PodGroup (and owning Volcano Job) annotations over the first pod's
    flavour: str = SINGLE  # state.XK8S, state.VOLCANO, state.K8S or state.SINGLE

    @property
    def is_group(self) -> bool:
        return self.flavour != SINGLE

    @property
    def is_volcano(self) -> bool:
        return self.flavour == VOLCANO

    @property
    def is_upstream(self) -> bool:
        """Kubernetes' own PodGroup (`upstream.py`)."""
        return self.flavour == K8S

    @property
    def fault_policy(self) -> str:
        policy = self.annotations.get(FAULT_ANNOTATION, "none")
        return policy if policy in FAULT_POLICIES else "none"

    @property
    def missing(self) -> int:
        """How many more members must exist before the gang may be placed."""
        return max(0, self.min_member - len(self.members))

    @property
    def timeout_seconds(self) -> int | None:
        raw = ((self.podgroup or {}).get("spec") or {}).get("scheduleTimeoutSeconds")
        return int(raw) if isinstance(raw, int) else None


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def _live(pod: Mapping[str, Any]) -> bool:
    return not is_finished(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp")


def collect(state: ClusterState, *, only_pending: bool = True) -> list[GangView]:
    """Gangs of our scheduler; with `only_pending`, only those with a member that needs a node.
    Ordered oldest first (by the earliest member creation), so a queue is fair."""
    if only_pending:
        keys = {state._gang_of[k] for k in state.pending_keys if k in state._gang_of}
    else:
        keys = set(state.gangs)
    views = []
    for key in keys:
        pods = [state.pods[k] for k in state.gangs.get(key, {}) if k in state.pods]
        live = [p for p in pods if _live(p)]
        if live:
            views.append(_view(state, key, gang_ref(live[0])[1], live, state.pending_keys))
    views.sort(key=lambda v: (min(_created(p) for p in v.members), v.key))
    return views


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp", ""))


def _view(state: ClusterState, key: PodKey, flavour: str, pods: list[dict[str, Any]], pending: set[PodKey]) -> GangView:
    pods = sorted(pods, key=lambda p: pod_key(p))
    podgroup = state.podgroup_of(key, flavour)
    placed = {pod_key(p): n for p in pods if (n := state.node_of(pod_key(p))) is not None}
    min_member = len(pods) if flavour == SINGLE else _min_member(podgroup, len(pods), flavour)
    annotations = {**_annotations(pods[0]), **_annotations(_owner_job(state, podgroup or pods[0])), **_annotations(podgroup)}
    return GangView(
        key=key,
        podgroup=podgroup,
        members=tuple(pods),
        pending=tuple(p for p in pods if pod_key(p) in pending),
        placed=placed,
        min_member=min_member,
        annotations=annotations,
        flavour=flavour,
    )


def _owner_job(state: ClusterState, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Volcano Job controlling a PodGroup or pod (its annotations count for the gang)."""
    name = volcano.owner_job(obj)
    return state.vc_jobs.get((pod_key(obj)[0], name)) if name else None


def _min_member(podgroup: Mapping[str, Any] | None, count: int, flavour: str) -> int:
    """A named gang waits for its PodGroup: without one, minMember is unknown (-1 = wait)."""
    if podgroup is None:
        return -1
    if flavour == K8S:
        return upstream.min_count(podgroup)
    raw = (podgroup.get("spec") or {}).get("minMember")
    return int(raw) if isinstance(raw, int) and raw > 0 else count


def gangs_on_nodes(state: ClusterState, nodes: set[str]) -> list[GangView]:
    """Every gang with a live member bound (or assumed) on one of `nodes`, whichever scheduler
    placed it: fault handling is opt-in per gang (its annotation), not per scheduler."""
    refs: dict[PodKey, str] = {}
    for node in nodes:
        for key in state.on_node.get(node, ()):
            pod = state.pods.get(key)
            if pod is not None:
                gang, flavour = gang_ref(pod)
                refs.setdefault(gang if flavour != SINGLE else key, flavour)
    views = []
    for gang, flavour in sorted(refs.items()):
        keys = state.members.get(gang, {}) if flavour != SINGLE else {gang: True}
        live = [p for k in keys if (p := state.pods.get(k)) is not None and _live(p)]
        if live:
            views.append(_view(state, gang, flavour, live, state.pending_keys))
    return views


def view_of(state: ClusterState, key: PodKey) -> GangView | None:
    """A named gang by key, whoever schedules it: its live members (none while a restarted gang's
    pods are recreated) and its PodGroup; None when it has neither (gang health, recovery)."""
    live = [p for k in state.members.get(key, {}) if (p := state.pods.get(k)) is not None and _live(p)]
    if live:
        return _view(state, key, gang_ref(live[0])[1], live, state.pending_keys)
    for flavour in (VOLCANO, XK8S, K8S):
        if (podgroup := state.podgroup_of(key, flavour)) is not None:
            annotations = {**_annotations(_owner_job(state, podgroup)), **_annotations(podgroup)}
            return GangView(key, podgroup, (), (), {}, _min_member(podgroup, 0, flavour), annotations, flavour)
    return None


def group_status(podgroup: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], scheduled: int) -> dict[str, Any]:
    """The PodGroup status from its members (finished ones included), as coscheduling reports it:
    Running once minMember run, Scheduled once minMember are bound, Finished when minMember
    succeeded, Failed when a member failed and the rest cannot reach minMember."""
    min_member = int((podgroup.get("spec") or {}).get("minMember") or 0)
    phases = [(p.get("status") or {}).get("phase") for p in pods]
    running, succeeded, failed = phases.count("Running"), phases.count("Succeeded"), phases.count("Failed")
    if min_member and succeeded >= min_member:
        phase = "Finished"
    elif failed and running + succeeded < min_member:
        phase = "Failed"
    elif running + succeeded >= max(min_member, 1):
        phase = "Running"
    elif scheduled >= max(min_member, 1):
        phase = "Scheduled"
    else:
        phase = "Pending"
    return {"phase": phase, "scheduled": scheduled, "running": running, "succeeded": succeeded, "failed": failed}


def status_patch(podgroup: Mapping[str, Any], wanted: Mapping[str, Any], now_rfc3339: str) -> dict[str, Any] | None:
    """The merge patch that brings the PodGroup's status to `wanted`, or None when nothing changes.
    scheduleStartTime is set once, when the scheduler first tries the gang."""
    current = podgroup.get("status") or {}
    patch = {k: v for k, v in wanted.items() if current.get(k, 0 if k != "phase" else None) != v}
    if not current.get("scheduleStartTime"):
        patch["scheduleStartTime"] = now_rfc3339
    return {"status": patch} if patch else None


API_VERSIONS = {XK8S: "scheduling.x-k8s.io/v1alpha1", VOLCANO: volcano.API_VERSION, K8S: upstream.API_VERSION}


def groups_of(state: ClusterState, key: PodKey) -> list[tuple[str, dict[str, Any], str]]:
    """The PodGroups named `key`, of every flavour the informers have seen: (flavour, PodGroup,
    its apiVersion) for events, rank maps and hostfiles."""
    return [(flavour, group, api) for flavour, api in API_VERSIONS.items()
            if (group := state.podgroup_of(key, flavour)) is not None]


def members_of(state: ClusterState, key: PodKey) -> list[dict[str, Any]]:
    """All our pods of a gang, finished ones included (for status counts)."""
    return [state.pods[k] for k in state.gangs.get(key, {}) if k in state.pods]
