"""Live gang health: the `FabricHealthy` condition of a gang, from where its members sit.

Why: a job owner should not have to read HyperNode conditions and node taints to learn whether
their gang is whole and on a healthy fabric. Each gang hypertopo schedules or remediates gets one
verdict, recomputed whenever the failed, degraded or unknown nodes or its members change:

* **False, FabricFailed**: a member sits on a failed node (the rescheduler's failed nodes);
* **False, FabricDegraded**: a member sits on a degraded node (grey failure: slower, not down);
* **False, Recovering**: a fault hit the gang and it has not had every member placed again;
* **Unknown, FabricUnknown**: a member sits under a HyperNode whose Ready is Unknown (its agent
  went stale, the grace not over yet), or on a node no HyperNode covers;
* **True, FabricHealthy**: none of these.

The message names the affected members by node, with the node's reason, bounded in size.
Volcano PodGroups carry it as a status condition (`status.conditions`, type `FabricHealthy`);
scheduler-plugins PodGroups have no conditions in their status schema, so the same condition,
as compact JSON, goes in their annotation `hypertopo.io/fabric-healthy`. Pure: dicts in, dicts out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.placement.core.topology import Topology
from aggregator.placement.kinds.podgroups import GangView
from aggregator.placement.live.state import PodKey

CONDITION = "FabricHealthy"
ANNOTATION = "hypertopo.io/fabric-healthy"
MESSAGE_LIMIT = 1024
NODES_LISTED = 8


@dataclass(frozen=True)
class Verdict:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


def unknown_nodes(hypernodes: Mapping[str, Mapping[str, Any]], topology: Topology) -> dict[str, str]:
    """Node -> why its fabric is unknown: below a HyperNode whose own Ready is Unknown (not one
    carried up from a HyperNode below it)."""
    unknown = {}
    for name, obj in hypernodes.items():
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "Unknown" and name in topology.domains:
                unknown[name] = f"HyperNode {name} Ready=Unknown ({cond.get('reason', '')})"
    carried = {up for d in unknown for up in topology.chains.get(d, (d,))[1:]}
    out: dict[str, str] = {}
    for domain in sorted(d for d in unknown if d not in carried):
        for node in topology.nodes_of(domain):
            out.setdefault(node, unknown[domain])
    return out


def _by_node(placed: Mapping[PodKey, str], problems: Mapping[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for pod, node in sorted(placed.items()):
        if node in problems:
            out.setdefault(node, []).append(pod[1])
    return out


def describe(hit: Mapping[str, list[str]], problems: Mapping[str, str], total: int) -> str:
    """'N of M members on K nodes: node (why): pod, pod; ...', bounded."""
    count = sum(len(pods) for pods in hit.values())
    parts = [f"{node} ({problems[node]}): {', '.join(pods)}" for node, pods in sorted(hit.items())[:NODES_LISTED]]
    more = f"; and {len(hit) - NODES_LISTED} more nodes" if len(hit) > NODES_LISTED else ""
    text = f"{count} of {total} members on {len(hit)} node(s): " + "; ".join(parts) + more
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 3] + "..."


def verdict(gang: GangView, failed: Mapping[str, str], degraded: Mapping[str, str], unknown: Mapping[str, str],
            topology: Topology, *, waiting: int = 0) -> Verdict:
    """The gang's FabricHealthy verdict; `waiting`: members a recovery still waits for."""
    total = max(len(gang.members), gang.min_member)
    hit = _by_node(gang.placed, failed)
    if hit:
        return Verdict("False", "FabricFailed", describe(hit, failed, total))
    hit = _by_node(gang.placed, degraded)
    if hit:
        return Verdict("False", "FabricDegraded", describe(hit, degraded, total))
    if waiting > 0:
        return Verdict("False", "Recovering", f"a fabric fault moved members: waiting for {waiting} of {total} "
                                              "to be placed again")
    uncovered = {n: f"node {n} is under no HyperNode" for n in gang.placed.values() if n not in topology.node_leaf}
    hit = _by_node(gang.placed, {**uncovered, **unknown})
    if hit:
        return Verdict("Unknown", "FabricUnknown", describe(hit, {**uncovered, **unknown}, total))
    return Verdict("True", "FabricHealthy", f"all {len(gang.placed)} placed members on healthy fabric")


def current(podgroup: Mapping[str, Any], *, volcano: bool) -> dict[str, Any] | None:
    """The FabricHealthy condition the PodGroup carries now (status or annotation)."""
    if volcano:
        for cond in (podgroup.get("status") or {}).get("conditions") or []:
            if cond.get("type") == CONDITION:
                return dict(cond)
        return None
    raw = ((podgroup.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def condition(found: Verdict, before: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    """The condition for `found`; lastTransitionTime moves only when the status changes."""
    since = str(before.get("lastTransitionTime") or now) if before and before.get("status") == found.status else now
    return {"type": CONDITION, "status": found.status, "reason": found.reason, "message": found.message,
            "lastTransitionTime": since}


def same(cond: Mapping[str, Any] | None, found: Verdict) -> bool:
    return cond is not None and all(cond.get(k) == v for k, v in
                                    (("status", found.status), ("reason", found.reason), ("message", found.message)))


def volcano_conditions(podgroup: Mapping[str, Any], cond: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The PodGroup's conditions with `cond` in place of any FabricHealthy one (others kept)."""
    kept = [dict(c) for c in (podgroup.get("status") or {}).get("conditions") or [] if c.get("type") != CONDITION]
    return [*kept, dict(cond)]


def annotation(cond: Mapping[str, Any]) -> str:
    return json.dumps({k: cond[k] for k in ("status", "reason", "message", "lastTransitionTime")},
                      separators=(",", ":"))


def event(found: Verdict) -> tuple[str, str]:
    """(reason, type) of the event written when the verdict changes."""
    if found.status == "True":
        return "FabricHealthy", "Normal"
    return ("FabricUnhealthy" if found.status == "False" else "FabricHealthUnknown"), "Warning"
