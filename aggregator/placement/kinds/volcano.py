"""Volcano's gang objects as hypertopo-scheduler reads and writes them: `scheduling.volcano.sh/v1beta1`
PodGroups (pods join one through the annotation `scheduling.k8s.io/group-name`), their Queues and
the `batch.volcano.sh` Jobs that own them.

Why the phases matter: Volcano's job controller creates a Job's pods only once its PodGroup has
left `Pending` (vc-scheduler's enqueue action moves it to `Inqueue`), and it reads `Running` and
`Completed` from the PodGroup too. A scheduler that places Volcano Jobs must drive the same phases:
Pending -> Inqueue (the queue is open and the gang's minResources fit in free capacity) ->
Running (minMember pods scheduled: bound, running or finished) -> Completed (every scheduled pod
finished), as vc-scheduler's `getPodGroupPhase` does. Pure: dicts in, dicts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggregator.placement.core.gang import Mode
from aggregator.placement.core.resources import GPU, QuantityError, Resources, resources_from

API_VERSION = "scheduling.volcano.sh/v1beta1"
JOB_API_VERSION = "batch.volcano.sh/v1alpha1"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
TASK_SPEC_KEY = "volcano.sh/task-spec"
DEFAULT_QUEUE = "default"
OPEN_STATES = ("", "Open")  # a Queue without a state yet is open (the controller sets it later)
UNSCHEDULABLE = "Unschedulable"
SCHEDULED = "Scheduled"


def spec(podgroup: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return ((podgroup or {}).get("spec")) or {}


def phase(podgroup: Mapping[str, Any] | None) -> str:
    return str(((podgroup or {}).get("status") or {}).get("phase") or "Pending")


def queue_name(podgroup: Mapping[str, Any]) -> str:
    return str(spec(podgroup).get("queue") or DEFAULT_QUEUE)


@dataclass(frozen=True)
class Topology:
    """`spec.networkTopology` (or a sub-group's): mode (default hard) and the highest tier."""

    mode: Mode = Mode.HARD
    highest_tier: int | None = None
    highest_tier_name: str | None = None


def network_topology(raw: Any) -> Topology | None:
    """A networkTopology block -> Topology; None when absent. `highestTierAllowed: 0` is kept as
    given: it is below every HyperNode tier (the lowest is 1), so no domain qualifies and nothing is
    placed, as vc-scheduler finds no eligible HyperNode for it either."""
    if not isinstance(raw, Mapping):
        return None
    mode = Mode.SOFT if str(raw.get("mode") or "hard").lower() == "soft" else Mode.HARD
    tier = raw.get("highestTierAllowed")
    name = raw.get("highestTierName")
    return Topology(mode, int(tier) if isinstance(tier, int) else None, str(name) if name else None)


def task_of(pod: Mapping[str, Any]) -> str:
    """The Volcano task a pod belongs to (annotation or label `volcano.sh/task-spec`)."""
    meta = pod.get("metadata") or {}
    return str((meta.get("annotations") or {}).get(TASK_SPEC_KEY) or (meta.get("labels") or {}).get(TASK_SPEC_KEY) or "")


def min_task_member(podgroup: Mapping[str, Any] | None) -> dict[str, int]:
    raw = spec(podgroup).get("minTaskMember") or {}
    return {str(k): int(v) for k, v in raw.items() if isinstance(v, int) and v > 0} if isinstance(raw, Mapping) else {}


def task_shortfall(podgroup: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """Tasks with fewer pods than their minTaskMember: task -> (have, need)."""
    need = min_task_member(podgroup)
    have: dict[str, int] = {}
    for pod in pods:
        have[task_of(pod)] = have.get(task_of(pod), 0) + 1
    return {task: (have.get(task, 0), n) for task, n in sorted(need.items()) if have.get(task, 0) < n}


# -- ownership and queues ---------------------------------------------------------------------
def owner_job(obj: Mapping[str, Any]) -> str | None:
    """The name of the Volcano Job that controls a PodGroup or pod, if one does."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch.volcano.sh/"):
            return str(ref.get("name", "")) or None
    return None


def job_scheduler(job: Mapping[str, Any] | None) -> str:
    return str(spec(job).get("schedulerName") or "volcano") if job else ""


def queue_problem(podgroup: Mapping[str, Any], queues: Mapping[str, Mapping[str, Any]] | None) -> str:
    """Why the PodGroup's queue admits nothing new ("" when it does). `queues` None: Volcano's
    Queue CRD is not installed, so there are no queues to respect."""
    if queues is None:
        return ""
    name = queue_name(podgroup)
    queue = queues.get(name)
    if queue is None:
        return f"queue {name!r} does not exist"
    state = str((queue.get("status") or {}).get("state") or "")
    if state not in OPEN_STATES:
        return f"queue {name!r} is {state}: it admits no new PodGroups"
    return ""


def min_resources(podgroup: Mapping[str, Any]) -> Resources:
    """`spec.minResources` (what the whole gang needs at least); QuantityError on a bad quantity."""
    raw = spec(podgroup).get("minResources")
    return resources_from(raw) if isinstance(raw, Mapping) else Resources()


def shortfall(want: Resources, have: Resources) -> str:
    """What `have` lacks to cover `want`, in words ("" when it covers it)."""
    parts = [f"{name} {w} > {h}" for name, w, h in (
        (GPU, want.gpus, have.gpus), ("cpu(m)", want.cpu_milli, have.cpu_milli),
        ("memory", want.memory, have.memory), ("pods", want.pods, have.pods)) if w > h]
    return ", ".join(parts)


def enqueue_problem(podgroup: Mapping[str, Any], queues: Mapping[str, Mapping[str, Any]] | None,
                    free_total: Resources) -> str:
    """Why a Pending PodGroup may not move to Inqueue yet ("" when it may): its queue, or
    minResources beyond what the usable nodes have free together."""
    problem = queue_problem(podgroup, queues)
    if problem:
        return problem
    try:
        want = min_resources(podgroup)
    except QuantityError as exc:
        return f"spec.minResources: {exc}"
    short = shortfall(want, free_total)
    if short:
        return f"minResources do not fit in free capacity ({short})"
    return ""


# -- status -----------------------------------------------------------------------------------
def status(podgroup: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The PodGroup status Volcano's scheduler would write for these pods (phase and counts).

    Scheduled pods are bound, running or finished; once minMember are scheduled the group is
    Running, or Completed when all of them finished. Below that it keeps Inqueue (or Pending)."""
    min_member = int(spec(podgroup).get("minMember") or 0)
    phases = [(p.get("status") or {}).get("phase") for p in pods]
    running, succeeded, failed = phases.count("Running"), phases.count("Succeeded"), phases.count("Failed")
    scheduled = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))
    completed = succeeded + failed
    current = phase(podgroup)
    if scheduled >= max(min_member, 1):
        new_phase = "Completed" if scheduled == completed else "Running"
    elif current in ("Inqueue", "Running", "Unknown", "Completed"):
        new_phase = "Inqueue"  # admitted earlier: pods being (re)created keep it admitted
    else:
        new_phase = "Pending"
    return {"phase": new_phase, "running": running, "succeeded": succeeded, "failed": failed}


