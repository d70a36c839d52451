"""What every hypertopo command shares: `--version`, `--log-format`, one-line errors, short warnings.

Operators meet these tools through a terminal or a log shipper, never through a Python traceback:
bad usage (an option, a flag value) is one line and exit code 2; bad input (a file that cannot be
read or holds a wrong field) is one line naming the file and the field path and exit code 1. A
warning that would list hundreds of names (every dropped domain of a large fabric) names a few and
counts the rest, so a log line stays readable. `--log-format json` writes one JSON object per line
for shippers (Fluent Bit, Vector, Loki's promtail) that parse structured logs.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

EXIT_OK, EXIT_INPUT, EXIT_USAGE = 0, 1, 2
PACKAGE = "hypertopo"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


Number = TypeVar("Number", int, float)


def number_argument(parse: Callable[[str], Number], noun: str, minimum: Number, rule: str) -> Callable[[str], Number]:
    """An argparse `type` for a number option: `parse` reads the text ("not a NOUN: TEXT" when it
    cannot) and a value below `minimum` is refused with `rule`, both as one usage line."""

    def convert(text: str) -> Number:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {noun}: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(rule)
        return value

    return convert


REPEATED = "may be repeated"


def _say_repeated(help_text: str | None) -> str | None:
    """A help text that says the option may be repeated (argparse.SUPPRESS and None kept as is)."""
    if help_text is None or help_text == argparse.SUPPRESS or REPEATED in help_text:
        return help_text
    return f"{help_text} ({REPEATED})"


class Accumulate(argparse.Action):
    """A multi-value option (nargs '+' or '*') whose repeats add up: `--reports A B --reports C`
    reads A, B and C. argparse's own store keeps only the last occurrence, which silently drops
    input a user named; its `extend` adds to a non-empty default, which a first occurrence must
    replace instead."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        if option_strings:
            kwargs["help"] = _say_repeated(kwargs.get("help"))
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        items.extend(values if isinstance(values, list) else [values])
        setattr(namespace, self.dest, items)


class _Append(argparse._AppendAction):
    """argparse's `append`, with help that says the option may be repeated."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs["help"] = _say_repeated(kwargs.get("help"))
        super().__init__(option_strings, dest, **kwargs)


def _store(**kwargs: Any) -> argparse.Action:
    """The `store` action, except that a multi-value option accumulates across repeats."""
    if kwargs.get("nargs") in (argparse.ONE_OR_MORE, argparse.ZERO_OR_MORE):
        return Accumulate(**kwargs)
    return argparse._StoreAction(**kwargs)


class CommandParser(argparse.ArgumentParser):
    """The argument parser of every hypertopo command: every multi-value option (nargs '+' or '*',
    `append`, `extend`) appends when repeated and says so in `--help`, wherever it is declared (a
    source's `add_arguments` included). Subcommand parsers and argument groups inherit it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _store)
        self.register("action", "store", _store)
        self.register("action", "append", _Append)
        self.register("action", "extend", Accumulate)


def parser_actions(parser: argparse.ArgumentParser) -> list[tuple[argparse.ArgumentParser, argparse.Action]]:
    """Every (parser, action) of a parser and, recursively, of its subcommands (for tests and docs)."""
    found: list[tuple[argparse.ArgumentParser, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found.extend(parser_actions(sub))
        else:
            found.append((parser, action))
    return found


class UsageError(Exception):
    """Bad command-line usage: one line, exit code 2."""


class InputError(ValueError):
    """An input file that cannot be used: one line naming the file (and field path), exit code 1."""

    def __init__(self, source: str | Path, message: str, field: str = "") -> None:
        self.source, self.field = str(source), field
        where = ": ".join(part for part in (str(source), field) if part)
        super().__init__(f"{where}: {message}" if where else message)


@functools.cache
def version_text() -> str:
    """`0.1.0 (git v0.1.0-12-gabc1234)`: the installed package's version, plus `git describe` when
    the code runs from a git checkout (so a bug report names the exact commit)."""
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        version = "unknown"
    described = _git_describe(Path(__file__).resolve().parents[2])
    return f"{version} (git {described})" if described else version


def _git_describe(checkout: Path) -> str | None:
    if not (checkout / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), "describe", "--always", "--dirty", "--tags"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


class _LazyVersion(argparse.Action):
    """`--version`: like argparse's, but `git describe` runs only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{parser.prog.split()[0]} {version_text()}")
        parser.exit()


def add_common_arguments(parser: argparse.ArgumentParser, *, top: bool = True) -> None:
    """`--version` (top-level parser) and `--log-format` (top-level and, with top=False, again on
    a subcommand so that either position works)."""
    if top:
        parser.add_argument("--version", action=_LazyVersion, help="print the version and exit")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text" if top else argparse.SUPPRESS,
        help="log lines as text (default) or one JSON object per line, for log shippers",
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (RFC 3339, UTC), level, logger, message, and the
    exception text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(level: str | int = logging.INFO, log_format: str = "text") -> None:
    """Configures the root logger once for the command (later `basicConfig` calls are no-ops)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


def summarise(names: Iterable[str], *, first: int = 5, width: int = 80) -> str:
    """`3: a, b, c` or `120: a, b, c, d, e and 115 more`; each name cut to `width` characters."""
    items = list(names)
    shown = [name if len(name) <= width else name[: width - 1] + "…" for name in items[:first]]
    rest = len(items) - len(shown)
    return f"{len(items)}: {', '.join(shown)}" + (f" and {rest} more" if rest else "")


def one_line(text: str, *, width: int = 400) -> str:
    """A message on one line of at most `width` characters (the rest counted, not printed)."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return f"{flat[:width]}… ({len(flat) - width} more characters)"
