"""Shared fixtures: the real control plane, the shared captures folder, a fresh metrics registry."""

from __future__ import annotations

import logging
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from controlplane.harness import ControlPlane, ControlPlaneError, build, running
from hypothesis import settings
from placement_live import Cluster, kwok_running
from realparts import missing, shared_data_dir

# Property tests check behaviour, not speed: on a shared 2-core CI machine a single example can take
# longer than hypothesis' default 200 ms deadline, and speed is the benchmarks' job.
settings.register_profile("hypertopo", deadline=None)
settings.load_profile("hypertopo")


@pytest.fixture(autouse=True)
def _root_logger_put_back() -> Iterator[None]:
    """Commands run in-process set up the root logger for a command's whole life (one stream handler
    on the stderr of that moment, level INFO). Put it back after each test, so that handler (on a
    captured stream pytest has since closed) and that level never leak into the tests after it."""
    root = logging.getLogger()
    level, before = root.level, set(root.handlers)
    yield
    for handler in [h for h in root.handlers if h not in before and type(h) is logging.StreamHandler]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ControlPlane]:
    """A real etcd + kube-apiserver (RBAC on, crds/ applied), shared by the whole session.

    Tests share it, so each test uses names of its own (see `unique`) and cleans up what would
    disturb others."""
    try:
        with running() as plane:
            yield plane
    except ControlPlaneError as exc:
        missing(f"cannot start the test control plane: {exc}")


@pytest.fixture
def unique() -> str:
    """A short random suffix for object names that must not collide between tests."""
    return uuid.uuid4().hex[:6]


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary, built from its Go module (tests/controlplane/helm/build_helm.sh, cached)."""
    proc = subprocess.run(["bash", str(Path(__file__).parent / "controlplane/helm/build_helm.sh")],
                          capture_output=True, text=True, check=False, timeout=3000)  # fmt: skip
    if proc.returncode != 0:
        missing(f"cannot build helm: {proc.stderr[-800:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def kubectl() -> str:
    """The kubectl binary built with the test control plane (what renders kustomize overlays)."""
    return str(build() / "kubectl")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data: real-world captures written by others (see its SOURCES.md)."""
    return shared_data_dir()


@pytest.fixture(scope="module")
def kwok(apiserver: ControlPlane) -> Iterator[None]:
    """kwok keeping the test's kwok-labelled nodes Ready and their bound pods Running."""
    with kwok_running(apiserver):
        yield


@pytest.fixture
def cluster(apiserver: ControlPlane, kwok: None, unique: str) -> Iterator[Cluster]:
    """GPU nodes, HyperNodes, PodGroups and pods of one test, removed afterwards."""
    c = Cluster(apiserver, unique)
    yield c
    c.cleanup()
