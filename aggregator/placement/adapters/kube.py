"""The scheduler's resources on the shared client (`agent.common.adapters.kube`, which has the verbs:
list, watch, bind, evict, events, merge patches) and the names the scheduler's modules use.

Only descriptors live here: the PodGroup kinds of the three gang flavours, Volcano's Queue, Job
and Command (their CRDs may not be installed, and Kubernetes' own PodGroup is served only with
its GenericWorkload gate on and `scheduling.k8s.io/v1beta1` enabled: the scheduler's informers
treat them all as optional), and ConfigMaps (a bound gang's hostfile, `hostfile`; written, never
watched).
"""

from __future__ import annotations

from agent.common.adapters.informer import Informer, wait_synced
from agent.common.adapters.kube import (
           EVENTS,
           HYPERNODES,
           MERGE_PATCH,
           NAMESPACES,
           NODES,
           PODS,
           KubeClient,
           Resource,
           connect,
)
from agent.common.api_error import ApiError

__all__ = ["COMMANDS", "CONFIGMAPS", "EVENTS", "HYPERNODES", "JSON_PATCH", "K8S_PODGROUPS", "MERGE_PATCH",
           "NAMESPACES", "NODES", "PODGROUPS", "PODS", "QUEUES", "VC_JOBS", "VC_PODGROUPS", "ApiError", "Informer",
           "KubeClient", "Resource", "connect", "wait_synced"]

PODGROUPS = Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", namespaced=True)
K8S_PODGROUPS = Resource("scheduling.k8s.io", "v1beta1", "podgroups", "K8sPodGroup", namespaced=True)
VC_PODGROUPS = Resource("scheduling.volcano.sh", "v1beta1", "podgroups", "VolcanoPodGroup", namespaced=True)
QUEUES = Resource("scheduling.volcano.sh", "v1beta1", "queues", "Queue")
VC_JOBS = Resource("batch.volcano.sh", "v1alpha1", "jobs", "VolcanoJob", namespaced=True)
COMMANDS = Resource("bus.volcano.sh", "v1alpha1", "commands", "Command", namespaced=True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
JSON_PATCH = "application/json-patch+json"
