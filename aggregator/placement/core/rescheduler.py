"""Fault-driven rescheduling: which nodes the fabric has failed, and which pods to evict for it.

A node has failed when it carries the taint `hypertopo.io/fabric-unhealthy`, or sits below a
HyperNode whose Ready condition is False for a reason nothing more precise explains (see
`failed_nodes`). Ready=Unknown means the agent behind it went stale, which
alone is no proof of a fault: it counts only once it has lasted the grace period.

Each affected gang, whichever scheduler placed it, follows its `hypertopo.io/on-fabric-fault`
annotation (on the pods, the PodGroup or the Volcano Job): `restart-pods` evicts only its pods on
failed nodes (their owner recreates them and a scheduler re-places them away from the fault),
`restart-gang` evicts all its pods (or, for a Volcano Job, asks Volcano to restart the Job),
`restart-pods-on-degraded` is `restart-pods` here and besides moves pods off nodes that stay
degraded (`degraded.py`), `none` (the default) leaves it alone. A degraded node (grey failure:
the HyperNode condition FabricDegraded, the node annotation `hypertopo.io/fabric-degraded`) is
never a failed node here. Pure: the eviction itself (Eviction API, rate limit, retries) is
`eviction.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator.placement.core.topology import Topology
from aggregator.placement.kinds import volcano
from aggregator.placement.kinds.podgroups import RESTART_ON_DEGRADED, GangView
from aggregator.placement.live.state import FABRIC_TAINT, ClusterState, PodKey


@dataclass(frozen=True)
class Eviction:
    pod: PodKey
    uid: str
    node: str
    gang: PodKey
    policy: str
    reason: str  # why the node failed


def _ready(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond
    return None


def tainted(node: Mapping[str, Any]) -> bool:
    return any(t.get("key") == FABRIC_TAINT for t in (node.get("spec") or {}).get("taints") or [])


@dataclass
class FaultTracker:
    """Remembers since when each HyperNode has been Ready=Unknown (monotonic seconds)."""

    grace_seconds: float
    unknown_since: dict[str, float] = field(default_factory=dict)

    def failed_domains(self, hypernodes: Mapping[str, Mapping[str, Any]], now: float) -> dict[str, str]:
        """HyperNode -> why it counts as failed: Ready=False, or Unknown for at least the grace."""
        failed: dict[str, str] = {}
        for name, obj in hypernodes.items():
            cond = _ready(obj) or {}
            status = cond.get("status")
            if status != "Unknown":
                self.unknown_since.pop(name, None)
            if status == "False":
                failed[name] = f"HyperNode {name} Ready=False ({cond.get('reason', '')}: {cond.get('message', '')})"
            elif status == "Unknown":
                since = self.unknown_since.setdefault(name, now)
                if now - since >= self.grace_seconds:
                    failed[name] = f"HyperNode {name} Ready=Unknown for {now - since:.0f}s (grace {self.grace_seconds:.0f}s)"
        for gone in [n for n in self.unknown_since if n not in hypernodes]:
            del self.unknown_since[gone]
        return failed


def own_failures(topology: Topology, failed_domains: Mapping[str, str]) -> dict[str, str]:
    """The failed HyperNodes whose failure is their own: not one carried up from a failed
    HyperNode below them (health rolls up, so one bad leaf can fail its spine and core too)."""
    known = {d: why for d, why in failed_domains.items() if d in topology.domains}
    carried = {up for d in known for up in topology.chains.get(d, (d,))[1:]}
    return {d: why for d, why in known.items() if d not in carried}


def failed_nodes(state: ClusterState, topology: Topology, failed_domains: Mapping[str, str]) -> dict[str, str]:
    """Node -> why it has failed.

    The fabric taint (the aggregator's `--taint-unhealthy`) names the failed nodes exactly. A
    failed HyperNode says less: its Ready condition rolls up member health, so a leaf is False
    when one of its nodes is. Its nodes count as failed only when nothing more precise explains
    it: no failed HyperNode below it and no tainted node inside it (a dead leaf switch, or an
    aggregator that does not taint)."""
    failed: dict[str, str] = {}
    for name, node_obj in state.nodes.items():
        if tainted(node_obj):
            failed[name] = f"node {name} has taint {FABRIC_TAINT}"
    for domain, why in sorted(own_failures(topology, failed_domains).items()):
        nodes = topology.nodes_of(domain)
        if any(node in failed for node in nodes):
            continue
        for node in nodes:
            failed.setdefault(node, why)
    return failed


@dataclass(frozen=True)
class JobRestart:
    """`restart-gang` of a gang owned by a Volcano Job: the job controller restarts the Job (a
    `RestartJob` Command), which also recreates every pod, instead of evicting them one by one."""

    job: PodKey
    gang: PodKey
    reason: str


def _hit(gang: GangView, failed: Mapping[str, str]) -> list[str]:
    return [n for n in gang.placed.values() if n in failed]


def job_restarts(gangs: Iterable[GangView], failed: Mapping[str, str], jobs: Mapping[PodKey, Any]) -> list[JobRestart]:
    """The Volcano Jobs to restart: `restart-gang` gangs whose PodGroup (or pods) a known Job owns."""
    out = []
    for gang in gangs:
        job = owning_job(gang, jobs)
        hit = _hit(gang, failed)
        if gang.fault_policy == "restart-gang" and job is not None and hit:
            out.append(JobRestart(job, gang.key, f"gang {gang.key[1]} restarts: {failed[hit[0]]}"))
    return out


def owning_job(gang: GangView, jobs: Mapping[PodKey, Any]) -> PodKey | None:
    """The Volcano Job that owns the gang (its PodGroup, else its pods), when the scheduler has seen it."""
    if not gang.is_volcano:
        return None
    for obj in (gang.podgroup, *gang.members[:1]):
        name = volcano.owner_job(obj or {})
        if name and (gang.key[0], name) in jobs:
            return (gang.key[0], name)
    return None


def plan(gangs: Iterable[GangView], failed: Mapping[str, str], jobs: Mapping[PodKey, Any] | None = None) -> list[Eviction]:
    """The pods to evict under each gang's policy (bound pods only: an assumed pod's bind is in
    flight and is looked at again once it lands). A `restart-gang` gang of a known Volcano Job is
    left to `job_restarts`."""
    evictions: list[Eviction] = []
    for gang in gangs:
        policy = gang.fault_policy
        hit = _hit(gang, failed)
        if policy == "none" or not hit:
            continue
        if policy == "restart-gang" and owning_job(gang, jobs or {}) is not None:
            continue
        for pod in gang.members:
            meta, node = pod.get("metadata") or {}, (pod.get("spec") or {}).get("nodeName")
            if not node or (policy in ("restart-pods", RESTART_ON_DEGRADED) and node not in failed):
                continue
            why = failed.get(node) or f"gang {gang.key[1]} restarts: {failed[hit[0]]}"
            key = (str(meta.get("namespace")), str(meta.get("name")))
            evictions.append(Eviction(key, str(meta.get("uid", "")), node, gang.key, policy, why))
    return evictions
