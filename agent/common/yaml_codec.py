"""YAML through libyaml's C loader and dumper where PyYAML has them, else the pure-Python ones.

Reading saved NodeTopology reports, cluster models and node labels, and printing HyperNode lists,
spent most of `hypertopo-aggregator render`'s time in PyYAML's pure-Python scanner and emitter;
libyaml (bundled with PyYAML's wheels) does the same safe subset several times faster. Both
raise `yaml.YAMLError` on bad input, so callers need not know which one ran.

Once parsed, PyYAML's SafeConstructor builds each value through a generator and two bookkeeping
dicts per node; that was as much time again as libyaml's parse. `Loader` builds the documents these
files hold (maps, lists and the scalars of the YAML core schema) in one loop, level by level in the
order SafeConstructor takes, so a document gives the same value or the same first error. A node it
does not build (a merge key `<<`, `!!set`, `!!omap`, a collection under an odd tag) sends the whole
document to SafeConstructor, unchanged.

Before any of that, a document in plain block style (reports and `kubectl -o yaml` output as they
are written) is read line by line by `yaml_block`, with these same resolver and constructors: an
8.9 KB report as `probe --model` writes it in a quarter of the instructions (5.7 M instead of 21.8 M
through libyaml and `Loader`, callgrind; 1.3 ms of CPU instead of 2.8 before yaml_block remembered
lines and values). Whatever it is not sure of
(flow collections, double quotes, a scalar over two lines, odd characters, any odd indentation) it
leaves to the path above, so values and errors stay libyaml's and SafeConstructor's.

Aliases are refused (`YamlLimitError`): an alias shares one value many times over, so a 4.6 KB
report of nested aliases became 232 MiB (20 s) for whoever walks it, and none of the files read
here (reports, models, node labels, `kubectl -o yaml` output) uses them. So is nesting past the
parser's own limits (the pure-Python parser recurses; libyaml stops at its own depth).

So, before any parser runs, is text with more than MAX_FLOW_DEPTH brackets (`[`, `{`) open at
once in one document: libyaml accepts flow collections 1,000 deep, and its scanner walks every
open level at every token (18 ms for 6 KB of `{"a":` 1,000 deep, where a 1.7 KB report takes
0.2 ms). The files read here nest a few brackets deep (a model's `{switches: [...]}`, JSON in an
annotation), and their readers refuse values nested past 32 anyway (input_limits.MAX_DEPTH).
The count is of characters, not a second YAML scanner: brackets in quoted text and comments
count too, a closing bracket cancels an opening one wherever they are, and a document marker
(`---`, `...`) starts the count again (libyaml ends any flow collection there). So a stream of
reports with a stray `[` each is read, a single document with 129 of them is refused; nesting
hidden from the count (`["]", ["]", ...`) still meets libyaml's own bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MethodType
from typing import IO, Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import BaseResolver

from agent.common import yaml_block

SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SafeDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_CORE = "tag:yaml.org,2002:"
_STR, _SEQ, _MAP = _CORE + "str", _CORE + "seq", _CORE + "map"
_SCALARS = frozenset(_CORE + name for name in ("str", "int", "float", "bool", "null", "timestamp", "binary"))
MAX_FLOW_DEPTH = 128  # brackets open at once in one document (libyaml's own bound is 1,000)
RESOLVED_KEPT = 4096  # plain scalars whose tag `Loader` remembers (bounded: the text is outside input)
_MAPPING = "while constructing a mapping"  # SafeConstructor's words, so the error reads the same
_MERGE_OR_VALUE = frozenset((_CORE + "merge", _CORE + "value"))  # keys SafeConstructor rewrites first
_NO_PATHS: dict[Any, Any] = {}  # never filled: see Loader


class YamlLimitError(yaml.YAMLError, ValueError):
    """YAML this project does not read: an alias, or nesting too deep (one line, with the line)."""


class _Unusual(Exception):
    """A node `Loader`'s loop leaves to SafeConstructor."""


class Loader(SafeLoader):
    """SafeLoader (libyaml's where there is one) that builds plain documents in one loop.

    libyaml's composer calls back into Python for every node: `resolve` for its tag and
    `descend_resolver`/`ascend_resolver` around it. With no path resolver set (PyYAML's way to tag
    a node by where it sits; none is set here) descending and ascending do nothing and a tag depends
    on the node's kind and, for a plain scalar, its text alone: so the first two are C callables
    that do that nothing (two Python calls fewer per node), and `resolve` answers without going
    through PyYAML's resolver, which it asks only for a plain scalar it has not seen."""

    _resolved: dict[str, str] = {}  # plain scalar -> its tag (RESOLVED_KEPT of them, the short ones)
    descend_resolver = _NO_PATHS.get  # (parent, index) -> index, nothing kept: a builtin, so unbound
    ascend_resolver = _NO_PATHS.clear  # () -> None on a dict that stays empty

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        if self.yaml_path_resolvers:  # one was added to a PyYAML class: PyYAML's own walk, node by node
            self.__dict__.update({name: MethodType(getattr(BaseResolver, name), self)
                                   for name in ("descend_resolver", "ascend_resolver", "resolve")})  # fmt: skip

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        """BaseResolver.resolve with no path resolver: a collection's default tag, a quoted
        scalar's `str`, a plain scalar's tag remembered (a few regular expressions tried once per
        text; field names and common values repeat in every file)."""
        if kind is not ScalarNode:
            return _SEQ if kind is SequenceNode else _MAP
        if not implicit[0]:
            return _STR
        return Loader._resolved.get(value) or _plain_tag(value)  # the remembered tag without a call

    def construct_document(self, node: Node) -> Any:
        try:
            return _build(self, node)
        except _Unusual:
            return super().construct_document(node)


