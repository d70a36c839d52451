"""The agent's one object in the API: its cluster-scoped NodeTopology, applied server-side.

Kept apart from the client (`agent.common.adapters.kube`) because only the agent needs it, and because
how the agent proves which Node it runs on (its pod-bound token, read back by a SelfSubjectReview)
is a question of the agent's least privilege, not of talking to the API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.common.adapters.kube import NODETOPOLOGIES, KubeClient, Resource, connect
from agent.common.api_error import ApiError
from agent.common.report import PLURAL

FIELD_MANAGER = "hypertopo-agent"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
NODE_UID_EXTRA = "authentication.kubernetes.io/node-uid"
SELF_SUBJECT_REVIEWS = Resource("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview")


def node_owner(user_info: Mapping[str, Any], node: str) -> dict[str, str] | None:
    """The owner reference to Node `node` from a SelfSubjectReview's userInfo: only when the token
    is bound to a pod on that very node (names the node and its UID), else None."""
    extra = user_info.get("extra") or {}
    names, uids = list(extra.get(NODE_NAME_EXTRA) or []), list(extra.get(NODE_UID_EXTRA) or [])
    if names != [node] or len(uids) != 1 or not uids[0]:
        return None
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": str(uids[0])}


class KubeApi:
    """The agent's `publish.ObjectApi`: applies and reads its cluster-scoped NodeTopology.

    Server-side apply (field manager `hypertopo-agent`, force) makes the agent the owner of every
    field it sends and needs no read-modify-write, so there is no resourceVersion race and the
    agent's RBAC stays at `patch` + `get` on its own object. The object carries an owner reference
    to its Node, so the garbage collector deletes the report of a deleted Node. The agent cannot
    read Nodes: the Node's UID comes from its own pod-bound service-account token
    (`authentication.kubernetes.io/node-uid`, Kubernetes >= 1.30), read back with a
    SelfSubjectReview that every authenticated user may make. Without it (a kubeconfig user, an
    older cluster) the object has no owner and the aggregator's sweep removes it instead."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._owners: dict[str, dict[str, str] | None] = {}  # node -> owner reference (None: none)

    @classmethod
    def from_config(cls, kubeconfig: str | None = None) -> KubeApi:
        return cls(connect(kubeconfig, timeout=(2.0, 10.0)))

    def owner_of(self, node: str) -> dict[str, str] | None:
        """The owner reference to this agent's Node (asked once)."""
        if node not in self._owners:
            self._owners[node] = self._ask_owner(node)
        return self._owners[node]

    def _ask_owner(self, node: str) -> dict[str, str] | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        try:
            review = self._kube.request("POST", SELF_SUBJECT_REVIEWS.path(), body=body)
        except ApiError as exc:
            if exc.transient and not exc.conflict:
                raise ApiError(exc.status, exc.reason, f"SelfSubjectReview: {exc.message}") from exc
            return None  # refused or not served: no owner, the aggregator's sweep covers it
        return node_owner((review.get("status") or {}).get("userInfo") or {}, node)

    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        name = obj["metadata"]["name"]
        body = dict(obj)
        owner = self.owner_of(name)
        if owner is not None:
            body["metadata"] = {**obj["metadata"], "ownerReferences": [owner]}
        try:
            return self._kube.apply(NODETOPOLOGIES, body, field_manager=FIELD_MANAGER)
        except ApiError as exc:
            raise ApiError(exc.status, exc.reason, f"apply {PLURAL}/{name}: {exc.message}") from exc

    def get(self, name: str) -> Mapping[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._kube.get(NODETOPOLOGIES, name)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise ApiError(exc.status, exc.reason, f"get {PLURAL}/{name}: {exc.message}") from exc
