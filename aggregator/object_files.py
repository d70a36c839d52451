"""Kubernetes objects saved in files, as the offline commands read them (`render --reports`,
`render --nodes`, `tree --from`): one object, several YAML documents, a `kind: *List` (what
`kubectl get ... -o yaml` prints), or JSON; `-` is stdin.

One reader for all of them, so each says the same thing about a wrong file: a document that is
not an object (a stray scalar, a password file) is reported, never dropped in silence, and a file
named on the command line that holds objects but none of the kind asked for is refused by name
(`of_kind`), rather than read as an empty cluster.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from agent.common import yaml_codec
from agent.common.command_line import InputError, one_line

Obj = dict[str, Any]


def _raise(error: InputError) -> None:
    raise error


def read_objects(
    source: str | Path, wanted: str, on_bad_document: Callable[[InputError], None] = _raise
) -> list[Obj]:
    """The objects in `source`, Lists unwrapped. An unreadable file raises InputError; a document
    that is not a mapping with a `kind` goes to `on_bad_document` (raising by default; the error
    names `wanted`, the kind the caller reads), and the file's other documents are still read.
    Empty documents (a trailing `---`) are nothing."""
    name = str(source)
    try:
        text = sys.stdin.read() if name == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise InputError(name, f"cannot read: {one_line(str(exc), width=200)}") from exc
    return objects_in_text(text, name, wanted, on_bad_document)


def objects_in_text(
    text: str, name: str, wanted: str, on_bad_document: Callable[[InputError], None] = _raise
) -> list[Obj]:
    """The objects in `text`, read as `read_objects` reads the file `name` once it holds `text`
    (JSON where `name` ends in .json, else YAML), errors naming `name`. Kept apart from the file
    so text already in memory (the parser fuzz tests' 10,000 inputs) takes the same path."""
    try:
        docs = [json.loads(text)] if name.endswith(".json") else yaml_codec.load_all(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InputError(name, f"cannot read: {one_line(str(exc), width=200)}") from exc
    except RecursionError:  # JSON nested past the interpreter's limit
        raise InputError(name, "cannot read: nested too deep") from None
    objects: list[Obj] = []
    for number, doc in enumerate(docs, 1):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc:
            on_bad_document(InputError(name, f"document {number} is not a {wanted} (no kind: not a Kubernetes object)"))
            continue
        if str(doc["kind"]).endswith("List"):
            items = doc.get("items")
            objects.extend(item for item in (items if isinstance(items, list) else []) if isinstance(item, dict))
        else:
            objects.append(doc)
    return objects


def of_kind(objects: Iterable[Obj], kind: str, source: str | Path) -> list[Obj]:
    """The objects of `kind`. A file with objects but none of that kind is the wrong file, not an
    empty one: InputError naming what it does hold. (An empty List is a real, empty answer.)"""
    objects = list(objects)
    wanted = [obj for obj in objects if obj.get("kind") == kind]
    if objects and not wanted:
        others = sorted({str(obj.get("kind")) for obj in objects})
        raise InputError(source, f"holds no {kind}, only {', '.join(others)}")
    return wanted
