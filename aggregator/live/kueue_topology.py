"""Kueue's `Topology` for the labels hypertopo writes on Nodes, kept by the aggregator.

Kueue's topology-aware scheduling places a workload by node labels named in a `Topology` object
(`kueue.x-k8s.io`, levels broadest first, ending with `kubernetes.io/hostname`), which a
ResourceFlavor names in `topologyName`. With `--node-labels` hypertopo labels every Node
`hypertopo.io/<tierName>=<HyperNode>`, so the Topology follows from the HyperNodes it writes: one
level per tier name, broadest (highest tier) first, then the host name. Kueue makes `levels`
immutable, so a changed tier structure means delete and create, never an update; a Topology of
that name that hypertopo did not create is left alone and reported.

Pure: `levels_of` and `topology_object` compute, `TopologyKeeper` decides through a small store
protocol (the API adapter is `aggregator.adapters.kueue`), so it is tested without an API server.
Kueue serves `v1beta2` (storage) and `v1beta1`; hypertopo writes `v1beta2` (Kueue v0.15 and later).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent.common.api_error import ApiError
from aggregator.live.node_marks import LABEL_PREFIX

log = logging.getLogger(__name__)

API_VERSION = "kueue.x-k8s.io/v1beta2"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_NAME = "hypertopo"
MANAGED_BY = {"app.kubernetes.io/managed-by": "hypertopo"}
MAX_LEVELS = 16  # Kueue's CRD: levels maxItems
RECHECK_SECONDS = 60.0  # read the live object back this often (someone may delete it)
ABSENT_RECHECK_SECONDS = 300.0  # Kueue not installed: ask again this rarely


def levels_of(hypernodes: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Node label keys broadest first: `hypertopo.io/<tierName>` for each tier name the HyperNodes
    use, highest tier first, then `kubernetes.io/hostname`; () when there is no HyperNode."""
    tiers: dict[str, int] = {}
    for obj in hypernodes:
        spec = obj.get("spec") or {}
        name, tier = spec.get("tierName"), spec.get("tier")
        if isinstance(name, str) and name and isinstance(tier, int):
            tiers[name] = max(tier, tiers.get(name, tier))
    if not tiers:
        return ()
    broadest_first = sorted(tiers, key=lambda name: (-tiers[name], name))
    keys = [LABEL_PREFIX + name for name in broadest_first][-(MAX_LEVELS - 1):]  # the finest levels matter most
    return (*keys, HOSTNAME_LABEL)


def topology_object(levels: Iterable[str], name: str = DEFAULT_NAME, api_version: str = API_VERSION) -> dict[str, Any]:
    """The Topology of these levels (Kueue's; KAI's is the same object under its own apiVersion)."""
    return {
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {"levels": [{"nodeLabel": key} for key in levels]},
    }


def live_levels(obj: Mapping[str, Any]) -> tuple[str, ...]:
    levels = (obj.get("spec") or {}).get("levels") or []
    return tuple(str(level.get("nodeLabel", "")) for level in levels if isinstance(level, dict))


def is_ours(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in MANAGED_BY.items())


class TopologyStore(Protocol):
    def get(self, name: str) -> dict[str, Any] | None: ...  # None: no such object
    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete(self, name: str, *, uid: str) -> None: ...


@dataclass
class _Seen:
    levels: tuple[str, ...] = ()
    checked_at: float = float("-inf")
    absent_api: bool = False  # Kueue's CRD is not installed


class TopologyKeeper:
    """Keeps one Topology in step with the HyperNodes; writes only when its levels change or it is
    gone, reads it back at most every RECHECK_SECONDS. Returns the number of API writes.

    `owner` and `api_version` name the scheduler in the log and `render` makes its object: KAI's
    Topology has the same shape and rules in another group (aggregator.live.kai_topology)."""

    owner = "Kueue"
    api_version = API_VERSION

    def __init__(self, store: TopologyStore, *, name: str = DEFAULT_NAME,
                 may_write: Callable[[], bool] = lambda: True):
        self.store, self.name, self.may_write = store, name, may_write
        self.seen = _Seen()
        self.foreign = False  # a Topology of our name that someone else owns

    def sync(self, hypernodes: Iterable[Mapping[str, Any]], now: float) -> int:
        wanted = levels_of(hypernodes)
        if not wanted or not self.may_write():
            return 0
        wait = ABSENT_RECHECK_SECONDS if self.seen.absent_api else RECHECK_SECONDS
        if wanted == self.seen.levels and now - self.seen.checked_at < wait:
            return 0
        try:
            writes = self._converge(wanted)
        except ApiError as exc:
            self._failed(exc, wanted, now)
            return 0
        self.seen = _Seen(wanted if not self.foreign else (), now)
        return writes

    def _failed(self, exc: ApiError, wanted: tuple[str, ...], now: float) -> None:
        """Not served (the scheduler is not installed) or not permitted (RBAC without its
        topologies, e.g. a newer image under older RBAC): said once, asked again rarely; anything
        else is retried next cycle."""
        if exc.status in (404, 403):
            if not self.seen.absent_api:
                if exc.status == 404:  # the resource itself is not served
                    log.info("%s's Topology API (%s) is not served; no Topology kept", self.owner, self.api_version)
                else:
                    log.warning("%s Topology %s: not permitted (%s); grant get, create, delete on %s topologies "
                                "(components/node-marks); no Topology kept", self.owner, self.name, exc,
                                self.api_version.split("/")[0])
            self.seen = _Seen(wanted, now, absent_api=True)
        else:
            log.warning("%s Topology %s: %s; retrying next cycle", self.owner, self.name, exc)

    def _converge(self, wanted: tuple[str, ...]) -> int:
        live = self.store.get(self.name)
        if live is not None and not is_ours(live):
            if not self.foreign:
                log.warning("%s Topology %s exists and is not managed by hypertopo; left alone", self.owner, self.name)
            self.foreign = True
            return 0
        self.foreign = False
        if live is not None and live_levels(live) == wanted:
            return 0
        writes = 0
        if live is not None:  # levels are immutable: replace the object
            self.store.delete(self.name, uid=str((live.get("metadata") or {}).get("uid", "")))
            writes += 1
        self.store.create(self.render(wanted))
        log.info("%s Topology %s: levels %s", self.owner, self.name, ", ".join(wanted))
        return writes + 1

    def render(self, levels: tuple[str, ...]) -> dict[str, Any]:
        return topology_object(levels, self.name)
