"""The scheduler's only door to the API server: list + watch (informers), pods/binding, the
Eviction API, Events and PodGroup status.

Why raw JSON calls instead of the generated models: the scheduler keeps objects as plain dicts
(the pure placement modules read dicts, as the API returns them), binding throughput matters
(model (de)serialisation costs more than the HTTP round trip) and the CRDs (HyperNode, PodGroup)
have no generated models. Every failure becomes `ApiError` with the HTTP status (0 when the server
could not be reached), so callers never import `kubernetes`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class ApiError(RuntimeError):
    """An API call that failed: `status` is the HTTP code (0: no answer), `reason` the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Resource:
    """Where a kind lives on the API server."""

    kind: str
    prefix: str  # /api/v1 or /apis/GROUP/VERSION
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        parts = [self.prefix]
        if self.namespaced and namespace:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name:
            parts.append(name)
        if sub:
            parts.append(sub)
        return "/".join(parts)


NODES = Resource("Node", "/api/v1", "nodes", namespaced=False)
PODS = Resource("Pod", "/api/v1", "pods", namespaced=True)
EVENTS = Resource("Event", "/api/v1", "events", namespaced=True)
HYPERNODES = Resource("HyperNode", "/apis/topology.volcano.sh/v1alpha1", "hypernodes", namespaced=False)
PODGROUPS = Resource("PodGroup", "/apis/scheduling.x-k8s.io/v1alpha1", "podgroups", namespaced=True)
VC_PODGROUPS = Resource("VolcanoPodGroup", "/apis/scheduling.volcano.sh/v1beta1", "podgroups", namespaced=True)
QUEUES = Resource("Queue", "/apis/scheduling.volcano.sh/v1beta1", "queues", namespaced=False)
VC_JOBS = Resource("VolcanoJob", "/apis/batch.volcano.sh/v1alpha1", "jobs", namespaced=True)
COMMANDS = Resource("Command", "/apis/bus.volcano.sh/v1alpha1", "commands", namespaced=True)


