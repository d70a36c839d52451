"""The one door to the Kubernetes API for the agent, the aggregator and the scheduler: the
`kubernetes` package is imported here and nowhere else.

Why one module: the three components used to carry three clients, three error types and three
kubeconfig precedences, so the same flag meant different clusters in different pods. Now:
- `connect()` picks the configuration one way (`config_source`): an explicit `--kubeconfig`, else
  the pod's service account when running in a pod, else what kubectl reads ($KUBECONFIG, then
  ~/.kube/config). The client's urllib3 retries are off: a dead server is noticed in one connect
  timeout and each caller's own backoff is the only retry policy.
- Objects travel as plain JSON dicts, not generated models: the CRDs (HyperNode, NodeTopology,
  PodGroup) have no models, the pure layers compare plain data, and (de)serialising models costs
  more than the HTTP round trip on the bind path.
- Every failure, HTTP or transport, becomes `agent.common.api_error.ApiError` (status 0: unreachable).
- Every successful write is reported to an `on_write(verb, resource)` hook (write metrics, tests).

The agent's own NodeTopology adapter (`KubeApi`: server-side apply of its one object) is
`agent.adapters.node_topology`; the informer is `agent.common.adapters.informer`; the lean HTTP/1.1
transport under the client is `agent.common.adapters.kube_http`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import should_bypass_proxies
from kubernetes.config.config_exception import ConfigException

from agent.common.adapters import kube_http
from agent.common.api_error import ApiError
from agent.common.report import API_GROUP, API_VERSION, PLURAL

log = logging.getLogger(__name__)

JSON = "application/json"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

Obj = dict[str, Any]
_BINDING = ('{"apiVersion":"v1","kind":"Binding","metadata":{"name":%s,"namespace":%s,"uid":%s},'
            '"target":{"apiVersion":"v1","kind":"Node","name":%s}}')
WriteHook = Callable[[str, str], None]
Timeout = float | tuple[float, float]
AUTH_REUSE_SECONDS = 10.0  # how long one bearer-token setting is reused (KubeClient._auth_setting)


@dataclass(frozen=True)
class Resource:
    """One REST resource: where its objects live on the API server."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = False

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = self.prefix
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        if sub:
            base += f"/{sub}"
        return base


NODES = Resource("", "v1", "nodes", "Node")
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
HYPERNODES = Resource("topology.volcano.sh", "v1alpha1", "hypernodes", "HyperNode")
NODETOPOLOGIES = Resource(API_GROUP, API_VERSION, PLURAL, "NodeTopology")


