"""Candidate domains kept per part between inferences (aggregator.tiers.infer, aggregator.tiers.candidates).

Every candidate depends on a small part of the classes only, so after a node moved between classes
(`dirty`: the class ids whose members changed) only the parts those classes touch are worked out
again; the rest keep their very `Domain` objects:

* an NVLink domain is the classes of one clique: only the dirty classes' cliques change;
* leaf grouping settles the exact leaf sets (classes cabled to the same leaves) biggest first, and a
  set's fate reads only the groups that share a leaf with it. So the sets fall into parts
  connected by shared leaves, each settled on its own in the same order as all together. After a
  change, the parts reached over shared leaves from the changed sets' leaves (before and after)
  are settled again. That is all of every part the change touched: a part that held a changed set
  still reaches it over the sets that did not change, and a part that split apart did so at the
  leaves of the set that changed;
* a level's domains are the groups connected by the switches of that level they reach, so they are
  parts in the same sense: the groups reached from the changed groups' switches are joined again.

The state belongs to one tree at a time: the inference that advances it takes it over (`take`), and
an older tree handing it on again gets a fresh one (`take` answers None).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aggregator.graph import FabricGraph
from aggregator.tiers.candidates import NVLINK, Domain, label_domains, settle_leaf_sets, switch_domain
from aggregator.tiers.classes import NodeClasses
from aggregator.tiers.levels import SwitchLevels, fabric_hosts_on, promoted_switches, switch_kind

LeafSet = frozenset[str]
Entry = tuple[frozenset[str], str | None, int]  # what the parts read of a class: switches, clique, nodes
Move = tuple[str, Entry | None, Entry | None]  # a dirty class: before, now (None: no such class)


@dataclass
class _Level:
    """One switch level's domains: the leaf groups connected by the switches of the level they reach."""

    kind: str
    groups_at: dict[str, set[LeafSet]] = field(default_factory=dict)  # switch -> groups reaching it
    domain_of: dict[LeafSet, str] = field(default_factory=dict)  # group -> key of its domain
    domains: dict[str, Domain] = field(default_factory=dict)


def _fingerprint(graph: FabricGraph) -> tuple[int, int, int, int, int, tuple[str, ...]]:
    """What the parts assume of the graph beyond its nodes' classes (as NodeClasses.levels does)."""
    return (
        id(graph),
        len(graph.switch_links),
        len(graph.uplinks),
        len(graph.attached_by_host),
        len(graph.attached_by_guid),
        tuple(graph.label_levels),
    )


