"""`hypertopo-aggregator tree`: the HyperNode tree in the terminal, live or from a saved render.

Live, it lists the cluster's HyperNodes through the shared client (`agent.adapters.kube.connect`:
--kubeconfig, else the pod's service account, else what kubectl reads), imported only then, so
`tree --from FILE` works without a cluster. Colour goes to a terminal, plain text down a pipe
(`NO_COLOR` is honoured; `--color` overrides both).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agent import yaml_codec
from agent.command_line import EXIT_INPUT, InputError, add_common_arguments, number_argument, one_line
from aggregator.tree import Tree, View, render_text

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
    sys.stdout.write(render_text(Tree(objects), view))
    return 0


def _colour(choice: str) -> bool:
    if choice != "auto":
        return choice == "always"
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def read_file(source: str) -> list[Mapping[str, Any]]:
    """HyperNode objects from a file (a List, YAML documents, one object, or JSON); `-`: stdin."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
        docs = [json.loads(text)] if source.endswith(".json") else list(yaml_codec.load_all(text))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise InputError(source, f"cannot read: {one_line(str(exc), width=200)}") from exc
    objects: list[Mapping[str, Any]] = []
    for doc in docs:
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
            items = doc.get("items")
            objects.extend(item for item in (items if isinstance(items, list) else []) if isinstance(item, dict))
        elif isinstance(doc, dict):
            objects.append(doc)
    return [obj for obj in objects if obj.get("kind") == "HyperNode"]


def _live(kubeconfig: str | None) -> list[Mapping[str, Any]] | None:
    from agent.adapters.kube import HYPERNODES, connect  # only a live tree needs the client
    from agent.api_error import ApiError

    try:
        items, _ = connect(kubeconfig).list(HYPERNODES)
    except ApiError as exc:
        print(f"hypertopo-aggregator tree: cannot list HyperNodes: {one_line(str(exc))}", file=sys.stderr)
        return None
    return list(items)