def condition(kind: str, reason: str, message: str, now: str, *, transition: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message[:1024],
            "lastTransitionTime": now, "transitionID": transition}


def with_condition(podgroup: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The conditions list with `new` in place of the same type (Unschedulable and Scheduled
    exclude each other); None when the list would not change (same type, reason and message)."""
    current = [dict(c) for c in ((podgroup.get("status") or {}).get("conditions") or [])]
    for cond in current:
        same = all(cond.get(k) == new[k] for k in ("type", "reason", "message"))
        if same and cond.get("status") == "True":
            return None
    opposite = SCHEDULED if new["type"] == UNSCHEDULABLE else UNSCHEDULABLE
    kept = [c for c in current if c.get("type") not in (new["type"], opposite)]
    return [*kept, dict(new)]


def command_restart_job(job: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """A `bus.volcano.sh/v1alpha1` Command asking Volcano's job controller to restart a Job
    (what `vcctl job restart` writes): the controller kills every pod and starts the Job again."""
    meta = job.get("metadata") or {}
    name = str(meta.get("name", ""))
    return {
        "apiVersion": "bus.volcano.sh/v1alpha1",
        "kind": "Command",
        "metadata": {
            "generateName": f"{name}-restartjob-",
            "namespace": meta.get("namespace", "default"),
            "ownerReferences": [{"apiVersion": JOB_API_VERSION, "kind": "Job", "name": name,
                                 "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}],
        },
        "action": "RestartJob",
        "target": {"apiVersion": JOB_API_VERSION, "kind": "Job", "name": name, "uid": meta.get("uid", "")},
        "reason": "FabricFault",
        "message": reason[:1024],
    }