def load_client(kubeconfig: str | None, *, pool_size: int = 32) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, $KUBECONFIG / ~/.kube/config, or the in-cluster account."""
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError):
        if kubeconfig:
            raise
        config.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size
    if not cfg.verify_ssl:  # the kubeconfig asked for it (insecure-skip-tls-verify): warned once, here
        log.warning("TLS verification of the API server is off (kubeconfig insecure-skip-tls-verify)")
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return client.ApiClient(cfg)


def _status_error(status: int, data: bytes) -> ApiError:
    """A non-2xx answer -> ApiError, with reason and message from its Status body when it has one."""
    reason, message = "", data.decode(errors="replace")[:500]
    try:
        doc = json.loads(data)
        reason, message = str(doc.get("reason", "")), str(doc.get("message", message))
    except (ValueError, AttributeError):
        pass
    return ApiError(status, reason, message)


def _api_error(exc: Exception) -> ApiError:
    if isinstance(exc, ApiException):
        return ApiError(int(exc.status or 0), str(exc.reason or ""), str(exc.body or ""))
    return ApiError(0, type(exc).__name__, str(exc))


class KubeApi:
    """Thin typed calls over one ApiClient; safe to use from several threads."""

    def __init__(self, api_client: client.ApiClient, *, request_timeout: float = 30) -> None:
        self._client = api_client
        self._timeout = request_timeout

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | tuple[float, float] | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """One request; the raw (unread) response on 2xx, else ApiError with the Status reason."""
        request = self._client.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Accept": JSON, "Content-Type": content_type},
            body=body,  # a dict: the REST layer json-encodes it for (merge-patch+)json
            auth_settings=["BearerToken"],
        )
        try:
            result = self._client.call_api(*request, _request_timeout=timeout if timeout is not None else self._timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise _api_error(exc) from exc
        resp: urllib3.BaseHTTPResponse = result.response
        if not 200 <= resp.status <= 299:
            data = resp.data
            resp.release_conn()
            raise _status_error(resp.status, data)
        return resp

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = self._call(method, path, **kwargs)
        try:
            data: dict[str, Any] = json.loads(resp.data or b"{}")
        finally:
            resp.release_conn()
        return data

    # -- reads --------------------------------------------------------------------------------
    def list(self, resource: Resource, *, label_selector: str = "", field_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        """All objects of a kind (every namespace) and the list's resourceVersion."""
        query = _selectors(label_selector, field_selector)
        doc = self._json("GET", resource.path(), query=query, timeout=120)
        return list(doc.get("items") or []), str(doc.get("metadata", {}).get("resourceVersion", ""))

    def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        return self._json("GET", resource.path(namespace, name))

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 60,
        on_response: Callable[[urllib3.BaseHTTPResponse | None], None] = lambda _r: None,
    ) -> Iterator[dict[str, Any]]:
        """Watch events ({type, object}) from a resourceVersion, with bookmarks, until the server
        closes the stream after `timeout_seconds`."""
        query: list[tuple[str, Any]] = [("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true")]
        query += [("timeoutSeconds", timeout_seconds), *_selectors(label_selector, field_selector)]
        resp = self._call("GET", resource.path(), query=query, timeout=(10, timeout_seconds + 30))
        on_response(resp)
        try:
            for line in iter_resp_lines(resp):
                if line:
                    yield json.loads(line)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _api_error(exc) from exc
        finally:
            on_response(None)
            resp.release_conn()

    # -- writes -------------------------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST pods/NAME/binding; the UID precondition refuses a pod recreated under the same name,
        and the API server refuses (409) a pod already bound elsewhere."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._json("POST", PODS.path(namespace, name, "binding"), body=body)

    def delete_pod(self, namespace: str, name: str, uid: str, *, grace_seconds: int | None = None) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        self._json("DELETE", PODS.path(namespace, name), body=body)

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """policy/v1 Eviction: PodDisruptionBudgets hold (a 429 means the budget refuses now)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        self._json("POST", PODS.path(namespace, name, "eviction"), body=body)

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self._json("POST", EVENTS.path(namespace), body=dict(event))

    def patch_status(self, resource: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]) -> None:
        self._json("PATCH", resource.path(namespace, name, "status"), body=dict(patch), content_type=MERGE_PATCH)

    def patch(self, resource: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]) -> None:
        """A merge patch of the object itself (Volcano's PodGroup CRD has no status subresource)."""
        self._json("PATCH", resource.path(namespace, name), body=dict(patch), content_type=MERGE_PATCH)

    def create(self, resource: Resource, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("POST", resource.path(namespace), body=dict(body))


def _selectors(label_selector: str, field_selector: str) -> list[tuple[str, Any]]:
    query: list[tuple[str, Any]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


class Informer(threading.Thread):
    """List, then watch from the list's resourceVersion (with bookmarks); on 410 Gone or a broken
    stream, re-list. Delivers ("SYNC", [objects]) after every list and (TYPE, object) per event to
    `sink`, from this thread. `stop()` ends it promptly by shutting the open stream."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        sink: Callable[[str, Any], None],
        *,
        label_selector: str = "",
        field_selector: str = "",
        watch_timeout: int = 60,
        backoff: float = 1.0,
        optional: bool = False,
        absent_recheck: float = 30.0,
    ) -> None:
        super().__init__(name=f"informer-{resource.plural}", daemon=True)
        self.api, self.resource, self.sink = api, resource, sink
        self.selectors = {"label_selector": label_selector, "field_selector": field_selector}
        self.watch_timeout, self.backoff = watch_timeout, backoff
        # optional: the kind's CRD may not be installed (Volcano's, scheduler-plugins'): a 404 on the
        # list counts as an empty, synced kind, looked for again every `absent_recheck` seconds
        self.optional, self.absent_recheck = optional, absent_recheck
        self.absent = False
        self._stop_event = threading.Event()
        self._resp: urllib3.BaseHTTPResponse | None = None
        self.synced = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:
                log.debug("stream shutdown of %s failed", self.resource.plural)

    def _set_resp(self, resp: urllib3.BaseHTTPResponse | None) -> None:
        self._resp = resp

    def run(self) -> None:
        rv = ""
        while not self._stop_event.is_set():
            try:
                if not rv:
                    items, rv = self.api.list(self.resource, **self.selectors)
                    if self.absent:
                        log.info("%s: the API server serves %s now", self.resource.plural, self.resource.prefix)
                    self.absent = False
                    self.sink("SYNC", items)
                    self.synced.set()
                rv = self._watch_from(rv)
            except ApiError as exc:
                if self._stop_event.is_set():
                    return
                if exc.status == 404 and self.optional:
                    rv = ""
                    self._absent()
                    continue
                log.warning("%s informer: %s; re-listing in %.1fs", self.resource.plural, exc, self.backoff)
                if exc.status == 410:
                    rv = ""
                self._stop_event.wait(self.backoff)

    def _absent(self) -> None:
        """The kind is not served (its CRD is not installed): an empty kind, said once, re-checked."""
        if not self.absent:
            log.info("%s %s is not served (CRD not installed?): treated as empty, checked again every %.0fs",
                     self.resource.kind, self.resource.prefix, self.absent_recheck)
            self.absent = True
            self.sink("ABSENT", [])
            self.synced.set()
        self._stop_event.wait(self.absent_recheck)

    def _watch_from(self, rv: str) -> str:
        """Follows one watch stream; returns the resourceVersion to resume from ("" = re-list)."""
        stream = self.api.watch(
            self.resource, rv, timeout_seconds=self.watch_timeout, on_response=self._set_resp, **self.selectors
        )
        for event in stream:
            if self._stop_event.is_set():
                return rv
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                code = obj.get("code")
                log.info("%s watch ended with %s (%s)", self.resource.plural, code, obj.get("message"))
                return "" if code == 410 else rv
            rv = obj.get("metadata", {}).get("resourceVersion", rv)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.sink(str(kind), obj)
            elif kind != "BOOKMARK":
                log.warning("%s watch: unknown event type %r skipped", self.resource.plural, kind)
        return rv


def wait_synced(informers: list[Informer], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(inf.synced.wait(max(0.0, deadline - time.monotonic())) for inf in informers)
