"""The agent's only contact with the Kubernetes client: apply and read its NodeTopology object.

Server-side apply (PATCH with `application/apply-patch+yaml`, field manager `hypertopo-agent`,
force) makes the agent the owner of every field it sends and needs no read-modify-write, so there
is no resourceVersion race and the agent's RBAC can stay at `patch` + `get` on its own object.
Client exceptions are turned into `agent.publish.ApiError` (status None: unreachable), which the
publisher's retry logic understands. The client's own urllib3 retries are turned off so a dead API
server is noticed in one connect timeout and the publisher's backoff is the only retry policy.

The object carries an owner reference to its Node, so the garbage collector deletes the report of
a Node that is deleted (a stale report would keep a node that left in its HyperNode). The agent
has no read access to Nodes: the Node's UID comes from its own pod-bound service-account token
(`authentication.kubernetes.io/node-uid`, Kubernetes >= 1.30), read back with a SelfSubjectReview
that every authenticated user may make. Without it (a kubeconfig user, an older cluster) the
object has no owner and the aggregator's sweep removes it instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from agent.publish import ApiError
from agent.report import API_GROUP, API_VERSION, PLURAL

FIELD_MANAGER = "hypertopo-agent"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
NODE_UID_EXTRA = "authentication.kubernetes.io/node-uid"


def load_client(kubeconfig: str | None = None) -> Any:
    """An ApiClient from --kubeconfig, else in-cluster config, else $KUBECONFIG / ~/.kube/config."""
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(client_configuration=configuration)
    except (ConfigException, OSError) as exc:
        raise ApiError(f"no usable Kubernetes configuration: {exc}") from exc
    configuration.retries = False
    if not configuration.verify_ssl:
        # the operator chose insecure-skip-tls-verify; one warning per request would drown the log
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return client.ApiClient(configuration)


def _status_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def node_owner(user_info: Mapping[str, Any], node: str) -> dict[str, str] | None:
    """The owner reference to Node `node` from a SelfSubjectReview's userInfo: only when the token
    is bound to a pod on that very node (names the node and its UID), else None."""
    extra = user_info.get("extra") or {}
    names, uids = list(extra.get(NODE_NAME_EXTRA) or []), list(extra.get(NODE_UID_EXTRA) or [])
    if names != [node] or len(uids) != 1 or not uids[0]:
        return None
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": str(uids[0])}


class KubeApi:
    """Applies and reads cluster-scoped `nodetopologies.hypertopo.io/v1alpha1` objects."""

    def __init__(self, api_client: Any, *, timeout: tuple[float, float] = (2.0, 10.0)) -> None:
        self._api = client.CustomObjectsApi(api_client)
        self._auth = client.AuthenticationV1Api(api_client)
        self._timeout = timeout
        self._owners: dict[str, dict[str, str] | None] = {}  # node -> owner reference (None: none)

    @classmethod
    def from_config(cls, kubeconfig: str | None = None) -> KubeApi:
        return cls(load_client(kubeconfig))

    def owner_of(self, node: str) -> dict[str, str] | None:
        """The owner reference to this agent's Node (asked once; see the module docstring)."""
        if node not in self._owners:
            self._owners[node] = self._ask_owner(node)
        return self._owners[node]

    def _ask_owner(self, node: str) -> dict[str, str] | None:
        body = client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
        try:
            review: Any = self._auth.create_self_subject_review(body, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status is None or exc.status >= 500 or exc.status == 429:
                raise ApiError(f"SelfSubjectReview: {exc.status} {_status_message(exc)}", exc.status) from exc
            return None  # refused or not served: no owner, the aggregator's sweep covers it
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(f"SelfSubjectReview: API server unreachable: {exc}") from exc
        status = review.status
        user = self._api.api_client.sanitize_for_serialization(status.user_info) if status else {}
        return node_owner(user or {}, node)

    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        name = obj["metadata"]["name"]
        body = dict(obj)
        owner = self.owner_of(name)
        if owner is not None:
            body["metadata"] = {**obj["metadata"], "ownerReferences": [owner]}
        try:
            result: Any = self._api.patch_cluster_custom_object(
                API_GROUP,
                API_VERSION,
                PLURAL,
                name,
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY_CONTENT_TYPE,
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            raise ApiError(f"apply {PLURAL}/{name}: {exc.status} {_status_message(exc)}", exc.status) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(f"apply {PLURAL}/{name}: API server unreachable: {exc}") from exc
        return result or {}  # the generated client decodes only 200; a create answers 201

    def get(self, name: str) -> Mapping[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            result: Any = self._api.get_cluster_custom_object(
                API_GROUP, API_VERSION, PLURAL, name, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ApiError(f"get {PLURAL}/{name}: {exc.status} {_status_message(exc)}", exc.status) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(f"get {PLURAL}/{name}: API server unreachable: {exc}") from exc
        return result
