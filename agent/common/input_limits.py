"""Bounds on input read from outside (files, lldpd, UFM, switch tables, reports): how deep, how
large, how many, which characters.

Why one module: every parser of outside input must fail the same way on hostile or broken input,
with one line naming the file and the field, never a traceback, and within a bounded time and
memory. Python's own readers are not bounded that way: `json.loads` recurses until the
interpreter's recursion limit (a RecursionError, not a ValueError), `str()` of a deeply nested
value recurses again, YAML aliases share one object many times so a walk over a 5 KB document
visits hundreds of MiB, `int()` and `str.isdigit()` accept Unicode digits (and disagree on "²"),
and a name with a trailing newline looks like another name once printed. The helpers here are
pure and iterative, so they cannot themselves overflow the stack.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32  # containers inside containers: real documents here nest 10 deep at most
MAX_ITEMS = 1_000_000  # values in one document (a 10,000-host UFM listing has ~3 million: see ufm)
MAX_TEXT = 1 << 20  # characters in one string value
MAX_NAME = 253  # a host or switch name (a DNS name's limit)


class InputLimitError(ValueError):
    """Input past a bound (too deep, too large, too many values, shared by YAML aliases), naming
    where (the file, the field path) in one line."""


def short(value: Any, width: int = 40) -> str:
    """A one-line preview of any value that never recurses (a nested list shows as `<list of 3>`)
    and never converts a huge integer to text (that raises past 4,300 digits)."""
    if isinstance(value, str):
        return repr(value[:width])
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() < 128 else f"<integer of {value.bit_length()} bits>"
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)}>"
    return f"<{type(value).__name__}>"


def scalar_text(value: Any) -> str | None:
    """A JSON scalar as text (a string as it is, a number as its digits); None for null, a list, an
    object, a bool (none of which are text), or an integer too long to print."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value) if value.bit_length() < 128 else None
    if isinstance(value, float):
        return repr(value)
    return None


def ascii_int(value: Any, *, max_digits: int = 18) -> int | None:
    """A non-negative integer written in ASCII digits (an int as it is); None otherwise. Unicode
    digits ("١٢", "²") are not numbers here: `str.isdigit` and `int` disagree about them."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 10**max_digits else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def has_control(text: str) -> bool:
    """Control, line-separator, format (bidirectional overrides, zero-width) and non-ASCII space
    characters: invisible or misleading once a name is printed (`leaf1\\n` looks like `leaf1`)."""
    return not text.isprintable()


def clean_name(text: str) -> str | None:
    """A host or switch name as every source spells it: surrounding blanks dropped; None (no usable
    name) when it holds a control character or is longer than a DNS name. One rule for every
    source, so two spellings of one switch are one switch, and two switches are never one name."""
    name = text.strip()
    if len(name) > MAX_NAME or has_control(name):
        return None
    return name


def visible(text: str) -> str:
    """`text` with its control characters written as escapes (`a\\x00b`), so an identifier that
    must be kept (a chassis ID) is printed as what it is rather than as a shorter look-alike."""
    return text if not has_control(text) else text.encode("unicode_escape").decode("ascii")


def check_tree(
    value: Any, what: str, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS, max_text: int = MAX_TEXT,
    shared: bool = False,
) -> None:
    """Raises InputLimitError when a decoded document nests deeper than `max_depth`, holds more than
    `max_items` values or a string longer than `max_text`, or holds one container twice (YAML
    aliases: a 5 KB document can name one list a billion times over; `shared` allows it for data
    built in Python, whose walk `max_items` still bounds). Iterative: a walk of the document's own
    size, whatever its shape."""
    seen: set[int] = set()
    stack: list[_Entry] = [(value, 0, None, None)]
    count = 0
    while stack:
        entry = stack.pop()
        node, depth = entry[0], entry[1]
        count += 1
        if count > max_items:
            raise InputLimitError(f"{what}: more than {max_items} values")
        if isinstance(node, str):
            if len(node) > max_text:
                raise InputLimitError(f"{what}{_path(entry)}: a string of {len(node)} characters (at most {max_text})")
            continue
        if not isinstance(node, (list, dict)):
            continue
        if depth >= max_depth:
            raise InputLimitError(f"{what}{_path(entry)}: nested deeper than {max_depth} levels")
        if not shared and id(node) in seen:
            raise InputLimitError(f"{what}{_path(entry)}: the same value used twice (YAML aliases are not accepted)")
        seen.add(id(node))
        stack.extend(_children(entry, what, max_text))


# (value, depth, the entry of the container holding it, its index or key there): a value's path is
# spelled out from these links only for an error, not for each of a document's values as it is walked
_Entry = tuple[Any, int, Any, Any]


def _children(entry: _Entry, what: str, max_text: int) -> list[_Entry]:
    node, depth = entry[0], entry[1] + 1
    if isinstance(node, list):
        return [(item, depth, entry, i) for i, item in enumerate(node)]
    for key in node:
        if isinstance(key, str) and len(key) > max_text:
            raise InputLimitError(f"{what}{_path(entry)}: a key of {len(key)} characters")
    return [(item, depth, entry, key) for key, item in node.items()]


def _path(entry: _Entry) -> str:
    """`.spec.items[3].name`: where `entry` sits in its document (each step cut to 200 characters)."""
    steps: list[str] = []
    while entry[2] is not None:
        parent, key = entry[2], entry[3]
        steps.append(f"[{key}]" if isinstance(parent[0], list) else f".{key if isinstance(key, str) else short(key)}")
        entry = parent
    path = ""
    for step in reversed(steps):
        path = f"{path}{step}"[:200]
    return path


def load_json(text: str | bytes, what: str, *, max_bytes: int, max_depth: int = MAX_DEPTH,
              max_items: int = MAX_ITEMS) -> Any:  # fmt: skip
    """`json.loads` within bounds: at most `max_bytes` of text, then `check_tree`. A body nested
    past the interpreter's own limit is an InputLimitError, not a RecursionError. Non-JSON raises
    json.JSONDecodeError (a ValueError) as json.loads does; NaN and Infinity are refused."""
    if len(text) > max_bytes:
        raise InputLimitError(f"{what}: {len(text)} bytes, more than the {max_bytes} accepted")
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise InputLimitError(f"{what}: nested deeper than {max_depth} levels") from None
    check_tree(doc, what, max_depth=max_depth, max_items=max_items)
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
