"""Render: a DomainTree (+ Ready conditions) -> full HyperNode objects, with stable names.

HyperNode names are what jobs, dashboards and people refer to, so they must not shift: a name is
derived from the domain's identity (its switch IDs, its NVLink clique, its label values), never
from an index or an order, so the same fabric gives the same names after a restart, a re-list, or
a new node joining. Names are DNS-1123 labels (lower-case, at most 63 characters) so they are
also valid label values (`hypertopo.io/<tierName>=<name>` on Nodes). An identity that is already
a valid name is used as is (`leaf-sw12`); one that must be changed to fit (upper case, dots,
several switches, a long UUID) gets a short hash of the exact identity, so two identities that
look alike after cleaning can never collide.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aggregator.health import Condition
from aggregator.tiers.infer import NVLINK, DomainTree, TreeDomain

API_VERSION = "topology.volcano.sh/v1alpha1"
KIND = "HyperNode"
OWNER_LABELS = {
    "volcano.sh/network-topology-source": "hypertopo",
    "app.kubernetes.io/managed-by": "hypertopo",
}
KIND_ANNOTATION = "hypertopo.io/domain-kind"
IDENTITY_ANNOTATION = "hypertopo.io/domain-identity"
MAX_NAME = 63
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text.lower())).strip("-")


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def domain_name(kind: str, identity: tuple[str, ...]) -> str:
    """Stable DNS-1123 name of a domain from its kind and identity."""
    # The digest covers the whole identity: two NVLink domains whose cluster UUIDs share the head
    # shown in the name (8 hex digits, met among a few thousand racks) keep distinct names, so their
    # `hypertopo.io/nvlink` label values never merge the two racks into one domain.
    digest = _short_hash("\0".join((kind, *identity)) if kind != NVLINK else "\0".join(identity))
    if kind == NVLINK and len(identity) == 1 and "/" in identity[0]:
        cluster_uuid, _, clique = identity[0].partition("/")
        identity = (f"{cluster_uuid.split('-')[0]}-c{clique}",)  # uuid head + clique, then the digest
        exact = False
    else:
        exact = len(identity) == 1 and _DNS_LABEL.fullmatch(identity[0]) is not None  # "$" would pass "leaf1\n"
    base = f"{_slug(kind)}-{_slug(identity[0]) if identity else 'none'}"
    if exact and len(base) <= MAX_NAME:
        return base
    return f"{base[: MAX_NAME - 9].rstrip('-')}-{digest}"


def names(tree: DomainTree) -> dict[str, str]:
    """Domain key -> HyperNode name."""
    return {key: domain_name(td.domain.kind, td.domain.identity) for key, td in tree.domains.items()}


MEMBER_TYPES = ("HyperNode", "Node")
MEMBERS_KEPT = 1_000_000  # member entries remembered per type; past it the table starts over
_member_entries: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in MEMBER_TYPES}


def member(kind: str, name: str) -> dict[str, Any]:
    """The member entry `{"type": kind, "selector": {"exactMatch": {"name": name}}}`, one instance
    per kind and name. Why: a live aggregator holds every entry twice, in the HyperNodes it wants
    and in its cache of the HyperNodes the API server has (`aggregator.live.slim.slim_hypernode`
    puts this instance in place of the decoded one); three dicts and two strings per node, ~0.6 kB
    a node each time. Entries are read and serialised, never changed (a write deep-copies its spec)."""
    table = _member_entries[kind]
    entry = table.get(name)
    if entry is None:
        if len(table) >= MEMBERS_KEPT:
            table.clear()  # sharing is an economy only: a fresh entry is equal to the old one
        name = sys.intern(name)
        entry = table[name] = {"type": kind, "selector": {"exactMatch": {"name": name}}}
    return entry


def _members(td: TreeDomain, name_of: Mapping[str, str]) -> list[dict[str, Any]]:
    """HyperNode members first, then Nodes, each sorted by name ("HyperNode" < "Node"; the direct
    nodes come sorted): one entry per node of the cluster over all domains, so no tuples, no sort."""
    children = sorted(name_of[child] for child in td.children)
    members = [member("HyperNode", name) for name in children]
    members += [member("Node", node) for node in td.direct_nodes]
    return members


def hypernode(
    td: TreeDomain, name_of: Mapping[str, str], condition: Condition | Sequence[Condition] | None
) -> dict[str, Any]:
    """One HyperNode; `condition` is Ready, or Ready and FabricDegraded (aggregator.health)."""
    status: dict[str, Any] = {"nodeCount": len(td.domain.nodes)}
    conditions = [condition] if isinstance(condition, Condition) else list(condition or ())
    if conditions:
        status["conditions"] = [c.to_wire() for c in conditions]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name_of[td.key],
            "labels": dict(OWNER_LABELS),
            "annotations": {
                KIND_ANNOTATION: td.domain.kind,
                IDENTITY_ANNOTATION: ",".join(td.domain.identity)[:1024],
            },
        },
        "spec": {"tier": td.tier, "tierName": td.tier_name, "members": _members(td, name_of)},
        "status": status,
    }


def render(tree: DomainTree, health: Mapping[str, Condition] | None = None) -> list[dict[str, Any]]:
    """Full HyperNode objects sorted by name; `health` maps domain keys to Ready conditions."""
    name_of = names(tree)
    objects = [hypernode(td, name_of, (health or {}).get(key)) for key, td in tree.domains.items()]
    return sorted(objects, key=lambda o: o["metadata"]["name"])


def as_list(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """A kubectl-appliable `List`."""
    return {"apiVersion": "v1", "kind": "List", "items": objects}