_AS_RESOLVER: Any = Loader  # what BaseResolver.resolve reads of a loader here is class attributes


def _plain_tag(value: str) -> str:
    """A plain scalar's tag as BaseResolver finds it with no path resolver (then it reads only
    the class's implicit resolvers, so the class stands in for a loader), remembered if short."""
    tag = Loader._resolved.get(value)
    if tag is None:
        tag = BaseResolver.resolve(_AS_RESOLVER, ScalarNode, value, (True, False))
        if len(value) <= 64 and len(Loader._resolved) < RESOLVED_KEPT:
            Loader._resolved[value] = tag
    return tag


_CONSTRUCTOR = SafeConstructor()  # a core scalar's constructor reads only class attributes of it
_IMMUTABLE = frozenset(_CORE + name for name in ("int", "float", "bool", "null", "timestamp"))
_built: dict[str, Any] = {}  # plain scalar -> its (immutable) value (RESOLVED_KEPT of them, the short ones)


def _plain_value(text: str) -> Any:
    """A plain scalar's value as `Loader` builds it (SafeConstructor's constructor for its tag);
    yaml_block.NOT_PLAIN for a tag outside the core scalars (`<<`, `=`)."""
    value = _built.get(text, yaml_block.NOT_PLAIN)
    if value is not yaml_block.NOT_PLAIN:
        return value
    tag = _plain_tag(text)
    if tag == _STR:
        value = text
    elif tag in _IMMUTABLE:
        value = Loader.yaml_constructors[tag](_CONSTRUCTOR, ScalarNode(tag, text))
    else:
        return value
    if len(text) <= 64 and len(_built) < RESOLVED_KEPT and value == value:  # not NaN: each is its own key
        _built[text] = value
    return value


def _block(text: str | bytes) -> Any:
    """`text` read by yaml_block where it is plain block YAML (NOT_PLAIN otherwise, or where a
    path resolver is set: then every node goes through PyYAML's walk)."""
    if not isinstance(text, str) or Loader.yaml_path_resolvers:
        return yaml_block.NOT_PLAIN
    return yaml_block.document(text, _plain_value)


def _build(loader: Any, root: Node) -> Any:
    """The document under `root`, as SafeConstructor builds it: a collection's entries are read
    when its level comes (breadth first, in document order), so the first error is the same."""
    if isinstance(root, ScalarNode):
        return _scalar(loader, root)
    top = _empty(root)
    level: list[tuple[Any, Any]] = [(root, top)]
    while level:
        following: list[tuple[Any, Any]] = []
        for node, into in level:
            if isinstance(into, list):
                into.extend([child.value if child.__class__ is ScalarNode and child.tag == _STR
                             else _value(loader, child, following) for child in node.value])  # fmt: skip
            else:
                _fill_mapping(loader, node, into, following)
        level = following
    return top


def _fill_mapping(loader: Any, node: Node, into: dict[Any, Any], following: list[tuple[Any, Any]]) -> None:
    pairs = node.value
    for key_node, _ in pairs:  # SafeConstructor rewrites these before it reads any entry
        if key_node.tag in _MERGE_OR_VALUE:
            raise _Unusual
    for key_node, value_node in pairs:
        if not isinstance(key_node, ScalarNode):
            _empty(key_node)  # a collection under an odd tag: SafeConstructor says what
            raise ConstructorError(_MAPPING, node.start_mark, "found unhashable key", key_node.start_mark)
        # a plain string read in place (most values are); the value first, then the key, as before
        value = (value_node.value if value_node.__class__ is ScalarNode and value_node.tag == _STR
                 else _value(loader, value_node, following))  # fmt: skip
        into[key_node.value if key_node.tag == _STR else _scalar(loader, key_node)] = value


def _value(loader: Any, node: Node, following: list[tuple[Any, Any]]) -> Any:
    if isinstance(node, ScalarNode):
        return _scalar(loader, node)
    into = _empty(node)
    following.append((node, into))
    return into


def _empty(node: Node) -> Any:
    if node.tag == _MAP and isinstance(node, MappingNode):
        return {}
    if node.tag == _SEQ and isinstance(node, SequenceNode):
        return []
    raise _Unusual


def _scalar(loader: Any, node: Node) -> Any:
    tag = node.tag
    if tag == _STR:
        return node.value
    if tag not in _SCALARS:
        raise _Unusual
    return loader.yaml_constructors[tag](loader, node)


def _text(source: str | bytes | IO[str] | IO[bytes]) -> str | bytes:
    return source if isinstance(source, (str, bytes)) else source.read()


