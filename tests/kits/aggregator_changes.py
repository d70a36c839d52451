"""Random cluster changes for the aggregator's incremental paths (tests import this module).

A `Cluster` is a modelled cluster whose nodes change one at a time the way a live one does: a
component fails or heals, a cable moves to another leaf, a node joins another NVLink clique or
leaves it, a Node turns NotReady, an agent pod stops, a Node is deleted and comes back, a label
changes. The switch-to-switch links come from switch LLDP tables built from the model, so a node's
leaf is what its own report's LLDP says, and a recabled report really moves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from agent.cluster_model import ClusterModel
from agent.common.report import ComponentHealth, Health, NodeReport, NvLinkDomain, report_spec
from agent.model_probe import report_for
from aggregator.sources import Source
from aggregator.sources.labels import LabelLevels
from aggregator.sources.nodetopology import NodeReports
from aggregator.sources.switch_lldp import SwitchNeighbour, SwitchTable, SwitchTables

ZONE = "example.com/zone"
CLUSTER_UUID = "6a1f3f5e-0000-4000-8000-00000000c0de"


def switch_tables(model: ClusterModel) -> tuple[SwitchTable, ...]:
    """Each parent switch's LLDP table: its children (the model's switch tree, undirected)."""
    children: dict[str, list[str]] = {}
    for child, parent in sorted(model.parents.items()):
        children.setdefault(parent, []).append(child)
    return tuple(
        SwitchTable(parent, tuple(SwitchNeighbour(f"swp{i}", c, "p1", True) for i, c in enumerate(kids)))
        for parent, kids in sorted(children.items())
    )


def sources(model: ClusterModel, *, labels: bool = True) -> tuple[Source, ...]:
    found: list[Source] = [NodeReports(), SwitchTables(switch_tables(model))]
    if labels:
        found.append(LabelLevels((ZONE,)))
    return tuple(found)


def leaves(model: ClusterModel) -> list[str]:
    return sorted({block.switch for block in model.blocks})


@dataclass
class Cluster:
    """The Kubernetes side of a modelled cluster, changed one event at a time."""

    model: ClusterModel
    reports: dict[str, NodeReport] = field(default_factory=dict)
    node_ready: dict[str, bool] = field(default_factory=dict)
    agent_ready: dict[str, bool] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    removed: dict[str, NodeReport] = field(default_factory=dict)
    _objects: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, model: ClusterModel) -> Cluster:
        names = sorted(model.nodes())
        cluster = cls(model)
        for i, name in enumerate(names):
            cluster.reports[name] = report_for(model, name)
            cluster.node_ready[name] = True
            cluster.agent_ready[name] = True
            cluster.labels[name] = {ZONE: f"z{i % 2}"}
            cluster.versions[name] = 1
        return cluster

    # -- what the controller's caches would hold -----------------------------------------------------
    def topologies(self) -> dict[str, dict[str, Any]]:
        return {n: self._object(n, r) for n, r in self.reports.items() if n in self.node_ready}

    def _object(self, node: str, report: NodeReport) -> dict[str, Any]:
        key = (node, self.versions[node])
        if key not in self._objects:  # report_spec costs ms per report: once per version
            version = str(self.versions[node])
            self._objects[key] = {
                "metadata": {"name": node, "resourceVersion": version},
                "spec": report_spec(report),
            }
        return self._objects[key]

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {
            n: {
                "metadata": {"name": n, "labels": dict(self.labels.get(n, {}))},
                "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
            }
            for n, ready in self.node_ready.items()
        }

    # -- changes ---------------------------------------------------------------------------------------
    def apply(self, change: tuple[str, str, Any]) -> str:
        """One change (kind, node, value); returns the node it touched."""
        kind, node, value = change
        if node not in self.reports and node not in self.removed:
            return node
        if kind == "remove":
            if node in self.reports:
                self.removed[node] = self.reports.pop(node)
                self.node_ready.pop(node, None)
                self.agent_ready.pop(node, None)
        elif kind == "restore":
            if node in self.removed:
                self.reports[node] = self.removed.pop(node)
                self.node_ready[node] = True
                self.agent_ready[node] = True
        elif node in self.reports:
            self._change(kind, node, value)
        self.versions[node] = self.versions.get(node, 1) + 1
        return node

    def _change(self, kind: str, node: str, value: Any) -> None:
        report = self.reports[node]
        if kind == "health":
            state = (
                Health.FAILED if value == "failed" else Health.DEGRADED if value == "degraded" else Health.OK
            )
            health = {
                **report.health,
                "rdma": ComponentHealth(state, "" if state is Health.OK else "port 1 down"),
            }
            self.reports[node] = dataclasses.replace(report, health=health)
        elif kind == "recable":
            lldp = tuple(dataclasses.replace(n, system_name=value) for n in report.lldp)
            self.reports[node] = dataclasses.replace(report, lldp=lldp)
        elif kind == "nvlink" and report.nvml is not None:
            domain = None if value is None else NvLinkDomain(CLUSTER_UUID, int(value), "completed")
            self.reports[node] = dataclasses.replace(
                report, nvml=dataclasses.replace(report.nvml, domain=domain)
            )
        elif kind == "ready":
            self.node_ready[node] = bool(value)
        elif kind == "agent":
            self.agent_ready[node] = bool(value)
        elif kind == "label":
            self.labels[node] = {ZONE: str(value)}


KINDS = ("health", "recable", "nvlink", "ready", "agent", "remove", "restore", "label")


def changes(model: ClusterModel, kinds: tuple[str, ...] = KINDS) -> st.SearchStrategy[tuple[str, str, Any]]:
    """One random change (of one of `kinds`) to one node of the model."""
    node = st.sampled_from(sorted(model.nodes()))
    values = {
        "health": st.sampled_from(["failed", "degraded", "ok"]),
        "recable": st.sampled_from([*leaves(model), "leaf-new"]),
        "nvlink": st.sampled_from([None, 1, 2, 3]),
        "ready": st.booleans(),
        "agent": st.booleans(),
        "remove": st.none(),
        "restore": st.none(),
        "label": st.sampled_from(["z0", "z1", "z2"]),
    }
    return st.one_of(*(st.tuples(st.just(kind), node, values[kind]) for kind in kinds))


def without_times(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """HyperNodes with condition timestamps left out (a fresh pipeline has no history to keep)."""
    for obj in objects:
        status = dict(obj.get("status") or {})
        status["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []
        ]
        yield {**obj, "status": status}
