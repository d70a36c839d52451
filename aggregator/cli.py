"""`hypertopo-aggregator`: `render` HyperNodes from files, or `run` the controller.

`render` needs no cluster: it reads NodeTopology objects saved from a cluster (or produced by
`hypertopo-agent probe`), optional fabric dumps, switch LLDP tables and a cluster model, and prints
the HyperNode tree as a `List` that `kubectl apply -f -` accepts, so the tree can be reviewed (or
applied by hand) before the controller is trusted with it. `run` is the controller
(aggregator.controller), imported only when asked for, so `render` works without it.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agent import yaml_codec
from agent.command_line import (
    EXIT_INPUT,
    EXIT_USAGE,
    CommandParser,
    InputError,
    UsageError,
    add_common_arguments,
    one_line,
    setup_logging,
    summarise,
)
from agent.report import KIND, NodeReport
from aggregator.measured_cli import add_measured_command
from aggregator.object_files import of_kind, read_objects
from aggregator.pipeline import ClusterInputs, Desired, Pipeline
from aggregator.registry import add_source_arguments, load_sources
from aggregator.render import as_list
from aggregator.sources import OptionError, SourceError, nodetopology
from aggregator.sources.nodetopology import NodeReports
from aggregator.tree_cli import add_tree_command
from aggregator.tree_dot import render_dot
from aggregator.tree_explain import Explanation, explain

log = logging.getLogger("hypertopo-aggregator")
PROG = "hypertopo-aggregator"


def load_reports(paths: Sequence[str], *, strict: bool = True) -> dict[str, NodeReport]:
    """NodeTopology objects from files (one object, several YAML documents, or a List) and from
    directories of such files (*.yaml, *.yml, *.json).

    An unreadable file, document or report raises InputError (file, object, field path) when
    `strict`; else it is skipped with a warning, as the live aggregator skips an unreadable
    NodeTopology, so one bad report never hides the rest of the cluster. A file named on the
    command line that holds other objects but no NodeTopology is the wrong file: an error either
    way (a directory's other files are passed over). A node reported twice keeps its last report."""
    reports: dict[str, NodeReport] = {}
    seen_in: dict[str, Path] = {}
    skipped: list[str] = []

    def skip(error: InputError, what: str) -> None:
        if strict:
            raise error
        skipped.append(what)
        log.warning("%s (skipped; --strict refuses it)", error)

    for file, named in _report_files(paths):
        try:
            objects = read_objects(file, KIND, functools.partial(skip, what=f"{file} (a document)"))
        except InputError as exc:
            skip(exc, f"{file}")
            continue
        topologies = of_kind(objects, KIND, file) if named else [o for o in objects if o.get("kind") == KIND]
        for obj in topologies:
            try:
                report = nodetopology.report_from_object(obj)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                error = InputError(file, one_line(str(exc), width=300), f"NodeTopology {_name_of(obj)!r}")
                if strict:
                    raise error from exc
                skip(error, f"{file}:{_name_of(obj)}")
                continue
            # filed under the object's name, as the API keys it: a spec naming another node is the
            # pipeline's to refuse (aggregator.crosscheck), not to stand in for that node's report
            name = str((obj.get("metadata") or {}).get("name") or report.node_name)
            if name in seen_in:
                log.warning("%s: NodeTopology %r also in %s: the later one is used", file, name, seen_in[name])
            seen_in[name] = file
            reports[name] = report
    if skipped:
        log.warning("skipped %s unreadable report(s): %s", len(skipped), summarise(skipped))
    return reports


def _report_files(paths: Sequence[str]) -> Iterator[tuple[Path, bool]]:
    """Each file to read, and whether it was named itself (not found in a named directory)."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from ((p, False) for p in sorted(p for ext in ("*.yaml", "*.yml", "*.json") for p in path.glob(ext)))
        else:
            yield path, True


def _name_of(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata")
    return one_line(str(metadata.get("name")), width=80) if isinstance(metadata, dict) else "None"


def load_nodes(paths: Sequence[str]) -> dict[str, bool]:
    """Node objects (`kubectl get nodes -o yaml`: a List, documents or one object) -> node name ->
    Ready (a node without conditions counts as Ready)."""
    nodes: dict[str, bool] = {}
    for raw in paths:
        for obj in of_kind(read_objects(raw, "Node"), "Node", raw):
            metadata = obj.get("metadata")
            if not isinstance(metadata, dict) or not metadata.get("name"):
                continue
            status = obj.get("status") or {}
            conditions = status.get("conditions") if isinstance(status, dict) else None
            if not isinstance(conditions or [], list):
                raise InputError(raw, "expected a list", f"Node {metadata['name']!r}: status.conditions")
            ready = [
                c.get("status") == "True" for c in conditions or [] if isinstance(c, dict) and c.get("type") == "Ready"
            ]
            nodes[str(metadata["name"])] = ready[0] if ready else True
    return nodes


def load_node_labels(paths: Sequence[str]) -> dict[str, dict[str, str]]:
    """`--node-labels` files: YAML maps of node name -> {label key: value}."""
    node_labels: dict[str, dict[str, str]] = {}
    for file in paths:
        try:
            data = yaml_codec.load(Path(file).read_text(encoding="utf-8")) or {}
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise InputError(file, f"cannot read: {one_line(str(exc), width=200)}") from exc
        if not isinstance(data, dict):
            raise InputError(file, f"expected a map of node name -> labels, got {type(data).__name__}")
        for node, labels_of in data.items():
            if not isinstance(labels_of, dict):
                raise InputError(file, f"expected a map of labels, got {type(labels_of).__name__}", str(node))
            node_labels[str(node)] = {str(k): str(v) for k, v in labels_of.items()}
    return node_labels


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


INPUT_ERRORS = (InputError, SourceError, OSError)  # a file that cannot be used


def exit_code_of(exc: BaseException) -> int:
    """2 for usage (an option's value), 1 for input (a file); the controller's `run` uses it too."""
    return EXIT_USAGE if isinstance(exc, (UsageError, OptionError)) else EXIT_INPUT


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
    """Why `render` leaves nodes out or prints no HyperNode (aggregator.tree_explain)."""
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
        from aggregator import controller
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
