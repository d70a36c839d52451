"""Opt-in marks on Node objects: `hypertopo.io/<tierName>` labels, the fabric-fault taint, and the
`hypertopo.io/fabric-degraded` annotation (grey failures, with the time since when).

Both are written only when they differ from the live Node, and touch nothing else on it:
- Labels go by server-side apply with their own field manager. The set we own is read back from
  the Node's managedFields, so a label we set earlier and no longer want is removed (applying the
  new, smaller set drops it), and labels anyone else set are never part of the comparison.
- Taints are an atomic list in the Node schema, so server-side apply would replace everyone's
  taints. Instead the new list is the live list minus our taint (plus it when wanted), sent as a
  merge patch with the live resourceVersion as precondition; a 409 re-reads the Node and retries.
- The degraded annotation goes by server-side apply under a field manager of its own, so applying
  an empty set removes it again and no one else's annotation is touched. Its value is the time the
  node was first seen degraded (RFC 3339, UTC); a live value is kept while the node stays degraded,
  so an aggregator restart does not reset it. It tells the scheduler which nodes are degraded and
  since when (`hypertopo.io/on-fabric-fault: restart-pods-on-degraded` acts on it); a node that
  failed outright gets the taint, never this mark alone.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aggregator.live.reconcile import ApiError, NotLeader

log = logging.getLogger(__name__)

LABEL_MANAGER = "hypertopo-aggregator-node-labels"
LABEL_PREFIX = "hypertopo.io/"
TAINT_KEY = "hypertopo.io/fabric-unhealthy"
TAINT_EFFECT = "NoSchedule"
DEGRADED_ANNOTATION = "hypertopo.io/fabric-degraded"
DEGRADED_MANAGER = "hypertopo-aggregator-node-degraded"

Obj = dict[str, Any]


class NodeStore(Protocol):
    def get(self, name: str) -> Obj: ...
    def apply_labels(self, name: str, labels: Mapping[str, str]) -> Obj: ...
    def patch_taints(self, name: str, taints: list[Obj], *, resource_version: str) -> Obj: ...
    def apply_annotations(self, name: str, annotations: Mapping[str, str], *, field_manager: str) -> Obj: ...


def owned_label_keys(node: Mapping[str, Any]) -> set[str]:
    keys: set[str] = set()
    for entry in (node.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != LABEL_MANAGER or entry.get("operation") != "Apply":
            continue
        labels = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        keys.update(k[2:] for k in labels if k.startswith("f:"))
    return keys


def label_changes(
    desired: Mapping[str, Mapping[str, str]], nodes: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, str]]:
    """Nodes whose hypertopo labels differ from the desired ones -> the full set to apply."""
    changes: dict[str, dict[str, str]] = {}
    for name, node in nodes.items():
        want = {k: v for k, v in (desired.get(name) or {}).items() if k.startswith(LABEL_PREFIX)}
        labels = (node.get("metadata") or {}).get("labels") or {}
        stale = {k for k in owned_label_keys(node) if k in labels} - want.keys()
        if stale or any(labels.get(k) != v for k, v in want.items()):
            changes[name] = want
    return changes


def _is_ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") == TAINT_KEY and taint.get("effect") == TAINT_EFFECT


def wanted_taints(node: Mapping[str, Any], unhealthy: bool) -> list[Obj] | None:
    """The node's new taint list, or None when it already is right."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    has = any(_is_ours(t) for t in taints)
    if has == unhealthy:
        return None
    others = [dict(t) for t in taints if not _is_ours(t)]
    if unhealthy:
        others.append({"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT})
    return others


def degraded_changes(
    degraded: frozenset[str], nodes: Mapping[str, Mapping[str, Any]], now: str
) -> dict[str, dict[str, str]]:
    """Nodes whose degraded annotation must change -> the annotations to apply ({} removes ours).

    A node newly degraded gets `now`; one still degraded keeps its live value; one no longer
    degraded loses it (only where our manager set it: someone else's copy is theirs)."""
    changes: dict[str, dict[str, str]] = {}
    for name, node in nodes.items():
        have = ((node.get("metadata") or {}).get("annotations") or {}).get(DEGRADED_ANNOTATION)
        if name in degraded and have is None:
            changes[name] = {DEGRADED_ANNOTATION: now}
        elif name not in degraded and have is not None and _owns_annotation(node):
            changes[name] = {}
    return changes


def _owns_annotation(node: Mapping[str, Any]) -> bool:
    for entry in (node.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") == DEGRADED_MANAGER and entry.get("operation") == "Apply":
            fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations") or {}
            if f"f:{DEGRADED_ANNOTATION}" in fields:
                return True
    return False


@dataclass
class MarkOutcome:
    writes: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    written: dict[str, Obj] = field(default_factory=dict)


class NodeMarker:
    def __init__(self, store: NodeStore, *, may_write: Callable[[], bool] = lambda: True, retries: int = 3):
        self.store = store
        self.may_write = may_write
        self.retries = retries

    def _check_leader(self) -> None:
        if not self.may_write():
            raise NotLeader("lease lost; not writing")

    def apply_labels(
        self, desired: Mapping[str, Mapping[str, str]], nodes: Mapping[str, Mapping[str, Any]]
    ) -> MarkOutcome:
        outcome = MarkOutcome()
        for name, labels in sorted(label_changes(desired, nodes).items()):
            self._check_leader()
            try:
                outcome.written[name] = self.store.apply_labels(name, labels)
                outcome.writes["labels"] += 1
            except ApiError as exc:
                log.warning("node %s: labels: %s", name, exc)
                outcome.errors.append(f"{name}: labels: {exc}")
        return outcome

    def apply_degraded(
        self, degraded: frozenset[str], nodes: Mapping[str, Mapping[str, Any]], now: str
    ) -> MarkOutcome:
        """Sets or removes the degraded annotation where it differs (`degraded_changes`)."""
        outcome = MarkOutcome()
        for name, marks in sorted(degraded_changes(degraded, nodes, now).items()):
            self._check_leader()
            try:
                outcome.written[name] = self.store.apply_annotations(name, marks, field_manager=DEGRADED_MANAGER)
                outcome.writes["degraded"] += 1
            except ApiError as exc:
                log.warning("node %s: degraded annotation: %s", name, exc)
                outcome.errors.append(f"{name}: degraded annotation: {exc}")
        return outcome

    def apply_taints(self, unhealthy: frozenset[str], nodes: Mapping[str, Mapping[str, Any]]) -> MarkOutcome:
        outcome = MarkOutcome()
        for name, node in sorted(nodes.items()):
            if wanted_taints(node, name in unhealthy) is None:
                continue
            try:
                self._taint(name, node, name in unhealthy, outcome)
            except ApiError as exc:
                log.warning("node %s: taint: %s", name, exc)
                outcome.errors.append(f"{name}: taint: {exc}")
        return outcome

    def _taint(self, name: str, node: Mapping[str, Any], unhealthy: bool, outcome: MarkOutcome) -> None:
        current: Mapping[str, Any] = node
        for _ in range(self.retries + 1):
            taints = wanted_taints(current, unhealthy)
            if taints is None:
                return
            self._check_leader()
            try:
                version = str((current.get("metadata") or {}).get("resourceVersion", ""))
                outcome.written[name] = self.store.patch_taints(name, taints, resource_version=version)
                outcome.writes["taint"] += 1
                return
            except ApiError as exc:
                if not exc.conflict:
                    raise
                current = self.store.get(name)
        outcome.errors.append(f"{name}: taint still conflicting after {self.retries} retries")
