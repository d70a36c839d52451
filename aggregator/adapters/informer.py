"""List-then-watch caches of API objects (the kopf / client-go informer pattern, one thread each).

Why: the controller must react within seconds to a NodeTopology or a Pod changing, without polling
the API server, and must never act on a half-known cluster. So each informer lists (paged), marks
itself synced, then watches from the list's resourceVersion with bookmarks. A 410 Gone (history
compacted) means re-list; any other failure (server unreachable, stream cut) is logged and retried
with capped backoff, keeping the last known objects: a short outage loses nothing, the re-list after
it brings every change made meanwhile. `on_change` is called after every change to the cache.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from aggregator.adapters.kube import KubeClient, Resource, Watch
from aggregator.reconcile import ApiError

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Informer:
    def __init__(
        self,
        kube: KubeClient,
        resource: Resource,
        *,
        label_selector: str | None = None,
        namespace: str | None = None,
        on_change: Callable[[], None] = lambda: None,
        watch_timeout: int = 60,
        max_backoff: float = 5.0,
    ):
        self.kube = kube
        self.resource = resource
        self.label_selector = label_selector
        self.namespace = namespace  # None: all namespaces (or a cluster-scoped resource)
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        self.synced = threading.Event()
        self.relists = 0
        self._objects: dict[str, Obj] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{resource.plural}", daemon=True)

    # -- cache -------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Obj]:
        with self._lock:
            return dict(self._objects)

    def _replace(self, items: list[Obj]) -> None:
        with self._lock:
            self._objects = {object_key(o): o for o in items}
        self.on_change()

    def _apply(self, kind: str, obj: Obj) -> None:
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(key, None)
            else:
                self._objects[key] = obj
        self.on_change()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.close()

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
                if exc.gone:
                    log.info("%s: watch history expired; re-listing", self.resource.plural)
                    continue
                log.warning("%s: %s; retrying in %.1fs", self.resource.plural, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(self.max_backoff, backoff * 2)

    def _list(self) -> str:
        items, version = self.kube.list(self.resource, namespace=self.namespace, label_selector=self.label_selector)
        self.relists += 1
        self._replace(items)
        self.synced.set()
        return version

    def _watch_from(self, version: str) -> None:
        """Watches until the server ends the stream, resuming from the last version seen."""
        while not self._stop.is_set():
            self._watch = self.kube.watch(
                self.resource,
                resource_version=version,
                namespace=self.namespace,
                label_selector=self.label_selector,
                timeout_seconds=self.watch_timeout,
            )
            for event in self._watch:
                version = (event.object.get("metadata") or {}).get("resourceVersion") or version
                if event.type in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(event.type, event.object)
                elif event.type != "BOOKMARK":
                    log.info("%s: skipping unknown watch event %s", self.resource.plural, event.type)
