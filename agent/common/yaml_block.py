"""Block-style YAML as PyYAML and kubectl write it, read line by line without libyaml's node objects.

Reports, node labels and `kubectl -o yaml` output are block YAML of one shape: `key: value` lines,
`- ` entries, nesting by indentation, plain or single-quoted one-line scalars. Through libyaml,
each node costs a Python Node, two Marks and a resolver call before anything is built (libyaml's
own scan is a sixth of the total); reading the lines directly takes a quarter of the
instructions (3.8x fewer on 8.9 KB reports as `probe --model` writes them, callgrind).

`document` reads only what it is sure of and answers NOT_PLAIN for anything else (flow
collections but `[]` and `{}`, double quotes, a scalar running onto a second line, a tag, an
anchor, a comment after a value, a document marker, tabs, a character YAML does not print as it
is (controls, NEL and the other line breaks past `\n`, a byte-order mark, surrogates), any
indentation it does not expect, a scalar its constructor refuses): the caller then reads the text
through libyaml, so every error, and every value of a document read here, is libyaml's and
SafeConstructor's. Plain scalars are resolved and constructed by PyYAML's own resolver and
constructors (`yaml_codec` hands them in), so `1`, `yes`, `~` and `2024-01-01` are what they are
there. Nesting deeper than MAX_NESTING also goes to libyaml (which bounds it), so this never
recurses far.

Field names, values and whole lines repeat from line to line and from report to report: a
one-line scalar's value, and how a `key: value` line splits, once read, are remembered by their
text (KEPT of each, short ones, immutable values only), so the next time each costs a dict lookup.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

NOT_PLAIN: Any = object()  # `document`'s answer for text it leaves to libyaml
MAX_NESTING = 64  # collections inside collections read here; deeper goes to libyaml
KEPT = 4096  # one-line scalars remembered, per `plain` (bounded: the text is outside input)

# not printable in YAML (controls, C1 and NEL, surrogates, U+FFFE/F), a YAML line break (U+2028, U+2029), the
# byte-order mark (skipped at a line's start), or one of !%&*>@`| (never read here)
_UNSURE = re.compile(
    "[^\n \"-$'-)+-=?A-_a-{}~\u00a0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)
_UNSURE_ASCII = "!%&*>@`|"  # the printable ASCII characters of _UNSURE
_KEY = re.compile(r"(?:([A-Za-z0-9_/][A-Za-z0-9_./-]{0,127})|'((?:[^']|''){0,128})'):(?: +(\S.*))?$")
# a quoted scalar, unrolled: `(?:[^']|'')*` would keep a backtracking entry per character (16 MiB for 100 KB)
_QUOTED = re.compile(r"'([^']*(?:''[^']*)*)'$")
_PLAIN_FIRST = frozenset("-?:,[]{}#&*!|>'\"%@` ")  # a plain scalar cannot start with these (but `-x`)

Scalar = Callable[[str], Any]  # a plain scalar's text -> its value (NOT_PLAIN where not a core scalar)
_Groups = tuple[Any, ...]  # _KEY's groups: plain key, quoted key, value text (None: absent)
_KEYS: dict[str, _Groups] = {}  # a `key: value` line's content -> _KEY's groups, read once
_KNOWN: dict[Scalar, dict[str, Any]] = {}  # per `plain`: a plain scalar's text -> its value, read once
_IMMUTABLE = frozenset((str, int, float, bool, type(None), datetime.date, datetime.datetime))


class _Unsure(Exception):
    """A line `document` leaves to libyaml."""


def document(text: str, plain: Scalar) -> Any:
    """The value of `text`, a one-document block YAML mapping or list, or NOT_PLAIN."""
    lines = _lines(text)
    if lines is None or not lines or lines[0][0] != 0:
        return NOT_PLAIN
    try:
        value, end = _Reader(lines, plain).node(0, 0, 0)
    except (_Unsure, ValueError, TypeError, OverflowError):  # a constructor's refusal: libyaml's words
        return NOT_PLAIN
    # the characters checked last, once the lines have been read (a scan of every character costs
    # as much as reading a report's lines; text that is not plain is mostly found out sooner)
    return value if end == len(lines) and _sure_characters(text) else NOT_PLAIN


def _sure_characters(text: str) -> bool:
    """No character of _UNSURE in `text`. ASCII text (nearly all) is checked by str methods, a
    fifth of the regular expression's CPU: printable ASCII or a line break, none of `!%&*>@`|`."""
    if text.isascii():
        return text.replace("\n", " ").isprintable() and not any(char in text for char in _UNSURE_ASCII)
    return _UNSURE.search(text) is None


def _key(content: str) -> _Groups | None:
    """_KEY's groups for a line's content (None where it is no `key: value` line), remembered for
    short lines (KEPT of them): most lines repeat from report to report, and a dict lookup is a
    fraction of the regular expression's match."""
    match = _KEY.match(content)
    if match is None:
        return None
    groups: _Groups = match.groups()
    if len(content) <= 80 and len(_KEYS) < KEPT:
        _KEYS[content] = groups
    return groups


