"""Python dependencies are pinned with hashes (issue 23): requirements/runtime.lock pins every
runtime dependency pyproject.toml declares, test.lock the same pins plus the test extra, every pin
carries sha256 hashes, and both the image (Dockerfile) and `make setup` (tests/setup.sh) install
from them with --require-hashes and the project itself with --no-deps, so nothing unpinned can slip
in. The image ships no leftover layer: its last stage copies a finished virtualenv and deletes
nothing."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCKS = REPO / "requirements"
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)")


def pins(name: str) -> dict[str, str]:
    """{canonical package name: version} of a lock file, checking every pin has a sha256 hash."""
    text = (LOCKS / name).read_text()
    out: dict[str, str] = {}
    for entry in re.split(r"\n(?=\S)", text):
        match = PIN.match(entry)
        if match is None:
            assert entry.startswith(("#", "--")) or not entry.strip(), f"{name}: unpinned entry {entry[:60]!r}"
            continue
        assert "--hash=sha256:" in entry, f"{name}: {match.group(1)} has no hash"
        out[canonicalize_name(match.group(1))] = match.group(2)
    return out


def declared() -> tuple[list[Requirement], list[Requirement]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return ([Requirement(r) for r in project["dependencies"]],
            [Requirement(r) for r in project["optional-dependencies"]["test"]])  # fmt: skip


def test_every_declared_dependency_is_pinned_within_its_range_with_hashes() -> None:
    runtime, test = declared()
    runtime_pins, test_pins = pins("runtime.lock"), pins("test.lock")
    for lock, reqs in ((runtime_pins, runtime), (test_pins, runtime + test)):
        for req in reqs:
            version = lock.get(canonicalize_name(req.name))
            assert version is not None, f"{req.name} is not pinned"
            assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version} outside {req.specifier}"
    assert not set(test_pins) & {"hypertopo"}, "the project itself is installed from the tree, not the lock"


def test_the_test_lock_keeps_every_runtime_pin() -> None:
    runtime, test = pins("runtime.lock"), pins("test.lock")
    assert {name: test.get(name) for name in runtime} == runtime
    build = pins("build.lock")
    assert {"setuptools", "wheel"} <= set(build)
    assert all(test.get(name, version) == version for name, version in build.items()), "build and test locks disagree"


def test_setup_installs_from_the_locks_with_hashes_then_the_project_without_dependencies() -> None:
    setup = (REPO / "tests" / "setup.sh").read_text().replace("\\\n", " ")
    lines = [line for line in setup.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert len(lines) == 2, lines
    locked, project = lines
    assert "--require-hashes" in locked and "requirements/test.lock" in locked and "requirements/build.lock" in locked
    assert "--no-deps" in project and "-e ." in project and "-r " not in project


def stages(dockerfile: str) -> list[str]:
    return re.split(r"(?m)^(?=FROM )", dockerfile)[1:]


def test_the_image_installs_the_runtime_lock_with_hashes_and_ships_no_leftover_layer() -> None:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    *builders, final = stages(text)
    runs = " ".join(line for stage in builders for line in stage.splitlines() if line.startswith("RUN "))
    assert re.search(r"pip .*install [^&]*--require-hashes [^&]*-r requirements/runtime\.lock", runs), runs
    assert re.search(r"pip .*install [^&]*--no-deps [^&]*\.whl", runs), "the project is installed without dependencies"
    assert "requirements/test.lock" not in text, "test tools do not belong in the image"
    final_copies = [line for line in final.splitlines() if line.startswith("COPY")]
    assert final_copies and all(line.startswith("COPY --from=") for line in final_copies), final_copies
    final_runs = [line for line in final.splitlines() if line.startswith("RUN ")]
    assert not [r for r in final_runs if re.search(r"\brm\b|pip |apt-get", r)], final_runs
