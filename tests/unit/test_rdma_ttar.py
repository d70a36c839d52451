"""tests/kits/ttar.py: the ttar fixture-archive extractor the sysfs tests stand on."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from ttar import TtarError, extract

SEP = "# ttar - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - -"

ARCHIVE = f"""# Archive created by ttar -c -f x.ttar sys
Directory: sys
Mode: 755
{SEP}
Directory: sys/class/infiniband/mlx5_0/ports/1
Mode: 755
{SEP}
Path: sys/class/infiniband/mlx5_0/ports/1/rate
Lines: 1
400 Gb/sec (4X NDR)
Mode: 644
{SEP}
Path: sys/class/infiniband/mlx5_0/node_guid
Lines: 1
0a7f:bc12:45ef:d23bEOF
Mode: 444
{SEP}
Path: sys/class/infiniband/mlx5_0/blob
Lines: 2
aNULLBYTENULLBYTEb
literal \\NULLBYTE and \\EOFEOF
Mode: 644
{SEP}
Path: sys/class/infiniband/mlx5_0/empty
Lines: 0
Mode: 200
{SEP}
Path: sys/class/infiniband/mlx5_0/device
SymlinkTo: ../../../0000:0c:00.0
{SEP}
File: sys/old/style
first
second
EOF
Directory: sys/readonly
Mode: 555
{SEP}
Path: sys/readonly/inside
Lines: 1
x
Mode: 644
"""


def test_archive_entries_become_files_links_and_modes(tmp_path: Path) -> None:
    root = extract("inline", tmp_path, text=ARCHIVE) / "sys"
    dev = root / "class" / "infiniband" / "mlx5_0"
    assert (dev / "ports" / "1" / "rate").read_bytes() == b"400 Gb/sec (4X NDR)\n"
    assert (dev / "node_guid").read_bytes() == b"0a7f:bc12:45ef:d23b"  # EOF: no trailing newline
    assert stat.S_IMODE((dev / "node_guid").stat().st_mode) == 0o444
    assert (dev / "blob").read_bytes() == b"a\x00\x00b\nliteral NULLBYTE and EOF"
    assert (dev / "empty").read_bytes() == b"" and stat.S_IMODE((dev / "empty").stat().st_mode) == 0o200
    assert os.readlink(dev / "device") == "../../../0000:0c:00.0"
    assert (root / "old" / "style").read_bytes() == b"first\nsecond\n"
    assert (root / "readonly" / "inside").read_text() == "x\n"  # written before 555 was applied
    assert stat.S_IMODE((root / "readonly").stat().st_mode) == 0o555


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Path: ../escape\nLines: 0\n", "line 1: unsafe entry path"),
        ("Path: /etc/passwd\nLines: 0\n", "line 1: unsafe entry path"),
        ("Path: a\nLines: 3\nonly one\n", "archive ends inside a file of 3 lines"),
        ("Path: a\nLines: many\n", "line 2: Lines needs a number"),
        ("Bogus: a\n", "line 1: unknown keyword"),
        ("Lines: 1\nx\n", "line 1: no Path/Directory"),
        ("File: a\nnever closed\n", "no closing EOF line"),
        ("Path: a\nLines: 0\nMode: rwx\n", "line 3: bad mode"),
    ],
)
def test_bad_archives_fail_with_the_line_and_reason(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TtarError, match=message):
        extract("inline", tmp_path, text=text)
    assert not (tmp_path.parent / "escape").exists()


def test_carriage_returns_inside_binary_content_are_not_line_breaks(tmp_path: Path) -> None:
    archive = tmp_path / "a.ttar"
    archive.write_bytes(b"Path: bin\nLines: 1\n\x89PNG\r\x1a\x00EOF\nMode: 644\n")
    extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "bin").read_bytes() == b"\x89PNG\r\x1a\x00"
