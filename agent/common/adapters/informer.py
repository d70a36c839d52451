"""List-then-watch caches of API objects (the kopf / client-go informer pattern, one thread each),
shared by the aggregator and the scheduler.

Why: a controller must react within seconds to an object changing, without polling the API
server, and must never act on a half-known cluster. So an informer lists (paged), marks itself
synced, then watches from the list's resourceVersion with bookmarks. A 410 Gone (history
compacted) means re-list at once; any other failure (server unreachable, stream cut) is logged and
retried with capped backoff, keeping the last known objects: a short outage loses nothing, and the
re-list after it brings every change made meanwhile. An *optional* kind (a CRD that may not be
installed: Volcano's, scheduler-plugins') answering 404 counts as an empty, synced kind and is
looked for again every `absent_recheck` seconds.

What a consumer gets, pick what fits:
- `snapshot()`: the cache, key -> object (key `namespace/name`, or `name` for cluster-scoped).
- `drain_changed()` (with `track_changes=True`): the keys added, modified or deleted since the
  previous drain, so a consumer that runs in ticks touches only what changed. A re-list adds only
  the keys whose object differs from the cache (by resourceVersion), or that appeared or vanished:
  an outage costs the changes made during it, never the whole kind. Off by default: a consumer
  that never drains must not collect every key it ever saw.
- `on_change()`: called (no arguments, from the informer thread) after every change to the cache:
  a wake-up for a loop that then drains.
- `on_event(type, payload)`: every change as it arrives, from the informer thread, for a consumer
  that keeps its own state (the scheduler): ("SYNC", [objects]) after each list, ("ABSENT", [])
  when an optional kind is not served, and (ADDED | MODIFIED | DELETED, object) per watch event.

`transform` (optional) turns each object into what is kept of it, on arrival, before anyone sees
it (client-go's informer transforms): the aggregator and the scheduler keep slim records
(aggregator.live.slim), so 100,000 Nodes with their images and managedFields are never held whole. It
must accept its own output (a re-list may pass a record through it again). A re-list keeps the
cached record of an object whose resourceVersion did not change, so a consumer that compares
records by identity (the aggregator's feed, its parsed reports) sees no change there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from agent.common.adapters.kube import Resource, WatchEvent
from agent.common.api_error import ApiError

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# objects per list page when a transform slims them: each page is decoded whole before it is
# slimmed, and what a page took stays with the process as freed-but-held heap (a page of 500 whole
# NodeTopology objects is ~40 MB decoded; of 50, ~4 MB), so slimmed kinds list in small pages
SLIM_PAGE = 50


class ListWatch(Protocol):
    """What an informer needs of `KubeClient` (tests script it)."""

    def list(self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None, transform: Callable[[Obj], Obj] | None = None,
             limit: int = 500) -> tuple[list[Obj], str]: ...

    def watch(self, resource: Resource, *, resource_version: str, namespace: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: int = 60) -> Iterable[WatchEvent]: ...


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def _version(obj: Obj | None) -> Any:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


class Informer:
    """One kind's list+watch cache on a daemon thread; `start()`, `stop()`, `synced` (an Event)."""

    def __init__(
        self,
        kube: ListWatch,
        resource: Resource,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        namespace: str | None = None,
        on_change: Callable[[], None] = lambda: None,
        on_event: Callable[[str, Any], None] | None = None,
        optional: bool = False,
        absent_recheck: float = 30.0,
        watch_timeout: int = 60,
        max_backoff: float = 5.0,
        track_changes: bool = False,
        transform: Callable[[Obj], Obj] | None = None,
    ):
        self.kube = kube
        self.resource = resource
        self.namespace = namespace  # None: all namespaces (or a cluster-scoped resource)
        self.selectors = {"label_selector": label_selector or None, "field_selector": field_selector or None}
        self.on_change = on_change
        self.on_event = on_event
        self.transform = transform
        self.optional, self.absent_recheck = optional, absent_recheck
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        self.synced = threading.Event()
        self.absent = False
        self.relists = 0
        self._objects: dict[str, Obj] = {}
        self.track_changes = track_changes
        self._changed: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{resource.plural}", daemon=True)

    # -- what consumers read -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Obj]:
        with self._lock:
            return dict(self._objects)

    def drain_changed(self) -> set[str]:
        """The keys changed since the previous call (see the module docstring); empties the set."""
        if not self.track_changes:
            raise RuntimeError(f"informer of {self.resource.plural} was built without track_changes=True")
        with self._lock:
            changed, self._changed = self._changed, set()
        return changed

    # -- cache updates -----------------------------------------------------------------------------
    def _replace(self, items: list[Obj], made: dict[int, Obj] | None = None) -> None:
        """The cache becomes `items`; those not in `made` (the records the transform already made
        while the client decoded pages, by id) go through the transform first."""
        transform, made = self.transform, made or {}
        if transform is not None:
            items = [o if made.get(id(o)) is o else transform(o) for o in items]
        with self._lock:
            old = self._objects
        fresh = {}
        for obj in items:  # an unchanged object keeps its cached record (same identity)
            key = object_key(obj)
            before = old.get(key)
            fresh[key] = before if before is not None and _version(before) == _version(obj) and _version(obj) else obj
        with self._lock:
            old, self._objects = self._objects, fresh
            if self.track_changes:
                self._changed.update(old.keys() - fresh.keys())
                self._changed.update(k for k, o in fresh.items() if k not in old or _version(old[k]) != _version(o))
        self._emit("SYNC", items)

    def _apply(self, kind: str, obj: Obj) -> None:
        if self.transform is not None:
            obj = self.transform(obj)
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(key, None)
            else:
                self._objects[key] = obj
            if self.track_changes:
                self._changed.add(key)
        self._emit(kind, obj)

    def _emit(self, kind: str, payload: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, payload)
        self.on_change()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread promptly: a blocked watch read is woken by shutting its socket."""
        self._stop.set()
        close = getattr(self._watch, "close", None)
        if close is not None:
            close()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                version = self._list()
                backoff = 0.2
                self._watch_from(version)
            except ApiError as exc:
                if self._stop.is_set():
                    return
                if exc.not_found and self.optional:
                    self._absent()
                elif exc.gone:
                    log.info("%s: watch history expired; re-listing", self.resource.plural)
                else:
                    log.warning("%s: %s; re-listing in %.1fs", self.resource.plural, exc, backoff)
                    self._stop.wait(backoff)
                    backoff = min(self.max_backoff, backoff * 2)

    def _made(self, made: dict[int, Obj]) -> Callable[[Obj], Obj]:
        """The transform, noting the id of each record it makes: a record is not slimmed twice (a
        second pass rebuilt every record, and the first copies freed among the kept ones left holes
        in the heap that stayed resident)."""
        transform = self.transform
        assert transform is not None

        def noted(obj: Obj) -> Obj:
            record = transform(obj)
            made[id(record)] = record
            return record

        return noted

    def _list(self) -> str:
        labels, fields = self.selectors["label_selector"], self.selectors["field_selector"]
        made: dict[int, Obj] = {}  # the records the client's pages were slimmed into, by id
        if self.transform is None:
            items, version = self.kube.list(self.resource, namespace=self.namespace, label_selector=labels,
                                            field_selector=fields)
        else:  # slimmed page by page where the client can (KubeClient); _replace slims what it did not
            items, version = self.kube.list(self.resource, namespace=self.namespace, label_selector=labels,
                                            field_selector=fields, transform=self._made(made),
                                            limit=SLIM_PAGE)
        if self.absent:
            log.info("%s: the API server serves %s now", self.resource.plural, self.resource.prefix)
            self.absent = False
        self.relists += 1
        self._replace(items, made)
        self.synced.set()
        return version

    def _absent(self) -> None:
        """The kind is not served (its CRD is not installed): an empty kind, said once, re-checked."""
        if not self.absent:
            log.info("%s %s is not served (CRD not installed?): treated as empty, checked again every %.0fs",
                     self.resource.kind, self.resource.prefix, self.absent_recheck)
            self.absent = True
            with self._lock:
                if self.track_changes:
                    self._changed.update(self._objects)
                self._objects = {}
            self._emit("ABSENT", [])
            self.synced.set()
        self._stop.wait(self.absent_recheck)

    def _watch_from(self, version: str) -> None:
        """Watches until the server ends the stream, resuming from the last version seen."""
        while not self._stop.is_set():
            self._watch = self.kube.watch(
                self.resource,
                resource_version=version,
                namespace=self.namespace,
                timeout_seconds=self.watch_timeout,
                **self.selectors,
            )
            version = self._follow(self._watch, version)

    def _follow(self, events: Iterable[WatchEvent], version: str) -> str:
        for event in _until(events, self._stop):
            version = (event.object.get("metadata") or {}).get("resourceVersion") or version
            if event.type in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(event.type, event.object)
            elif event.type != "BOOKMARK":
                log.info("%s: skipping unknown watch event %s", self.resource.plural, event.type)
        return version


def _until(events: Iterable[WatchEvent], stop: threading.Event) -> Iterator[WatchEvent]:
    for event in events:
        if stop.is_set():
            return
        yield event


def wait_synced(informers: Iterable[Informer], timeout: float) -> bool:
    """Whether every informer synced within `timeout` seconds (together)."""
    deadline = time.monotonic() + timeout
    return all(inf.synced.wait(max(0.0, deadline - time.monotonic())) for inf in informers)
