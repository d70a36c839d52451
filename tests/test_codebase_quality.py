"""The code base stays clean: ruff, mypy and the layer contract (pure layers free of the Kubernetes
client, NVML, netlink and sockets) hold for every commit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False, timeout=600)


def test_ruff_finds_nothing() -> None:
    proc = run(sys.executable, "-m", "ruff", "check", "agent", "aggregator", "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing() -> None:
    proc = run(sys.executable, "-m", "mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pure_layers_import_no_kubernetes_nvml_netlink_or_sockets() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    proc = run(str(lint_imports), "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout
