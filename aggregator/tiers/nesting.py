"""Nesting of candidate domains (aggregator.tiers.infer): accepting them smallest rank first, and
re-nesting after a small change by replaying only the domains the change can reach.

A domain's outcome (accepted with its children and direct classes, merged into a root, or dropped)
depends only on the outcomes of the earlier domains that share a class with it. So after a change,
walking the same order, a domain is *tainted* when its classes changed (or it is new, or it
vanished) or it shares a class, before or after the change, with an earlier tainted domain; every
other domain reads exactly what it read last time and keeps its outcome. Only tainted domains are
offered again. A node moving between classes taints the domains along its classes' chains (its
rack, leaf, spine, core): a handful out of thousands.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from aggregator.tiers.candidates import Domain


@dataclass
class Nesting:
    """Domains (over classes) accepted smallest rank first.

    `top` holds, for each class, the largest accepted domain holding it so far: those are the
    roots of the tree built so far, and every class of a root has that root as its top (a domain
    that took only part of a root's classes would have partly overlapped it, and been dropped). So
    a new domain partly overlaps a root it touches exactly when that root's classes are not all
    among its own: a subset test, whatever the classes weigh."""

    top: dict[str, str] = field(default_factory=dict)  # class -> key of the largest accepted domain
    accepted: dict[str, Domain] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    direct: dict[str, frozenset[str]] = field(default_factory=dict)  # classes in no child
    merged: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    dropped: list[tuple[str, str]] = field(default_factory=list)
    # what a later re-nesting replays from: every domain offered (in order), and each outcome
    offered: dict[str, Domain] = field(default_factory=dict)
    merged_into: dict[str, str] = field(default_factory=dict)
    reason: dict[str, str] = field(default_factory=dict)  # dropped key -> why
    owner: dict[str, str] = field(default_factory=dict)  # class -> key of the domain holding it directly
    kinds: tuple[str, ...] = ()  # the ranking of kinds the order followed
    # re-nesting: the domains whose outcome, parent or merges may differ from the last nesting's
    # (the tainted, their children before and after, the roots they merge into); None: all
    touched: set[str] | None = None

    def offer(self, domain: Domain) -> None:
        self.offered[domain.key] = domain
        top, classes = self.top, domain.nodes
        found = set(map(top.get, classes))
        loose = None in found  # some classes in no accepted domain yet
        roots = {k for k in found if k is not None}
        overlapped = [k for k in roots if not self.accepted[k].nodes <= classes]
        if overlapped:  # the first by name, so the reason does not depend on set order
            key = min(overlapped)
            self.drop(domain.key, f"partly overlaps {key}; kept {key}")
            return
        if not loose and len(roots) == 1:
            self.merge(domain.key, roots.pop())  # same node set: one HyperNode
            return
        key = domain.key
        self.accepted[key] = domain
        self.children[key] = sorted(roots)
        self.direct[key] = frozenset([c for c in classes if c not in top]) if loose else frozenset()
        for child in self.children[key]:
            self.parent[child] = key
        top.update(dict.fromkeys(classes, key))

    def drop(self, key: str, reason: str) -> None:
        self.dropped.append((key, reason))
        self.reason[key] = reason

    def merge(self, key: str, root: str) -> None:
        self.merged[root].append(key)
        self.merged_into[key] = root


def nest(order: Iterable[Domain]) -> Nesting:
    """Every domain offered in order (lowest rank first, then by key)."""
    nesting = Nesting()
    for domain in order:
        nesting.offer(domain)
    nesting.owner = {c: key for key, cids in nesting.direct.items() for c in cids}
    return nesting


def renest(order: list[Domain], old: Nesting) -> Nesting:
    """The same result as `nest(order)`, given `old`, the nesting of the previous order with the
    same ranking of kinds: untainted domains copy their old outcome, tainted ones are offered
    again (see the module docstring for why that is exact). Children and direct classes start as
    copies of the old ones (a tainted domain's are dropped when it is tainted): the loop over the
    thousands of untainted domains only records them in order."""
    new = Nesting(parent=dict(old.parent), children=dict(old.children), direct=dict(old.direct))
    replay = _Replay(old, new)
    keys = {d.key for d in order}
    for key in old.offered.keys() - keys:  # vanished: whatever shared a class with it may change
        replay.taint(key, old.offered[key].nodes)
    tainted_classes, before_of, offered, accepted = replay.classes, old.offered.get, new.offered, new.accepted
    old_accepted = old.accepted
    for domain in order:
        key, classes = domain.key, domain.nodes
        before = before_of(key)
        if before is None or before.nodes != classes or not classes.isdisjoint(tainted_classes):
            replay.offer(domain, before)
        elif key in old_accepted:  # untainted: its old outcome
            offered[key] = accepted[key] = domain
        else:
            offered[key] = domain
            if key in old.merged_into:
                new.merge(key, old.merged_into[key])
            else:
                new.drop(key, old.reason[key])
    return replay.finish()


@dataclass
class _Replay:
    old: Nesting
    new: Nesting
    classes: set[str] = field(default_factory=set)  # every class of a tainted domain, old or new
    tainted: dict[str, None] = field(default_factory=dict)  # in order
    resolved: set[str] = field(default_factory=set)  # classes whose top is known to `new`
    highest: dict[str, str] = field(default_factory=dict)  # kept domain -> its highest kept ancestor

    def kept(self, key: str) -> bool:
        """Accepted as before, untainted (only asked of domains already walked, or not yet: those
        are not accepted yet)."""
        return key in self.new.accepted and key not in self.tainted

    def taint(self, key: str, classes: frozenset[str]) -> None:
        """`key` may change outcome: later domains sharing its classes are tainted too, and its old
        children lose it as their parent (offering it again, or a later domain, sets it anew)."""
        self.classes |= classes
        self.tainted[key] = None
        self.new.children.pop(key, None)
        self.new.direct.pop(key, None)
        parent = self.new.parent
        for child in self.old.children.get(key, ()):
            if parent.get(child) == key:
                del parent[child]

    def offer(self, domain: Domain, before: Domain | None) -> None:
        self.taint(domain.key, domain.nodes if before is None else domain.nodes | before.nodes)
        self._resolve(set(domain.nodes) - self.resolved)
        self.new.offer(domain)

    def _resolve(self, classes: set[str]) -> None:
        """Seeds `top` of classes no tainted domain held yet: the largest kept domain holding each.
        Every kept domain holding the class comes before the first tainted one (which would taint
        it), and kept domains are accepted as before, so it is the highest kept one on the class's
        old chain of ancestors, and the top of all its classes alike: they are seeded together
        (a few such domains cover the thousands of classes of a core)."""
        owner, kept, top, accepted = self.old.owner, self.kept, self.new.top, self.new.accepted
        while classes:
            c = classes.pop()
            self.resolved.add(c)
            lowest = owner.get(c)
            if lowest is not None and kept(lowest):
                highest = self._highest(lowest)
                cover = accepted[highest].nodes
                top.update(dict.fromkeys(cover, highest))
                self.resolved |= cover
                classes -= cover

    def _highest(self, key: str) -> str:
        found = self.highest.get(key)
        if found is None:
            parent = self.old.parent.get(key)
            above = parent is not None and self.kept(parent)
            found = self.highest[key] = self._highest(parent) if above and parent else key
        return found

    def finish(self) -> Nesting:
        """The new nesting, with `owner` patched: tainted domains' direct classes moved."""
        new, old = self.new, self.old
        owner = dict(old.owner)
        for key in self.tainted:
            for c in old.direct.get(key, ()):
                if owner.get(c) == key:
                    del owner[c]
        for key in self.tainted:
            owner.update(dict.fromkeys(new.direct.get(key, ()), key))
        new.owner = owner
        touched = set(self.tainted)
        for key in self.tainted:
            touched.update(old.children.get(key, ()), new.children.get(key, ()))
            touched.update(root for root in (old.merged_into.get(key), new.merged_into.get(key)) if root)
        new.touched = touched
        return new