# -- configuration ------------------------------------------------------------------------------
def config_source(kubeconfig: str | None, environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """Which configuration `connect` loads: ("kubeconfig", path) or ("in-cluster", None).

    An explicit file wins; in a pod (service host set and a token mounted) the service account
    comes next; else kubectl's order: $KUBECONFIG, then ~/.kube/config (path None: the client's
    default, which is ~/.kube/config)."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return "kubeconfig", str(Path(kubeconfig).expanduser())
    if env.get("KUBERNETES_SERVICE_HOST") and Path(SERVICE_ACCOUNT_TOKEN).exists():
        return "in-cluster", None
    if env.get("KUBECONFIG"):
        return "kubeconfig", env["KUBECONFIG"]
    return "kubeconfig", None


def connect(
    kubeconfig: str | None = None,
    *,
    on_write: WriteHook | None = None,
    timeout: Timeout = 10.0,
    pool_size: int | None = None,
) -> KubeClient:
    """A client from `config_source`; a missing or broken configuration raises ApiError(0)."""
    configuration = client.Configuration()
    kind, path = config_source(kubeconfig)
    where = "the pod's service account" if kind == "in-cluster" else f"kubeconfig {path or '~/.kube/config'}"
    if path and os.pathsep not in path and not Path(path).is_file():  # the client's own words are vaguer
        raise ApiError(0, "NoConfiguration", f"no usable Kubernetes configuration: {where}: no such file")
    try:
        if kind == "in-cluster":
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=path, client_configuration=configuration)
    except (ConfigException, OSError) as exc:
        raise ApiError(0, "NoConfiguration", f"no usable Kubernetes configuration: {where}: {exc}") from exc
    except (TypeError, AttributeError, ValueError) as exc:  # YAML that is not a kubeconfig's shape
        raise ApiError(
            0, "NoConfiguration", f"no usable Kubernetes configuration: {where} is not a kubeconfig ({exc})"
        ) from exc
    configuration.retries = False
    if pool_size:
        configuration.connection_pool_maxsize = pool_size
    if not configuration.verify_ssl:
        # the operator chose insecure-skip-tls-verify; one warning per request would drown the log
        log.warning("TLS verification of the API server is off (kubeconfig insecure-skip-tls-verify)")
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return KubeClient(client.ApiClient(configuration), on_write=on_write, timeout=timeout)


# -- errors -------------------------------------------------------------------------------------
def _error_from(exc: Exception) -> ApiError:
    if isinstance(exc, ApiException) and exc.status:
        return _status_error(int(exc.status), str(exc.reason or ""), exc.body)
    return ApiError(0, "Unreachable", f"API server unreachable: {type(exc).__name__}: {exc}")


def _status_error(status: int, reason: str, data: bytes | str | None) -> ApiError:
    """A non-2xx answer: reason and message from its Status body when it has one."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data or "")
    try:
        doc = json.loads(text or "{}")
        return ApiError(status, str(doc.get("reason") or reason), str(doc.get("message", "")))
    except (ValueError, AttributeError):
        return ApiError(status, reason, text[:500])


# -- the client ---------------------------------------------------------------------------------
def lean_pool(configuration: client.Configuration) -> kube_http.Pool | None:
    """The lean transport for this configuration, or None where a proxy sits between us and the
    API server (then the generated client's transport, which speaks to proxies, carries it)."""
    if configuration.proxy and not should_bypass_proxies(configuration.host, configuration.no_proxy or ""):
        return None
    tls = None
    if configuration.host.startswith("https:"):
        tls = kube_http.tls_context(verify=bool(configuration.verify_ssl), ca_file=configuration.ssl_ca_cert,
                                    ca_data=configuration.ca_cert_data, cert_file=configuration.cert_file,
                                    key_file=configuration.key_file,
                                    check_hostname=configuration.assert_hostname is not False)
    server = kube_http.Server.from_url(configuration.host, tls, server_hostname=configuration.tls_server_name)
    return kube_http.Pool(server, size=configuration.connection_pool_maxsize or 10)


class KubeClient:
    """Plain-dict REST calls, safe to share between threads. The configuration (server, TLS,
    token refresh) is the generated client's; the requests go over `kube_http`'s kept-alive
    connections, or through the generated client's transport where a proxy is configured."""

    def __init__(self, api: client.ApiClient, *, on_write: WriteHook | None = None, timeout: Timeout = 10.0,
                 auth_reuse: float = AUTH_REUSE_SECONDS, lean: bool = True):
        self.api = api
        self.on_write = on_write or (lambda verb, resource: None)
        self.timeout = timeout
        self.auth_reuse = auth_reuse
        self._auth: tuple[float, dict[str, Any] | None] = (float("-inf"), None)  # (reuse until, setting)
        self.http = lean_pool(api.configuration) if lean else None
        self._heads: dict[tuple[str, str], bytes] = {}  # (content type, authorization) -> header lines
        agent = getattr(api, "user_agent", None) or "hypertopo"
        self._agent = f"User-Agent: {agent}\r\n"

    def _auth_setting(self) -> dict[str, Any] | None:
        """The bearer-token setting, asked of the configuration at most every `auth_reuse` seconds.

        Why: asking runs the loader's refresh hook (kubeconfig or in-cluster token reload), about
        0.3-0.6 ms of CPU a request, a third of a pods/binding call's client-side cost. The loaders
        renew a token minutes before it expires (kubeconfig: 5 min; in-cluster: the file is re-read
        every minute and kubelet rotates it at 80% of its life), so seconds of reuse never send an
        expired one; a 401 drops the cached setting all the same."""
        until, setting = self._auth
        now = time.monotonic()
        if now >= until:
            setting = self.api.configuration.auth_settings().get("BearerToken")
            self._auth = (now + self.auth_reuse, setting)
        return setting

    def warm(self, connections: int) -> int:
        """Opens up to `connections` kept-alive connections now (in parallel), so a burst of
        requests right after start-up does not pay for TLS handshakes; returns how many opened."""
        return self.http.warm(connections) if self.http is not None else 0

    # -- transport ---------------------------------------------------------------------------------
    def _head(self, content_type: str) -> bytes:
        """The request's header lines (cached: they change only when the token does)."""
        setting = self._auth_setting()
        authorization = str(setting.get("value") or "") if setting else ""
        head = self._heads.get((content_type, authorization))
        if head is None:
            lines = f"Accept: {JSON}\r\nContent-Type: {content_type}\r\n{self._agent}"
            if authorization:
                lines += f"Authorization: {authorization}\r\n"
            head = self._heads[(content_type, authorization)] = lines.encode("latin-1")
        return head

    def _refused(self, status: int, reason: str, data: bytes | None) -> ApiError:
        if status == 401:  # a token revoked or rotated early: ask the configuration again next time
            self._auth = (float("-inf"), None)
        return _status_error(status, reason, data)

    def _lean(self, http: kube_http.Pool, method: str, target: str, body: Any, content_type: str,
              timeout: Timeout, stream: bool) -> kube_http.Response:
        raw = body if body is None or isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
        try:
            resp = http.request(method, target, head=self._head(content_type), body=raw, timeout=timeout, stream=stream)
        except OSError as exc:
            raise _error_from(exc) from exc
        if 200 <= resp.status <= 299:
            return resp
        raise self._refused(resp.status, resp.reason, resp.data)

    def _send(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
              content_type: str = JSON, timeout: Timeout | None = None,
              stream: bool = False) -> kube_http.Response | urllib3.BaseHTTPResponse:
        """One request; on 2xx the answer, its body read (a `kube_http.Response`) unless `stream`;
        else ApiError. `body`: a JSON value, or bytes already serialised."""
        target = path + ("?" + urlencode({k: v for k, v in query.items() if v is not None}) if query else "")
        if self.http is not None:
            return self._lean(self.http, method, target, body, content_type, timeout or self.timeout, stream)
        headers = {"Accept": JSON, "Content-Type": content_type}
        _, url, headers, body, _ = self.api.param_serialize(
            method, path, header_params=headers, body=json.loads(body) if isinstance(body, bytes) else body,
            auth_settings=["BearerToken"], _request_auth=self._auth_setting(),
        )
        try:
            result = self.api.call_api(method, url + target[len(path):], headers, body,
                                       _request_timeout=timeout or self.timeout)
            resp: urllib3.BaseHTTPResponse = result.response
            if stream and 200 <= resp.status <= 299:
                return resp
            data = resp.data
            resp.release_conn()
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise _error_from(exc) from exc
        if 200 <= resp.status <= 299:
            return kube_http.Response(resp.status, str(resp.reason or ""), data=data)
        raise self._refused(resp.status, str(resp.reason or ""), data)

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        """One request with a JSON answer (kwargs: query, body, content_type, timeout)."""
        result: Obj = json.loads(self._send(method, path, **kwargs).data or b"{}")
        return result

    def _write(self, verb: str, resource: Resource, sub: str | None, method: str, path: str, **kw: Any) -> Obj:
        result = self.request(method, path, **kw)
        self.on_write(verb, resource.plural + (f"/{sub}" if sub else ""))
        return result

    # -- reads -------------------------------------------------------------------------------------
    def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Obj:
        return self.request("GET", resource.path(namespace=namespace, name=name))

    def list(self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None, transform: Callable[[Obj], Obj] | None = None,
             limit: int = 500) -> tuple[list[Obj], str]:
        """All objects (paged; every namespace unless one is named) and the list's resourceVersion,
        where a watch starts from. `transform` is applied page by page, so a list of 100,000 whole
        Nodes is never held at once (the informers keep slim records: aggregator.live.slim); `limit`
        objects a page."""
        items: list[Obj] = []
        token: str | None = None
        while True:
            query = {"labelSelector": label_selector or None, "fieldSelector": field_selector or None,
                     "limit": limit, "continue": token}
            doc = self.request("GET", resource.path(namespace=namespace), query=query)
            page, meta = doc.pop("items", None) or [], doc.get("metadata") or {}
            items.extend(map(transform, page) if transform is not None else page)
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(self, resource: Resource, *, resource_version: str, namespace: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: int = 60) -> Watch:
        """Events from `resource_version` on, with bookmarks, until the server ends the stream."""
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector or None,
            "fieldSelector": field_selector or None,
        }
        resp = self._send("GET", resource.path(namespace=namespace), query=query,
                          timeout=(5.0, timeout_seconds + 15.0), stream=True)
        if isinstance(resp, kube_http.Response):
            return Watch(resp.chunks(), resp.shutdown)
        return Watch(resp.stream(None, decode_content=False), _shutdown_of(resp), resp.close)

    # -- writes ------------------------------------------------------------------------------------
    def create(self, resource: Resource, obj: Mapping[str, Any], *, field_manager: str | None = None,
               namespace: str | None = None) -> Obj:
        """POST; the namespace defaults to the object's own."""
        namespace = namespace or (obj.get("metadata") or {}).get("namespace")
        path = resource.path(namespace=namespace)
        return self._write("create", resource, None, "POST", path, query={"fieldManager": field_manager},
                           body=dict(obj))

    def apply(self, resource: Resource, obj: Mapping[str, Any], *, field_manager: str,
              subresource: str | None = None, namespace: str | None = None, force: bool = True) -> Obj:
        """Server-side apply; a `metadata.resourceVersion` in `obj` is a precondition (409 if stale)."""
        path = resource.path(namespace=namespace, name=obj["metadata"]["name"], sub=subresource)
        query = {"fieldManager": field_manager, "force": "true" if force else None}
        return self._write("apply", resource, subresource, "PATCH", path, query=query, body=dict(obj),
                           content_type=APPLY_PATCH)

    def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any], *,
                    field_manager: str | None = None, subresource: str | None = None,
                    namespace: str | None = None) -> Obj:
        """JSON merge patch; a `metadata.resourceVersion` in `patch` is a precondition (409 if stale)."""
        path = resource.path(namespace=namespace, name=name, sub=subresource)
        return self._write("patch", resource, subresource, "PATCH", path, query={"fieldManager": field_manager},
                           body=dict(patch), content_type=MERGE_PATCH)

    def patch(self, resource: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]) -> None:
        """A merge patch of the object itself (Volcano's PodGroup CRD has no status subresource);
        the answer (the whole object) is not decoded: nobody reads it."""
        self._patch_quiet(resource, namespace, name, patch, None)

    def patch_status(self, resource: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]) -> None:
        """A merge patch of the `/status` subresource; the answer is not decoded (see `patch`)."""
        self._patch_quiet(resource, namespace, name, patch, "status")

    def _patch_quiet(self, resource: Resource, namespace: str | None, name: str, patch: Mapping[str, Any],
                     sub: str | None) -> None:
        self._send("PATCH", resource.path(namespace=namespace, name=name, sub=sub), body=dict(patch),
                   content_type=MERGE_PATCH)
        self.on_write("patch", resource.plural + (f"/{sub}" if sub else ""))

    def replace(self, resource: Resource, obj: Mapping[str, Any], *, field_manager: str | None = None,
                namespace: str | None = None) -> Obj:
        """PUT: optimistic concurrency through the object's metadata.resourceVersion."""
        path = resource.path(namespace=namespace, name=obj["metadata"]["name"])
        return self._write("update", resource, None, "PUT", path, query={"fieldManager": field_manager},
                           body=dict(obj))

    def delete(self, resource: Resource, name: str, *, resource_version: str | None = None,
               uid: str | None = None, namespace: str | None = None, grace_seconds: int | None = None) -> None:
        """DELETE with optional resourceVersion / UID preconditions."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {"resourceVersion": resource_version, "uid": uid}
        if any(preconditions.values()):
            body["preconditions"] = {k: v for k, v in preconditions.items() if v}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        self._write("delete", resource, None, "DELETE", resource.path(namespace=namespace, name=name), body=body)

    # -- the scheduler's pod verbs -----------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST pods/NAME/binding; the UID precondition refuses a pod recreated under the same name,
        and the API server refuses (409) a pod already bound elsewhere. The body is written
        straight to bytes and the answer (a Status) is not decoded: this is the hot verb."""
        body = _BINDING % (json.dumps(name), json.dumps(namespace), json.dumps(uid), json.dumps(node))
        self._send("POST", PODS.path(namespace=namespace, name=name, sub="binding"), body=body.encode())
        self.on_write("create", "pods/binding")

    def delete_pod(self, namespace: str, name: str, uid: str, *, grace_seconds: int | None = None) -> None:
        self.delete(PODS, name, uid=uid, namespace=namespace, grace_seconds=grace_seconds)

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """policy/v1 Eviction: PodDisruptionBudgets hold (a 429 means the budget refuses now)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        self._write("create", PODS, "eviction", "POST", PODS.path(namespace=namespace, name=name, sub="eviction"),
                    body=body)

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.create(EVENTS, event, namespace=namespace)


class Watch:
    """A streaming watch answer: iterate for events, `close()` from another thread to stop it.

    An ERROR event becomes `ApiError` (410 Gone means: re-list). Each event is one JSON line,
    decoded to a plain dict, never to the generated client's models."""

    def __init__(self, chunks: Iterator[bytes], shutdown: Callable[[], None],
                 finish: Callable[[], None] = lambda: None) -> None:
        self._chunks, self._shutdown, self._finish = chunks, shutdown, finish

    def close(self) -> None:
        """Interrupts a reader blocked in another thread (closing the answer there would wait for
        that reader's TLS lock): shutting the socket down wakes it with an error."""
        self._shutdown()

    def __iter__(self) -> Iterator[WatchEvent]:
        buffer = b""
        try:
            for chunk in self._chunks:
                buffer = buffer + chunk if buffer else chunk
                if b"\n" not in chunk:
                    continue
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _event(json.loads(line))
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            raise _error_from(exc) from exc
        finally:
            with contextlib.suppress(Exception):
                self._finish()


def _shutdown_of(response: urllib3.BaseHTTPResponse) -> Callable[[], None]:
    """Shuts down the socket under a urllib3 answer (the generated transport's watches)."""
    def shutdown() -> None:
        connection = getattr(response, "connection", None) or getattr(response, "_connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    return shutdown


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    object: Obj


def _event(doc: Mapping[str, Any]) -> WatchEvent:
    obj = dict(doc.get("object") or {})
    if doc.get("type") == "ERROR":
        raise ApiError(int(obj.get("code", 0)), str(obj.get("reason", "")), str(obj.get("message", "")))
    return WatchEvent(str(doc.get("type")), obj)