def _refuse_deep_flow(source: str | bytes) -> None:
    """YamlLimitError where more than MAX_FLOW_DEPTH brackets are open at once in one document
    (opening ones less closing ones since its start), naming the line of the first one past it.
    Linear, at C speed (str.count and str.find, 4 KB at a time), done at the first bracket past it;
    two counts where the text holds too few opening brackets to pass it."""
    text = source if isinstance(source, str) else source.decode("latin-1")  # bytes as they are: ASCII stays
    if text.count("[") + text.count("{") <= MAX_FLOW_DEPTH:  # too few to pass it (any file read here)
        return
    depth = 0
    for start, stop, new_document in _pieces(text):
        depth = _counted(text, start, stop, 0 if new_document else depth)


def _pieces(text: str) -> Iterator[tuple[int, int, bool]]:
    """(start, stop, whether a document starts there) of 4 KB pieces of `text`, cut at document
    markers (where libyaml ends any flow collection)."""
    start, new_document = 0, True
    while start < len(text):
        stop = min(len(text), start + 4096)
        marker = _first_marker(text, start, stop)
        yield start, (stop if marker < 0 else marker + 1), new_document
        start, new_document = (stop, False) if marker < 0 else (marker + 4, True)


def _first_marker(text: str, start: int, stop: int) -> int:
    """The offset of the line break before the first document marker (`---` or `...` at a line's
    start, then a blank or the line's end) whose line break lies in text[start:stop], or -1."""
    while found := [
        at for at in (text.find("\n---", start, stop + 4), text.find("\n...", start, stop + 4)) if at >= 0
    ]:
        at = min(found)
        if text[at + 4 : at + 5] in ("", " ", "\t", "\r", "\n"):
            return at
        start = at + 1
    return -1


def _counted(text: str, start: int, stop: int, depth: int) -> int:
    """The depth after text[start:stop] from `depth` before it. A part that opens too few brackets
    to pass the bound from the depth it starts at is passed whole (four counts), any other is
    halved, down to a few characters read one by one."""
    parts = [(start, stop)]  # the next one last
    while parts:
        start, stop = parts.pop()
        opened = text.count("[", start, stop) + text.count("{", start, stop)
        if depth + opened <= MAX_FLOW_DEPTH:
            depth += opened - text.count("]", start, stop) - text.count("}", start, stop)
        elif stop - start > 32:
            middle = (start + stop) // 2
            parts += [(middle, stop), (start, middle)]
        else:
            depth = _read_brackets(text, start, stop, depth)
    return depth


def _read_brackets(text: str, start: int, stop: int, depth: int) -> int:
    """The depth after text[start:stop], read a character at a time; YamlLimitError past the bound."""
    for at in range(start, stop):
        char = text[at]
        if char == "[" or char == "{":
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                line = text.count("\n", 0, at) + 1
                raise YamlLimitError(
                    f"line {line}: more than {MAX_FLOW_DEPTH} brackets ([ or {{) open at once: nested too deep"
                )
        elif char == "]" or char == "}":
            depth -= 1
    return depth


def _refuse_aliases(text: str | bytes) -> None:
    """An alias needs an anchor (`&name`) and a reference (`*name`): without both characters in the
    text there is none, and the event scan (libyaml's speed) is skipped."""
    if not (("&" in text and "*" in text) if isinstance(text, str) else (b"&" in text and b"*" in text)):
        return
    for event in yaml.parse(text, Loader=SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            raise YamlLimitError(f"line {line}: YAML aliases are not accepted (*{event.anchor})")


def load(source: str | bytes | IO[str] | IO[bytes]) -> Any:
    """One YAML document (like `yaml.safe_load`), aliases refused."""
    text = _text(source)
    _refuse_deep_flow(text)
    _refuse_aliases(text)
    value = _block(text)
    if value is not yaml_block.NOT_PLAIN:
        return value
    try:
        return yaml.load(text, Loader=Loader)
    except RecursionError:
        raise YamlLimitError("YAML nested too deep") from None
    except ValueError as exc:  # an integer past Python's 4,300 digits; text that is not UTF-8
        raise YamlLimitError(" ".join(str(exc).split())[:200]) from None


def load_all(source: str | bytes | IO[str] | IO[bytes]) -> list[Any]:
    """Every document of a YAML stream (like `yaml.safe_load_all`), read to the end, aliases refused."""
    text = _text(source)
    _refuse_deep_flow(text)
    _refuse_aliases(text)
    value = _block(text)
    if value is not yaml_block.NOT_PLAIN:
        return [value]
    try:
        return list(yaml.load_all(text, Loader=Loader))
    except RecursionError:
        raise YamlLimitError("YAML nested too deep") from None
    except ValueError as exc:  # an integer past Python's 4,300 digits; text that is not UTF-8
        raise YamlLimitError(" ".join(str(exc).split())[:200]) from None


def dump(data: Any, stream: IO[str] | None = None, **options: Any) -> Any:
    """`yaml.safe_dump`: returns the text, or writes it to `stream` and returns None."""
    return yaml.dump(data, stream, Dumper=SafeDumper, **options)
