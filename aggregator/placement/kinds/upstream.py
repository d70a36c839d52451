"""Kubernetes' own PodGroups (`scheduling.k8s.io`, the Workload API) as hypertopo-scheduler reads
and writes them, beside scheduler-plugins' (`podgroups`) and Volcano's (`volcano`).

Which version: Kubernetes 1.37 serves PodGroup as `v1beta1` and `v1alpha3` (both behind the
GenericWorkload gate, beta and off by default); kube-scheduler reads and patches `v1beta1`, and so
does hypertopo. A pod joins one with `spec.schedulingGroup.podGroupName` (same namespace).

What maps onto a hypertopo gang:

* `spec.schedulingPolicy.gang.minCount` is the gang's minMember; a `basic` policy is no gang at
  all (kube-scheduler places its pods one by one), so its minMember is 1;
* `spec.schedulingConstraints.topology[0].key` (kube-scheduler reads the first entry only) asks
  for every pod on nodes that share one value of that node label. With `--node-labels` the
  aggregator writes `hypertopo.io/<tierName>` = the HyperNode of that tier holding the node, so
  the key names a tier, and "one value" is "one HyperNode of that tier": hard mode with that tier
  as the highest allowed (Volcano's `highestTierName`). A placed member pins the domain, as
  kube-scheduler's TopologyPlacement pins it to the scheduled pods' value. A key that names no
  tier of the current tree is refused with one line (`key_problem`), never placed without it.
* status: kube-scheduler writes one condition, `PodGroupInitiallyScheduled` (metav1.Condition):
  False/`Unschedulable` with the reason a gang did not fit, True/`Scheduled` once it is placed,
  never back from True to False, `observedGeneration` the PodGroup's generation and
  `lastTransitionTime` moved only when the status changes (`apimeta.SetStatusCondition`). It
  patches `/status` with a strategic merge, which merges `conditions` by `type`: hypertopo's own
  `FabricHealthy` condition sits beside kube-scheduler's without either overwriting the other.

Pure: dicts in, dicts out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggregator.placement.core.topology import Topology

GROUP = "scheduling.k8s.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"
SCHEDULED = "Scheduled"  # kube-scheduler's reason for True
UNSCHEDULABLE = "Unschedulable"
LABEL_PREFIX = "hypertopo.io/"  # the aggregator's --node-labels keys: hypertopo.io/<tierName>
MESSAGE_LIMIT = 1024
KEY_SHOWN = 80  # characters of a refused key repeated in its message


def group_name(pod: Mapping[str, Any]) -> str:
    """The PodGroup a pod names in `spec.schedulingGroup.podGroupName` ("" when none)."""
    group = (pod.get("spec") or {}).get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) else ""


def spec(podgroup: Mapping[str, Any] | None) -> Mapping[str, Any]:
    raw = (podgroup or {}).get("spec")
    return raw if isinstance(raw, Mapping) else {}


def min_count(podgroup: Mapping[str, Any]) -> int:
    """The gang's minMember: `gang.minCount`; 1 for a `basic` policy (no all-or-nothing)."""
    policy = spec(podgroup).get("schedulingPolicy")
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    raw = gang.get("minCount") if isinstance(gang, Mapping) else None
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 1


def topology_key(podgroup: Mapping[str, Any] | None) -> str:
    """The first `schedulingConstraints.topology[].key` ("" when none): the only one
    kube-scheduler reads."""
    constraints = spec(podgroup).get("schedulingConstraints")
    entries = constraints.get("topology") if isinstance(constraints, Mapping) else None
    first = entries[0] if isinstance(entries, list) and entries else None
    key = first.get("key") if isinstance(first, Mapping) else None
    return key if isinstance(key, str) else ""


def tier_name(key: str) -> str:
    """The tier a `hypertopo.io/<tierName>` label key names ("" for any other key)."""
    return key[len(LABEL_PREFIX):] if key.startswith(LABEL_PREFIX) else ""


def key_problem(podgroup: Mapping[str, Any] | None, topology: Topology) -> str:
    """Why the PodGroup's topology key cannot be honoured ("" when it can, or there is none)."""
    return unknown_key(topology_key(podgroup), str(((podgroup or {}).get("metadata") or {}).get("name", "")), topology)


def unknown_key(key: str, group: str, topology: Topology) -> str:
    """Why topology key `key` of PodGroup `group` names no tier of `topology` ("" when it names one,
    or is empty)."""
    if not key or topology.tier_of_name(tier_name(key)) is not None:
        return ""
    shown = key if len(key) <= KEY_SHOWN else key[:KEY_SHOWN] + "..."
    keys = ", ".join(LABEL_PREFIX + n for _, n in sorted(topology.tier_names.items())) or "none (no HyperNodes)"
    return (f"pod group {group}: schedulingConstraints.topology key {shown!r} is no hypertopo tier; "
            f"hypertopo-scheduler places by the keys {keys}")


# -- status -----------------------------------------------------------------------------------
def conditions(podgroup: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = ((podgroup.get("status") or {}).get("conditions")) or []
    return [c for c in raw if isinstance(c, Mapping)] if isinstance(raw, list) else []


def find(podgroup: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions(podgroup) if c.get("type") == kind), None)


def initially_scheduled(podgroup: Mapping[str, Any]) -> bool:
    """Whether the PodGroup says it was placed once (kube-scheduler never takes that back)."""
    cond = find(podgroup, INITIALLY_SCHEDULED)
    return cond is not None and cond.get("status") == "True"


def condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
    """A condition to set (`to_write` adds the time and the generation)."""
    text = message if len(message) <= MESSAGE_LIMIT else message[:MESSAGE_LIMIT - 3] + "..."
    return {"type": kind, "status": status, "reason": reason, "message": text}


def to_write(podgroup: Mapping[str, Any], new: Mapping[str, Any], now: str) -> dict[str, Any] | None:
    """The condition entry a status patch should carry to set `new`, as kube-scheduler's
    `updatePodGroupCondition` does; None when it writes nothing: the PodGroup already carries
    it (same status, reason, message and generation), or `PodGroupInitiallyScheduled` would go
    back from True."""
    existing = find(podgroup, str(new["type"]))
    if new["type"] == INITIALLY_SCHEDULED and existing is not None and existing.get("status") == "True" \
            and new["status"] != "True":
        return None
    generation = (podgroup.get("metadata") or {}).get("generation")
    entry = dict(new)
    if isinstance(generation, int):
        entry["observedGeneration"] = generation
    if existing is not None and all(existing.get(k) == entry.get(k) for k in
                                    ("status", "reason", "message", "observedGeneration")):
        return None
    same_status = existing is not None and existing.get("status") == entry["status"]
    entry["lastTransitionTime"] = str(existing.get("lastTransitionTime") or now) if same_status and existing else now
    return entry