class CandidateParts:
    """Every candidate domain of a graph's classes, kept per part (see the module docstring)."""

    def __init__(self, graph: FabricGraph, classes: NodeClasses) -> None:
        self.graph, self.classes, self.fingerprint = graph, classes, _fingerprint(graph)
        self.owner: object = None  # the tree holding the state now (`take`)
        self.seen: dict[str, Entry] = {}  # class -> switches, clique, nodes
        self.hosts_on: dict[str, int] = {}  # switch -> nodes cabled to it
        # switch -> hosts the fabric sources cable to it, Nodes or not: the leaves never depend on
        # which hosts are Nodes (aggregator.tiers.levels)
        self.fabric_hosts = fabric_hosts_on(graph)
        self.peers: dict[str, set[str]] = defaultdict(set)  # switch links, both ways
        for a, b in graph.switch_links:
            self.peers[a].add(b)
            self.peers[b].add(a)
        self.promoted: set[str] = set()
        self.cliques: dict[str, set[str]] = {}  # clique -> its classes
        self.nvlink: dict[str, Domain] = {}  # clique -> its domain
        self.exact: dict[LeafSet, set[str]] = {}  # leaf set -> the classes cabled to exactly it
        self.size: dict[LeafSet, int] = {}  # leaf set -> nodes
        self.sets_on: dict[str, set[LeafSet]] = {}  # leaf -> the leaf sets holding it
        self.group_of: dict[LeafSet, LeafSet] = {}  # leaf set -> the leaf group it settled in
        self.groups: dict[LeafSet, Domain] = {}  # leaf group -> its domain (over classes)
        self.uncabled: dict[str, tuple[str, ...]] = {}  # class -> leaves of its group it lacks
        self.leaf_use: dict[str, int] = {}  # leaf -> groups holding it
        self.leaves: frozenset[str] = frozenset()
        self.leaves_stale = True
        self.levels: SwitchLevels | None = None
        self.by_level: list[_Level] = []
        self.labels: list[Domain] = []
        self.update(frozenset(classes.members), fresh=True)

    @classmethod
    def take(
        cls, held: tuple[CandidateParts, object] | None, graph: FabricGraph, classes: NodeClasses
    ) -> CandidateParts | None:
        """The state a previous tree holds, if it is still that tree's and of this graph and classes;
        taken over (the previous tree can no longer hand it on)."""
        if held is None:
            return None
        parts, owner = held
        if parts.owner is not owner or parts.classes is not classes or parts.graph is not graph:
            return None
        if parts.fingerprint != _fingerprint(graph):
            return None
        parts.owner = None
        return parts

    # -- the candidates ------------------------------------------------------------------------
    def found(self) -> list[Domain]:
        promoted = self.promoted
        leaf = (
            [d for sw, d in self.groups.items() if not sw & promoted]
            if promoted
            else list(self.groups.values())
        )
        levels = [d for level in self.by_level for d in level.domains.values()]
        return [*self.nvlink.values(), *leaf, *levels, *self.labels]

    @property
    def switch_levels(self) -> int:
        return len(self.by_level) + 1 if self.leaves else 0

    def node_uncabled(self) -> dict[str, tuple[str, ...]]:
        members = self.classes.members
        return {n: missing for c, missing in self.uncabled.items() for n in members[c]}

    # -- keeping them --------------------------------------------------------------------------
    def update(self, dirty: Iterable[str], *, fresh: bool = False) -> bool:
        """Works the dirty classes' changes in; False when the change reached what the parts
        assume fixed (which switches are promoted spines): then the caller builds a fresh state."""
        moves = self._weigh_all() if fresh else self._reweigh(dirty)
        if fresh:
            self.promoted = promoted_switches(self.graph, self._all_hosts())
        elif not self._promoted_kept(moves):
            return False
        self._regroup_nvlink(moves, fresh)
        changed_groups = self._regroup_leaves(moves, fresh)
        self._relevel(changed_groups, fresh)
        if self.graph.label_levels:
            self.labels = label_domains(self.graph, self.classes, self.switch_levels)
        return True

    def _weigh_all(self) -> list[Move]:
        """`_reweigh` of every class into an empty state, in one pass."""
        members = self.classes.members
        self.seen = {cid: (sig[0], sig[1], len(members[cid])) for cid, sig in self.classes.signature.items()}
        hosts_on: dict[str, int] = defaultdict(int)
        for switches, _clique, weight in self.seen.values():
            for switch in switches:
                hosts_on[switch] += weight
        self.hosts_on = dict(hosts_on)
        return [(cid, None, entry) for cid, entry in self.seen.items()]

    def _reweigh(self, dirty: Iterable[str]) -> list[Move]:
        """(class, before, now) per dirty class; the hosts per switch updated."""
        members, signature, hosts_on = self.classes.members, self.classes.signature, self.hosts_on
        moves: list[Move] = []
        for cid in dirty:
            before = self.seen.pop(cid, None)
            now: Entry | None = None
            if cid in members:
                sig = signature[cid]
                now = self.seen[cid] = (sig[0], sig[1], len(members[cid]))
            if before == now:
                continue
            for entry, sign in ((before, -1), (now, 1)):
                if entry is not None:
                    for switch in entry[0]:
                        left = hosts_on.get(switch, 0) + sign * entry[2]
                        if left:
                            hosts_on[switch] = left
                        else:
                            del hosts_on[switch]
            moves.append((cid, before, now))
        return moves

    def _promoted_kept(self, moves: list[Move]) -> bool:
        """Whether the promoted spines stay the same: only switches whose hosts changed, and the
        switch-linked peers of those, can change (promoted_switches)."""
        if not self.peers:
            return True
        suspects: set[str] = set()
        for _cid, before, now in moves:
            for entry in (before, now):
                if entry is not None:
                    suspects.update(entry[0])
        for s in list(suspects):
            suspects.update(self.peers.get(s, ()))
        hosts_on, fabric, peers = self.hosts_on, self.fabric_hosts, self.peers
        for s in suspects:
            hosts = max(hosts_on.get(s, 0), fabric.get(s, 0))
            carrying = [p for p in peers.get(s, ()) if p in hosts_on or p in fabric] if hosts else []
            promoted = len(carrying) >= 2 and len(carrying) > hosts
            if promoted != (s in self.promoted):
                return False
        return True

    def _all_hosts(self) -> dict[str, int]:
        """Hosts per switch: the Nodes on it, or the hosts the fabric sources know, whichever is more."""
        merged = dict(self.fabric_hosts)
        for s, count in self.hosts_on.items():
            merged[s] = max(count, merged.get(s, 0))
        return merged

    def _leaf_set(self, entry: Entry | None) -> LeafSet | None:
        """A class's leaf set: its switches less promoted spines (all of them if only spines)."""
        if entry is None or not entry[0]:
            return None
        return (entry[0] - self.promoted) or entry[0] if self.promoted else entry[0]

    def _regroup_nvlink(self, moves: list[Move], fresh: bool) -> None:
        """The NVLink domains of the cliques the moves touch (of every clique when fresh)."""
        if fresh:
            cliques: dict[str, set[str]] = defaultdict(set)
            for cid, _before, now in moves:
                if now is not None and now[1]:
                    cliques[now[1]].add(cid)
            self.cliques = dict(cliques)
            self.nvlink = {
                d: Domain(f"{NVLINK}:{d}", NVLINK, (str(d),), frozenset(c)) for d, c in cliques.items()
            }
            return
        touched = set()
        for cid, before, now in moves:
            if before is not None and before[1]:
                self.cliques[before[1]].discard(cid)
                touched.add(before[1])
            if now is not None and now[1]:
                self.cliques.setdefault(now[1], set()).add(cid)
                touched.add(now[1])
        for clique in touched:
            cids = self.cliques[clique]
            if not cids:
                del self.cliques[clique], self.nvlink[clique]
                continue
            old = self.nvlink.get(clique)
            if old is None or old.nodes != cids:
                self.nvlink[clique] = Domain(f"{NVLINK}:{clique}", NVLINK, (str(clique),), frozenset(cids))

    def _regroup_leaves(self, moves: list[Move], fresh: bool) -> dict[LeafSet, Domain | None]:
        """Settles again the parts of the leaf sets the moves reach (all of them when fresh);
        returns the leaf groups whose domain changed (None: gone)."""
        changed = self._fill(moves) if fresh else self._resize(moves)
        exact = self.exact
        reached = set(exact) if fresh else _reach(changed, self.sets_on)
        old_groups = {self.group_of.pop(sw) for sw in reached | changed if sw in self.group_of}
        for sw in () if fresh else reached:
            for cid in exact[sw]:
                self.uncabled.pop(cid, None)
        group_of, missing = settle_leaf_sets(reached, self.size)
        self.group_of.update(group_of)
        members: dict[LeafSet, set[str]] = defaultdict(set)
        for sw, group in group_of.items():
            members[group] |= exact[sw]
            if missing[sw]:
                self.uncabled.update(dict.fromkeys(exact[sw], missing[sw]))
        if fresh:
            self.groups = {group: switch_domain("leaf", group, cids) for group, cids in members.items()}
            self.leaf_use = dict(Counter(leaf for group in members for leaf in group))
            self.leaves_stale = True
            return dict(self.groups)
        out: dict[LeafSet, Domain | None] = {}
        for group in old_groups - members.keys():
            del self.groups[group]
            self._use(group, -1)
            out[group] = None
        for group, cids in members.items():
            old = self.groups.get(group)
            if old is not None and old.nodes == cids:
                continue
            if old is None:
                self._use(group, 1)
            self.groups[group] = out[group] = switch_domain("leaf", group, cids)
        return out

    def _fill(self, moves: list[Move]) -> set[LeafSet]:
        """`_resize` of every class into an empty state, in one pass."""
        exact: dict[LeafSet, set[str]] = defaultdict(set)
        size: dict[LeafSet, int] = defaultdict(int)
        for cid, _before, now in moves:
            sw = self._leaf_set(now)
            if sw is not None and now is not None:
                exact[sw].add(cid)
                size[sw] += now[2]
        self.exact, self.size = dict(exact), dict(size)
        sets_on: dict[str, set[LeafSet]] = defaultdict(set)
        for sw in exact:
            for leaf in sw:
                sets_on[leaf].add(sw)
        self.sets_on = dict(sets_on)
        return set(exact)

    def _resize(self, moves: list[Move]) -> set[LeafSet]:
        """The moved classes out of their old exact leaf sets and into their new ones; returns
        the sets whose classes changed (gone ones included)."""
        exact, size, sets_on = self.exact, self.size, self.sets_on
        changed: set[LeafSet] = set()
        for cid, before, now in moves:
            self.uncabled.pop(cid, None)
            for entry, sign in ((before, -1), (now, 1)):
                sw = self._leaf_set(entry)
                if sw is None or entry is None:
                    continue
                changed.add(sw)
                if sign > 0:
                    exact.setdefault(sw, set()).add(cid)
                else:
                    exact[sw].discard(cid)
                size[sw] = size.get(sw, 0) + sign * entry[2]
        for sw in changed:
            if exact[sw]:
                for leaf in sw:
                    sets_on.setdefault(leaf, set()).add(sw)
            else:
                del exact[sw], size[sw]
                for leaf in sw:
                    sets_on[leaf].discard(sw)
                    if not sets_on[leaf]:
                        del sets_on[leaf]
        return changed

    def _use(self, group: LeafSet, sign: int) -> None:
        """Counts the groups holding each leaf; the leaves change when a count starts or ends."""
        for leaf in group:
            count = self.leaf_use.get(leaf, 0) + sign
            if count:
                self.leaf_use[leaf] = count
            else:
                del self.leaf_use[leaf]
            if count == (1 if sign > 0 else 0):
                self.leaves_stale = True

    def _relevel(self, changed: dict[LeafSet, Domain | None], fresh: bool) -> None:
        if self.leaves_stale:
            self.leaves = frozenset((self.leaf_use.keys() | self.fabric_hosts.keys()) - self.promoted)
            self.leaves_stale = False
        levels = self.classes.levels(self.graph, self.leaves)
        if levels is not self.levels:  # other switch heights: every level's domains anew
            self.levels = levels
            top = max(levels.height.values(), default=0)
            self.by_level = [_Level(switch_kind(level)) for level in range(1, top + 1)]
            changed = dict(self.groups)
        for number, level in enumerate(self.by_level, start=1):
            _join(level, changed, self.groups, lambda sw, n=number: levels.at_level(sw, n))  # type: ignore[misc]


