"""Reading single sysfs/procfs attribute files without ever raising.

Kernel attribute files are small text values (one PAGE_SIZE at most, see
Documentation/filesystems/sysfs.rst), but on real hosts they are also missing (older drivers),
unreadable (EINVAL for a down link's `speed`, EPERM for write-only files) or garbled (binary junk
from a broken firmware, a truncated fixture). The probes need to tell these apart: absent is a
quiet `None`; garbled is a problem the probe reports by file name in its degraded health. This
module keeps that bookkeeping in one place (`Problems`) so each probe reads like the ABI it parses.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_MAX_ATTR_BYTES = 64 * 1024  # far above PAGE_SIZE: a bigger file is not a sysfs attribute
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0/C1 controls except tab and newline
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# Paths may be plain strings: a probe reading hundreds of counter files a cycle joins them with
# os.path.join, which costs a fraction of building a pathlib.Path per file.
StrPath = str | os.PathLike[str]


@dataclass
class Problems:
    """Collects human-readable reasons, each naming the file relative to `root`."""

    root: Path
    reasons: list[str] = field(default_factory=list)

    def add(self, path: StrPath, what: str) -> None:
        self.reasons.append(f"{self.name(path)}: {what}")

    def name(self, path: StrPath) -> str:
        try:
            return str(Path(path).relative_to(self.root))
        except ValueError:
            return str(Path(path))


def read_bytes(path: StrPath) -> bytes | None:
    """The raw content, or None when the file is absent or the kernel refuses to read it.

    One read(2) of up to the size limit: sysfs hands a whole attribute over in one read, and plain
    os calls keep a probe of thousands of counter and GID files cheap."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, _MAX_ATTR_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text(path: StrPath, problems: Problems | None = None, *, required: bool = False) -> str | None:
    """Stripped text of an attribute file.

    Absent or unreadable: None (and a problem only when `required`). Binary or non-UTF-8 content,
    or content too big for an attribute: None and a problem."""
    raw = read_bytes(path)
    if raw is None:
        if required and problems is not None:
            problems.add(path, "missing or unreadable")
        return None
    return decode_text(raw, path, problems)


def decode_text(raw: bytes, path: StrPath, problems: Problems | None = None) -> str | None:
    """`read_text` of content already read (so a caller that looked at the bytes reads once)."""
    if len(raw) > _MAX_ATTR_BYTES or b"\x00" in raw:
        if problems is not None:
            problems.add(path, "binary or oversized content")
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        if problems is not None:
            problems.add(path, "not UTF-8 text")
        return None
    if _CONTROL.search(text):
        if problems is not None:
            problems.add(path, "control characters in content")
        return None
    return text.strip()


def read_int(path: StrPath, problems: Problems | None = None, *, base: int = 10) -> int | None:
    """An integer attribute (`base=16` accepts the `0x` prefix sysfs uses for LIDs)."""
    text = read_text(path, problems)
    if text is None or text == "":
        return None
    try:
        return int(text, base)
    except ValueError:
        if problems is not None:
            problems.add(path, f"not an integer: {text[:40]!r}")
        return None


def link_name(path: StrPath) -> str | None:
    """The last component of a symlink's target (`device` -> `0000:0c:00.0`), or None.

    Reads the link text instead of resolving it, so a fixture tree whose links point outside
    itself still answers."""
    try:
        target = os.readlink(path)
    except OSError:
        return None
    name = os.path.basename(target.rstrip("/"))
    return name or None


def pci_address(device_link: StrPath) -> str | None:
    """The PCI address a `device` symlink points at, or None when the parent is not PCI."""
    name = link_name(device_link)
    if name is not None and not _PCI_ADDRESS.match(name.lower()):
        try:  # a link like `../..` names its target only once resolved
            name = Path(device_link).resolve().name
        except (OSError, RuntimeError):
            return None
    if name is None or not _PCI_ADDRESS.match(name.lower()):
        return None
    return name.lower()


@functools.lru_cache(maxsize=4096)  # the same few hundred sysfs names come back every cycle
def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that puts mlx5_2 before mlx5_10 and ib2 before ib10."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def list_dir(path: StrPath) -> list[str] | None:
    """Entry names sorted naturally, or None when the directory is absent or unreadable."""
    try:
        names = os.listdir(path)
    except OSError:
        return None
    return sorted(names, key=natural_key)
