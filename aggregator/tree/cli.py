"""`hypertopo-aggregator tree`: the HyperNode tree in the terminal, live or from a saved render.

Live, it lists the cluster's HyperNodes through the shared client (`agent.common.adapters.kube.connect`:
--kubeconfig, else the pod's service account, else what kubectl reads), imported only then, so
`tree --from FILE` works without a cluster. Colour goes to a terminal, plain text down a pipe
(`NO_COLOR` is honoured; `--color` overrides both). Live, it also lists the Nodes and NodeTopology
reports and says which Nodes are in no HyperNode and why (aggregator.tree.explain); from a file it
can only point at `render`'s stderr and the aggregator's log.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from agent.common.command_line import EXIT_INPUT, add_common_arguments, number_argument, one_line
from aggregator.object_files import of_kind, read_objects
from aggregator.tree.explain import HeardReports, explain
from aggregator.tree.model import Tree, View, render_text

_positive_int = number_argument(int, "whole number", 1, "must be 1 or more")


def add_tree_command(sub: Any) -> None:
    tree = sub.add_parser(
        "tree",
        help="print the HyperNode tree (live, or from a render's output) with each domain's state",
        description="Prints the HyperNodes nested: tier, name, node count, Ready / FabricDegraded with "
        "the reason, and the unhealthy nodes under their domain. Reads the cluster's HyperNodes, or "
        "--from a file (`render` output, `kubectl get hypernodes -o yaml`; - for stdin).",
    )
    tree.add_argument("--from", dest="source", metavar="FILE", help="read HyperNodes from this file instead")
    tree.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else as kubectl)")
    tree.add_argument("--depth", type=_positive_int, metavar="N", help="show N levels of HyperNodes (default all)")
    tree.add_argument("--only-unhealthy", action="store_true",
                      help="show only the domains that are not healthy or hold unhealthy nodes (and their parents)")
    tree.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                      help="colour: auto (on a terminal, unless NO_COLOR is set), always or never")
    add_common_arguments(tree, top=False)
    tree.set_defaults(func=cmd_tree)


def cmd_tree(args: argparse.Namespace) -> int:
    objects = read_file(args.source) if args.source else _live(args.kubeconfig)
    if objects is None:
        return EXIT_INPUT
    view = View(depth=args.depth, only_unhealthy=args.only_unhealthy, colour=_colour(args.color))
    tree = Tree(objects)
    sys.stdout.write(render_text(tree, view))
    if args.source:
        if not tree.domains:
            print(f"(no HyperNode in {args.source}: `render` prints why on its stderr; the aggregator logs it "
                  "and exports hypertopo_aggregator_tree_empty_reason)")  # fmt: skip
    else:
        for line in _live_explanation(args.kubeconfig, tree):
            print(line)
    return 0


def explain_tree(tree: Tree, nodes: Iterable[str], topologies: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why the cluster's Nodes are in no HyperNode of `tree` (aggregator.tree.explain); which fabric
    sources the aggregator has is not known here, so the lines say so."""
    placed = {node for domain in tree.domains.values() for node in domain.nodes}
    names = set(nodes)
    reports = HeardReports().over({n: obj for n, obj in topologies.items() if n in names})
    found = explain(nodes=names, placed=placed, hypernodes=len(tree.domains), reports=reports, fabric_sources=None)
    return found.lines()


def _live_explanation(kubeconfig: str | None, tree: Tree) -> list[str]:
    """`explain_tree` over the cluster's Nodes and NodeTopology reports (nothing when they cannot be listed)."""
    from agent.common.adapters.kube import NODES, NODETOPOLOGIES, connect
    from agent.common.api_error import ApiError

    try:
        client = connect(kubeconfig)
        nodes, _ = client.list(NODES)
        topologies, _ = client.list(NODETOPOLOGIES)
    except ApiError as exc:
        return [f"(cannot list Nodes and NodeTopology reports to say which nodes are left out: {one_line(str(exc))})"]
    names = [str(n["metadata"]["name"]) for n in nodes if (n.get("metadata") or {}).get("name")]
    return explain_tree(tree, names, {str(t["metadata"]["name"]): t for t in topologies
                                      if (t.get("metadata") or {}).get("name")})  # fmt: skip


def _colour(choice: str) -> bool:
    if choice != "auto":
        return choice == "always"
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def read_file(source: str) -> list[Mapping[str, Any]]:
    """HyperNode objects from a file (a List, YAML documents, one object, or JSON); `-`: stdin."""
    return list(of_kind(read_objects(source, "HyperNode"), "HyperNode", source))


def _live(kubeconfig: str | None) -> list[Mapping[str, Any]] | None:
    from agent.common.adapters.kube import HYPERNODES, connect  # only a live tree needs the client
    from agent.common.api_error import ApiError

    try:
        items, _ = connect(kubeconfig).list(HYPERNODES)
    except ApiError as exc:
        print(f"hypertopo-aggregator tree: cannot list HyperNodes: {one_line(str(exc))}", file=sys.stderr)
        return None
    return list(items)
