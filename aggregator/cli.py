"""`hypertopo-aggregator`: `render` HyperNodes from files, or `run` the controller.

`render` needs no cluster: it reads NodeTopology objects saved from a cluster (or produced by
`hypertopo-agent probe`), optional fabric dumps, switch LLDP tables and a cluster model, and prints
the HyperNode tree as a `List` that `kubectl apply -f -` accepts, so the tree can be reviewed (or
applied by hand) before the controller is trusted with it. `run` is the controller
(aggregator.controller), imported only when asked for, so `render` works without it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from agent import yaml_codec
from agent.cluster_model import ModelError, load_model
from agent.report import KIND, NodeReport
from aggregator.feed import StaticSources
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.render import as_list
from aggregator.sources import ibnetdiscover, labels, nodetopology, switch_lldp


class InputError(ValueError):
    pass


def _documents(path: Path) -> Iterator[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
        docs = [json.loads(text)] if path.suffix == ".json" else yaml_codec.load_all(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from exc
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind", "").endswith("List"):
            yield from (item for item in doc.get("items") or [] if isinstance(item, dict))
        elif isinstance(doc, dict):
            yield doc


def load_reports(paths: Sequence[str]) -> dict[str, NodeReport]:
    """NodeTopology objects from files (one object, several YAML documents, or a List) and from
    directories of such files (*.yaml, *.yml, *.json)."""
    reports: dict[str, NodeReport] = {}
    for raw in paths:
        path = Path(raw)
        files = (
            sorted(p for ext in ("*.yaml", "*.yml", "*.json") for p in path.glob(ext))
            if path.is_dir()
            else [path]
        )
        for file in files:
            for obj in _documents(file):
                if obj.get("kind") != KIND:
                    continue
                try:
                    report = nodetopology.report_from_object(obj)
                except (TypeError, ValueError, KeyError) as exc:
                    raise InputError(
                        f"{file}: NodeTopology {obj.get('metadata', {}).get('name')!r}: {exc}"
                    ) from exc
                reports[report.node_name] = report
    return reports


def load_nodes(paths: Sequence[str]) -> dict[str, bool]:
    """Node objects (`kubectl get nodes -o yaml`: a List, documents or one object) -> node name ->
    Ready (a node without conditions counts as Ready)."""
    nodes: dict[str, bool] = {}
    for raw in paths:
        for obj in _documents(Path(raw)):
            if obj.get("kind") != "Node" or not (obj.get("metadata") or {}).get("name"):
                continue
            conditions = (obj.get("status") or {}).get("conditions") or []
            ready = [c.get("status") == "True" for c in conditions if c.get("type") == "Ready"]
            nodes[str(obj["metadata"]["name"])] = ready[0] if ready else True
    return nodes


def add_fabric_arguments(parser: argparse.ArgumentParser) -> None:
    """The fabric options `render` and `run` share (same names, meanings and help): dumps, how
    their hosts meet node names, and which NICs are fabric NICs. Read by `static_sources`."""
    parser.add_argument(
        "--ibnetdiscover",
        nargs="+",
        metavar="FILE",
        help="`ibnetdiscover` dumps (topology or `-s -p` port format): switch links, HCAs; one per "
        "subnet where each rail or plane is a fabric of its own",
    )
    parser.add_argument(
        "--strip-domain",
        nargs="?",
        const=".",
        metavar="SUFFIX",
        help="match dump hosts and node names without their DNS domain: SUFFIX, or (without one) "
        "everything from the first dot",
    )
    parser.add_argument(
        "--dump-host-regex",
        metavar="REGEX",
        help="read the host name out of an HCA's node description with this regular expression (its "
        "group `node`, else its first group; default: the first word before mlx5_0, HCA-1, ...)",
    )
    parser.add_argument(
        "--fabric-interfaces",
        metavar="REGEX",
        help="interfaces whose LLDP neighbours are fabric cabling (default: those carrying an RDMA "
        "device; every interface of a report without one)",
    )


def static_sources(args: argparse.Namespace) -> StaticSources:
    """The inputs read once from files and options (`add_fabric_arguments`, plus --switch-lldp,
    --model and --label-levels), for `render` and `run`. Raises the sources' own errors (with file
    and line) for unusable files and InputError for a bad regular expression."""
    dumps = [ibnetdiscover.parse_file(path) for path in args.ibnetdiscover or []]
    return StaticSources(
        fabric=ibnetdiscover.merge(dumps) if dumps else None,
        switch_tables=tuple(switch_lldp.load_files(args.switch_lldp or [])),
        model=load_model(args.model) if args.model else None,
        label_levels=labels.parse_levels(args.label_levels) if args.label_levels else (),
        fabric_interfaces=_pattern(args.fabric_interfaces, "--fabric-interfaces"),
        host_names=ibnetdiscover.HostNames(
            pattern=_pattern(args.dump_host_regex, "--dump-host-regex"), domain=args.strip_domain
        ),
    )


def _inputs(args: argparse.Namespace) -> ClusterInputs:
    reports = load_reports(args.reports or [])
    nodes = load_nodes(args.nodes or [])
    static = static_sources(args)
    node_labels: dict[str, dict[str, str]] = {}
    for file in args.node_labels or []:
        node_labels.update(
            {
                str(k): {str(a): str(b) for a, b in v.items()}
                for k, v in (yaml_codec.load(Path(file).read_text(encoding="utf-8")) or {}).items()
            }
        )
    return static.inputs(
        reports, node_ready=nodes, node_labels=node_labels, include_fabric_hosts=not reports and not nodes
    )


def _pattern(text: str | None, option: str) -> str | None:
    if text is not None:
        try:
            re.compile(text)
        except re.error as exc:
            raise InputError(f"{option} {text!r}: not a regular expression: {exc}") from exc
    return text


def cmd_render(args: argparse.Namespace) -> int:
    try:
        inputs = _inputs(args)
    except (
        InputError,
        ibnetdiscover.IbnetdiscoverError,
        switch_lldp.SwitchLldpError,
        labels.LabelLevelsError,
        ModelError,
        OSError,
    ) as exc:
        print(f"hypertopo-aggregator render: {exc}", file=sys.stderr)
        return 2
    desired = Pipeline(ready_threshold=args.ready_threshold).compute(inputs, now=time.time())
    document = as_list(desired.hypernodes)
    if args.format == "json":
        json.dump(document, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        yaml_codec.dump(document, sys.stdout, sort_keys=False)
    if desired.tree is not None:
        for key, reason in desired.tree.dropped:
            print(f"hypertopo-aggregator render: dropped domain {key}: {reason}", file=sys.stderr)
        for node, missing in sorted(desired.tree.uncabled.items()):
            print(
                f"hypertopo-aggregator render: {node} is not cabled to {', '.join(missing)} "
                "(the rest of its leaf domain is)",
                file=sys.stderr,
            )
    for warning in desired.warnings:
        print(f"hypertopo-aggregator render: warning: {warning}", file=sys.stderr)
    if not desired.hypernodes and (inputs.reports or inputs.node_ready or inputs.fabric):
        print("hypertopo-aggregator render: no HyperNodes: no node was placed on a switch", file=sys.stderr)
    return 0


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
    add_fabric_arguments(render)
    render.add_argument(
        "--switch-lldp",
        nargs="+",
        metavar="FILE",
        help="`lldpcli -f json0 show neighbors` output of switches, one file per switch "
        "(named after the switch unless it holds a local-chassis section)",
    )
    render.add_argument("--model", metavar="FILE", help="a cluster model file (switch tree + node blocks)")
    render.add_argument(
        "--label-levels",
        metavar="KEYS",
        help="comma-separated node label keys, broadest first (with --node-labels)",
    )
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
    render.add_argument("--format", choices=("yaml", "json"), default="yaml", help="output format")
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
    run.set_defaults(func=controller.run)


def parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="hypertopo-aggregator",
        description="Joins per-node NodeTopology reports (and fabric dumps) into Volcano HyperNodes.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_render(sub)
    _add_run(sub, wanted="run" in argv[:1])
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(argv).parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
