"""Files the aggregator's commands read: NodeTopology reports, Node objects and `--node-labels`
maps, and the exit code of an input error. Apart from aggregator.cli so the controller (`run`) and
`measured` use the same readers without importing the command line (no import cycle)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from agent.common import yaml_codec
from agent.common.command_line import (
    EXIT_INPUT,
    EXIT_USAGE,
    InputError,
    UsageError,
    one_line,
    summarise,
)
from agent.common.report import KIND, NodeReport
from aggregator.object_files import of_kind, read_objects
from aggregator.sources import OptionError, SourceError, nodetopology

log = logging.getLogger("hypertopo-aggregator")


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


INPUT_ERRORS = (InputError, SourceError, OSError)  # a file that cannot be used


def exit_code_of(exc: BaseException) -> int:
    """2 for usage (an option's value), 1 for input (a file); the controller's `run` uses it too."""
    return EXIT_USAGE if isinstance(exc, (UsageError, OptionError)) else EXIT_INPUT