def _lines(text: str) -> list[tuple[int, str]] | None:
    """(indentation, content) of each line with content; None where a line holds a comment
    after something (`#` elsewhere than at a line's start)."""
    if "#" not in text:  # no comment anywhere (reports, `kubectl -o yaml`): one comprehension
        return [
            (len(line) - len(content), content) for line in text.split("\n") if (content := line.lstrip(" "))
        ]
    lines = []
    for line in text.split("\n"):
        content = line.lstrip(" ")
        if not content or content[0] == "#":
            continue
        if "#" in content:
            return None
        lines.append((len(line) - len(content), content))
    return lines


def _is_entry(content: str) -> bool:
    return content[0] == "-" and (len(content) == 1 or content[1] == " ")


class _Reader:
    """Reads `lines` from an index: each method returns the value and the index after it."""

    def __init__(self, lines: list[tuple[int, str]], plain: Scalar) -> None:
        self.lines, self.plain, self.count = lines, plain, len(lines)
        self.known = _KNOWN.get(plain) or _KNOWN.setdefault(plain, {})

    def node(self, at: int, column: int, depth: int) -> tuple[Any, int]:
        """A mapping or list whose first line `at` is indented by `column`."""
        if depth > MAX_NESTING:
            raise _Unsure
        content = self.lines[at][1]
        if _is_entry(content):
            return self.sequence(at, column, depth)
        return self.mapping(at, column, _KEYS.get(content) or _key(content), depth)

    def sequence(self, at: int, column: int, depth: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        lines, count, known = self.lines, self.count, self.known
        while at < count:
            indent, content = lines[at]
            if indent != column or not (content[0] == "-" and (len(content) == 1 or content[1] == " ")):
                break
            entry = content[1:].lstrip(" ")
            if not entry or _is_entry(entry):  # `-` alone, `- - x`: left to libyaml
                raise _Unsure
            key = _KEYS.get(entry) or _key(entry)
            if key:  # `- key: value`: a mapping at the entry's column
                value, at = self.mapping(at, column + len(content) - len(entry), key, depth + 1)
            else:
                value, at = known.get(entry, NOT_PLAIN), at + 1
                if value is NOT_PLAIN:
                    value = self.scalar(entry)
            items.append(value)
            if at < count and lines[at][0] > column:  # a scalar going on, or a stray indentation
                raise _Unsure
        return items, at

    def mapping(self, at: int, column: int, key: _Groups | None, depth: int) -> tuple[dict[Any, Any], int]:
        """The mapping at `column` from line `at`, whose first key `key` has already been matched.
        (A value or key read before is taken from `known` here, without a call: most are.)"""
        into: dict[Any, Any] = {}
        lines, count, known = self.lines, self.count, self.known
        while True:
            if key is None:
                raise _Unsure
            name, quoted, text = key
            at += 1
            if text is None:
                value, at = self.under(at, column, depth)
            elif (value := known.get(text, NOT_PLAIN)) is NOT_PLAIN:
                value = self.scalar(text)
            if quoted is not None:
                name = quoted.replace("''", "'")
            elif (found := known.get(name, NOT_PLAIN)) is not NOT_PLAIN:
                name = found
            else:  # its text matched _KEY: a plain scalar wherever it stands
                name = self.remembered(name)
            into[name] = value
            if at >= count:
                return into, at
            indent, content = lines[at]
            if indent != column or (content[0] == "-" and (len(content) == 1 or content[1] == " ")):
                if indent < column:
                    return into, at
                raise _Unsure  # deeper, or an entry under a key that has its value
            key = _KEYS.get(content) or _key(content)

    def under(self, at: int, column: int, depth: int) -> tuple[Any, int]:
        """The value of a key with nothing after its colon (the key's line is before `at`): the
        lines indented under it, a list at the key's own indentation, or null."""
        if at < self.count:
            indent, content = self.lines[at]
            if indent > column:
                return self.node(at, indent, depth + 1)
            if indent == column and _is_entry(content):
                return self.sequence(at, column, depth + 1)  # a list at its key's indentation
        return None, at

    def scalar(self, text: str) -> Any:
        """A one-line value: `[]`, `{}`, a single-quoted string or a plain scalar."""
        first = text[0]
        if first == "'":
            quoted = _QUOTED.match(text)
            if quoted is None:
                raise _Unsure
            return quoted.group(1).replace("''", "'")
        if first == "[" or first == "{":
            if text == "[]":
                return []
            if text == "{}":
                return {}
            raise _Unsure
        if (first in _PLAIN_FIRST and not (first == "-" and len(text) > 1 and text[1] != " ")) or (
            ": " in text or text[-1] == ":" or text[-1] == " "
        ):
            raise _Unsure
        return self.remembered(text)

    def remembered(self, text: str) -> Any:
        """`plain(text)`, remembered where the value is one of the immutable core scalars."""
        value = self.plain(text)
        if value is NOT_PLAIN:
            raise _Unsure
        if len(text) <= 64 and len(self.known) < KEPT and type(value) in _IMMUTABLE:
            self.known[text] = value
        return value
