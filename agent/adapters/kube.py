"""The agent's only contact with the Kubernetes client: apply and read its NodeTopology object.

Server-side apply (PATCH with `application/apply-patch+yaml`, field manager `hypertopo-agent`,
force) makes the agent the owner of every field it sends and needs no read-modify-write, so there
is no resourceVersion race and the agent's RBAC can stay at `patch` + `get` on its own object.
Client exceptions are turned into `agent.publish.ApiError` (status None: unreachable), which the
publisher's retry logic understands. The client's own urllib3 retries are turned off so a dead API
server is noticed in one connect timeout and the publisher's backoff is the only retry policy.
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


class KubeApi:
    """Applies and reads cluster-scoped `nodetopologies.hypertopo.io/v1alpha1` objects."""

    def __init__(self, api_client: Any, *, timeout: tuple[float, float] = (2.0, 10.0)) -> None:
        self._api = client.CustomObjectsApi(api_client)
        self._timeout = timeout

    @classmethod
    def from_config(cls, kubeconfig: str | None = None) -> KubeApi:
        return cls(load_client(kubeconfig))

    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        name = obj["metadata"]["name"]
        try:
            result: Any = self._api.patch_cluster_custom_object(
                API_GROUP,
                API_VERSION,
                PLURAL,
                name,
                dict(obj),
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
