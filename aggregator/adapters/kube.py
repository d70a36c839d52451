"""The aggregator's only door to the Kubernetes API (the `kubernetes` package is imported here and
nowhere else in the aggregator, apart from the placement plugin's own adapter).

Objects travel as plain JSON dicts, not as the client's generated models: the HyperNode and
NodeTopology kinds are CRDs the client knows nothing about, and reconcile compares plain data.
Every failure, HTTP or transport, becomes `ApiError` (status 0 when the server was unreachable),
so callers never see a urllib3 or client exception. Every successful write is reported to an
`on_write(verb, resource)` hook: that is what the write metrics and the tests count.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from aggregator.reconcile import ApiError

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Resource:
    """One REST resource: where its objects live on the API server."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        if sub:
            base += f"/{sub}"
        return base


HYPERNODES = Resource("topology.volcano.sh", "v1alpha1", "hypernodes", "HyperNode")
NODETOPOLOGIES = Resource("hypertopo.io", "v1alpha1", "nodetopologies", "NodeTopology")
NODES = Resource("", "v1", "nodes", "Node")
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    object: dict[str, Any]


WriteHook = Callable[[str, str], None]


def _error_from(exc: Exception) -> ApiError:
    if isinstance(exc, ApiException):
        message = ""
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            message = str(exc.body or "")
        return ApiError(int(exc.status or 0), str(exc.reason or ""), message)
    return ApiError(0, type(exc).__name__, str(exc))


