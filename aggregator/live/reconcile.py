"""Reconcile: make the live HyperNodes equal to the desired ones, touching only hypertopo's own.

Why this shape:
- Ownership is the two labels of DESIGN.md. A HyperNode without both is someone else's: it is
  never modified or deleted, and a desired name that collides with one is reported as a clash.
  New objects are created with POST (which fails if the name is taken), so a hand-written object
  that appears at the last moment can never be taken over by a create; spec and labels of existing
  objects go by server-side apply (field manager `hypertopo-aggregator`) with the live
  resourceVersion as precondition, status by server-side apply on `/status` with the same guard.
- No write when nothing changed, across restarts too: the diff compares desired spec, labels and
  status with the live object semantically. The status the pipeline derives after a restart
  carries fresh condition timestamps, so `lastTransitionTime` is taken from the live condition
  whenever that condition's status did not change, and `observedGeneration` from the live object.
- A 409 means the cache was stale: re-read the object and try again, a bounded number of times.
- Every write first asks `may_write()` (the leader elector), so a replica that lost its lease
  stops between two writes, not after the cycle.

`plan` is pure and is what happens: `Applier.apply` makes the plan and carries it out step by step
through a `HyperNodeStore` (the Kubernetes adapter, or a test double), re-planning only an object
whose write met a 409.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from agent.common.api_error import ApiError as ApiError  # re-exported: callers catch it from here

log = logging.getLogger(__name__)

OWNER_LABELS: Mapping[str, str] = {
    "volcano.sh/network-topology-source": "hypertopo",
    "app.kubernetes.io/managed-by": "hypertopo",
}
FIELD_MANAGER = "hypertopo-aggregator"
API_VERSION = "topology.volcano.sh/v1alpha1"
KIND = "HyperNode"

Obj = dict[str, Any]


class NotLeader(Exception):
    """Raised before a write when this replica may no longer write (lease lost)."""


class HyperNodeStore(Protocol):
    def get(self, name: str) -> Obj: ...
    def create(self, obj: Obj) -> Obj: ...
    def apply(self, obj: Obj) -> Obj: ...
    def apply_status(self, obj: Obj) -> Obj: ...
    def delete(self, name: str, *, resource_version: str) -> None: ...


def is_owned(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in OWNER_LABELS.items())


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _applied_label_keys(live: Mapping[str, Any]) -> set[str]:
    """Label keys our field manager set by apply (from managedFields), so a dropped one is noticed."""
    keys: set[str] = set()
    for entry in _meta(live).get("managedFields") or []:
        if entry.get("manager") != FIELD_MANAGER or entry.get("operation") != "Apply":
            continue
        labels = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        keys.update(k[2:] for k in labels if k.startswith("f:"))
    return keys


def needs_spec(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """True when spec, our labels or our annotations differ from the live object."""
    if desired.get("spec") != live.get("spec"):
        return True
    for part in ("labels", "annotations"):
        want = _meta(desired).get(part) or {}
        have = _meta(live).get(part) or {}
        if any(have.get(k) != v for k, v in want.items()):
            return True
    dropped = _applied_label_keys(live) - set((_meta(desired).get("labels") or {}).keys())
    return bool(dropped & set((_meta(live).get("labels") or {}).keys()))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_count_owner(live: Mapping[str, Any]) -> str | None:
    """The other field manager that owns `status.nodeCount`, if one does.

    Volcano's hyperNode-controller (on by default in vc-controller-manager) writes its own count
    there (direct members, a child HyperNode counting one). Where it runs, it owns the field and we
    leave it: writing ours back would make the two rewrite each other without end."""
    for entry in _meta(live).get("managedFields") or []:
        if entry.get("manager") == FIELD_MANAGER:
            continue
        fields = ((entry.get("fieldsV1") or {}).get("f:status")) or {}
        if "f:nodeCount" in fields:
            return str(entry.get("manager") or "?")
    return None


def merged_status(desired: Mapping[str, Any], live: Mapping[str, Any], now: str | None = None) -> Obj:
    """The status to publish: desired, with each condition's lastTransitionTime kept from the live
    condition of the same type when its status did not change, and observedGeneration = live's.
    `nodeCount` stays the live one when another manager owns it (`node_count_owner`)."""
    status = copy.deepcopy(dict(desired.get("status") or {}))
    if node_count_owner(live) is not None:
        status.pop("nodeCount", None)
        if "nodeCount" in (live.get("status") or {}):
            status["nodeCount"] = live["status"]["nodeCount"]
    live_conditions = {c.get("type"): c for c in (live.get("status") or {}).get("conditions") or []}
    generation = _meta(live).get("generation")
    for cond in status.get("conditions") or []:
        before = live_conditions.get(cond.get("type"))
        if before is not None and before.get("status") == cond.get("status"):
            cond["lastTransitionTime"] = before.get("lastTransitionTime")
        elif not cond.get("lastTransitionTime"):
            cond["lastTransitionTime"] = now or _now()
        if generation is not None:
            cond["observedGeneration"] = generation
    return status


def needs_status(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    return merged_status(desired, live) != (live.get("status") or {})


@dataclass(frozen=True)
class Plan:
    """What a reconcile would do, by name. Empty plan = no write."""

    create: tuple[str, ...] = ()
    update_spec: tuple[str, ...] = ()
    update_status: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    clashes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.create or self.update_spec or self.update_status or self.delete)


def plan(desired: Sequence[Mapping[str, Any]], live: Mapping[str, Mapping[str, Any]]) -> Plan:
    """Pure diff of desired HyperNodes against the live ones (all of them, owned or not)."""
    create, spec, status, clashes = [], [], [], []
    wanted = set()
    for obj in desired:
        name = _meta(obj)["name"]
        wanted.add(name)
        current = live.get(name)
        if current is None:
            create.append(name)
        elif not is_owned(current):
            clashes.append(name)
        else:
            if needs_spec(obj, current):
                spec.append(name)
            if needs_status(obj, current):
                status.append(name)
    delete = sorted(n for n, o in live.items() if n not in wanted and is_owned(o))
    return Plan(tuple(create), tuple(spec), tuple(status), tuple(delete), tuple(clashes))


def spec_body(desired: Mapping[str, Any], resource_version: str | None) -> Obj:
    meta: Obj = {"name": _meta(desired)["name"], "labels": {**(_meta(desired).get("labels") or {}), **OWNER_LABELS}}
    if _meta(desired).get("annotations"):
        meta["annotations"] = dict(_meta(desired)["annotations"])
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": copy.deepcopy(desired.get("spec"))}


def status_body(desired: Mapping[str, Any], live: Mapping[str, Any]) -> Obj:
    meta = {"name": _meta(desired)["name"], "resourceVersion": _meta(live).get("resourceVersion")}
    status = merged_status(desired, live)
    if node_count_owner(live) is not None:
        status.pop("nodeCount", None)  # applied without it: the field stays its owner's
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "status": status}


@dataclass
class Outcome:
    """What one `Applier.apply` did: writes by verb, clashes, errors, and the objects as written."""

    writes: Counter[str] = field(default_factory=Counter)
    clashes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    written: dict[str, Obj] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)

    @property
    def total_writes(self) -> int:
        return sum(self.writes.values())


class Applier:
    """Applies desired HyperNodes through a store; see the module docstring for the rules."""

    def __init__(
        self,
        store: HyperNodeStore,
        *,
        may_write: Callable[[], bool] = lambda: True,
        conflict_retries: int = 3,
    ):
        self.store = store
        self.may_write = may_write
        self.conflict_retries = conflict_retries

    def apply(self, desired: Sequence[Mapping[str, Any]], live: Mapping[str, Mapping[str, Any]]) -> Outcome:
        """Carries out `plan(desired, live)`: creates, spec and status writes, deletes, in that
        order; clashes are reported, never written. A 409 re-reads that one object and plans it
        again (`_converge`)."""
        return self.execute(plan(desired, live), desired, live)

    def execute(
        self, todo: Plan, desired: Sequence[Mapping[str, Any]], live: Mapping[str, Mapping[str, Any]]
    ) -> Outcome:
        """Carries out a plan made from these desired and live objects."""
        outcome = Outcome()
        for name in todo.clashes:
            log.error("HyperNode %s exists without hypertopo's ownership labels; leaving it alone", name)
            outcome.clashes.append(name)
        by_name = {_meta(d)["name"]: d for d in desired}
        touched = dict.fromkeys((*todo.create, *todo.update_spec, *todo.update_status))  # plan order, once
        for name in touched:
            try:
                self._converge(by_name[name], live.get(name), outcome)
            except ApiError as exc:
                self._failed(outcome, name, exc)
        for name in todo.delete:
            try:
                self._remove(name, live[name], outcome)
            except ApiError as exc:
                self._failed(outcome, name, exc)
        return outcome

    @staticmethod
    def _failed(outcome: Outcome, name: str, exc: ApiError) -> None:
        log.warning("HyperNode %s: %s", name, exc)
        outcome.errors.append(f"{name}: {exc}")
        if exc.status == 0:
            raise exc  # unreachable: the rest would fail the same way; retry next cycle

    def _check_leader(self) -> None:
        if not self.may_write():
            raise NotLeader("lease lost; not writing")

    def _refresh(self, name: str) -> Obj | None:
        try:
            return self.store.get(name)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def _converge(self, desired: Mapping[str, Any], live: Mapping[str, Any] | None, outcome: Outcome) -> None:
        """One planned object: its create, spec and status steps (`plan` of it alone); on a 409
        the object is re-read and planned again."""
        name = _meta(desired)["name"]
        for _ in range(self.conflict_retries + 1):
            try:
                self._converge_once(desired, live, outcome)
                return
            except ApiError as exc:
                if not exc.conflict:
                    raise
                log.info("HyperNode %s: conflict (%s); re-reading and retrying", name, exc.message or exc.reason)
                live = self._refresh(name)
        outcome.errors.append(f"{name}: still conflicting after {self.conflict_retries} retries")

    def _converge_once(self, desired: Mapping[str, Any], live: Mapping[str, Any] | None, outcome: Outcome) -> None:
        name = _meta(desired)["name"]
        steps = plan([desired], {} if live is None else {name: live})
        if steps.clashes:  # after a re-read: someone else's object took the name meanwhile
            log.error("HyperNode %s exists without hypertopo's ownership labels; leaving it alone", name)
            outcome.clashes.append(name)
            return None
        current: Obj | None = dict(live) if live is not None else None
        if steps.create:
            self._check_leader()
            current = outcome.written[name] = self.store.create(spec_body(desired, None))
            outcome.writes["create"] += 1
        elif steps.update_spec:
            assert current is not None
            self._check_leader()
            body = spec_body(desired, _meta(current).get("resourceVersion"))
            current = outcome.written[name] = self.store.apply(body)
            outcome.writes["apply"] += 1
        # the status step, against the object as the steps above left it (a create writes no status)
        if current is not None and needs_status(desired, current):
            self._check_leader()
            current = outcome.written[name] = self.store.apply_status(status_body(desired, current))
            outcome.writes["apply-status"] += 1

    def _remove(self, name: str, live: Mapping[str, Any], outcome: Outcome) -> None:
        current: Mapping[str, Any] | None = live
        for _ in range(self.conflict_retries + 1):
            if current is None or not is_owned(current):
                return
            self._check_leader()
            try:
                self.store.delete(name, resource_version=str(_meta(current).get("resourceVersion", "")))
            except ApiError as exc:
                if exc.not_found:
                    return
                if not exc.conflict:
                    raise
                current = self._refresh(name)
                continue
            outcome.writes["delete"] += 1
            outcome.deleted.append(name)
            return
