"""Admission of Volcano PodGroups: Pending -> Inqueue, as vc-scheduler's enqueue action does.

Why it matters: Volcano's job controller creates a Job's pods only once its PodGroup has left
Pending, so a scheduler that runs Volcano Jobs must admit their groups before any pod exists. A
group is admitted when its queue exists and is open and its `minResources` fit in the free
capacity of the schedulable nodes together; otherwise it stays Pending with an `Unschedulable`
condition and events that say why. Runs on the scheduling loop thread; the writes go through the
`StatusWriter` and the `EventRecorder`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aggregator.placement.core.resources import Resources
from aggregator.placement.kinds import volcano
from aggregator.placement.live.events import EventRecorder
from aggregator.placement.live.state import ClusterState, PodKey
from aggregator.placement.live.status_writer import StatusWriter

log = logging.getLogger("hypertopo.scheduler")


class Admission:
    def __init__(self, state: ClusterState, status: StatusWriter, events: EventRecorder, scheduler_name: str) -> None:
        self.state, self.status, self.events, self.scheduler_name = state, status, events, scheduler_name

    def free_sum(self) -> Resources:
        """Free capacity of all schedulable nodes together (kept by the state as it changes)."""
        return self.state.free_total

    def admit(self, key: PodKey, podgroup: dict[str, Any], pods: tuple[Mapping[str, Any], ...] = ()) -> bool:
        """Moves a Pending Volcano PodGroup to Inqueue when its queue is open and its minResources
        fit; else says why (condition, event). True when the group is admitted."""
        if volcano.phase(podgroup) != "Pending":
            return True
        queues = self.state.queues if self.state.queues_known else None
        problem = volcano.enqueue_problem(podgroup, queues, self.free_sum())
        if problem:
            self.unschedulable(key, podgroup, pods, f"PodGroup {key[1]} not admitted: {problem}", "NotEnqueued")
            return False
        log.info("Volcano PodGroup %s/%s: Pending -> Inqueue (queue %s)", *key, volcano.queue_name(podgroup))
        self.status.set_volcano(key, podgroup, {"phase": "Inqueue"})
        return True

    def enqueue_jobs(self) -> None:
        """Admits the Pending PodGroups of Volcano Jobs that name this scheduler: they have no pods
        yet (the job controller creates them once the group is Inqueue)."""
        for key, podgroup in self.state.vc_podgroups.items():
            if volcano.phase(podgroup) != "Pending" or key in self.state.gangs:
                continue
            job_name = volcano.owner_job(podgroup)
            job = self.state.vc_jobs.get((key[0], job_name)) if job_name else None
            if volcano.job_scheduler(job) == self.scheduler_name:
                self.admit(key, podgroup)

    def unschedulable(self, key: PodKey, podgroup: dict[str, Any], pods: tuple[Mapping[str, Any], ...],
                      message: str, reason: str = "NotEnoughResources") -> None:
        """Events on the pods and the PodGroup, and the PodGroup's Unschedulable condition."""
        for pod in pods:
            self.events.record(pod, reason="FailedScheduling", message=message)
        self.events.record(podgroup, reason="Unschedulable", message=message, kind="PodGroup",
                           api_version=volcano.API_VERSION)
        self.status.condition(key, podgroup, volcano.UNSCHEDULABLE, reason, message)
