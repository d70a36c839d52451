"""One node's row of the probe plan, as the aggregator publishes it in the node's own NodeTopology
(`status.probePlan`) and the agent reads it: whom to probe (name and address) and whose probes to
answer (addresses).

Why the aggregator publishes it rather than every agent computing the plan: to compute it an agent
had to list every HyperNode each round and read its peers' and probers' NodeTopology objects, so
10,000 agents made ~10,000 x (HyperNodes + 14) reads every few minutes, and needed `list` on
HyperNodes, a grant nothing else of the agent uses. The aggregator already holds the tree and every
report's probe address in its caches; it plans once (`agent.measure_plan`, the same deterministic
plan) and writes each measuring node's row into that node's NodeTopology status, only when the row
changed. An agent then reads one object, its own, which it may already read: one GET a round,
whatever the cluster's size, and no new grant.

Pure: domains and addresses in, rows and wire dicts out. `from_wire` bounds what it accepts (the
status is outside input to the agent) and names the field it refuses.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.measure_plan import Domain, plan, tree_digest

UNPLACED = "hypertopo-unplaced"  # the pseudo-leaf of measuring nodes no HyperNode holds yet
MAX_PEERS = 64  # spec.measurements' maxItems: a row naming more could not be published anyway
MAX_PROBERS = 256  # in-degree is bounded by 3 + 4 x (tiers - 1) (agent.measure_plan): far below
MAX_TEXT = 253  # a node name (DNS subdomain) or an address
PLAN_DIGEST_KEY = "hypertopo.io/probe-plan-digest"  # the published row's digest in the aggregator's slim record


class RowError(ValueError):
    """A `status.probePlan` the agent cannot use, in one line naming the field."""


@dataclass(frozen=True, slots=True)
class PlanRow:
    """`tree`: the digest of the tree planned from; `peers`: (node, address) to probe; `probers`:
    the addresses whose probes this node answers; `digest`: of the row itself, so a writer can tell
    a row already published from a changed one without keeping it."""

    tree: str
    peers: tuple[tuple[str, str], ...]
    probers: frozenset[str]

    @property
    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=10)
        h.update(self.tree.encode())
        for node, address in self.peers:
            h.update(f"\0{node}\1{address}".encode())
        h.update(b"\2" + "\0".join(sorted(self.probers)).encode())
        return h.hexdigest()


def with_unplaced(domains: Iterable[Domain], measuring: Iterable[str]) -> list[Domain]:
    """The domains plus one pseudo-leaf of the measuring nodes no leaf holds, so that a cluster
    without a cabling source still measures (and the `measured` source can find its leaves)."""
    out = list(domains)
    placed = {c for d in out if d.tier == 1 for c in d.children}
    loose = tuple(sorted(n for n in measuring if n not in placed))
    if len(loose) >= 2 and all(d.name != UNPLACED for d in out):
        out.append(Domain(UNPLACED, 1, loose))
    return out


def rows(domains: Iterable[Domain], addresses: Mapping[str, str]) -> dict[str, PlanRow]:
    """Every measuring node's row (`addresses`: node -> probe address, the measuring nodes): the
    plan over the tree (`agent.measure_plan.plan`), peers without an address left out (nothing
    would answer), probers by address. O(nodes x plan size)."""
    tree = with_unplaced(domains, addresses)
    try:
        plans = plan(tree)
    except ValueError:  # a tree the plan cannot use with the pseudo-leaf: the cabled part alone
        tree = [d for d in tree if d.name != UNPLACED]
        plans = plan(tree)
    digest = tree_digest(tree)
    probers: dict[str, set[str]] = defaultdict(set)
    for node, probes in plans.items():
        if node in addresses:
            for p in probes:
                probers[p.peer].add(addresses[node])
    out = {}
    for node in addresses:
        peers = tuple((p.peer, addresses[p.peer]) for p in plans.get(node, ()) if p.peer in addresses)
        out[node] = PlanRow(digest, peers[:MAX_PEERS], frozenset(probers.get(node, ())))
    return out


def to_wire(row: PlanRow) -> dict[str, Any]:
    return {
        "tree": row.tree,
        "digest": row.digest,
        "peers": [{"node": n, "address": a} for n, a in row.peers],
        "probers": sorted(row.probers),
    }


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise RowError(f"status.probePlan.{field}: not a name or address of 1-{MAX_TEXT} characters")
    return value


def from_wire(value: Any) -> PlanRow | None:
    """The row in a NodeTopology's `status.probePlan` (None: not planned yet); RowError when it
    is malformed or over its bounds."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RowError("status.probePlan: not an object")
    peers, probers = value.get("peers") or [], value.get("probers") or []
    if not isinstance(peers, list) or len(peers) > MAX_PEERS:
        raise RowError(f"status.probePlan.peers: not a list of at most {MAX_PEERS}")
    if not isinstance(probers, list) or len(probers) > MAX_PROBERS:
        raise RowError(f"status.probePlan.probers: not a list of at most {MAX_PROBERS}")
    pairs = []
    for i, p in enumerate(peers):
        if not isinstance(p, Mapping):
            raise RowError(f"status.probePlan.peers[{i}]: not an object")
        pairs.append((_text(p.get("node"), f"peers[{i}].node"), _text(p.get("address"), f"peers[{i}].address")))
    tree = value.get("tree", "")
    return PlanRow(
        tree if isinstance(tree, str) else "",
        tuple(pairs),
        frozenset(_text(a, f"probers[{i}]") for i, a in enumerate(probers)),
    )
