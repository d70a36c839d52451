"""How tests meet real components (binaries, root, shared captures, processes and their ports).

Outside CI a missing component skips the test with the reason; with HYPERTOPO_REQUIRE_REAL=1
(set by .ci/run) it fails the test instead, so CI can never pass by skipping real parts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

REQUIRE_REAL = os.environ.get("HYPERTOPO_REQUIRE_REAL") == "1"
# ../shared/data beside the checkout (DESIGN.md); HYPERTOPO_SHARED_DATA points elsewhere.
SHARED_DATA = Path(
    os.environ.get("HYPERTOPO_SHARED_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data"
)


def missing(reason: str) -> NoReturn:
    """A real component is not here: fail under HYPERTOPO_REQUIRE_REAL=1, else skip."""
    import pytest  # here, not at the top: the benchmark scripts use this module and measure their RSS

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


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    """(status, body) of a GET; an error status comes back as it is, no answer at all as (0, "")."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def wait_for(condition: Callable[[], Any], *, timeout: float = 15.0, interval: float = 0.05, what: str = "") -> Any:
    """Polls `condition` until it returns something truthy and returns that; fails the test (naming
    `what`) once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def stop_processes(procs: Iterable[subprocess.Popen[Any]], timeout: float) -> None:
    """SIGTERM each process still running, then give each `timeout` seconds to exit; one that has not
    is killed (and reaped). All are signalled before any is waited for, so they wind down together."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


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