class KubeClient:
    """Plain-dict REST calls on top of the generated client's configured transport (auth, TLS)."""

    def __init__(self, api: client.ApiClient, *, on_write: WriteHook | None = None, timeout: float = 10.0):
        self.api = api
        self.on_write = on_write or (lambda verb, resource: None)
        self.timeout = timeout

    # -- transport ---------------------------------------------------------------------------------
    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, body, _ = self.api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        try:
            resp = self.api.call_api(method, url, headers, body, _request_timeout=timeout or self.timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise _error_from(exc) from exc
        return resp

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = self._send(method, path, **kwargs)
        try:
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _error_from(exc) from exc
        doc = json.loads(data or b"{}")
        if not 200 <= resp.status <= 299:
            raise ApiError(resp.status, str(doc.get("reason") or resp.reason), str(doc.get("message", "")))
        result: dict[str, Any] = doc
        return result

    def _write(self, verb: str, resource: Resource, sub: str | None, method: str, path: str, **kw: Any) -> Any:
        result = self.request(method, path, **kw)
        self.on_write(verb, resource.plural + (f"/{sub}" if sub else ""))
        return result

    # -- reads -----------------------------------------------------------------------------------
    def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        return self.request("GET", resource.path(namespace=namespace, name=name))

    def list(
        self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """All objects (paged) and the list's resourceVersion, where a watch starts from."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query = {"labelSelector": label_selector, "limit": 500, "continue": token}
            doc = self.request("GET", resource.path(namespace=namespace), query=query)
            items.extend(doc.get("items") or [])
            token = (doc.get("metadata") or {}).get("continue")
            if not token:
                return items, str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        timeout_seconds: int = 60,
    ) -> Watch:
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector,
        }
        resp = self._send(
            "GET", resource.path(namespace=namespace), query=query, timeout=(5.0, timeout_seconds + 15.0)
        )
        if not 200 <= resp.status <= 299:
            doc = json.loads(resp.read() or b"{}")
            raise ApiError(resp.status, str(doc.get("reason") or resp.reason), str(doc.get("message", "")))
        return Watch(resp.response)

    # -- writes ----------------------------------------------------------------------------------
    def create(
        self, resource: Resource, obj: Mapping[str, Any], *, field_manager: str, namespace: str | None = None
    ) -> dict[str, Any]:
        path = resource.path(namespace=namespace)
        query = {"fieldManager": field_manager}
        return self._write("create", resource, None, "POST", path, query=query, body=dict(obj))

    def apply(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        *,
        field_manager: str,
        subresource: str | None = None,
        namespace: str | None = None,
        force: bool = True,
    ) -> dict[str, Any]:
        """Server-side apply; a `metadata.resourceVersion` in `obj` is a precondition (409 if stale)."""
        name = obj["metadata"]["name"]
        path = resource.path(namespace=namespace, name=name, sub=subresource)
        query = {"fieldManager": field_manager, "force": "true" if force else None}
        body = dict(obj)
        return self._write("apply", resource, subresource, "PATCH", path, query=query, body=body, content_type=APPLY_PATCH)

    def merge_patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        field_manager: str,
        subresource: str | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """JSON merge patch; a `metadata.resourceVersion` in `patch` is a precondition (409 if stale)."""
        path = resource.path(namespace=namespace, name=name, sub=subresource)
        query = {"fieldManager": field_manager}
        return self._write("patch", resource, subresource, "PATCH", path, query=query, body=dict(patch), content_type=MERGE_PATCH)

    def replace(
        self, resource: Resource, obj: Mapping[str, Any], *, field_manager: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """PUT: optimistic concurrency through the object's metadata.resourceVersion."""
        path = resource.path(namespace=namespace, name=obj["metadata"]["name"])
        query = {"fieldManager": field_manager}
        return self._write("update", resource, None, "PUT", path, query=query, body=dict(obj))

    def delete(
        self,
        resource: Resource,
        name: str,
        *,
        resource_version: str | None = None,
        namespace: str | None = None,
    ) -> None:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        self._write("delete", resource, None, "DELETE", resource.path(namespace=namespace, name=name), body=body)


class Watch:
    """A streaming watch response: iterate for events, `close()` from another thread to stop it.

    An ERROR event becomes `ApiError` (410 Gone means: re-list)."""

    def __init__(self, response: Any):
        self._response = response

    def close(self) -> None:
        """Interrupts a reader blocked in another thread (closing the response there would wait for
        that reader's TLS lock): shutting the socket down wakes it with an error."""
        connection = getattr(self._response, "connection", None) or getattr(self._response, "_connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __iter__(self) -> Iterator[WatchEvent]:
        buffer = b""
        try:
            for chunk in self._response.stream(None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield _event(json.loads(line))
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            raise _error_from(exc) from exc
        finally:
            with contextlib.suppress(Exception):
                self._response.close()


def _event(doc: Mapping[str, Any]) -> WatchEvent:
    obj = dict(doc.get("object") or {})
    if doc.get("type") == "ERROR":
        raise ApiError(int(obj.get("code", 0)), str(obj.get("reason", "")), str(obj.get("message", "")))
    return WatchEvent(str(doc.get("type")), obj)


def connect(kubeconfig: str | None = None, *, on_write: WriteHook | None = None) -> KubeClient:
    """In-cluster service account when running in a pod, else the kubeconfig (flag or $KUBECONFIG)."""
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if not path and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(
            config_file=str(Path(path).expanduser()) if path else None, client_configuration=configuration
        )
    configuration.retries = False
    if not configuration.verify_ssl:
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # the kubeconfig chose this
    return KubeClient(client.ApiClient(configuration), on_write=on_write)


class HyperNodeClient:
    """`reconcile.HyperNodeStore` over the API server: POST to create, server-side apply (force,
    field manager `hypertopo-aggregator`) for spec and for `/status`."""

    def __init__(self, kube: KubeClient, *, field_manager: str = "hypertopo-aggregator"):
        self.kube = kube
        self.field_manager = field_manager

    def get(self, name: str) -> dict[str, Any]:
        return self.kube.get(HYPERNODES, name)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(HYPERNODES, obj, field_manager=self.field_manager)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.apply(HYPERNODES, obj, field_manager=self.field_manager)

    def apply_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.apply(HYPERNODES, obj, field_manager=self.field_manager, subresource="status")

    def delete(self, name: str, *, resource_version: str) -> None:
        self.kube.delete(HYPERNODES, name, resource_version=resource_version)


class LeaseClient:
    """`leader.LeaseStore` for one Lease: replace is a PUT, so its resourceVersion is a precondition."""

    def __init__(self, kube: KubeClient, *, namespace: str, name: str, field_manager: str = "hypertopo-aggregator"):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.field_manager = field_manager

    def get(self) -> dict[str, Any]:
        return self.kube.get(LEASES, self.name, namespace=self.namespace)

    def create(self, lease: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(LEASES, lease, field_manager=self.field_manager, namespace=self.namespace)

    def replace(self, lease: dict[str, Any]) -> dict[str, Any]:
        return self.kube.replace(LEASES, lease, field_manager=self.field_manager, namespace=self.namespace)


class NodeClient:
    """`node_marks.NodeStore`: labels by server-side apply under their own field manager, taints by
    merge patch guarded by resourceVersion (the taint list is atomic; apply would replace it)."""

    def __init__(self, kube: KubeClient, *, label_manager: str, taint_manager: str = "hypertopo-aggregator"):
        self.kube = kube
        self.label_manager = label_manager
        self.taint_manager = taint_manager

    def get(self, name: str) -> dict[str, Any]:
        return self.kube.get(NODES, name)

    def apply_labels(self, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}}
        return self.kube.apply(NODES, body, field_manager=self.label_manager)

    def patch_taints(self, name: str, taints: list[dict[str, Any]], *, resource_version: str) -> dict[str, Any]:
        patch = {"metadata": {"resourceVersion": resource_version}, "spec": {"taints": taints}}
        return self.kube.merge_patch(NODES, name, patch, field_manager=self.taint_manager)
