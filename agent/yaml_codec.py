"""YAML through libyaml's C loader and dumper where PyYAML has them, else the pure-Python ones.

Reading saved NodeTopology reports, cluster models and node labels, and printing HyperNode lists,
spent most of `hypertopo-aggregator render`'s time in PyYAML's pure-Python scanner and emitter;
libyaml (bundled with PyYAML's wheels) does the same safe subset several times faster. Both
raise `yaml.YAMLError` on bad input, so callers need not know which one ran.

Aliases are refused (`YamlLimitError`): an alias shares one value many times over, so a 4.6 KB
report of nested aliases became 232 MiB (20 s) for whoever walks it, and none of the files read
here (reports, models, node labels, `kubectl -o yaml` output) uses them. So is nesting past the
parser's own limits (the pure-Python parser recurses; libyaml stops at its own depth).
"""

from __future__ import annotations

from typing import IO, Any

import yaml

SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SafeDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class YamlLimitError(yaml.YAMLError, ValueError):
    """YAML this project does not read: an alias, or nesting too deep (one line, with the line)."""


def _text(source: str | bytes | IO[str] | IO[bytes]) -> str | bytes:
    return source if isinstance(source, (str, bytes)) else source.read()


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
    _refuse_aliases(text)
    try:
        return yaml.load(text, Loader=SafeLoader)
    except RecursionError:
        raise YamlLimitError("YAML nested too deep") from None
    except ValueError as exc:  # an integer past Python's 4,300 digits; text that is not UTF-8
        raise YamlLimitError(" ".join(str(exc).split())[:200]) from None


def load_all(source: str | bytes | IO[str] | IO[bytes]) -> list[Any]:
    """Every document of a YAML stream (like `yaml.safe_load_all`), read to the end, aliases refused."""
    text = _text(source)
    _refuse_aliases(text)
    try:
        return list(yaml.load_all(text, Loader=SafeLoader))
    except RecursionError:
        raise YamlLimitError("YAML nested too deep") from None
    except ValueError as exc:  # an integer past Python's 4,300 digits; text that is not UTF-8
        raise YamlLimitError(" ".join(str(exc).split())[:200]) from None


def dump(data: Any, stream: IO[str] | None = None, **options: Any) -> Any:
    """`yaml.safe_dump`: returns the text, or writes it to `stream` and returns None."""
    return yaml.dump(data, stream, Dumper=SafeDumper, **options)
