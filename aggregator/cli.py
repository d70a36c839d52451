"""`hypertopo-aggregator`: `render` HyperNodes from files, or `run` the controller.

`render` needs no cluster: it reads NodeTopology objects saved from a cluster (or produced by
`hypertopo-agent probe`), optional fabric dumps, switch LLDP tables and a cluster model, and prints
the HyperNode tree as a `List` that `kubectl apply -f -` accepts, so the tree can be reviewed (or
applied by hand) before the controller is trusted with it. `run` is the controller
(aggregator.live.controller), imported only when asked for, so `render` works without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent.common import yaml_codec
from agent.common.command_line import (
    CommandParser,
    UsageError,
    add_common_arguments,
    one_line,
    setup_logging,
    summarise,
)
from aggregator.inputs import INPUT_ERRORS, exit_code_of, load_node_labels, load_nodes, load_reports
from aggregator.measured_cli import add_measured_command
from aggregator.pipeline import ClusterInputs, Desired, Pipeline
from aggregator.registry import add_source_arguments, load_sources
from aggregator.render import as_list
from aggregator.sources import OptionError
from aggregator.sources.nodetopology import NodeReports
from aggregator.tree.cli import add_tree_command
from aggregator.tree.dot import render_dot
from aggregator.tree.explain import Explanation, explain

log = logging.getLogger("hypertopo-aggregator")
PROG = "hypertopo-aggregator"


def _inputs(args: argparse.Namespace) -> ClusterInputs:
    reports = load_reports(args.reports or [], strict=args.strict)
    nodes = load_nodes(args.nodes or [])
    sources = load_sources(args, live=False)
    node_labels = load_node_labels(args.node_labels or [])
    return ClusterInputs(
        reports,
        node_ready=nodes,
        node_labels=node_labels,
        include_fabric_hosts=not reports and not nodes,
        sources=sources,
    )


def cmd_render(args: argparse.Namespace) -> int:
    inputs = _inputs(args)
    pipeline = Pipeline(ready_threshold=args.ready_threshold, degraded_threshold=args.degraded_threshold)
    desired = pipeline.compute(inputs, now=time.time())
    document = as_list(desired.hypernodes)
    if args.format == "json":
        json.dump(document, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif args.format == "dot":
        sys.stdout.write(render_dot(document["items"]))
    else:
        yaml_codec.dump(document, sys.stdout, sort_keys=False)
    if desired.tree is not None:
        _warn_tree(desired.tree.dropped, desired.tree.uncabled)
    for warning in desired.warnings:
        print(f"hypertopo-aggregator render: warning: {one_line(warning)}", file=sys.stderr)
    for line in explain_render(inputs, desired).lines():
        print(f"{PROG} render: {one_line(line, width=600)}", file=sys.stderr)
    return 0


def explain_render(inputs: ClusterInputs, desired: Desired) -> Explanation:
    """Why `render` leaves nodes out or prints no HyperNode (aggregator.tree.explain)."""
    placed = set(desired.tree.lowest) if desired.tree is not None else set()
    nodes = set(inputs.reports) | set(inputs.node_ready) | placed
    sources = [s.name for s in inputs.all_sources() if not isinstance(s, NodeReports)]
    pattern = next((s.fabric_interfaces for s in inputs.all_sources() if isinstance(s, NodeReports)), None)
    return explain(nodes=nodes, placed=placed, hypernodes=len(desired.hypernodes), reports=inputs.reports,
                   fabric_sources=sources, refused={f.node for f in getattr(desired, "findings", ())},
                   fabric_pattern=pattern)  # fmt: skip


def _warn_tree(dropped: Sequence[tuple[str, str]], uncabled: Mapping[str, Sequence[str]]) -> None:
    """The tree's warnings, each one line however large the fabric: a count and the first names."""
    if dropped:
        names = [f"{key} ({reason})" for key, reason in dropped]
        print(f"{PROG} render: dropped domains that partly overlap a kept one, {summarise(names)}", file=sys.stderr)
    if uncabled:
        names = [f"{node} (not to {', '.join(missing)})" for node, missing in sorted(uncabled.items())]
        print(
            f"{PROG} render: nodes not cabled to every leaf of their leaf domain (the rest of it is), "
            f"{summarise(names)}",
            file=sys.stderr,
        )


def _add_render(sub: Any) -> None:
    render = sub.add_parser(
        "render",
        help="print the HyperNode tree for saved inputs (no cluster needed)",
        description="Reads saved inputs and prints the HyperNodes as a kubectl-appliable List.",
    )
    render.add_argument(
        "--reports",
        nargs="+",
        metavar="PATH",
        help="NodeTopology objects: files (one object, YAML documents or a List) or directories",
    )
    render.add_argument(
        "--nodes",
        nargs="+",
        metavar="PATH",
        help="Node objects (`kubectl get nodes -o yaml`): the cluster's nodes, for a cluster without "
        "agents (dump hosts are then matched to these names)",
    )
    add_source_arguments(render, live=False)  # aggregator.registry: every source's options
    render.add_argument(
        "--node-labels",
        nargs="+",
        metavar="FILE",
        help="YAML files mapping node name -> {label: value} for --label-levels",
    )
    render.add_argument(
        "--ready-threshold",
        type=float,
        default=0.0,
        help="unhealthy members a HyperNode tolerates: fraction < 1 or a count (default 0)",
    )
    render.add_argument(
        "--degraded-threshold",
        type=float,
        default=0.0,
        help="degraded members (grey failures) a HyperNode tolerates before FabricDegraded=True: "
        "fraction < 1 or a count (default 0: any degraded member)",
    )
    render.add_argument(
        "--format",
        choices=("yaml", "json", "dot"),
        default="yaml",
        help="output format: yaml, json (both kubectl-appliable) or dot (a Graphviz picture: dot -Tsvg)",
    )
    render.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 1) an unreadable report instead of skipping it with a warning",
    )
    add_common_arguments(render, top=False)
    render.set_defaults(func=cmd_render)


def _add_run(sub: Any, wanted: bool) -> None:
    run = sub.add_parser(
        "run",
        help="run the controller (leader-elected; keeps HyperNodes in the cluster true)",
        description="Runs the aggregator controller against the cluster.",
    )
    if not wanted:  # the controller (and the Kubernetes client) load only for `run`
        run.set_defaults(func=lambda _args: 1)
        return
    try:
        from aggregator.live import controller
    except ImportError as exc:
        message = f"the controller is not available: {exc}"
        run.set_defaults(func=lambda _args: (print(message, file=sys.stderr), 1)[1])
        return
    controller.add_run_arguments(run)
    add_common_arguments(run, top=False)
    run.set_defaults(func=controller.run)


def parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    top = CommandParser(
        prog="hypertopo-aggregator",
        description="Joins per-node NodeTopology reports (and fabric dumps) into Volcano HyperNodes.",
    )
    add_common_arguments(top)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_render(sub)
    _add_run(sub, wanted=_command_of(argv) == "run")
    add_tree_command(sub)
    add_measured_command(sub)
    return top


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand word, past top-level options (`--log-format json run`)."""
    words = iter(argv)
    for word in words:
        if word == "--log-format":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0, 1 for input that cannot be used, 2 for bad usage; an error is one line on stderr."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(argv).parse_args(argv)
    setup_logging("INFO", args.log_format)
    try:
        result: int = args.func(args)
    except (UsageError, OptionError, *INPUT_ERRORS) as exc:
        print(f"{PROG} {args.command}: {one_line(str(exc), width=600)}", file=sys.stderr)
        return exit_code_of(exc)
    return result


if __name__ == "__main__":
    sys.exit(main())
