"""YAML through libyaml's C loader and dumper where PyYAML has them, else the pure-Python ones.

Reading saved NodeTopology reports, cluster models and node labels, and printing HyperNode lists,
spent most of `hypertopo-aggregator render`'s time in PyYAML's pure-Python scanner and emitter;
libyaml (bundled with PyYAML's wheels) does the same safe subset several times faster. Both
raise `yaml.YAMLError` on bad input, so callers need not know which one ran.
"""

from __future__ import annotations

from typing import IO, Any

import yaml

SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SafeDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load(source: str | bytes | IO[str] | IO[bytes]) -> Any:
    """One YAML document (like `yaml.safe_load`)."""
    return yaml.load(source, Loader=SafeLoader)


def load_all(source: str | bytes | IO[str] | IO[bytes]) -> list[Any]:
    """Every document of a YAML stream (like `yaml.safe_load_all`), read to the end."""
    return list(yaml.load_all(source, Loader=SafeLoader))


def dump(data: Any, stream: IO[str] | None = None, **options: Any) -> Any:
    """`yaml.safe_dump`: returns the text, or writes it to `stream` and returns None."""
    return yaml.dump(data, stream, Dumper=SafeDumper, **options)
