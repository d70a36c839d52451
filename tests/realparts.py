"""How tests meet real components (binaries, root, shared captures).

Outside CI a missing component skips the test with the reason; with HYPERTOPO_REQUIRE_REAL=1
(set by .ci/run) it fails the test instead, so CI can never pass by skipping real parts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE_REAL = os.environ.get("HYPERTOPO_REQUIRE_REAL") == "1"
# ../shared/data beside the checkout (DESIGN.md); HYPERTOPO_SHARED_DATA points elsewhere.
SHARED_DATA = Path(
    os.environ.get("HYPERTOPO_SHARED_DATA") or Path(__file__).resolve().parent.parent.parent / "shared" / "data"
)


def missing(reason: str) -> NoReturn:
    """A real component is not here: fail under HYPERTOPO_REQUIRE_REAL=1, else skip."""
    if REQUIRE_REAL:
        pytest.fail(f"real component missing (HYPERTOPO_REQUIRE_REAL=1): {reason}")
    pytest.skip(reason)


def require_binary(name: str) -> str:
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )
    if not path:
        missing(f"{name} is not installed (.ci/run installs it)")
    return path


def require_root() -> None:
    if os.geteuid() != 0:
        missing("needs root (network namespaces, raw sockets)")


def shared_data_dir() -> Path:
    if not SHARED_DATA.is_dir():
        missing(f"shared captures not found at {SHARED_DATA}")
    return SHARED_DATA


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ip(*args: str) -> None:
    """`ip ARGS` (iproute2); a failure raises with its stderr captured."""
    subprocess.run([require_binary("ip"), *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def veth_netns(name: str, a: str, b: str, *a_options: str) -> Iterator[str]:
    """A network namespace NAME (needs root) holding veth pair a/b, both up (`a_options`, e.g.
    "mtu", "9000", apply to a); yields NAME and deletes the namespace afterwards."""
    require_root()
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "add", a, *a_options, "type", "veth", "peer", "name", b)
        ip("-n", name, "link", "set", a, "up")
        ip("-n", name, "link", "set", b, "up")
        yield name
    finally:
        ip("netns", "del", name)
