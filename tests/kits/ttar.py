"""Extracts ttar text archives (the format prometheus/procfs and node_exporter keep their sysfs and
procfs fixtures in) into a directory, so probes can read a real host's tree in tests.

Format (ideaship/ttar, as written by `ttar -c`):

    # comment lines (the `# ttar - - -` separators) are ignored
    Directory: sys/class/infiniband        a directory
    Mode: 755                              the mode of the entry just named
    Path: sys/class/infiniband/mlx4_0/fw_ver
    Lines: 1                               then exactly that many content lines;
    2.31.5050                              a last line ending in `EOF` had no trailing newline,
    Mode: 644                              `NULLBYTE` stands for a NUL byte (`\\NULLBYTE`, `\\EOF`
                                           are the literal words)
    Path: sys/bus/pci/devices/0000:00:02.1
    SymlinkTo: ../../../devices/pci0000:00/0000:00:02.1

An older variant names files with `File:` and ends their content with a line `EOF`; both are read.
Bad archives raise `TtarError` with the line number; entry paths may not escape the destination.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

_KEYWORD = re.compile(r"^(Directory|Path|File|Lines|Mode|SymlinkTo): ?(.*)$")


class TtarError(ValueError):
    """A malformed archive, with the line it failed on."""


@dataclass
class _State:
    dest: Path
    current: Path | None = None
    dir_modes: list[tuple[Path, int]] = field(default_factory=list)


def extract(archive: Path | str, dest: Path, *, text: str | None = None) -> Path:
    """Unpacks `archive` (or the archive `text`) under `dest`; returns `dest`.

    Directory modes are applied last, so a read-only directory still receives its entries."""
    # bytes, not read_text(): universal newlines would turn a `\r` inside binary content into a line
    body = text if text is not None else Path(archive).read_bytes().decode("utf-8", errors="surrogateescape")
    state = _State(dest)
    dest.mkdir(parents=True, exist_ok=True)
    lines = iter(enumerate(body.split("\n"), start=1))
    for number, line in lines:
        _apply(line, number, lines, state)
    for path, mode in reversed(state.dir_modes):
        path.chmod(mode)
    return dest


def _apply(line: str, number: int, lines: Iterator[tuple[int, str]], state: _State) -> None:
    if line.startswith("#") or line == "":
        return
    match = _KEYWORD.match(line)
    if not match:
        raise TtarError(f"line {number}: unknown keyword: {line[:60]!r}")
    keyword, value = match.groups()
    if keyword == "Directory":
        state.current = _safe_path(state.dest, value, number)
        state.current.mkdir(parents=True, exist_ok=True)
    elif keyword in ("Path", "File"):
        state.current = _safe_path(state.dest, value, number)
        state.current.parent.mkdir(parents=True, exist_ok=True)
        if keyword == "File":
            _write(state.current, _until_eof(lines, number))
    elif keyword == "Lines":
        _write(_need(state, number), _counted(lines, _count(value, number), number))
    elif keyword == "SymlinkTo":
        target = _need(state, number)
        if target.is_symlink() or target.exists():
            target.unlink()
        os.symlink(value, target)
    else:
        _set_mode(_need(state, number), value, number, state)


def _need(state: _State, number: int) -> Path:
    if state.current is None:
        raise TtarError(f"line {number}: no Path/Directory before this line")
    return state.current


def _safe_path(dest: Path, value: str, number: int) -> Path:
    rel = PurePosixPath(value)
    if not value or rel.is_absolute() or ".." in rel.parts:
        raise TtarError(f"line {number}: unsafe entry path {value!r}")
    return dest.joinpath(*rel.parts)


def _count(value: str, number: int) -> int:
    if not value.isdigit():
        raise TtarError(f"line {number}: Lines needs a number, got {value!r}")
    return int(value)


def _counted(lines: Iterator[tuple[int, str]], count: int, number: int) -> bytes:
    out = bytearray()
    for _ in range(count):
        item = next(lines, None)
        if item is None:
            raise TtarError(f"line {number}: archive ends inside a file of {count} lines")
        out += _decode_line(item[1])
    return bytes(out)


def _until_eof(lines: Iterator[tuple[int, str]], number: int) -> bytes:
    out = bytearray()
    for _, line in lines:
        if line == "EOF":
            return bytes(out)
        out += _decode_line(line)
    raise TtarError(f"line {number}: file content has no closing EOF line")


def _decode_line(line: str) -> bytes:
    """One content line -> bytes: NULLBYTE -> NUL, a trailing unescaped EOF drops the newline."""
    newline = b"\n"
    if line.endswith("EOF") and not line.endswith("\\EOF"):
        line, newline = line[: -len("EOF")], b""
    line = re.sub(r"(?<!\\)NULLBYTE", "\x00", line).replace("\\NULLBYTE", "NULLBYTE").replace("\\EOF", "EOF")
    return line.encode("utf-8", errors="surrogateescape") + newline


def _write(path: Path, content: bytes) -> None:
    if path.is_symlink():
        path.unlink()
    path.write_bytes(content)


def _set_mode(path: Path, value: str, number: int, state: _State) -> None:
    if not re.fullmatch(r"[0-7]{3,4}", value):
        raise TtarError(f"line {number}: bad mode {value!r}")
    mode = int(value, 8)
    if path.is_symlink():
        return
    if path.is_dir():
        state.dir_modes.append((path, mode))
    else:
        path.chmod(mode)
