"""After a node moves, a domain whose classes changed gets its node set by patching the previous
one (tiers._Expansion): less the moved nodes and the members of classes it lost, plus those of
classes it gained and the moved nodes now in its classes. Checked against gathering the members
of its classes from scratch."""

from __future__ import annotations

from aggregator.tiers.infer import Domain, DomainTree, NodeClasses, TreeDomain, _Expansion


def _classes(members: dict[str, set[str]]) -> NodeClasses:
    classes = NodeClasses()
    for cid, nodes in members.items():
        classes.members[cid] = set(nodes)
        classes.of_node.update(dict.fromkeys(nodes, cid))
    return classes


def _previous(key: str, cids: frozenset[str], nodes: frozenset[str]) -> DomainTree:
    domain = TreeDomain(Domain(key, "leaf", (key,), nodes), 1, None, (), tuple(sorted(nodes)))
    return DomainTree({key: domain}, ("leaf",), {}, class_sets={key: (cids, cids)})


def test_a_domain_losing_a_class_and_gaining_one_while_a_node_moved_has_the_node_set_of_its_classes() -> None:
    # before: classes a {n1, n2}, b {n3}, n4 in class a too; now n4 moved to class c, the domain
    # lost b (still a class, elsewhere) and gained c
    previous = _previous("leaf:x", frozenset({"a", "b"}), frozenset({"n1", "n2", "n3", "n4"}))
    now = _classes({"a": {"n1", "n2"}, "b": {"n3"}, "c": {"n4", "n5"}})
    cids = frozenset({"a", "c"})
    expand = _Expansion(now, previous, dirty={"a", "c"}, moved={"n4"})
    nodes, direct = expand.nodes("leaf:x", cids, cids)
    assert nodes == {"n1", "n2", "n4", "n5"}
    assert direct == ("n1", "n2", "n4", "n5")


def test_a_moved_node_leaving_the_domains_classes_leaves_its_node_set() -> None:
    previous = _previous("leaf:x", frozenset({"a"}), frozenset({"n1", "n2"}))
    now = _classes({"a": {"n1"}, "z": {"n2"}})
    expand = _Expansion(now, previous, dirty={"a", "z"}, moved={"n2"})
    assert expand.nodes("leaf:x", frozenset({"a"}), frozenset())[0] == {"n1"}


def test_a_node_moving_between_two_classes_of_the_domain_leaves_the_very_node_set() -> None:
    """Same nodes, same object: comparing the rebuilt domain with the previous one stays cheap."""
    before = frozenset({"n1", "n2", "n3"})
    previous = _previous("core:x", frozenset({"a", "b"}), before)
    now = _classes({"a": {"n1"}, "b": {"n2", "n3"}})
    expand = _Expansion(now, previous, dirty={"a", "b"}, moved={"n2"})
    assert expand.nodes("core:x", frozenset({"a", "b"}), frozenset())[0] is before