def _reach(start: Iterable[LeafSet], holding: dict[str, set[LeafSet]]) -> set[LeafSet]:
    """Every set connected to the start sets' switches through switches they share."""
    reached: set[LeafSet] = set()
    visited: set[str] = set()
    stack = [s for sw in start for s in sw]
    while stack:
        s = stack.pop()
        if s in visited:
            continue
        visited.add(s)
        for sw in holding.get(s, ()):
            if sw not in reached:
                reached.add(sw)
                stack.extend(sw)
    return reached


def _join(
    level: _Level,
    changed: dict[LeafSet, Domain | None],
    groups: dict[LeafSet, Domain],
    at: Callable[[LeafSet], list[str]],
) -> None:
    """A level's domains again over the groups connected to the changed groups' switches."""
    groups_at, domain_of = level.groups_at, level.domain_of
    _reindex(groups_at, changed, at)
    seeds = [s for group in changed for s in at(group)]
    old_keys = {domain_of.pop(g) for g in changed if g in domain_of}
    visited: set[str] = set()
    found: dict[str, Domain] = {}
    for seed in seeds:
        if seed in visited or seed not in groups_at:
            continue
        switches, members = _part(seed, groups_at, at, visited)
        for g in members:
            key = domain_of.pop(g, None)
            if key is not None:
                old_keys.add(key)
        domain = switch_domain(
            level.kind, frozenset(switches), frozenset().union(*(groups[g].nodes for g in members))
        )
        found[domain.key] = domain
        domain_of.update(dict.fromkeys(members, domain.key))
    for key in old_keys - found.keys():
        del level.domains[key]
    for key, domain in found.items():
        old = level.domains.get(key)
        if old is None or old.nodes != domain.nodes:
            level.domains[key] = domain


def _reindex(
    groups_at: dict[str, set[LeafSet]],
    changed: dict[LeafSet, Domain | None],
    at: Callable[[LeafSet], list[str]],
) -> None:
    """Which groups reach each switch of the level, for the changed groups (None: gone)."""
    for group, now in changed.items():
        for s in at(group):
            if now is None:
                groups_at[s].discard(group)
                if not groups_at[s]:
                    del groups_at[s]
            else:
                groups_at.setdefault(s, set()).add(group)


def _part(
    seed: str, groups_at: dict[str, set[LeafSet]], at: Callable[[LeafSet], list[str]], visited: set[str]
) -> tuple[list[str], list[LeafSet]]:
    """The switches and groups connected to `seed` (breadth first over groups reaching a switch)."""
    switches, members, seen_groups = [seed], [], set()
    visited.add(seed)
    i = 0
    while i < len(switches):
        for g in groups_at[switches[i]]:
            if g not in seen_groups:
                seen_groups.add(g)
                members.append(g)
                for s in at(g):
                    if s not in visited:
                        visited.add(s)
                        switches.append(s)
        i += 1
    return switches, members
